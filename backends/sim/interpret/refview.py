"""Ref values in the interpreter and the ref transforms (indexing, transpose,
reshape, bitcast, tiling, swizzle) applied to them.

A `Ref` is a buffer plus a NumPy view into its data, so writes through any
chain of transforms land in the buffer. Buffers hold logical (untiled) data:
tiling and swizzling change only where bytes live in real SMEM, not which
logical element a (transformed) ref names, so `UntilingTransform` and
`UnswizzleRef` at the head of a chain are identities here.
"""
import math
from typing import Any

import numpy as np
from jax import tree_util

from pallas_sim.backends.sim.machine import aliasing, memory
from pallas_sim.errors import KernelError, OutOfBoundsError, UnsupportedPrimitiveError
from pallas_sim.backends.sim.base import jax_internals as jx
# (an allocation's layout from its transforms, in either release's form)
from pallas_sim.backends.sim.analysis.given_layouts import logical_shape, tiling_of


class Ref:
  __slots__ = ("buf", "view", "raw_tiled", "layout")

  def __init__(self, buf, view, raw_tiled=False, layout=None):
    self.buf = buf
    self.view = view
    # True while a tiled buffer's root ref has not yet been untiled.
    self.raw_tiled = raw_tiled
    # A RefUnion member's own tiling and swizzle (machine/aliasing.py).
    self.layout = layout

  @property
  def tiling(self):
    return self.buf.tiling if self.layout is None else self.layout.tiling

  @property
  def swizzle(self):
    return self.buf.swizzle if self.layout is None else self.layout.swizzle

  @property
  def shape(self):
    return self.view.shape

  def __repr__(self):
    return f"Ref({self.buf!r} view{list(self.view.shape)})"


def root_ref(buf):
  # (a tiled allocation's refs start at its tiled layout where they undo it)
  return Ref(buf, buf.data, raw_tiled=buf.tiling is not None and jx.SCRATCH_REFS_UNDO_TILING)


def _as_int(x):
  return int(x)


def _scalar_index(ix, bufname):
  a = np.asarray(ix)
  if a.ndim:
    raise UnsupportedPrimitiveError(
        f"array (gather) indexing of ref {bufname} is not modelled")
  return int(a)


def _index(view, indexer, bufname):
  return _index_axes(view, [(ix.start, ix.size, ix.stride) if isinstance(ix, SLICES)
                            else (ix, None, None) for ix in indexer.indices], bufname)


def _index_axes(view, axes, bufname):
  """view indexed by axes: per axis (start, size, stride) of a slice, or
  (index, None, None)."""
  shape = view.shape
  idx = []
  for d, ((ix, size, stride), dim) in enumerate(zip(axes, shape)):
    if size is not None:
      start, size, stride = _as_int(ix), int(size), int(stride)
      last = start + (size - 1) * stride if size else start
      if start < 0 or (size and last >= dim):
        raise OutOfBoundsError(
            f"index {start}:{start + size * stride}"
            f"{'' if stride == 1 else ':' + str(stride)} on axis {d} is out of "
            f"bounds for ref {bufname} of shape {tuple(shape)}")
      idx.append(slice(start, start + size * stride, stride))
    else:
      i = _scalar_index(ix, bufname)
      if not 0 <= i < dim:
        raise OutOfBoundsError(
            f"index {i} on axis {d} is out of bounds for ref {bufname} of "
            f"shape {tuple(shape)}")
      idx.append(i)
  # The Ellipsis keeps an all-integer index a 0-d view into the buffer
  # (plain integer indexing would return a detached scalar).
  return view[tuple(idx) + (Ellipsis,)]


def apply(ref, transforms, wg=None):
  """Applies a sequence of JAX ref transforms to `ref`; returns a new Ref.
  `wg`: the accessing warpgroup, where a transform needs to know whose it
  is (plgpu.cluster_ref: a cluster peer's SMEM)."""
  view = ref.view
  raw = ref.raw_tiled
  buf = ref.buf
  layout = ref.layout
  for i, tr in enumerate(transforms):
    # (the common cases first: indexers by exact type, then untiling and
    # unswizzling, before the isinstance checks that go through Protocols)
    if type(tr) in _PLAIN_INDEXERS and not raw:
      view = _index(view, tr, buf.name)
      continue
    if isinstance(tr, jx.gpu_core.UntilingTransform):
      if not raw:
        raise UnsupportedPrimitiveError(
            f"untiling a ref of {buf.name} that is not tiled")
      raw = False
      continue
    if isinstance(tr, jx.gpu_core.UnswizzleRef):
      continue
    if isinstance(tr, jx.gpu_core.ClusterRefTransform) and wg is not None and not raw:
      r = _cluster_peer(Ref(buf, view), tr, wg)
      buf, view = r.buf, r.view
      continue
    if isinstance(tr, jx.gpu_core.ExtractAliasedRef):
      buf, view, layout = _aliased(buf, view, tr, transforms[i + 1:])
      raw = any(isinstance(t, jx.gpu_core.UntilingTransform) for t in transforms[i + 1:])
      continue
    if raw:
      raise UnsupportedPrimitiveError(
          f"transform {type(tr).__name__} on the raw tiled layout of "
          f"{buf.name}: only access through the untiled ref is modelled")
    if isinstance(tr, INDEXERS):
      view = _index(view, tr, buf.name)
    elif isinstance(tr, jx.state_types.TransposeTransform):
      view = view.transpose(tr.permutation)
    elif isinstance(tr, jx.state_types.ReshapeTransform):
      v = view.view()
      try:
        v.shape = tr.shape
      except AttributeError:
        raise UnsupportedPrimitiveError(
            f"reshape of a non-contiguous view of {buf.name} to {tr.shape}")
      view = v
    elif isinstance(tr, jx.state_types.BitcastTransform):
      view = view.view(tr.dtype)
    else:
      raise UnsupportedPrimitiveError(
          f"ref transform {type(tr).__name__} is not modelled (transforms: "
          f"{', '.join(type(t).__name__ for t in transforms)})")
  return Ref(buf, view, raw, layout)


def _aliased(buf, view, tr, rest):
  """A RefUnion member: the union's bytes at the member's offset, viewed as
  its elements in logical order (the untiled shape where `rest` untiles it),
  and its Layout."""
  if view.dtype != np.int8 or view.ndim != 1 or view.size != buf.data.size:
    raise UnsupportedPrimitiveError(
        f"ExtractAliasedRef of {buf.name}: only the whole union is modelled")
  tiling, swizzle = tiling_of(rest)
  shape = logical_shape(tuple(tr.shape), rest)
  if tiling is None and swizzle is None:  # (the allocation's, from jax 0.12.1)
    tiling, swizzle = (buf.members or {}).get(tr, (None, None))
  dtype = np.dtype(tr.dtype)
  bits = jx.dtypes.itemsize_bits(tr.dtype)
  if bits not in (4, 8 * dtype.itemsize):
    raise UnsupportedPrimitiveError(
        f"aliased ref of {buf.name} with sub-byte dtype {tr.dtype}: not modelled")
  nbytes = (math.prod(shape) * bits + 7) // 8
  if tr.offset + nbytes > view.size:
    raise OutOfBoundsError(f"aliased ref of {buf.name}: bytes {tr.offset}.."
                           f"{tr.offset + nbytes} past its {view.size}")
  layout = aliasing.layout_for(buf, dtype, shape, tiling, swizzle)
  if bits == 4:  # (two to a byte: a buffer of its own, aliasing.nibble_member)
    member = aliasing.nibble_member(buf, tr.offset, dtype, shape, layout)
    return member, member.data, None
  member = view[tr.offset:tr.offset + nbytes].view(dtype).reshape(shape)
  return buf, member, layout


def _cluster_peer(ref, tr, wg):
  """`ref`'s elements in the cluster peer that `tr` (plgpu.cluster_ref)
  names: this block's cluster coordinates with those of `tr.dims` replaced."""
  from pallas_sim.backends.sim.interpret.rules.refs import peer_ref
  peer = cluster_peer(wg, tr.dims, tr.idxs, "cluster_ref")
  return ref if peer is wg.block else peer_ref(peer, ref)


def cluster_peer(wg, dims, idxs, what):
  """The block of wg's cluster whose coordinates are wg's block's with
  those along the cluster axes `dims` replaced by `idxs`."""
  blk = wg.block
  group = blk.group
  coords = list(blk.cluster)
  for name, i in zip(dims, idxs):
    if name not in group.cluster_axes:
      raise KernelError(f"{what}: {name!r} is not a cluster axis of this kernel "
                        f"({sorted(group.cluster_axes)})")
    d, size = group.cluster_axes[name]
    i = _as_int(i)
    if not 0 <= i < size:
      raise OutOfBoundsError(f"{what}: index {i} along cluster axis {name!r} "
                             f"of size {size}")
    coords[d] = i
  return group.by_cluster[tuple(coords)]


def unflatten(treedef, leaves):
  """Transforms from a primitive's treedef param and its flat operands."""
  if treedef is None:
    return ()
  return tree_util.tree_unflatten(treedef, list(leaves))


class FastSlice:
  """An indexer's slice with its dynamic start filled in (the fields of a
  jax Slice, without its pytree and validation machinery)."""
  __slots__ = ("start", "size", "stride")

  def __init__(self, start, size, stride):
    self.start, self.size, self.stride = start, size, stride


class FastIndexer:
  """An NDIndexer of a compiled transform chain, its leaves filled in."""
  __slots__ = ("indices",)

  def __init__(self, indices):
    self.indices = indices


SLICES = (jx.indexing.Slice, FastSlice)
INDEXERS = (jx.indexing.NDIndexer, FastIndexer)
_PLAIN_INDEXERS = frozenset(INDEXERS)


def _template(treedef):
  """The transform chain of a treedef with dynamic leaves, decoded once:
  (a function leaves -> transforms that fills the indexers' dynamic starts
  and indices in without rebuilding JAX's indexer objects (their
  unflattening and validation were most of a TMA copy's cost), the chain's
  index plans where it is indexers alone, else None), or None where the
  chain is not plain indexers over static transforms."""
  marks = [np.array(0, np.int32) for _ in range(treedef.num_leaves)]
  pos = {id(m): i for i, m in enumerate(marks)}
  try:
    trs = unflatten(treedef, marks)
  except Exception:
    return None
  parts, used = [], set()
  for tr in trs:
    if not isinstance(tr, jx.indexing.NDIndexer):
      if any(id(x) in pos for x in tree_util.tree_leaves(tr)):
        return None
      parts.append(tr)
      continue
    if tr.int_indexer_shape != ():
      return None
    axes: list[tuple[int | None, Any, int | None, int | None]] = []
    for ix in tr.indices:
      if isinstance(ix, jx.indexing.Slice):
        if not isinstance(ix.size, int) or not isinstance(ix.stride, int):
          return None
        start = pos.get(id(ix.start))
        if start is None and not isinstance(ix.start, (int, np.integer)):
          return None
        used.add(start)
        axes.append((start, ix.start, ix.size, ix.stride))
      else:
        i = pos.get(id(ix))
        if i is None and not isinstance(ix, (int, np.integer)):
          return None
        used.add(i)
        axes.append((i, ix, None, None))
    parts.append(tuple(axes))
  if used - {None} != set(range(len(marks))):
    return None

  def fill(leaves):
    out = []
    for part in parts:
      if type(part) is not tuple:
        out.append(part)
        continue
      idx = []
      for i, static, size, stride in part:
        v = static if i is None else leaves[i]
        idx.append(v if size is None else FastSlice(v, size, stride))
      out.append(FastIndexer(idx))
    return out
  # (a chain of indexers alone: compile_transforms indexes straight from it)
  return fill, (parts if all(type(p) is tuple for p in parts) else None)


def index_plans(treedef):
  """A transform chain with dynamic leaves as plain indexers only: per
  indexer, per axis (leaf position or None, static index or start, slice
  size or None for an integer index, stride); None where the chain is
  anything else (or has no dynamic leaves)."""
  if treedef is None or not treedef.num_leaves:
    return None
  template = _template(treedef)
  return None if template is None else template[1]


def refuse_unmodelled(treedef):
  """Raises, when the kernel is compiled, for transforms the simulator does
  not model: im2col_ref's window gather (a TMA load in im2col mode)."""
  if jx.Im2ColTransform is None or treedef is None:
    return
  try:
    trs = unflatten(treedef, [None] * treedef.num_leaves)
  except Exception:  # (a transform that needs its leaves: none of these)
    return
  if any(isinstance(t, jx.Im2ColTransform) for t in trs):
    raise UnsupportedPrimitiveError(
        "plgpu.im2col_ref is not modelled: a TMA load in im2col mode gathers "
        "windows of the padded input, which the simulator's TMA does not do "
        "(and the lowering accepts only under Lane lowering semantics); load "
        "the windows with plain TMA copies of the input instead")


def compile_transforms(treedef):
  """Decodes a primitive's transform treedef once: returns f(ref, leaves) -> Ref.
  Static transforms (no dynamic leaves) are unflattened here, not per call;
  dynamic ones through _template where it can."""
  refuse_unmodelled(treedef)
  if treedef is None:
    return lambda ref, leaves, wg=None: ref
  if treedef.num_leaves == 0:
    trs = unflatten(treedef, [])
    if not trs:
      return lambda ref, leaves, wg=None: ref
    return lambda ref, leaves, wg=None: apply(ref, trs, wg)
  template = _template(treedef)
  if template is None:
    return lambda ref, leaves, wg=None: apply(ref, unflatten(treedef, leaves), wg)
  fill, plans = template
  if plans is None:
    return lambda ref, leaves, wg=None: apply(ref, fill(leaves), wg)

  def direct(ref, leaves, wg=None):
    if ref.raw_tiled:  # (apply says why that is not modelled)
      return apply(ref, fill(leaves), wg)
    view, name = ref.view, ref.buf.name
    for plan in plans:
      view = _index_axes(view, [(static if i is None else leaves[i], size, stride)
                                for i, static, size, stride in plan], name)
    return Ref(ref.buf, view, False, ref.layout)
  return direct


def compile_clipped(treedef):
  """compile_transforms for apply_clipped: f(ref, leaves) -> (Ref, box shape,
  in-bounds slices or None)."""
  refuse_unmodelled(treedef)
  if treedef is None:
    return lambda ref, leaves: (ref, ref.view.shape, None)
  if treedef.num_leaves == 0:
    trs = unflatten(treedef, [])
    return lambda ref, leaves: apply_clipped(ref, trs)
  template = _template(treedef)
  if template is not None:
    fill = template[0]
    return lambda ref, leaves: apply_clipped(ref, fill(leaves))
  return lambda ref, leaves: apply_clipped(ref, unflatten(treedef, leaves))


def num_leaves(treedef):
  return 0 if treedef is None else treedef.num_leaves


def barrier_of(ref, what):
  """The single mbarrier a (transformed) barrier ref names."""
  v = ref.view
  if isinstance(v, np.ndarray):
    if v.dtype != object:
      raise KernelError(f"{what}: {ref.buf.name} is not a barrier ref")
    if v.size != 1:  # (a slice of one barrier names it, as in the lowering)
      raise KernelError(f"{what}: barrier ref {ref.buf.name} of shape "
                        f"{v.shape} must be indexed down to one barrier")
    return v.reshape(())[()]
  return v


def static_ref(aval, treedef, name="ref", given=None):
  """The Ref a primitive would see, from avals alone (before anything runs):
  a buffer of the right logical shape and strides but no memory, dynamic
  indices taken as 0. For static checks of shapes and layouts; None where it
  cannot be built (then the checks run when the primitive does). `given`:
  the layout (tiling, swizzle, a union's members') of the allocation the ref
  names, where its transforms do not say (analysis/given_layouts.py)."""
  inner = getattr(aval, "inner_aval", None)
  if inner is None or not hasattr(inner.dtype, "itemsize"):
    return None
  space = str(getattr(aval, "memory_space", None))
  if space not in memory.SPACES:
    return None
  try:
    trs = unflatten(treedef, [0] * num_leaves(treedef))
    tiling, swizzle = tiling_of(trs)
    shape = logical_shape(tuple(inner.shape), trs)
    if tiling is None and swizzle is None and given is not None:
      tiling, swizzle, _ = given
    dtype = np.dtype(inner.dtype)
    strides = [dtype.itemsize] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
      strides[d] = strides[d + 1] * shape[d + 1]
    data = np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, strides,
                                           writeable=False)
    buf = memory.Buffer(name, space, data, tiling, swizzle)
    if given is not None:
      buf.members = given[2]
    return apply(root_ref(buf), trs)
  except Exception:  # an exotic ref: checked at run time instead
    return None


def apply_clipped(ref, transforms):
  """`apply` for the GMEM side of a TMA copy, whose box may reach past the
  array's ends (TMA clips it: loads fill the rest, stores drop it). Returns
  (Ref of the in-bounds part, the box's shape, the box's in-bounds slices),
  the slices None where the box is in bounds. Indexers only are clipped; a
  ref with other transforms must stay in bounds."""
  # (exact types first, as in apply: NDIndexer's isinstance goes through
  # typing's Protocol check, ~1.5 us a call)
  if not all(type(tr) in _PLAIN_INDEXERS or isinstance(tr, INDEXERS) for tr in transforms):
    r = apply(ref, transforms)
    return r, r.view.shape, None
  view = ref.view
  box = [(n, 0, n) for n in view.shape]  # per axis: size, in-bounds [lo, hi)
  for tr in transforms:
    view, box = _index_clipped(view, box, tr, ref.buf.name)
  shape = tuple(n for n, _, _ in box)
  if all(lo == 0 and hi == n for n, lo, hi in box):
    return Ref(ref.buf, view), shape, None
  return Ref(ref.buf, view), shape, tuple(slice(lo, hi) for _, lo, hi in box)


def _index_clipped(view, box, indexer, bufname):
  idx, out = [], []
  empty = False
  for d, (ix, (n, lo, hi)) in enumerate(zip(indexer.indices, box)):
    if isinstance(ix, SLICES):
      start, size, stride = _as_int(ix.start), int(ix.size), int(ix.stride)
      if stride != 1:
        last = start + (size - 1) * stride if size else start
        if start < lo or last >= hi:
          raise UnsupportedPrimitiveError(
              f"a strided TMA box past the ends of {bufname} is not modelled")
        idx.append(slice(start - lo, start - lo + size * stride, stride))
        out.append((size, 0, size))
        continue
      new_lo = min(max(lo - start, 0), size)
      new_hi = min(max(hi - start, 0), size)
      new_hi = max(new_hi, new_lo)
      a = start + new_lo - lo
      idx.append(slice(a, a + new_hi - new_lo))
      out.append((size, new_lo, new_hi))
    else:
      i = _scalar_index(ix, bufname)
      if lo <= i < hi:
        idx.append(i - lo)
      else:
        empty = True
        idx.append(slice(0, 0))
  for n, lo, hi in box[len(indexer.indices):]:
    out.append((n, lo, hi))
  view = view[tuple(idx) + (Ellipsis,)]
  if empty:  # an integer index off the array: nothing of the box is in bounds
    view = np.empty((0,) * len(out), view.dtype)
    out = [(n, 0, 0) for n, _, _ in out]
  return view, out
