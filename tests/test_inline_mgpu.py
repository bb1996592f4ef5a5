"""plgpu.inline_mgpu: Mosaic GPU code (FragmentedArrays, raw MLIR) inside a
kernel, built as the lowering builds it and evaluated lane by lane
(interpret/rules/inline_mgpu.py, mlir/evaluator.py). The kernels here also run on
the H200 in test_gpu.py."""
import math

import jax
import jax.numpy as jnp
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith as arith_dialect
from jax._src.lib.mlir.dialects import gpu as gpu_dialect
from jax._src.lib.mlir.dialects import memref as memref_dialect
import jax.experimental.mosaic.gpu as mgpu
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from conftest import store_unoptimized
from pallas_sim.backends.sim.interpret.rules.inline_mgpu import cuda_place, physical_order


def scaled_rows(x, s, layout=plgpu.Layout.WGMMA):
  """x * s[:, None] in bf16, the broadcast and product written in Mosaic GPU."""
  shape = x.shape

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, jnp.bfloat16))
  def k(x_ref, s_ref, o_ref):
    xv = plgpu.load(x_ref, layout=layout, optimized=False).astype(jnp.bfloat16)
    sv = plgpu.load(s_ref, layout=layout.reduce(1), optimized=False)

    @plgpu.inline_mgpu(arg_types=(layout, layout.reduce(1)),
                       return_type=plgpu.ShapeDtypeStruct(shape, jnp.bfloat16, layout=layout))
    def scale(ctx, x_fa, s_fa):
      return s_fa.broadcast_in_dim(shape, [0], layout=layout.to_mgpu()) * x_fa

    store_unoptimized(o_ref, scale(xv, sv))
  return k(x, s)


def twice_plus_one_swizzled(x):
  """x[0] + x[0] + 1 through a tiled, 128-byte-swizzled SMEM buffer: loaded
  with FragmentedArray.load_tiled (ldmatrix), stored with store_tiled
  (stmatrix) and copied out by the launch context's TMA copy."""
  dtype = x.dtype
  shape = x.shape[1:]
  tile = (64, 128 // dtype.itemsize)
  transforms = (plgpu.TilingTransform(tile), plgpu.SwizzleTransform(128))
  signed = mgpu.utils.is_signed(dtype)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, dtype),
                scratch_types=[plgpu.SMEM(x.shape, dtype, transforms=transforms),
                               plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(transforms),),
                       return_type=plgpu.ShapeDtypeStruct(shape, dtype,
                                                          layout=plgpu.Layout.WGMMA))
    def twice_plus_one(ctx, ref):
      v = mgpu.FragmentedArray.load_tiled(ref, swizzle=128, is_signed=signed)
      one = mgpu.FragmentedArray.splat(mgpu.c(1, v.mlir_dtype), shape=v.shape,
                                       layout=v.layout, is_signed=signed)
      return v + v + one

    @plgpu.inline_mgpu(arg_types=(plgpu.Layout.WGMMA, plgpu.RefType(transforms),
                                  plgpu.RefType()))
    def store(ctx, arr, ref, out):
      first = mgpu.memref_slice(ref, (0,))
      arr.store_tiled(first, swizzle=128)
      mgpu.commit_shared()
      ctx.async_copy(src_ref=first, dst_ref=out, swizzle=128,
                     gmem_transform=mgpu.TileTransform(tile))
      ctx.await_async_copy(0)

    store(twice_plus_one(smem.at[0]), smem, o_ref)
  return k(x)


def cuda_block_index(grid, cluster):
  """Each block's linear index in the CUDA grid the lowering launches,
  read with gpu.block_id / gpu.grid_dim."""
  names = tuple("abcd"[:len(grid)])
  cnames = tuple("xyz"[:len(cluster)])

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((*cluster, *grid, 128), jnp.int32),
                grid=grid, grid_names=names, cluster=cluster, cluster_names=cnames)
  def k(o_ref):
    @plgpu.inline_mgpu(return_type=plgpu.ShapeDtypeStruct((), jnp.int32,
                                                          layout=plgpu.Layout.WG_SPLAT))
    def linear(ctx):
      d = gpu_dialect.Dimension
      gx, gy = gpu_dialect.grid_dim(d.x), gpu_dialect.grid_dim(d.y)
      bx, by, bz = (gpu_dialect.block_id(d.x), gpu_dialect.block_id(d.y),
                    gpu_dialect.block_id(d.z))
      i = arith_dialect.addi(bx, arith_dialect.addi(
          arith_dialect.muli(by, gx), arith_dialect.muli(bz, arith_dialect.muli(gx, gy))))
      return mgpu.FragmentedArray.splat(
          arith_dialect.index_cast(ir.IntegerType.get_signless(32), i), (),
          is_signed=False)
    idx = [jax.lax.axis_index(a) for a in (*cnames, *names)]
    o_ref[*idx] = jnp.full((128,), linear())
  return k()


def warp_scalar():
  """Inside warp_map: warp 1 stores its id through a ref and returns id + 10."""
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct((), jnp.int32),
                          jax.ShapeDtypeStruct((), jnp.int32)))
  def k(y_ref, z_ref):
    @plgpu.warp_map
    def _(warp_id):
      @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.Layout.WG_SPLAT),
                         return_type=plgpu.ShapeDtypeStruct(
                             (), jnp.int32, layout=plgpu.Layout.WG_SPLAT))
      def write(ctx, ref, wid):
        memref_dialect.store(wid.registers.item(), ref, [])
        ten = mgpu.FragmentedArray.splat(
            mgpu.c(10, ir.IntegerType.get_signless(32)), (), is_signed=True)
        return wid + ten

      @pl.when(warp_id == 1)
      def _():
        z_ref[...] = write(y_ref, warp_id)
  return k()


def float_ops(x, y, z):
  """x*y + z (contracted, as the GPU's compiler does), (x + z) / y, x*y and
  z - x*y, computed on FragmentedArrays of the WGMMA layout."""
  shape, dtype = x.shape, x.dtype
  lay = plgpu.Layout.WGMMA
  out = jax.ShapeDtypeStruct(shape, dtype)

  @plgpu.kernel(out_type=(out,) * 4)
  def k(x_ref, y_ref, z_ref, o1, o2, o3, o4):
    xv, yv, zv = (plgpu.load(r, layout=lay, optimized=False) for r in (x_ref, y_ref, z_ref))
    ret = plgpu.ShapeDtypeStruct(shape, dtype, layout=lay)

    @plgpu.inline_mgpu(arg_types=(lay, lay, lay), return_type=(ret,) * 4)
    def ops(ctx, a, b, c):
      return a * b + c, (a + c) / b, a * b, c - a * b

    r = ops(xv, yv, zv)
    for o, v in zip((o1, o2, o3, o4), r):
      store_unoptimized(o, v)
  return k(x, y, z)


def _want_cuda_index(grid, cluster):
  """The CUDA linear index of each (cluster, grid) position, by the
  lowering's mapping: the grid scaled by the cluster, row-major."""
  pad = (1,) * (len(grid) - len(cluster)) + cluster
  scaled = tuple(g * c for g, c in zip(grid, pad))
  lin = np.arange(math.prod(scaled), dtype=np.int32).reshape(scaled)
  inter = tuple(v for p in zip(grid, pad) for v in p)
  perm = tuple(range(1, 2 * len(grid), 2)) + tuple(range(0, 2 * len(grid), 2))
  out = lin.reshape(inter).transpose(perm)
  out = out.reshape(cluster + grid) if cluster else out.reshape(grid)
  return np.broadcast_to(out[..., None], out.shape + (128,))


@pytest.mark.parametrize("layout", [plgpu.Layout.WGMMA, plgpu.Layout.WGMMA_UPCAST_2X,
                                    plgpu.Layout.WGMMA_UPCAST_4X])
def test_fragmented_array_arithmetic_and_broadcast_in_registers(rng, layout):
  x = rng.integers(-10, 10, (128, 128)).astype(np.int8)
  s = rng.uniform(-100, 100, 128).astype(jnp.bfloat16)
  got = ps.run(scaled_rows, x, s, layout, backend="sim")
  want = x.astype(jnp.bfloat16) * s[:, None]
  np.testing.assert_array_equal(np.asarray(got), want)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.int16, jnp.uint16])
def test_swizzled_smem_through_ldmatrix_stmatrix_and_a_tma_copy(rng, dtype):
  x = rng.uniform(-10, 10, (2, 128, 128)).astype(dtype)
  got = ps.run(twice_plus_one_swizzled, x, backend="sim")
  np.testing.assert_array_equal(np.asarray(got), x[0] + x[0] + np.asarray(1, dtype))


@pytest.mark.parametrize("grid,cluster", [((2, 3), ()), ((2, 3), (2,)),
                                          ((2, 3, 4), (2, 3)), ((2, 3, 4, 5), (2,))])
def test_block_ids_are_those_of_the_cuda_grid_the_lowering_launches(grid, cluster):
  got = ps.run(cuda_block_index, grid, cluster, backend="sim")
  np.testing.assert_array_equal(np.asarray(got), _want_cuda_index(grid, cluster))


def test_inside_a_warp_the_body_runs_on_that_warps_lanes():
  y, z = ps.run(warp_scalar, backend="sim")
  assert int(y) == 1 and int(z) == 11


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(dtype=st.sampled_from([np.float32, np.float16, jnp.bfloat16]),
                  seed=st.integers(0, 2**31 - 1))
def test_float_ops_round_once_products_contract_and_divide_as_the_gpu(dtype, seed):
  from pallas_sim.backends.sim.machine.numerics import division, rounding
  r = np.random.default_rng(seed)
  x, y, z = (r.uniform(-4, 4, (128, 128)).astype(dtype) for _ in range(3))
  got = [np.asarray(v) for v in ps.run(float_ops, x, y, z, backend="sim")]
  f = lambda a: np.asarray(a, np.float64)
  dt = np.dtype(dtype)
  want = [rounding.fma(f(x), f(y), f(z), dt),
          division.div_full(rounding.to_dtype(f(x) + f(z), dt).astype(np.float32),
                            y.astype(np.float32), dt),  # (the GPU's div.full.f32)
          rounding.to_dtype(f(x) * f(y), dt),
          rounding.fma(-f(x), f(y), f(z), dt)]
  for g, w, what in zip(got, want, ("x*y+z", "(x+z)/y", "x*y", "z-x*y")):
    np.testing.assert_array_equal(g.view(f"u{dt.itemsize}"), w.view(f"u{dt.itemsize}"), what)


def test_cuda_place_folds_leading_grid_axes_into_z():
  class L:
    grid, cluster, cluster_names = (2, 3, 4, 5), (2,), ("x",)
  axes = {("grid", 0): (1, 2), ("grid", 1): (2, 3), ("grid", 2): (3, 4),
          ("grid", 3): (4, 5), "x": (1, 2)}
  block_id, grid_dim, cbid, cdim = cuda_place(L, axes)
  assert grid_dim == (10, 4, 6) and cdim == (2, 1, 1)
  assert block_id == (4 * 2 + 1, 3, 1 * 3 + 2) and cbid == (1, 0, 0)


def test_physical_order_is_the_tma_swizzle():
  # 128-byte swizzle of a (8, 64) bf16 tile: row r's 16-byte chunk c lies at
  # chunk c ^ r of that row.
  order = physical_order((8, 64), 2, (8, 64), 128)
  r, c = np.indices((8, 64))
  chunk = c // 8
  assert np.array_equal(order.reshape(8, 64), r * 64 + ((chunk ^ r) * 8) + c % 8)
  # Tiling alone: (16, 16) in (8, 8) tiles, row-major over the tiles.
  order = physical_order((16, 16), 4, (8, 8), None).reshape(16, 16)
  assert order[8, 0] == 2 * 64 and order[0, 8] == 64 and order[9, 9] == 3 * 64 + 9


def test_two_threads_writing_one_output_through_inline_mgpu_race():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((), jnp.float32), num_threads=2,
                thread_name="t")
  def k(o_ref):
    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def write(ctx, ref):
      memref_dialect.store(mgpu.c(1.0, ir.F32Type.get()), ref, [])
    write(o_ref)
  with pytest.raises(ps.RaceError, match="inline_mgpu"):
    ps.run(k, backend="sim")


def test_reads_are_the_elements_the_body_read():
  # Only row 0 is written before the body reads it: reading row 0 is no
  # uninitialized read (the bounding box of what the body read is reported).
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((), jnp.float32),
                scratch_types=[plgpu.SMEM((2, 128), jnp.float32)])
  def k(o_ref, smem):
    smem[0] = jnp.full((128,), 3.0, jnp.float32)

    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(), plgpu.RefType()))
    def first(ctx, s, o):
      c0 = arith_dialect.constant(ir.IndexType.get(), 0)
      memref_dialect.store(memref_dialect.load(s, [c0, c0]), o, [])
    first(smem, o_ref)
  assert float(ps.run(k, backend="sim", on_uninitialized="raise")) == 3.0


def test_ir_the_evaluator_does_not_know_is_rejected_by_name_at_the_users_line():
  from jax.experimental.mosaic.gpu import utils as mgpu_utils

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((), jnp.int32))
  def k(o_ref):
    @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),))
    def clock(ctx, ref):
      t = mgpu_utils.inline_ptx("mov.u32 $0, %clock;",
                                result_types=ir.IntegerType.get_signless(32),
                                has_side_effects=True)
      memref_dialect.store(t, ref, [])
    clock(o_ref)
  with pytest.raises(ps.UnsupportedPrimitiveError, match="mov.u32") as e:
    ps.run(k, backend="sim")
  assert "test_inline_mgpu.py" in str(e.value)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=4, max_size=4),
                  st.integers(-2**31, 2**31 - 1).filter(lambda d: d != 0))
def test_evaluator_integer_ops_follow_arith_semantics(xs, d):
  # Signless integers: signed division truncates toward zero, remainders
  # take the dividend's sign, shifts are arithmetic or logical by op, and
  # index_cast / extsi sign-extend (an i1 true extends to -1).
  from jax._src.interpreters import mlir as jax_mlir
  from jax._src.lib.mlir.dialects import func
  from pallas_sim.backends.sim.mlir import evaluator as E
  with jax_mlir.make_ir_context(), ir.Location.unknown():
    m = ir.Module.create()
    i32, idx = ir.IntegerType.get_signless(32), ir.IndexType.get()
    with ir.InsertionPoint(m.body):
      blk = func.FuncOp("f", ([i32], [])).add_entry_block()
    with ir.InsertionPoint(blk):
      (a,) = blk.arguments
      c = arith_dialect.constant(i32, d)
      five = arith_dialect.constant(i32, 5)
      neg = arith_dialect.cmpi(arith_dialect.CmpIPredicate.slt, a, c)
      func.ReturnOp([arith_dialect.divsi(a, c), arith_dialect.remsi(a, c),
                     arith_dialect.divui(a, c), arith_dialect.shrsi(a, five),
                     arith_dialect.shrui(a, five), arith_dialect.index_cast(idx, a),
                     arith_dialect.extsi(i32, neg)])
    lanes = E.Lanes(np.arange(4), (128, 1, 1), (0, 0, 0), (1, 1, 1), (0, 0, 0),
                    (1, 1, 1), None)
    out = E.run(E.compile_block(blk), lanes, [np.array(xs, np.int64).astype(np.uint32)])
  s = lambda v: [int(x) for x in np.asarray(v).astype(np.uint32).view(np.int32)]
  ud = d & 0xFFFFFFFF
  trunc_div = lambda x: abs(x) // abs(d) * (1 if (x < 0) == (d < 0) else -1)
  assert s(out[0]) == [trunc_div(x) for x in xs]
  assert s(out[1]) == [x - trunc_div(x) * d for x in xs]
  assert [int(v) for v in np.asarray(out[2]).astype(np.uint32)] == [(x & 0xFFFFFFFF) // ud for x in xs]
  assert s(out[3]) == [x >> 5 for x in xs]
  assert [int(v) for v in np.asarray(out[4]).astype(np.uint32)] == [(x & 0xFFFFFFFF) >> 5 for x in xs]
  assert [int(v) for v in out[5]] == xs
  assert s(out[6]) == [-1 if x < d else 0 for x in xs]


def _evaluate(build, arg_types, args, lanes=128):
  """Builds a function body with `build(*block_args)` and evaluates it on
  `lanes` lanes over an arena holding the numpy arrays `args` (memref
  arguments, in order); returns the arrays after it ran."""
  from jax._src.interpreters import mlir as jax_mlir
  from jax._src.lib.mlir.dialects import func
  from pallas_sim.backends.sim.mlir import evaluator as E
  ctx = jax_mlir.make_ir_context()
  mgpu.dialect.register_dialect(ctx)
  with ctx, ir.Location.unknown():
    m = ir.Module.create()
    i32 = ir.IntegerType.get_signless(32)
    m.operation.attributes["mosaic_gpu.arch_major"] = ir.IntegerAttr.get(i32, 9)
    m.operation.attributes["mosaic_gpu.arch_minor"] = ir.IntegerAttr.get(i32, 0)
    with ir.InsertionPoint(m.body):
      blk = func.FuncOp("f", (arg_types(), [])).add_entry_block()
    with ir.InsertionPoint(blk):
      build(*blk.arguments)
      func.ReturnOp([])
    prog = E.compile_block(blk)
  offs = [i * 4096 for i in range(len(args))]
  arena = E.Arena(4096 * len(args))
  refs = []
  for a, off, t in zip(args, offs, arg_types_list(arg_types)):
    arena.data[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
    strides = [int(np.prod(a.shape[d + 1:])) for d in range(a.ndim)]  # (row-major, in elements)
    refs.append(E.MemRef(E.ARENA_BASE + off, np.int64(0), a.shape, strides, a.dtype,
                         "smem" if "workgroup" in str(t) else "gmem"))
  lanes_ = E.Lanes(np.arange(lanes), (lanes, 1, 1), (0, 0, 0), (1, 1, 1), (0, 0, 0),
                   (1, 1, 1), arena)
  E.run(prog, lanes_, refs)
  return [arena.data[o:o + a.nbytes].view(a.dtype).reshape(a.shape) for a, o in zip(args, offs)]


def arg_types_list(arg_types):
  from jax._src.interpreters import mlir as jax_mlir
  with jax_mlir.make_ir_context(), ir.Location.unknown():
    return [str(t) for t in arg_types()]


def test_evaluator_masks_per_lane_control_flow_and_vector_stores():
  from jax._src.lib.mlir.dialects import scf, vector as vector_dialect
  f32 = lambda: ir.F32Type.get()
  idx = lambda: ir.IndexType.get()

  # Lanes below 64 copy in[tid] (64 elements: the others would be out of
  # bounds) to out[tid]; one lane stores 7 to `flag` (one address, masked).
  def build(inp, out, flag):
    tid = gpu_dialect.thread_id(gpu_dialect.Dimension.x)
    low = arith_dialect.cmpi(arith_dialect.CmpIPredicate.ult, tid,
                             arith_dialect.constant(idx(), 64))
    branch = scf.IfOp(low)
    with ir.InsertionPoint(branch.then_block):
      memref_dialect.store(memref_dialect.load(inp, [tid]), out, [tid])
      scf.YieldOp([])
    with mgpu.utils.when(mgpu.utils.single_thread_predicate()):
      memref_dialect.store(arith_dialect.constant(f32(), 7.0), flag, [])
  types = lambda: [ir.MemRefType.get((64,), f32()), ir.MemRefType.get((128,), f32()),
                   ir.MemRefType.get((), f32())]
  inp = np.arange(64, dtype=np.float32)
  _, out, flag = _evaluate(build, types, [inp, np.full(128, -1, np.float32),
                                          np.zeros((), np.float32)])
  np.testing.assert_array_equal(out[:64], inp)
  np.testing.assert_array_equal(out[64:], -1)
  assert float(flag) == 7.0

  # A vector<1xf32> per lane (its value the lane's id) lands at out[tid];
  # a non-splat dense constant; a loop with negative i32 bounds.
  def build2(out, out2, count):
    tid = gpu_dialect.thread_id(gpu_dialect.Dimension.x)
    v = arith_dialect.uitofp(f32(), arith_dialect.index_cast(ir.IntegerType.get_signless(32), tid))
    vector_dialect.store(vector_dialect.broadcast(ir.VectorType.get((1,), f32()), v), out, [tid])
    c = arith_dialect.constant(ir.VectorType.get((4,), ir.BF16Type.get()),
                               ir.Attribute.parse("dense<[1.5, -2.0, 3.0, 0.25]> : vector<4xbf16>"))
    vector_dialect.store(c, out2, [arith_dialect.constant(idx(), 0)])
    i32 = ir.IntegerType.get_signless(32)
    loop = scf.ForOp(arith_dialect.constant(i32, -3), arith_dialect.constant(i32, 2),
                     arith_dialect.constant(i32, 1), [arith_dialect.constant(i32, 0)])
    with ir.InsertionPoint(loop.body):
      scf.YieldOp([arith_dialect.addi(loop.inner_iter_args[0], arith_dialect.constant(i32, 1))])
    memref_dialect.store(loop.results[0], count, [])
  types2 = lambda: [ir.MemRefType.get((128,), f32()),
                    ir.MemRefType.get((4,), ir.BF16Type.get()),
                    ir.MemRefType.get((), ir.IntegerType.get_signless(32))]
  out, out2, count = _evaluate(build2, types2, [np.zeros(128, np.float32),
                                                np.zeros(4, jnp.bfloat16), np.zeros((), np.int32)])
  np.testing.assert_array_equal(out, np.arange(128, dtype=np.float32))
  np.testing.assert_array_equal(out2.astype(np.float32), [1.5, -2.0, 3.0, 0.25])
  assert int(count) == 5


def test_evaluator_reads_smem_through_a_rebuilt_descriptor():
  # utils.ptr_as_memref builds a memref descriptor (pointers of address
  # space 3) from an SMEM pointer.
  f32 = ir.F32Type.get

  def build(src, out):
    ptr = mgpu.utils.memref_ptr(src)
    again = mgpu.utils.ptr_as_memref(ptr, ir.MemRefType(src.type))
    c1 = arith_dialect.constant(ir.IndexType.get(), 1)
    memref_dialect.store(memref_dialect.load(again, [c1]), out, [])
  smem = "#gpu.address_space<workgroup>"
  types = lambda: [ir.MemRefType.get((4,), f32(), memory_space=ir.Attribute.parse(smem)),
                   ir.MemRefType.get((), f32())]
  _, out = _evaluate(build, types, [np.array([1, 2, 3, 4], np.float32), np.zeros((), np.float32)])
  assert float(out) == 2.0


_BINARY = ["add", "sub", "mul", "div", "rem", "max", "min", "and", "or", "xor",
           "shift_left", "shift_right_logical", "shift_right_arithmetic"]


def _lowering_impl(name):
  """The FragmentedArray function the real lowering uses for lax.<name>."""
  from jax._src.lax import lax as lax_internal
  from jax._src.pallas.mosaic_gpu import core as gpu_core
  from jax._src.pallas.mosaic_gpu import lowering as L
  prim = getattr(lax_internal, f"{name}_p")
  return L.mosaic_lowering_rules[gpu_core.LANExWG_SEMANTICS][prim].keywords["impl"]


def binary_two_ways(name, x, y):
  """lax.<name>(x, y) as a plain kernel (the simulator's lax rules) and as
  the lowering's own FragmentedArray code inside inline_mgpu (its IR
  evaluated): two independent paths that must agree bit for bit."""
  lay = plgpu.Layout.WGMMA
  op = {"and": jax.lax.bitwise_and, "or": jax.lax.bitwise_or,
        "xor": jax.lax.bitwise_xor}.get(name) or getattr(jax.lax, name)
  impl = _lowering_impl(name)
  out = jax.ShapeDtypeStruct(x.shape, x.dtype)

  @plgpu.kernel(out_type=(out, out))
  def k(x_ref, y_ref, o1, o2):
    a = plgpu.load(x_ref, layout=lay, optimized=False)
    b = plgpu.load(y_ref, layout=lay, optimized=False)
    store_unoptimized(o1, op(a, b))

    @plgpu.inline_mgpu(arg_types=(lay, lay), return_type=plgpu.ShapeDtypeStruct(
        x.shape, x.dtype, layout=lay))
    def inline(ctx, fa, fb):
      return impl(fa, fb)
    store_unoptimized(o2, inline(a, b))
  return k(x, y)


def _operands(r, name, dtype):
  dt = np.dtype(dtype)
  shape = (64, 128)
  if dt.kind == "f" or dt == jnp.bfloat16:
    x = r.uniform(-8, 8, shape) * 2.0 ** r.integers(-10, 10, shape)
    y = r.uniform(-8, 8, shape) * 2.0 ** r.integers(-10, 10, shape)
    x[0, :8] = [0.0, -0.0, 0.0, -0.0, np.inf, -np.inf, np.nan, 1.0]
    y[0, :8] = [-0.0, 0.0, 0.0, -0.0, 1.0, np.inf, 1.0, np.nan]
    return x.astype(dt), y.astype(dt)
  info = np.iinfo(dt)
  x = r.integers(info.min, info.max, shape, endpoint=True).astype(dt)
  if name.startswith("shift"):
    y = r.integers(0, 8 * dt.itemsize + 4, shape).astype(dt)
  else:
    y = r.integers(info.min, info.max, shape, endpoint=True).astype(dt)
    if name in ("div", "rem"):
      y[y == 0] = 1
  return x, y


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(name=st.sampled_from(_BINARY),
                  dtype=st.sampled_from([np.float32, np.float16, jnp.bfloat16,
                                         np.int32, np.uint32, np.int16]),
                  seed=st.integers(0, 2**31 - 1))
def test_the_evaluator_and_the_lax_rules_agree_on_the_lowerings_own_ops(name, dtype, seed):
  is_float = np.dtype(dtype).kind == "f" or dtype == jnp.bfloat16
  hypothesis.assume(not (is_float and name in ("rem", "and", "or", "xor") or
                         is_float and name.startswith("shift")))
  x, y = _operands(np.random.default_rng(seed), name, dtype)
  plain, inline = ps.run(binary_two_ways, name, x, y, backend="sim")
  u = f"u{np.dtype(dtype).itemsize}"
  bits = lambda v: np.where(np.isnan(np.asarray(v, np.float32)), 0, np.asarray(v).view(u)) \
      if is_float else np.asarray(v).view(u)  # (NaN payloads aside)
  np.testing.assert_array_equal(bits(inline), bits(plain),
                                err_msg=f"lax.{name} {np.dtype(dtype).name}")
  if is_float:
    np.testing.assert_array_equal(np.isnan(np.asarray(inline, np.float32)),
                                  np.isnan(np.asarray(plain, np.float32)))


@pytest.mark.parametrize("src,to", [(np.float32, jnp.bfloat16), (jnp.bfloat16, np.float32),
                                    (np.float32, np.int32), (np.int32, np.float16),
                                    (np.int16, np.float32), (np.float16, np.int8),
                                    (np.uint8, np.float32)])
def test_casts_in_inline_mgpu_agree_with_the_lax_rules(src, to):
  lay = plgpu.Layout.WGMMA
  r = np.random.default_rng(0)
  isf = np.dtype(src).kind == "f" or src == jnp.bfloat16
  x = (r.uniform(-300, 300, (64, 128)) if isf else
       r.integers(np.iinfo(src).min, np.iinfo(src).max, (64, 128))).astype(src)
  if isf:
    x[0, :3] = [np.nan, np.inf, -np.inf]
  out = jax.ShapeDtypeStruct(x.shape, to)
  signed = mgpu.utils.is_signed(jnp.dtype(to)) if jnp.issubdtype(to, jnp.integer) else None

  @plgpu.kernel(out_type=(out, out))
  def k(x_ref, o1, o2):
    a = plgpu.load(x_ref, layout=lay, optimized=False)
    store_unoptimized(o1, a.astype(to))

    @plgpu.inline_mgpu(arg_types=(lay,), return_type=plgpu.ShapeDtypeStruct(
        x.shape, to, layout=lay))
    def cast(ctx, fa):
      return fa.astype(mgpu.utils.dtype_to_ir_type(jnp.dtype(to)), is_signed=signed)
    store_unoptimized(o2, cast(a))
  plain, inline = (np.asarray(v) for v in ps.run(k, x, backend="sim"))
  np.testing.assert_array_equal(inline.astype(np.float64), plain.astype(np.float64))
