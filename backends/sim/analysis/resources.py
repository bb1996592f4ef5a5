"""Static resource checks, before anything runs, with the real lowering's
rules and numbers (jax 0.11.2, jax/_src/pallas/mosaic_gpu/lowering.py
`_estimate_resources`, and mosaic/gpu/core.py `_launch`):

- each SMEM allocation of a run_scoped is rounded up to 1024 bytes;
- a run_scoped needs its own allocations plus the most its body needs;
  equations in sequence, cond branches and loop bodies reuse the same bytes
  (max), nested scopes add up;
- barriers are counted apart, 8 bytes each; identical barrier allocations of
  scopes in sequence share space (a multiset union), nested ones add up;
- reductions (reduce_sum/max/min) need `reduction_scratch_bytes` (2048);
- ACC (registers) and GMEM take no SMEM; tiling and swizzle change no size.
The error message is the lowering's, word for word.
"""
import collections
import dataclasses
import math
import re
from typing import Any

from pallas_sim.backends.sim.analysis import layout_hints, walker
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.base import locations
from pallas_sim.backends.sim.base.jax_internals import primitive_name
from pallas_sim.backends.sim.machine import named_barriers
from pallas_sim.errors import LoweringError, SmemOverflowError, UnsupportedPrimitiveError

SMEM_ALIGNMENT = 1024
MBARRIER_BYTES = 8
REDUCTION_SCRATCH_BYTES = 2048


def _align(x, a=SMEM_ALIGNMENT):
  return -(-x // a) * a


class _Need:
  """SMEM bytes and barriers a part of the kernel needs, and `parts`: the
  allocations that make up those bytes ((bytes, what), for an overflow's
  report), along the path that needs the most."""
  __slots__ = ("smem", "barriers", "parts")

  def __init__(self, smem=0, barriers=None, parts=()):
    self.smem = _align(smem)
    self.barriers = barriers if barriers is not None else collections.Counter()
    self.parts = parts

  def __add__(self, o):
    return _Need(self.smem + o.smem, self.barriers + o.barriers, self.parts + o.parts)

  def union(self, o):
    big = self if self.smem >= o.smem else o
    return _Need(big.smem, self.barriers | o.barriers, big.parts)


def _alloc_need(aval, where=None, name=None):
  dt = aval.inner_aval.dtype if hasattr(aval, "inner_aval") else aval.dtype
  shape = aval.inner_aval.shape if hasattr(aval, "inner_aval") else aval.shape
  if type(dt).__name__ in ("BarrierType", "ClusterBarrierType"):
    return _Need(barriers=collections.Counter({(dt, math.prod(shape)): 1}))
  if str(getattr(aval, "memory_space", "")) == "smem":
    nbytes = math.prod(shape) * dt.itemsize
    what = ((f"{name} " if name else "") + f"{dt}{list(shape)}"
            + (f" at {where}" if where else ""))
    return _Need(smem=nbytes, parts=((_align(nbytes), what),))
  return _Need()


def scope_names(body):
  """The names a run_scoped's body gives its allocations (None where it
  gives none), from its debug info."""
  info = getattr(body, "debug_info", None)
  names = list(getattr(info, "arg_names", None) or ())
  n = len(body.invars)
  return names[-n:] if len(names) >= n else [None] * n


def scope_layout(avals, base):
  """Where a run_scoped's SMEM allocations lie, as the lowering lays them
  out: one after another from `base`, each rounded up to 1024 bytes (a
  nested scope starts after them; scopes in sequence start at the same
  base). Returns ([(start, end) or None per allocation], the next base)."""
  ranges, top = [], base
  for aval in avals:
    size = _alloc_need(aval).smem
    ranges.append((top, top + size) if size else None)
    top += size
  return ranges, top


def _jaxpr_need(jaxpr, reduction_bytes):
  need = _Need()
  for eqn in jaxpr.eqns:
    need = need.union(_eqn_need(eqn, reduction_bytes))
  return need


def _eqn_need(eqn, reduction_bytes):
  name = eqn.primitive.name
  if name == "run_scoped":
    body = walker.bodies(eqn)[0]
    own = _Need()
    where = locations.eqn_location(eqn)
    for v, label in zip(body.invars, scope_names(body)):
      # (JAX's pipelines allocate their slots in one scope at the user's call:
      # their names tell the in_specs' from the out_specs')
      owner = label and jx.pipeline_allocation(eqn, label)
      own = own + _alloc_need(v.aval, where, f"{owner}'s {label}" if owner else label)
    return own + _jaxpr_need(body, reduction_bytes)
  if name in ("reduce_sum", "reduce_max", "reduce_min"):
    return _Need(smem=reduction_bytes, parts=((_align(reduction_bytes),
                                               "a reduction's scratch"),))
  need = _Need()
  # Only these are looked into by the real estimator (custom_jvp_call etc.
  # are not: their allocations count for nothing there, and so here).
  if name in _LOOKED_INTO:
    for body in walker.bodies(eqn):
      need = need.union(_jaxpr_need(body, reduction_bytes))
  return need


_LOOKED_INTO = frozenset(("cond", "scan", "jit", "pjit", "run_state", "while"))


@dataclasses.dataclass(frozen=True)
class KernelResources:
  """What a kernel body allocates and holds, read once before it runs."""
  smem: int                  # the bytes the lowering requests (smem_bytes)
  # the SMEM allocations `smem` counts, largest first: (bytes, what)
  smem_parts: tuple[tuple[int, str], ...]
  barriers: int              # the barriers a block can have (barrier_count)
  primitives: frozenset[str]  # every primitive in it (primitive_names)


def of(kernel_jaxpr: Any) -> KernelResources:
  """The kernel body's KernelResources."""
  need = _jaxpr_need(kernel_jaxpr, REDUCTION_SCRATCH_BYTES)
  return KernelResources(_need_bytes(need), tuple(sorted(need.parts, key=lambda p: -p[0])),
                         barrier_count(kernel_jaxpr),
                         frozenset(primitive_names(kernel_jaxpr)))


def smem_bytes(kernel_jaxpr, reduction_bytes=REDUCTION_SCRATCH_BYTES):
  """The `smem_bytes` the real lowering requests for this kernel body."""
  return _need_bytes(_jaxpr_need(kernel_jaxpr, reduction_bytes))


def _need_bytes(need):
  size = need.smem
  for (_, count), times in need.barriers.items():
    size += times * count * MBARRIER_BYTES
  return size


def check_smem(nbytes, gpu, where=None, parts=()):
  """The lowering's SMEM check, in its words; `parts` (KernelResources.
  smem_parts): where the bytes go, said after them."""
  if nbytes > gpu.max_smem_per_block:
    said = "; ".join(f"{b // 1024} KiB {what}" for b, what in parts[:4])
    more = f"; and {len(parts) - 4} more" if len(parts) > 4 else ""
    raise SmemOverflowError(
        "Mosaic GPU kernel exceeds available shared memory: "
        f"smem_bytes={nbytes} > max_smem_bytes={gpu.max_smem_per_block}"
        + (f". Where it goes, largest first: {said}{more}. Fewer pipeline slots "
           "(max_concurrent_steps) or smaller tiles need less" if parts else ""),
        smem_bytes=nbytes, max_smem_bytes=gpu.max_smem_per_block, where=where)


_SMEM_MSG = re.compile(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)")
# JAX's VerificationError puts this before the verifier's own words
_JAX_VERIFIER_PREFIX = ("Pallas encountered an internal verification error. Please file "
                        "a bug at https://github.com/jax-ml/jax/issues/new/choose. "
                        "Error details: ")
# Layout inference's failures, worded two ways across the window
_NO_LAYOUTS = re.compile(r"Failed to infer a possible set of layouts|Layout inference failed")
# The ops of the kernel as a whole (a pass that held one names no primitive)
_KERNEL_OPS = frozenset(("mpmd_map", "pallas_call"))
_JAX_MESH_AXIS = re.compile(r"Axis '?([\w.-]+)'? does not refer to a GPU mesh axis "
                            r"\(available axes: \[([^\]]*)\]\)")
_UNIMPLEMENTED = re.compile(r"Unimplemented primitive in Pallas Mosaic GPU lowering: (\w+)")


def first_use(jaxpr, name, where=None):
  """The user's file:line of the first equation of primitive `name` in
  `jaxpr` (nested bodies included), or of the equation that holds it where
  its own traceback stops inside JAX (jnp.cumsum's, traced under a jit of
  JAX's own: the user's line is the jit's); None where there is none."""
  for eqn in jaxpr.eqns:
    at = locations.eqn_location(eqn) or where
    if primitive_name(eqn) == name:
      return at
    for body in walker.bodies(eqn):
      found = first_use(body, name, at)
      if found is not None:
        return found
  return None


def lowering_error(exc, where=None, kernel_jaxpr=None, kernel_where=None):
  """Our error for an exception from JAX's real Mosaic GPU lowering: an SMEM
  overflow keeps its numbers; anything else is a LoweringError with the
  lowering's own message (its first lines: the rest is JAX's traceback).
  Where layout inference failed, the kernel's loads with no layout that
  reach a reduction (layout_hints) are named, and the first is `where`.
  An unimplemented primitive whose error says no better place than the
  kernel's own line (`kernel_where`) is placed at its first use."""
  msg = str(exc).strip()
  m = _SMEM_MSG.search(msg)
  if m:
    return SmemOverflowError(
        f"Mosaic GPU kernel exceeds available shared memory: {m.group(0)}",
        smem_bytes=int(m.group(1)), max_smem_bytes=int(m.group(2)), where=where)
  m = _JAX_MESH_AXIS.search(msg)
  if m:  # (the check lowers the kernel alone, outside the shard_map that named it)
    return UnsupportedPrimitiveError(
        f"lax.axis_index({m.group(1)!r}): {m.group(1)!r} is not an axis of this kernel "
        f"(its grid, cluster and thread axes: {m.group(2).replace(chr(39), '') or 'none'}); "
        "an axis of a "
        "JAX mesh (shard_map) says which device runs the kernel, and pallas-sim "
        "simulates one GPU: pass the device's index in as an argument",
        primitive="axis_index", where=where)
  lines: list[str] = []
  for line in msg.splitlines():
    if line.startswith("-----") or len(lines) == 6:  # JAX's traceback follows
      break
    lines.append(line.replace(" Please file an issue at "
                              "https://github.com/jax-ml/jax/issues/new/choose.", ""))
  if lines and lines[0].startswith(_JAX_VERIFIER_PREFIX):
    # (JAX's VerificationError: the IR its lowering made does not verify. Its
    # own line asks for a bug report; what the verifier says is the news.)
    lines[0] = lines[0][len(_JAX_VERIFIER_PREFIX):]
    lines.append("(the IR JAX's lowering made fails MLIR's verifier: JAX asks for a "
                 "bug report, https://github.com/jax-ml/jax/issues)")
  op = locations.mosaic_op_name(exc)
  if not lines:  # (a bare assertion: where JAX raised it is all it says)
    lines = [f"an assertion with no message, at {jx.raised_at(exc)}"
             + (f", on the op of a {op}" if op else "")]
  if _NO_LAYOUTS.search(msg):
    hints = layout_hints.layoutless_reductions(kernel_jaxpr) if kernel_jaxpr else []
    narrow = layout_hints.narrow_loads(kernel_jaxpr) if kernel_jaxpr and not hints else []
    if hints:
      where = hints[0].load
      advice = ("; ".join(f"the {h.primitive} at {h.use} is of a value loaded with no "
                          f"layout at {h.load}" for h in hints[:3])
                + ". Give the load one: plgpu.load(ref.at[idx], layout="
                "plgpu.Layout.WGMMA), or plgpu.layout_cast the value")
    elif narrow:
      where = narrow[0][0]
      advice = ("; ".join(f"the read at {at} gives {n} elements" for at, n in narrow[:3])
                + f", not a multiple of a warpgroup's {layout_hints.WARPGROUP_THREADS} "
                "threads, and the layouts a read can take spread a value over all of "
                "them: read and compute in pieces of 128 elements or more, or hold "
                "such a value in SMEM")
    else:
      advice = ("give it one where a value is made, e.g. plgpu.layout_cast(x, "
                "plgpu.Layout.WGMMA) on a loop's initial carry such as jnp.zeros, or "
                "plgpu.load(ref.at[idx], layout=...)")
    lines.append("(layout inference could not settle a layout for every value of the "
                 f"kernel: {advice})")
  m = _UNIMPLEMENTED.search(msg)
  if m and kernel_jaxpr is not None and where in (None, kernel_where):
    where = first_use(walker.inner(kernel_jaxpr), m.group(1)) or where
  return LoweringError.of(
      exc, f"the Mosaic GPU lowering rejects this kernel "
      f"({type(exc).__name__}): " + "\n".join(lines).strip(),
      primitive=m.group(1) if m else (op if op not in _KERNEL_OPS else None),
      where=where)


def primitive_names(kernel_jaxpr):
  """The names of every primitive in the kernel body, nested bodies included."""
  return {primitive_name(eqn) for eqn in walker.equations(kernel_jaxpr)}


def scope_allocations(eqn):
  """The variables a run_scoped equation's body allocates (its invars);
  none for any other equation."""
  return walker.bodies(eqn)[0].invars if eqn.primitive.name == "run_scoped" else ()


def asked_registers(jaxpr):
  """The largest count plgpu.set_max_registers asks for in the kernel body,
  by action ("increase", "decrease")."""
  found: dict[str, int] = {}
  for eqn in walker.equations(jaxpr):
    if primitive_name(eqn) == "set_max_registers":
      n = jx.param(eqn, "n")
      if n is not None:
        a = jx.param(eqn, "action")
        found[a] = max(found.get(a, 0), int(n))
  return found


def barrier_count(kernel_jaxpr):
  """How many mbarriers the kernel body's scopes allocate, each scope
  counted once (however often it runs), and the block's 16 named barriers
  where an inline_mgpu body may use them: the barriers a block can have."""
  count, named = 0, 0
  for eqn in walker.equations(kernel_jaxpr):
    if primitive_name(eqn) == "inline_mgpu":
      named = named_barriers.COUNT
    for v in scope_allocations(eqn):
      dt = getattr(getattr(v.aval, "inner_aval", None), "dtype", None)
      if type(dt).__name__ in ("BarrierType", "ClusterBarrierType"):
        count += math.prod(v.aval.inner_aval.shape)
  return count + named
