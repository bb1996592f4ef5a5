"""`plgpu.inline_mgpu`: Mosaic GPU code inside a Pallas kernel.

The body is Python that builds MLIR. The simulator builds it once per kernel
and argument shapes, the way the lowering does, but in a function of its own
whose arguments are staging buffers: array arguments enter as memrefs loaded
into FragmentedArrays of the declared layouts (`load_untiled`, by the same
code the GPU runs, so each lane holds the registers it holds there), and
results leave through `store_untiled`. mlir/evaluator.py then evaluates
that IR for the lanes that run it (a warpgroup, or one warp inside
`warp_map`).

Refs are staged in the byte order they have on the GPU (SMEM tiled and
swizzled as the ref type's transforms say) and copied back where the body
wrote. For race detection and the uninitialized-memory check the body reads
(and writes) the bounding box of the elements it read (wrote), at the
primitive's place in the thread's program.

The launch context (`ctx`) offers `async_copy` between SMEM and GMEM
(completed when issued: the body's own `await_async_copy` has nothing to
wait for) and `named_region`; anything else of it is rejected by name.

Named barriers and async-proxy fences at the body's top level end a segment
of it (mlir/evaluator.py): what the segment read and wrote is recorded and
copied back, then the barrier is carried out by machine/named_barriers.py
(a bar.sync may wait for other warpgroups here) and the fence as
commit_smem's fence (checks/observer.py); refs are staged again after a
sync, since other threads ran meanwhile. A fence is cumulative: it orders
the generic-proxy accesses its thread knows of (its own, and those released
to it) before the async-proxy work it issues next, on either side of a
hand-off, as the PTX memory model's proxy-preserved causality order allows.
"""
import contextlib
import functools
import math
from typing import Any

import numpy as np
from jax import tree_util
import jax.experimental.mosaic.gpu as mgpu

from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.interpret.compiler import Gen, rule
from pallas_sim.backends.sim.mlir import evaluator as mlir_eval
from pallas_sim.backends.sim.machine import named_barriers
from pallas_sim.backends.sim.machine.state import Warp
from pallas_sim.errors import KernelError, UnsupportedPrimitiveError
from pallas_sim.backends.sim.base import jax_internals as jx

ir, arith, func, memref = jx.ir, jx.arith, jx.func, jx.memref

_PRIM = "inline_mgpu"
_WORKGROUP = "#gpu.address_space<workgroup>"


def _ir_type(dtype):
  return mgpu.utils.dtype_to_ir_type(np.dtype(dtype))


def _physical(tr):
  """(tiling, swizzle) that a RefType's transforms name."""
  tiling, swizzle = None, None
  for t in tr:
    if isinstance(t, jx.gpu_core.TilingTransform):
      tiling = tuple(t.tiling)
    elif isinstance(t, jx.gpu_core.SwizzleTransform):
      swizzle = t.swizzle
    else:
      raise UnsupportedPrimitiveError(
          f"inline_mgpu: a ref transform {type(t).__name__} in the ref's type")
  return tiling, swizzle


def tiled_shape(shape, tiling):
  if tiling is None:
    return tuple(shape)
  n = len(tiling)
  lead, minor = shape[:len(shape) - n], shape[len(shape) - n:]
  if any(d % t for d, t in zip(minor, tiling)):
    raise KernelError(f"inline_mgpu: a ref of shape {tuple(shape)} does not tile "
                      f"by {tiling}")
  return (*lead, *(d // t for d, t in zip(minor, tiling)), *tiling)


def _tile(a, tiling):
  """Array `a` with its minor dims split by `tiling` into tiles: (..., M, N)
  -> (..., M/tm, N/tn, tm, tn), tiles in row-major order (a view where it
  can be)."""
  n = len(tiling)
  lead = a.shape[:a.ndim - n]
  split = list(lead)
  for d, t in zip(a.shape[a.ndim - n:], tiling):
    split += [d // t, t]
  k = len(lead)
  return a.reshape(split).transpose(
      list(range(k)) + [k + 2 * i for i in range(n)] + [k + 2 * i + 1 for i in range(n)])


def _swizzle(b, swizzle):
  """Byte offsets (from a 1024-byte-aligned base) moved by the swizzle: each
  16-byte chunk's index XOR the 128-byte row's index, modulo swizzle/16."""
  if swizzle is None or swizzle == 16:
    return b
  return b ^ (((b // 128) % (swizzle // 16)) * 16)


@functools.lru_cache(maxsize=64)
def physical_order(shape, itemsize, tiling, swizzle):
  """For each logical element (row-major), its element offset in the
  physical buffer: tiles in row-major order, then swizzled, as
  FragmentedArray's tiled loads and TMA place them. (Cached: read-only.)"""
  idx = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
  if tiling is not None:
    idx = _tile(idx, tiling)
  at = np.empty(idx.size, np.int64)
  at[idx.reshape(-1)] = np.arange(idx.size)  # logical -> physical (element)
  at = _swizzle(at * itemsize, swizzle) // itemsize
  at.flags.writeable = False
  return at


class _Marker:
  """The launch context the body gets: what it asks of it becomes a marker
  op in the IR, which the evaluator hands back to `_marker`."""

  def __init__(self, table):
    self._table = table

  def _emit(self, kind, values, **kw):
    i32 = ir.IntegerType.get_signless(32)
    ir.Operation.create(
        "pallas_sim.marker", operands=list(values),
        attributes={"index": ir.IntegerAttr.get(i32, len(self._table))})
    self._table.append((kind, kw))

  def async_copy(self, *, src_ref, dst_ref, gmem_slice=(), gmem_transform=(),
                 swizzle=None, barrier=None, arrive=None, **kw):
    bad = [k for k, v in kw.items() if v not in (None, False, ())]
    bad += ["barrier"] * (barrier is not None) + ["arrive"] * bool(arrive)
    if bad:
      raise UnsupportedPrimitiveError(
          f"inline_mgpu: ctx.async_copy with {', '.join(bad)} (copies complete "
          "when issued here: barriers and other options are not modelled)")
    if not isinstance(gmem_transform, tuple):
      gmem_transform = (gmem_transform,)
    self._emit("async_copy", (src_ref, dst_ref), gmem_slice=gmem_slice,
               gmem_transform=gmem_transform, swizzle=swizzle)

  def await_async_copy(self, allow_groups, await_read_only=False, **kw):
    pass  # (copies complete when issued)

  @contextlib.contextmanager
  def named_region(self, *args, **kwargs):
    yield

  def __getattr__(self, name):
    raise UnsupportedPrimitiveError(
        f"inline_mgpu: the launch context's {name!r} is not modelled")


class _Built:
  __slots__ = ("prog", "markers", "kinds")
  prog: mlir_eval.Program
  markers: list[tuple[str, dict[str, Any]]]  # (kind, keywords) per marker op
  kinds: list[tuple[Any, ...]]               # the arguments' kinds (_build)


def _build(eqn, kinds, warp):
  """The body's IR, for arguments of `kinds`: ("array", shape, dtype,
  layout) or ("ref", phys_shape, dtype, space)."""
  p = eqn.params
  mgpu_fn = p["mgpu_fn"]
  ret_ty = p["flat_ret_ty"]
  ctx = jx.mlir.make_ir_context()
  mgpu.dialect.register_dialect(ctx)
  ctx.allow_unregistered_dialects = True
  markers: list[tuple[str, dict[str, Any]]] = []
  with ctx, ir.Location.unknown():
    module = ir.Module.create()
    i32 = ir.IntegerType.get_signless(32)
    module.operation.attributes["mosaic_gpu.arch_major"] = ir.IntegerAttr.get(i32, 9)
    module.operation.attributes["mosaic_gpu.arch_minor"] = ir.IntegerAttr.get(i32, 0)
    smem = ir.Attribute.parse(_WORKGROUP)
    types = []
    for k in kinds:
      if k[0] == "array":
        types.append(ir.MemRefType.get(k[1], _ir_type(k[2])))
      else:
        types.append(ir.MemRefType.get(k[1], _ir_type(k[2]),
                                       memory_space=smem if k[3] == "smem" else None))
    for r in ret_ty:
      types.append(ir.MemRefType.get(r.shape, _ir_type(r.dtype)))
    with ir.InsertionPoint(module.body):
      fn = func.FuncOp("body", (types, []))
      block = fn.add_entry_block()
    with ir.InsertionPoint(block):
      args = list(block.arguments)
      inputs = []
      for k, a in zip(kinds, args):
        inputs.append(_as_fragmented(k, a) if k[0] == "array" else a)
      ret = mgpu_fn(_Marker(markers), *tree_util.tree_unflatten(p["pytree_args"], inputs))
      leaves = tree_util.tree_leaves(ret, is_leaf=lambda x: isinstance(x, mgpu.FragmentedArray))
      if len(leaves) != len(ret_ty):
        raise KernelError(f"inline_mgpu: the body returned {len(leaves)} arrays, "
                          f"its return_type names {len(ret_ty)}")
      for fa, r, out in zip(leaves, ret_ty, args[len(kinds):]):
        if not isinstance(fa, mgpu.FragmentedArray) or tuple(fa.shape) != tuple(r.shape):
          raise KernelError(f"inline_mgpu: the body returned {fa}, its return_type "
                            f"says {r.shape} {r.dtype}")
        if warp and r.shape:
          raise KernelError(
              "inline_mgpu in a single-warp context only supports scalar return "
              f"types. Got shape={tuple(r.shape)}.")
        _store(fa, out)
      func.ReturnOp([])
    built = _Built()
    built.prog = mlir_eval.compile_block(block)
    built.markers = markers
    built.kinds = kinds
  return built


def _as_fragmented(kind, ref):
  _, shape, dtype, layout = kind
  signed = mgpu.utils.is_signed(np.dtype(dtype))
  lay = layout.to_mgpu() if layout is not None else mgpu.WGSplatFragLayout(shape)
  if not shape or isinstance(lay, mgpu.WGSplatFragLayout):
    # (jaxlib's arith.py redefines constant(result, value) over the generated
    # constant(result, value_attr...): mypy keeps the generated one)
    c0 = arith.constant(ir.IndexType.get(), 0)  # type: ignore[call-arg, arg-type]
    v = memref.load(ref, [c0] * len(shape))
    return mgpu.FragmentedArray.splat(v, tuple(shape), lay, is_signed=signed) if shape \
        else mgpu.FragmentedArray.splat(v, (), is_signed=signed)
  if isinstance(lay, mgpu.WGStridedFragLayout):
    return mgpu.FragmentedArray.load_strided(ref, is_signed=signed, vec_size=lay.vec_size)
  return mgpu.FragmentedArray.load_untiled(ref, layout=lay, is_signed=signed,
                                           optimized=False)


def _store(fa, out):
  if isinstance(fa.layout, mgpu.WGSplatFragLayout):
    # (jaxlib's arith.py redefines constant(result, value) over the generated
    # constant(result, value_attr...): mypy keeps the generated one)
    c0 = arith.constant(ir.IndexType.get(), 0)  # type: ignore[call-arg, arg-type]
    memref.store(fa.registers.flat[0], out, [c0] * len(fa.shape))
  else:
    fa.store_untiled(out, optimized=False)


def cuda_place(launch, axes):
  """(block_id, grid_dim, cluster_block_id, cluster_dims) of a block in the
  CUDA grid the lowering launches: the Pallas grid (its leading axes folded
  into one past three) reversed, so that its last axis is x, each axis
  scaled by the cluster's size along it."""
  grid = tuple(launch.grid)
  g = [axes[("grid", d)][0] for d in range(len(grid))]
  c = [axes[n][0] for n in launch.cluster_names]
  cl = (1,) * (3 - len(launch.cluster)) + tuple(launch.cluster)
  ci = (0,) * (3 - len(c)) + tuple(c)
  if len(grid) <= 3:
    pg = (1,) * (3 - len(grid)) + grid
    pi = (0,) * (3 - len(grid)) + tuple(g)
  else:
    pg = (math.prod(grid[:-2]), *grid[-2:])
    pi = (int(np.ravel_multi_index(g[:-2], grid[:-2])), *g[-2:])
  pg, pi, cl, ci = pg[::-1], pi[::-1], cl[::-1], ci[::-1]
  return (tuple(i * k + j for i, k, j in zip(pi, cl, ci)),
          tuple(n * k for n, k in zip(pg, cl)), ci, cl)


def _memref(off, shape, dtype, space):
  strides = [0] * len(shape)
  st = 1
  for d in reversed(range(len(shape))):
    strides[d] = st
    st *= shape[d]
  return mlir_eval.MemRef(mlir_eval.ARENA_BASE + off, np.int64(0), shape, strides,
                          np.dtype(dtype), space)


def _marker(entry, values, arena):
  kind, kw = entry
  if kind == "async_copy":
    _async_copy(arena, *values, **kw)


def _addresses(m):
  """The byte address of each element of memref m (an array of its shape)."""
  idx = np.indices(m.shape).reshape(len(m.shape), -1)
  return np.broadcast_to(m.addresses(list(idx)), (idx.shape[1],)).reshape(m.shape)


def _gmem_view(addr, gmem_slice, transforms):
  """GMEM element addresses sliced by `gmem_slice` and transformed into the
  SMEM ref's shape (tiling, transposition), as a TMA copy maps them."""
  sl: list[int | np.integer | slice] = []
  for s in (gmem_slice if isinstance(gmem_slice, tuple) else (gmem_slice,)):
    if isinstance(s, mgpu.DynamicSlice):
      if not isinstance(s.base, (int, np.integer)):
        raise UnsupportedPrimitiveError(
            "inline_mgpu: ctx.async_copy with a gmem_slice at a dynamic offset")
      sl.append(slice(int(s.base), int(s.base) + s.length))
    elif isinstance(s, (int, np.integer, slice)):
      sl.append(s)
    else:
      raise UnsupportedPrimitiveError(f"inline_mgpu: ctx.async_copy with gmem_slice {s!r}")
  addr = addr[tuple(sl)]
  for t in transforms:
    if isinstance(t, mgpu.TileTransform):
      addr = _tile(addr, t.tiling)
    elif isinstance(t, mgpu.TransposeTransform):
      addr = addr.transpose(t.permutation)
    else:
      raise UnsupportedPrimitiveError(
          f"inline_mgpu: ctx.async_copy with the GMEM transform {type(t).__name__}")
  return addr


def _async_copy(arena, src, dst, *, gmem_slice, gmem_transform, swizzle):
  """A TMA copy between an SMEM memref (its bytes swizzled) and a GMEM one,
  completed at once."""
  to_gmem = src.space == "smem"
  sm, gm = (src, dst) if to_gmem else (dst, src)
  if sm.space != "smem" or gm.space == "smem":
    raise KernelError("inline_mgpu: ctx.async_copy copies between SMEM and GMEM")
  s_addr = mlir_eval.ARENA_BASE + _swizzle(_addresses(sm) - mlir_eval.ARENA_BASE, swizzle)
  g_addr = _gmem_view(_addresses(gm), gmem_slice, gmem_transform)
  if g_addr.shape != s_addr.shape:
    raise KernelError(f"inline_mgpu: ctx.async_copy between SMEM of shape "
                      f"{sm.shape} and GMEM of shape {g_addr.shape}")
  a, b = (s_addr, g_addr) if to_gmem else (g_addr, s_addr)
  arena.store(b.reshape(-1), arena.load(a.reshape(-1), sm.dtype), sm.dtype)


def _bbox_ref(r, touched):
  """The sub-ref of r covering the logical elements `touched` (a bool array
  of r's shape), or None."""
  if not touched.any():
    return None
  if touched.ndim == 0:
    return r
  sl = []
  for d in range(touched.ndim):
    ax = tuple(i for i in range(touched.ndim) if i != d)
    hit = np.nonzero(touched.any(axis=ax))[0]
    sl.append(slice(int(hit[0]), int(hit[-1]) + 1))
  return refview.Ref(r.buf, r.view[tuple(sl)], layout=r.layout)


@rule("inline_mgpu")
def _inline_mgpu(eqn, cx):
  p = eqn.params
  arg_types = p["flat_arg_types"]
  n_args = p["pytree_args"].num_leaves
  tr_tree = p["pytree_ref_transforms"]
  ret_ty = p["flat_ret_ty"]
  where = cx.where(eqn)
  launch = cx.launch
  latency = cx.timing.barrier_latency
  cache: dict[tuple[tuple[tuple[Any, ...], ...], bool], _Built] = {}

  def inline_mgpu(wg, *operands):
    args = operands[:n_args]
    trs = tree_util.tree_unflatten(tr_tree, operands[n_args:])
    warp = isinstance(wg, Warp)
    kinds, staged = [], []
    for a, t, tr in zip(args, arg_types, trs):
      if isinstance(t, jx.gpu_primitives.RefType):
        r = refview.apply(a, tr or (), wg)
        view = r.view
        space = "smem" if r.buf.space == "smem" else "gmem"
        tiling, swizzle = _physical(t.transforms) if space == "smem" \
            else (None, None)
        order = physical_order(view.shape, view.dtype.itemsize, tiling, swizzle)
        kinds.append(("ref", tiled_shape(view.shape, tiling), view.dtype, space))
        staged.append((r, order))
      else:
        x = np.asarray(a)
        if warp and x.shape:
          raise KernelError("inline_mgpu in a single-warp context only supports "
                            f"scalar arrays (and Refs). Got shape {x.shape}.")
        kinds.append(("array", x.shape, x.dtype, t))
        staged.append((x, None))
    key = (tuple(kinds), warp)
    built = cache.get(key)
    if built is None:
      built = cache[key] = _build(eqn, kinds, warp)
    return (yield from _run(wg, built, staged, warp))

  def _run(wg, built, staged, warp):
    # The buffers lie in an arena, each 1024-aligned (swizzling acts on
    # address bits); refs in their physical order.
    outs = [np.zeros(r.shape, r.dtype) for r in ret_ty]
    datas = [np.ascontiguousarray(obj).reshape(-1) if order is None
             else _physical_data(obj, order) for obj, order in staged]
    datas += [o.reshape(-1) for o in outs]
    offsets, total = [], 0
    for d in datas:
      offsets.append(total)
      total += -(-max(d.nbytes, 1) // 1024) * 1024
    arena = mlir_eval.Arena(total)
    refs = []
    for d, off, k in zip(datas, offsets, [*built.kinds, *(("out", o.shape) for o in outs)]):
      arena.data[off:off + d.nbytes] = d.view(np.uint8)
      refs.append(_memref(off, k[1], d.dtype, k[3] if k[0] == "ref" else "gmem"))
    block_id, grid_dim, cbid, cdim = cuda_place(launch, wg.axes)
    base = (wg.parent.index * 128 + wg.warp * 32) if warp else wg.index * 128
    lanes = mlir_eval.Lanes(
        tid=base + np.arange(32 if warp else 128), block_dim=(128 * launch.num_threads, 1, 1),
        block_id=block_id, grid_dim=grid_dim, cluster_block_id=cbid,
        cluster_dim_blocks=cdim, arena=arena,
        marker=lambda i, xs: _marker(built.markers[i], xs, arena))
    segments = mlir_eval.run_segments(built.prog, lanes, refs)
    while True:
      with np.errstate(all="ignore"):
        try:
          sync, bid, count = next(segments)
        except StopIteration:  # (results leave through the staged outputs)
          sync = None
      _record(wg, staged, offsets, arena)
      fences, lanes.fences = lanes.fences, []
      for f in fences:
        _fence(wg, f)
      if sync is None:
        break
      if sync.kind == "fence":
        _fence(wg, sync)
      elif sync.op == "arrive":
        named_barriers.arrive(wg, bid, count, where)
      else:
        yield from named_barriers.sync(wg, bid, count, where, latency)
        # (other threads ran meanwhile: the body reads the refs as they are now)
        for (obj, order), off in zip(staged, offsets):
          if order is not None:
            d = _physical_data(obj, order)
            arena.data[off:off + d.nbytes] = d.view(np.uint8)
    results = []
    for o, off, r in zip(outs, offsets[len(staged):], ret_ty):
      flat = arena.data[off:off + o.nbytes].view(o.dtype)
      v = flat.reshape(o.shape)
      if isinstance(r.layout.to_mgpu() if hasattr(r.layout, "to_mgpu") else None,
                    mgpu.WGSplatFragLayout) and o.shape:
        v = np.full(o.shape, flat[0], o.dtype)
      results.append(v.copy() if v.ndim else v[()])
    return results

  def _record(wg, staged, offsets, arena):
    """What the body read and wrote of its refs since the last segment, at
    the primitive's place; its writes copied back."""
    blk = wg.block
    for (obj, order), off in zip(staged, offsets):
      if order is None:
        continue
      r = obj
      view = r.view
      isz = view.dtype.itemsize
      nb = view.size * isz
      rd = arena.read[off:off + nb].reshape(-1, isz).any(1)[order].reshape(view.shape)
      wr = arena.written[off:off + nb].reshape(-1, isz).any(1)[order].reshape(view.shape)
      sub = _bbox_ref(r, rd)
      if sub is not None:
        blk.hb.plain(wg, sub, False, _PRIM, where)
        blk.group.read(sub, "thread", _PRIM, where, wg.index, blk)
      sub = _bbox_ref(r, wr)
      if sub is not None:
        blk.hb.plain(wg, sub, True, _PRIM, where)
        phys = arena.data[off:off + nb].view(view.dtype)
        vals = phys[order].reshape(view.shape)
        if view.ndim:
          view[wr] = vals[wr]
        else:
          view[...] = vals
        blk.group.wrote(sub)
    arena.read[:] = False
    arena.written[:] = False

  return Gen(inline_mgpu)


def _physical_data(ref, order):
  """A ref's elements in the order they have in memory on the GPU."""
  flat = np.ascontiguousarray(ref.view).reshape(-1)
  phys = np.empty_like(flat)
  phys[order] = flat
  return phys


def _fence(wg, sync):
  """An async-proxy fence: over SMEM (all state spaces, or shared::cta) it
  orders what commit_smem's fence orders; a fence of GMEM alone orders
  nothing the simulator tracks (TMA and plain GMEM accesses are one proxy
  here). Unlike commit_smem it has no warpgroup barrier."""
  if sync.op in ("async_shared", "async"):
    wg.block.hb.commit_smem(wg, barrier=False)
