"""Which allocation each ref of a kernel names, and the layout (tiling,
swizzle) an allocation is given where its refs' own transforms do not say.

Up to jax 0.12.0.1 a scratch ref's aval is its tiled layout and each ref
carries the transforms that undo it (Untiling, Unswizzle), which every
primitive's ref transforms repeat. From 0.12.1 the aval is logical and only
run_scoped's `ref_transforms` holds the allocation's Tiling and Swizzle
(a RefUnion's: one tuple a member, by its ExtractAliasedRef). The static
checks (interpret/rules/tma.py, wgmma.py) and the swizzle inference
(smem_swizzle.py) read it from here; the buffers get it when allocated
(interpret/rules/refs.py)."""
from typing import Any

import jax

from pallas_sim.backends.sim.analysis import walker
from pallas_sim.backends.sim.base import jax_internals as jx

Layout = tuple  # (tiling, swizzle, members): members {ExtractAliasedRef: (tiling, swizzle)}


def tiling_of(transforms):
  """(tiling, swizzle) that a ref's transforms name (None where they do not):
  the transforms that undo them (Untiling, Unswizzle: a ref whose aval is
  the tiled layout, as jax 0.12.0.1 and before give scratch), or an
  allocation's own (Tiling, Swizzle: run_scoped's `ref_transforms` from jax
  0.12.1, beside a logical aval)."""
  tiling = swizzle = None
  for tr in transforms:
    if isinstance(tr, (jx.gpu_core.UntilingTransform, jx.gpu_core.TilingTransform)):
      tiling = tr.tiling
    elif isinstance(tr, (jx.gpu_core.UnswizzleRef, jx.gpu_core.SwizzleTransform)):
      swizzle = tr.swizzle
  return tiling, swizzle


def logical_shape(shape, transforms):
  """The logical shape of an allocation of `shape` given these transforms:
  untiled where they undo a tiling (the aval is the tiled layout), as it is
  where they are the allocation's own."""
  if not any(isinstance(tr, jx.gpu_core.UntilingTransform) for tr in transforms):
    return tuple(shape)
  tiling = tiling_of(transforms)[0]
  k = len(tiling)
  return shape[:-2 * k] + tuple(n * t for n, t in zip(shape[-2 * k:-k], shape[-k:]))


def is_smem(v: Any) -> bool:
  aval = getattr(v, "aval", None)
  return hasattr(aval, "inner_aval") and str(getattr(aval, "memory_space", "")) == "smem"


def union_members(aval: Any, transforms: Any) -> dict | None:
  """A RefUnion allocation's members' (tiling, swizzle) by ExtractAliasedRef,
  where `transforms` (its run_scoped ref_transforms) hold one tuple a member;
  None for any other allocation, or a union given no transforms."""
  if not isinstance(aval, jx.gpu_core.AbstractRefUnion) or not transforms or not all(
      isinstance(t, tuple) for t in transforms):
    return None
  refs = jax.tree.leaves(jx.gpu_core.flatten_ref_union(aval),
                         is_leaf=lambda x: isinstance(x, jx.pallas_core.TransformedRef))
  members = {}
  for r, t in zip(refs, transforms):
    (extract,) = r.transforms
    members[extract] = tiling_of(t)
  return members


def given(aval: Any, transforms: Any) -> Layout | None:
  """The layout an allocation's own transforms give it (jax 0.12.1's form),
  or None (none given, or the old form, whose refs carry it)."""
  members = union_members(aval, transforms)
  if members is not None:
    return (None, None, members) if any(m != (None, None) for m in members.values()) else None
  if not transforms or any(isinstance(t, jx.gpu_core.UntilingTransform) for t in transforms):
    return None
  tiling, swizzle = tiling_of(transforms)
  return None if tiling is None and swizzle is None else (tiling, swizzle, None)


class Allocations(walker.Forward):
  """Which allocation (a run_scoped invar) each ref names, run forward
  through the kernel, the layouts allocations are given (`layouts`), and
  for each equation whose operands name any, their layouts (`at`: id(eqn)
  -> one per operand, None for one without). Subclasses see each
  equation's operands as allocations too (`seen`)."""

  def __init__(self):
    self.layouts: dict[Any, Layout] = {}  # allocation var -> its given layout
    self.at: dict[int, tuple] = {}

  def join(self, a, b):
    return a if a is b else None

  def seen(self, eqn, ins):
    if any(x in self.layouts for x in ins if x is not None):
      self.at[id(eqn)] = tuple(self.layouts.get(x) if x is not None else None for x in ins)

  def allocated(self, eqn, body):
    trs = jx.param(eqn, "ref_transforms") or ()
    for v, t in zip(body.invars, trs):
      layout = given(v.aval, t)
      if layout is not None:
        self.layouts[v] = layout

  def transfer(self, eqn, ins):
    self.seen(eqn, ins)
    return [None] * len(eqn.outvars)

  def call(self, eqn, form, ins):
    """A scope's body names its own allocations and what it closes over; a
    call's or map's body takes the operands by position where the counts
    agree (refs passed another way are not followed)."""
    for body in form.bodies:
      if form.kind == "scoped":
        self.allocated(eqn, body)
        sub_in = list(ins[:len(body.constvars)]) + [v if is_smem(v) else None
                                                     for v in body.invars]
      elif len(ins) in (len(body.invars), len(body.constvars) + len(body.invars)):
        sub_in = list(ins)
      else:
        sub_in = [None] * (len(body.constvars) + len(body.invars))
      self.walk(body, sub_in)
    return [None] * len(eqn.outvars)


def of(launch: Any, eqn: Any, index: int) -> Layout | None:
  """The given layout of operand `index` of `eqn` in this launch."""
  at = getattr(launch, "given_layouts", None) or {}
  ops = at.get(id(eqn))
  return ops[index] if ops is not None and index < len(ops) else None
