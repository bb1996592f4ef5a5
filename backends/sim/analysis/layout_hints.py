"""Where a kernel that JAX's layout inference cannot settle most likely needs a
layout: a reduction (or a broadcast) of a value loaded from GMEM or SMEM with
no layout given. The lowering's own error names no op ("Failed to infer a
possible set of layouts"); the value's load is where the fix goes
(plgpu.load(ref.at[idx], layout=...)), and the reduction is why."""
from __future__ import annotations

import math
from typing import Any, NamedTuple

from pallas_sim.backends.sim.analysis import walker
from pallas_sim.backends.sim.base.jax_internals import primitive_name
from pallas_sim.backends.sim.base.locations import eqn_location

# What needs its operand's layout settled: a reduction over some axes, a
# broadcast to more dimensions.
_NEEDS = frozenset(("reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
                    "reduce_and", "reduce_or", "argmax", "argmin", "broadcast_in_dim"))
_LOADS = frozenset(("get", "load"))
# How far back through elementwise work a load is looked for.
_DEPTH = 12


class Hint(NamedTuple):
  load: str       # file:line of the load with no layout
  use: str        # file:line of the reduction or broadcast
  primitive: str  # the latter's primitive


def layoutless_reductions(kernel_jaxpr: Any) -> list[Hint]:
  """Each reduction or broadcast whose operand comes, through elementwise
  work of the same shape only, from a load of GMEM or SMEM with no layout
  (no layout_cast on the way, no layout= on the load); in kernel order."""
  hints: list[Hint] = []
  for j in walker.jaxprs(kernel_jaxpr):
    made = {id(v): e for e in j.eqns for v in e.outvars}
    for eqn in j.eqns:
      name = primitive_name(eqn)
      if name not in _NEEDS or not eqn.invars:
        continue
      load = _layoutless_load(eqn.invars[0], made)
      if load is None:
        continue
      at_load, at_use = eqn_location(load), eqn_location(eqn)
      if at_load and at_use:
        hints.append(Hint(at_load, at_use, name))
  return list(dict.fromkeys(hints))


def _reads_memory(load: Any) -> bool:
  """Whether a load's ref (its first operand) is of GMEM or SMEM."""
  space = str(getattr(load.invars[0].aval, "memory_space", "")).lower()
  return "gmem" in space or "smem" in space


def _layoutless_load(var: Any, made: dict[int, Any]) -> Any:
  """The load `var` comes from with no layout given, or None."""
  shape = getattr(getattr(var, "aval", None), "shape", None)
  for _ in range(_DEPTH):
    eqn = made.get(id(var))
    if eqn is None:
      return None  # (an input of the body: a loop's carry, the kernel's)
    name = primitive_name(eqn)
    if name in _LOADS:
      if eqn.params.get("layout") is not None:  # (0.11.2: the load takes it)
        return None
      return eqn if _reads_memory(eqn) else None
    if name == "layout_cast" or len(eqn.outvars) != 1:
      return None
    ins = [v for v in eqn.invars
           if getattr(getattr(v, "aval", None), "shape", None) == shape]
    if not ins or getattr(eqn.outvars[0].aval, "shape", None) != shape:
      return None
    var = ins[0]
  return None


# A warpgroup's threads: the layouts a plain load can take (strided, WGMMA
# tiles) spread a value over all of them.
WARPGROUP_THREADS = 128


def narrow_loads(kernel_jaxpr: Any) -> list[tuple[str, int]]:
  """(file:line, elements) of each plain read of GMEM or SMEM (ref[...], no
  layout given) whose value has elements but not a multiple of a
  warpgroup's 128 threads: no layout that layout inference can choose for
  it spreads it over the warpgroup; in kernel order."""
  found: list[tuple[str, int]] = []
  for eqn in walker.equations(kernel_jaxpr):
    if primitive_name(eqn) != "get" or eqn.params.get("layout") is not None:
      continue
    shape = getattr(eqn.outvars[0].aval, "shape", ())
    size = math.prod(shape)
    if shape and size % WARPGROUP_THREADS and _reads_memory(eqn):
      at = eqn_location(eqn)
      if at:
        found.append((at, size))
  return list(dict.fromkeys(found))
