"""Async semantics the simulator must model: TMA loads land later than issued,
SMEM and outputs start poisoned, wgmma groups are in flight until awaited."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from conftest import store_unoptimized
from pallas_sim.backends.sim.base import jax_internals as jx

X = jnp.arange(256, dtype=jnp.float32) + 1


def load_kernel(wait):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                scratch_types=[plgpu.SMEM((256,), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    if wait:
      plgpu.barrier_wait(bar)
    o_ref[...] = smem[...] * 2
    if not wait:
      plgpu.barrier_wait(bar)  # still observe the completion, later
  return k


def test_read_after_barrier_wait_sees_the_tma_data():
  np.testing.assert_array_equal(ps.run(load_kernel(True), X, backend="sim"), 2 * X)


def test_read_before_barrier_wait_sees_poison_not_the_data():
  sim = ps.simulate(load_kernel(False), X, on_race="report", on_uninitialized="report")
  assert np.isnan(np.asarray(sim.outputs)).all()
  [unset] = sim.report.uninitialized
  assert unset.kind == "uninitialized read" and unset.site.agent == "thread"
  [race] = sim.report.races  # and the detector says why, in program order
  assert race.first.agent == "tma_load" and race.second.agent == "thread"
  assert "no barrier_wait" in race.advice


def test_unwritten_outputs_and_smem_are_poisoned():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                scratch_types=[plgpu.SMEM((128,), jnp.float32)])
  def k(o_ref, smem):
    o_ref[pl.ds(0, 128)] = smem[...]  # SMEM never written; second half untouched

  sim = ps.simulate(k, on_uninitialized="report")
  assert np.isnan(np.asarray(sim.outputs)).all()
  read, unwritten = sim.report.uninitialized
  assert read.buffer == "smem" and unwritten.buffer == "o_ref"
  assert "o_ref[128:256] of shape (256,): 128 of 256 elements" in unwritten.text


def test_int_outputs_are_poisoned_with_a_sentinel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), jnp.int32))
  def k(o_ref):
    o_ref[pl.ds(0, 128)] = jnp.ones((128,), jnp.int32)

  out = np.asarray(ps.run(k, backend="sim", on_uninitialized="report"))
  assert (out[:128] == 1).all() and (out[128:] != 0).all() and (out[128:] == out[128]).all()


def test_tma_store_lands_only_when_awaited_or_at_kernel_end():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32),
                scratch_types=[plgpu.SMEM((128,), jnp.float32)])
  def k(o_ref, smem):
    smem[...] = jnp.full((128,), 3.0, jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[0])
    plgpu.wait_smem_to_gmem(0)
    o_ref[1] = o_ref[0]  # the store above has landed

  out = np.asarray(ps.run(k, backend="sim"))
  np.testing.assert_array_equal(out, 3.0)


def test_reading_gmem_before_the_tma_store_lands_sees_the_old_bytes():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32),
                scratch_types=[plgpu.SMEM((128,), jnp.float32)])
  def k(o_ref, smem):
    smem[...] = jnp.full((128,), 3.0, jnp.float32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[0])
    o_ref[1] = o_ref[0]  # too early: the store is still in flight
    plgpu.wait_smem_to_gmem(0)

  sim = ps.simulate(k, on_race="report", on_uninitialized="report")
  out = np.asarray(sim.outputs)
  assert (out[0] == 3.0).all() and np.isnan(out[1]).all()
  [race] = sim.report.races
  assert "wait_smem_to_gmem" in race.advice


def wgmma_kernel(body):
  """A (64, 64) and B (64, 128) f16 loaded by TMA into swizzled SMEM, then
  body(acc, a_smem, b_smem); the output is the accumulator."""
  T = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                scratch_types=dict(a=plgpu.SMEM((64, 64), jnp.float16, transforms=T),
                                   b=plgpu.SMEM((64, 128), jnp.float16, transforms=T),
                                   bar=plgpu.Barrier(num_arrivals=2),
                                   acc=plgpu.ACC((64, 128), jnp.float32)))
  def k(a_ref, b_ref, o_ref, a, b, bar, acc):
    plgpu.copy_gmem_to_smem(a_ref, a, bar)
    plgpu.copy_gmem_to_smem(b_ref, b, bar)
    plgpu.barrier_wait(bar)
    body(acc, a, b)
    o_ref[...] = acc[...]
  return k


def test_wgmma_is_async_until_awaited():
  """acc[...] waits for every group: three wgmmas issued back to back all
  land in the accumulator."""
  def body(acc, a, b):
    for _ in range(3):
      plgpu.wgmma(acc, a, b)
  k = wgmma_kernel(body)

  rng = np.random.default_rng(0)
  av = jnp.asarray(rng.standard_normal((64, 64)), jnp.float16)
  bv = jnp.asarray(rng.standard_normal((64, 128)), jnp.float16)
  out = np.asarray(ps.run(k, av, bv, backend="sim"))
  want = 3 * (np.asarray(av, np.float32) @ np.asarray(bv, np.float32))
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)


def test_barrier_phases_are_tracked_per_thread_wait():
  """Two completions of one barrier, each observed by its own wait."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32),
                scratch_types=[plgpu.SMEM((2, 128), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    for i in range(2):
      plgpu.copy_gmem_to_smem(x_ref.at[i], smem.at[i], bar)
      plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  x = jnp.arange(256, dtype=jnp.float32).reshape(2, 128)
  np.testing.assert_array_equal(ps.run(k, x, backend="sim"), x)


def test_fori_loop_while_cond_in_kernel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 128), jnp.float32))
  def k(x_ref, o_ref):
    def body(i, acc):
      return acc + x_ref[i]
    total = lax.fori_loop(0, 4, body, jnp.zeros((128,), jnp.float32))

    def wbody(c):
      i, v = c
      return i + 1, v * 2
    _, v = lax.while_loop(lambda c: c[0] < 3, wbody, (0, total))
    o_ref[0] = v
    # (a scalar read from a register array does not lower; from a ref it does)
    o_ref[1] = lax.cond(x_ref[0, 1] > 0, lambda: v, lambda: -v)
    o_ref[2] = jnp.where(x_ref[1] > 200, x_ref[1], 0.0)
    o_ref[3] = jnp.exp(x_ref[0] / 128) + jnp.tanh(x_ref[2])

  x = jnp.arange(512, dtype=jnp.float32).reshape(4, 128)
  xn = np.asarray(x)
  want = np.stack([8 * xn.sum(0), 8 * xn.sum(0), np.where(xn[1] > 200, xn[1], 0),
                   np.exp(xn[0] / 128) + np.tanh(xn[2])])
  np.testing.assert_allclose(ps.run(k, x, backend="sim"), want, rtol=1e-6)


def test_integer_indexed_refs_are_views_into_the_buffer():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.SMEM((2, 128), jnp.float32)])
  def k(x_ref, o_ref, smem):
    smem[...] = jnp.zeros((2, 128), jnp.float32)
    smem.at[1, 5][...] = x_ref[5]  # a store through an all-integer index
    o_ref[...] = smem[1]

  out = np.asarray(ps.run(k, X, backend="sim"))
  assert out[5] == X[5] and (np.delete(out, 5) == 0).all()


def test_tma_limits_of_the_lowering():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4,), jnp.int32),
                scratch_types=[plgpu.SMEM((4,), jnp.int32)])
  def k(x_ref, o_ref, smem):
    plgpu.copy_smem_to_gmem(smem.at[0], o_ref.at[3])
    plgpu.wait_smem_to_gmem(0)

  with pytest.raises(ps.KernelError, match="divisible by 128, but got 32"):
    ps.run(k, jnp.array([1, 2, 3, 4], jnp.int32), backend="sim")


def _column_copy(rows, cols, dtype):
  """Copies column 0 of a (rows, cols) array through SMEM in two TMA boxes
  of (rows // 2, 1), to column 0 of the output."""
  half = rows // 2

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((rows, cols), dtype),
                scratch_types=[plgpu.SMEM((half, 1), dtype), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    for i in range(2):
      box = (pl.ds(i * half, half), pl.ds(0, 1))
      plgpu.copy_gmem_to_smem(x_ref.at[box], smem, bar)
      plgpu.barrier_wait(bar)
      plgpu.copy_smem_to_gmem(smem, o_ref.at[box])
      plgpu.wait_smem_to_gmem(0)
  return k


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.int8])
def test_a_unit_box_column_of_a_one_column_array(dtype):
  """TMA's limits apply to the box once the dimensions where the array and
  the box are both 1 are dropped (from jax 0.12.1): a bf16 box (8, 1) of a
  (16, 1) array is 8 contiguous elements, 128 bits; int8's 64 bits are not
  enough. Before 0.12.1 the array's rows, 1 or 2 bytes apart, are refused
  first, as they are in every release for a (16, 2) array, which keeps its
  unit box dimension. (ps.run has the real lowering check each kernel too.)"""
  x = jnp.asarray(np.arange(16).reshape(16, 1), dtype)
  strides = "all GMEM strides except the last one to be a multiple of 16 bytes"
  if not jx.TMA_DROPS_UNIT_DIMS:
    with pytest.raises(ps.KernelError, match=strides):
      ps.run(_column_copy(16, 1, dtype), x, backend="sim")
  elif dtype == jnp.bfloat16:
    out = ps.run(_column_copy(16, 1, dtype), x, backend="sim")
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
  else:
    with pytest.raises(ps.KernelError, match="divisible by 128, but got 64") as e:
      ps.run(_column_copy(16, 1, dtype), x, backend="sim")
    assert "test_semantics.py:" in e.value.where
  with pytest.raises(ps.KernelError, match=strides):
    ps.run(_column_copy(16, 2, dtype), jnp.zeros((16, 2), dtype), backend="sim")


def test_a_tiled_allocation_copies_in_boxes_of_its_tiles():
  """TMA's 256-element limit is on the box the descriptor holds, which for a
  tiled allocation is its tiles: 512 rows tiled (8, 64) are boxes of 8 rows.
  The allocation's tiling comes from its transforms in either form (its
  refs' up to jax 0.12.0.1, run_scoped's from 0.12.1)."""
  tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((512, 64), jnp.float16),
                scratch_types=[plgpu.SMEM((512, 64), jnp.float16, transforms=tr),
                               plgpu.Barrier()])
  def k(x_ref, o_ref, s, bar):
    plgpu.copy_gmem_to_smem(x_ref, s, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(s, o_ref)
    plgpu.wait_smem_to_gmem(0)

  x = jnp.asarray(np.random.default_rng(0).standard_normal((512, 64)), jnp.float16)
  np.testing.assert_array_equal(np.asarray(ps.run(k, x, backend="sim")), np.asarray(x))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_float_to_int_cast_of_nan_and_inf_as_on_hardware(dtype):
  # Found by the agreement suite on an H200: bf16 NaN -> int32 gave INT_MIN
  # here (numpy's cast) but 0 on the GPU (cvt.rzi: NaN -> 0, saturating).
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32))
  def k(x_ref, o_ref):
    o_ref[...] = jnp.log(x_ref[...]).astype(jnp.int32)

  x = np.full(128, 2.0, np.float32)
  x[:4] = [-1.0, 0.0, np.inf, 1e30 if dtype != jnp.float16 else 6e4]
  out = np.asarray(ps.run(k, jnp.asarray(x, dtype), backend="sim"))
  assert list(out[:4]) == [0, -2 ** 31, 2 ** 31 - 1, int(np.log(np.float32(x[3])))]
  assert (out[4:] == 0).all()  # trunc(log 2)


def test_plgpu_load_with_a_layout_reads_the_ref():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64,), jnp.float32),
                scratch_types=[plgpu.SMEM((64, 128), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = jnp.sum(plgpu.load(smem, layout=plgpu.Layout.WGMMA), axis=1)

  x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
  np.testing.assert_allclose(ps.run(k, jnp.asarray(x), backend="sim"), x.sum(1),
                             rtol=1e-5)


def test_mul_feeding_an_add_is_a_fused_multiply_add():
  # LLVM contracts x*y+c into one fma on the GPU (one rounding), even when the
  # product has other uses; the agreement suite saw x*x+y differ in the last
  # bit on an H200 until we did the same (lab/contraction_probe.py).
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((3, 128), jnp.float32))
  def k(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[0] = x * x - y_ref[...]  # fused: exact x*x
    p = x * x
    o_ref[1] = p - y_ref[...]      # fused although p is stored too
    o_ref[2] = p

  x = jnp.full((128,), 1 + 2 ** -12, jnp.float32)
  y = jnp.full((128,), 1 + 2 ** -11, jnp.float32)
  out = np.asarray(ps.run(k, x, y, backend="sim"))
  assert out[0, 0] == np.float32(2.0 ** -24) and out[1, 0] == np.float32(2.0 ** -24)
  assert out[2, 0] == np.float32(1 + 2 ** -11)  # x*x rounded where it is stored


def test_integer_division_and_remainder_truncate_toward_zero():
  # lax.div/rem are C's (truncation toward zero); jnp's // and % floor, and
  # JAX builds them from lax.div/rem with a correction.
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 128), jnp.int32))
  def k(x_ref, y_ref, o_ref):
    x, y = x_ref[...], y_ref[...]
    o_ref[0] = lax.div(x, y)
    o_ref[1] = lax.rem(x, y)
    o_ref[2] = x // y
    o_ref[3] = x % y

  r = np.random.default_rng(0)
  x = r.integers(-1000, 1000, 128).astype(np.int32)
  y = r.integers(1, 30, 128).astype(np.int32) * r.choice([-1, 1], 128).astype(np.int32)
  out = np.asarray(ps.run(k, jnp.asarray(x), jnp.asarray(y), backend="sim"))
  q = np.array([int(a / b) for a, b in zip(x.tolist(), y.tolist())])  # truncated
  np.testing.assert_array_equal(out[0], q)
  np.testing.assert_array_equal(out[1], x - q * y)
  np.testing.assert_array_equal(out[2], x // y)
  np.testing.assert_array_equal(out[3], x % y)


def test_wgmma_reads_its_operands_when_it_completes():
  """A store into a wgmma's operand while the wgmma is in flight (a race)
  lands before the tensor core reads it here: the simulator takes the
  latest moment the hardware may read, so a racy kernel gets wrong numbers
  rather than lucky right ones, and the race is reported."""
  def body(acc, a, b):
    plgpu.wgmma(acc, a, b)
    b[...] = jnp.zeros((64, 128), jnp.float16)  # while the wgmma may read b
    plgpu.wgmma_wait(0)
  k = wgmma_kernel(body)

  rng = np.random.default_rng(0)
  av = jnp.asarray(rng.standard_normal((64, 64)), jnp.float16)
  bv = jnp.asarray(rng.standard_normal((64, 128)), jnp.float16)
  sim = ps.simulate(k, av, bv, on_race="report")
  np.testing.assert_array_equal(np.asarray(sim.outputs), 0.0)
  [race] = sim.report.races
  assert race.first.agent == "wgmma" and race.second.prim == "store"
  assert "wgmma_wait" in race.advice


def reduction_store(op, dtype):
  """x (2, 128): row 0 stored to the output by TMA, then row 1 reduced into
  it with `op`."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), dtype),
                scratch_types=[plgpu.SMEM((2, 128), dtype)])
  def k(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem.at[0], o_ref)
    plgpu.wait_smem_to_gmem(0)
    plgpu.copy_smem_to_gmem(smem.at[1], o_ref, reduction_op=op)
    plgpu.wait_smem_to_gmem(0)
  return k


# Counts about to wrap and bounds at the ends (inc and dec take them unsigned).
WRAP_OLD = np.array([0, 1, 4, 5, 6, 7, 2 ** 32 - 1, 2 ** 31] * 16, np.uint32)
WRAP_BOUND = np.array([5] * 64 + [0] * 32 + [2 ** 32 - 1] * 32, np.uint32)


@pytest.mark.parametrize("op,dtype,combine", [
    ("add", jnp.float32, np.add), ("max", jnp.float16, np.maximum),
    ("smin", jnp.int32, np.minimum),
    ("umax", jnp.int32, lambda a, b: np.maximum(a.view(np.uint32), b.view(np.uint32)).view(np.int32))])
def test_tma_reduction_store_combines_with_gmem(op, dtype, combine):
  k = reduction_store(op, dtype)
  r = np.random.default_rng(0)
  x = (r.integers(-1000, 1000, (2, 128)) if dtype == jnp.int32
       else r.standard_normal((2, 128))).astype(dtype)
  out = np.asarray(ps.run(k, jnp.asarray(x), backend="sim"))
  np.testing.assert_array_equal(out, combine(x[0], x[1]))


def _inc(old, bound):
  return np.where(old >= bound, 0, old + 1).astype(np.uint32)


def _dec(old, bound):
  return np.where((old == 0) | (old > bound), bound, old - 1).astype(np.uint32)


@pytest.mark.parametrize("op,combine", [("inc", _inc), ("dec", _dec)])
def test_tma_reduction_store_inc_and_dec_wrap_as_ptx_says(op, combine):
  """cp.reduce.async.bulk .inc/.dec on i32, taken as unsigned (as CUDA's
  atomicInc/atomicDec): inc counts up to the SMEM value, then wraps to 0;
  dec counts down, and from 0 or past the bound starts again at it."""
  x = np.stack([WRAP_OLD, WRAP_BOUND]).view(np.int32)
  out = np.asarray(ps.run(reduction_store(op, jnp.int32), jnp.asarray(x),
                          backend="sim")).view(np.uint32)
  np.testing.assert_array_equal(out, combine(WRAP_OLD, WRAP_BOUND))


def test_max_and_min_order_signed_zeros_as_the_gpu():
  # Measured on an H200 (lab/register_numerics_probe.py): max/min take
  # -0 < +0 whichever operand comes first; numpy returns either zero.
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 128), jnp.float32))
  def k(x_ref, y_ref, o_ref):
    x, y = x_ref[...], y_ref[...]
    o_ref[0] = jnp.maximum(x, y)
    o_ref[1] = jnp.minimum(x, y)
    o_ref[2] = jnp.maximum(y, x)
    o_ref[3] = jnp.minimum(y, x)

  out = np.asarray(ps.run(k, jnp.full((128,), -0.0, jnp.float32),
                          jnp.zeros((128,), jnp.float32), backend="sim"))
  assert (out == 0).all()
  assert list(np.signbit(out[:, 0])) == [False, True, False, True]
  # and NaN wins over a number, either way round (max.NaN on the GPU)
  out = np.asarray(ps.run(k, jnp.full((128,), jnp.nan, jnp.float32),
                          jnp.ones((128,), jnp.float32), backend="sim"))
  assert np.isnan(out).all()


@pytest.mark.parametrize("dtype,big", [(jnp.float16, 2048.0), (jnp.bfloat16, 256.0)])
def test_direct_half_sums_are_summed_in_f32_and_rounded_once(dtype, big):
  # The simulator's documented approximation (interpret/rules/lax_math.py _reduce): on
  # an H200 this lax.reduce_sum gave 2288 (f16) and 496 (bf16), rounding in
  # the half type in its own order; f32 then one rounding gives 2304 and
  # 512, in index order in the half type 2048 and 256.
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64), dtype),
                scratch_types=[plgpu.SMEM((64, 256), dtype), plgpu.Barrier()])
  def k(x_ref, o_ref, x_s, bar):
    plgpu.copy_gmem_to_smem(x_ref, x_s, bar)
    plgpu.barrier_wait(bar)
    x = plgpu.load(x_s, layout=plgpu.Layout.WGMMA)
    store_unoptimized(o_ref.at[0], lax.reduce_sum(x, axes=(1,)))
    store_unoptimized(o_ref.at[1], jnp.sum(x, axis=1))

  x = np.ones((64, 256), dtype)
  x[:, 0] = big
  out = np.asarray(ps.run(k, jnp.asarray(x), backend="sim"), np.float64)
  assert (out == float(np.asarray(big + 255.0, dtype))).all()


def known_zero_kernel(dtype, zero):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((1, 256), dtype))
  def k(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = (x * x + zero(x)) + y_ref[...]
  return k


KNOWN_ZEROS = {
    "iota along an axis of size 1": lambda x: lax.broadcasted_iota(
        jnp.int32, x.shape, 0).astype(x.dtype),
    "zeros_like": jnp.zeros_like,
    "literal": lambda x: 0.0,
}


@pytest.mark.parametrize("zero", list(KNOWN_ZEROS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_an_add_of_a_known_zero_folds_and_the_product_fuses_on(dtype, zero):
  # Measured on an H200 (lab/register_numerics_probe.py): x*x + 0 + y
  # is one fused multiply-add x*x + y when the compiler knows the zero;
  # x * 0 it does not know, and x*x rounds before its + y.
  r = np.random.default_rng(3)
  x = r.uniform(-2, 2, (1, 256)).astype(dtype)
  y = r.uniform(-2, 2, (1, 256)).astype(dtype)
  from tolerance import fma_round, round_to  # (the agreement suite's own rounding)
  xf, yf = x.astype(np.float64), y.astype(np.float64)
  fused = fma_round(xf, xf, yf, dtype).astype(dtype)
  unfused = round_to(round_to(xf * xf, dtype) + yf, dtype).astype(dtype)
  assert (fused != unfused).any()
  got = np.asarray(ps.run(known_zero_kernel(dtype, KNOWN_ZEROS[zero]), jnp.asarray(x),
                          jnp.asarray(y), backend="sim"))
  np.testing.assert_array_equal(got, fused)
  got = np.asarray(ps.run(known_zero_kernel(dtype, lambda v: v * jnp.asarray(0, dtype)),
                          jnp.asarray(x), jnp.asarray(y), backend="sim"))
  np.testing.assert_array_equal(got, unfused)


def tma_past_the_end_kernel(oob_mode=None, rows=100):
  """A (64, 128) TMA box at rows 64.. of a `rows`-row array, round trip:
  the load reaches past the end (TMA fills zeros by default), the store too
  (TMA drops what falls outside)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((rows, 128), jnp.float32),
                scratch_types=[plgpu.SMEM((64, 128), jnp.float32), plgpu.Barrier()],
                grid=(1,), grid_names=("i",))
  def k(x_ref, o_ref, smem, bar):
    kw = {} if oob_mode is None else dict(oob_mode=oob_mode)
    start = 64 + lax.axis_index("i")  # (dynamic: JAX checks static slices itself)
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(start, 64)], smem, bar, **kw)
    plgpu.barrier_wait(bar)
    smem[...] = smem[...] + 1.0
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(start, 64)])
    plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(0, 64)])
    plgpu.wait_smem_to_gmem(0)
  return k


def test_tma_boxes_past_the_end_fill_zeros_on_load_and_drop_on_store():
  x = jnp.arange(100 * 128, dtype=jnp.float32).reshape(100, 128)
  sim = ps.simulate(tma_past_the_end_kernel(), x)
  out = np.asarray(sim.outputs)
  np.testing.assert_array_equal(out[64:], np.asarray(x)[64:] + 1)
  np.testing.assert_array_equal(out[:36], np.asarray(x)[64:] + 1)
  np.testing.assert_array_equal(out[36:64], 1.0)  # the zeros the load filled, + 1
  assert sim.report.uninitialized == [] and sim.report.races == []


def test_tma_box_past_the_end_with_promise_in_bounds_is_an_error():
  from jax.experimental.mosaic.gpu.launch_context import OOBFillMode
  x = jnp.zeros((100, 128), jnp.float32)
  with pytest.raises(ps.OutOfBoundsError, match="reaches past its ends"):
    ps.run(tma_past_the_end_kernel(OOBFillMode.PROMISE_IN_BOUNDS), x, backend="sim")


def test_tma_box_past_the_end_undefined_leaves_smem_unwritten():
  from jax.experimental.mosaic.gpu.launch_context import OOBFillMode
  x = jnp.zeros((100, 128), jnp.float32)
  sim = ps.simulate(tma_past_the_end_kernel(OOBFillMode.UNDEFINED), x,
                    on_uninitialized="report")
  [f] = sim.report.uninitialized
  assert f.kind == "uninitialized read" and f.buffer == "smem"
  assert "elements (36, 0)..(63, 127)" in str(f)


def test_async_prefetch_changes_no_value():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), jnp.float32))
  def k(x_ref, o_ref):
    plgpu.async_prefetch(x_ref)
    o_ref[...] = x_ref[...] + 1

  np.testing.assert_array_equal(ps.run(k, X, backend="sim"), X + 1)


def test_run_state_returns_what_its_body_returns_as_the_lowering_does():
  """pl.run_state(f)(ACC.init(x)): the lowering gives f's own result (here
  x + 4x = 5) where f returns one, as JAX's test_fori_loop_accumulator
  checks on the GPU, not the accumulator's final value (1)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 64), jnp.float16))
  def k(i_ref, o_ref):
    def scope(acc_ref):
      return lax.fori_loop(0, 4, lambda _, v: v + acc_ref[...], acc_ref[...])
    o_ref[...] = pl.run_state(scope)(plgpu.ACC.init(i_ref[...]))

  out = ps.run(k, jnp.ones((64, 64), jnp.float16), backend="sim")
  np.testing.assert_array_equal(out, 5.0)


def test_run_state_whose_body_returns_its_ref_gives_its_final_value():
  """A body may return its own ref (the accumulator a wgmma wrote, a plain
  ref it updated): the lowering returns the ref's value when the scope ends,
  after its wgmma are awaited."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 64), jnp.float32))
  def plain(o_ref):
    def body(r):
      r[...] = r[...] + 1
      return r
    o_ref[...] = pl.run_state(body)(jnp.ones((64, 64), jnp.float32))
  np.testing.assert_array_equal(ps.run(plain, backend="sim"), 2.0)

  tr = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 64), jnp.float32),
                scratch_types=[plgpu.SMEM((64, 64), jnp.float16, transforms=tr)] * 2
                + [plgpu.Barrier(num_barriers=2)])
  def acc(a_ref, b_ref, o_ref, sa, sb, bar):
    plgpu.copy_gmem_to_smem(a_ref, sa, bar.at[0])
    plgpu.copy_gmem_to_smem(b_ref, sb, bar.at[1])
    plgpu.barrier_wait(bar.at[0])
    plgpu.barrier_wait(bar.at[1])

    def body(acc_ref):
      plgpu.wgmma(acc_ref, sa, sb)
      return acc_ref
    o_ref[...] = pl.run_state(body)(plgpu.ACC.init(jnp.zeros((64, 64), jnp.float32)))
  rng = np.random.default_rng(0)
  a, b = (jnp.asarray(rng.uniform(-1, 1, (64, 64)), jnp.float16) for _ in range(2))
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  np.testing.assert_allclose(ps.run(acc, a, b, backend="sim"), want, rtol=1e-3, atol=1e-3)


def shifts_kernel(dtype, max_amount):
  """The three shifts of a linspace over dtype's range, by 0..max_amount-1."""
  @plgpu.kernel(out_type=[jax.ShapeDtypeStruct((256,), dtype)] * 3)
  def k(x_ref, y_ref, l_ref, r_ref, a_ref):
    x, y = x_ref[...], y_ref[...]
    l_ref[...] = lax.shift_left(x, y)
    r_ref[...] = lax.shift_right_logical(x, y)
    a_ref[...] = lax.shift_right_arithmetic(x, y)
  info = jnp.iinfo(dtype)
  x = jnp.linspace(jnp.array(info.min, dtype), jnp.array(info.max, dtype), 256, dtype=dtype)
  return k, (x, (jnp.arange(256) % max_amount).astype(dtype))


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint32])
def test_shifts_act_on_bit_patterns_with_clamped_amounts(dtype):
  k, (x, y) = shifts_kernel(dtype, 40)  # (past the width: 0, or the sign)
  outs = ps.run(k, x, y, backend="sim")
  for got, op in zip(outs, (lax.shift_left, lax.shift_right_logical,
                            lax.shift_right_arithmetic)):
    np.testing.assert_array_equal(got, op(x, y), err_msg=op.__name__)


def bulk_copy_kernel(shape=(8, 512), out_shape=(8, 512)):
  """A TMA load (oob_mode UNDEFINED) and a store of a box longer than 256
  elements: one contiguous range each way when `out_shape` is the box."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(out_shape, jnp.float32),
                scratch_types=[plgpu.SMEM(shape, jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, oob_mode=plgpu.OOBFillMode.UNDEFINED)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref.at[:shape[0], :shape[1]])
    plgpu.wait_smem_to_gmem(0)
  return k


def test_contiguous_copies_take_the_bulk_path_without_the_256_limit():
  x = jnp.arange(8 * 512, dtype=jnp.float32).reshape(8, 512)
  np.testing.assert_array_equal(ps.run(bulk_copy_kernel(), x, backend="sim"), x)
  # A box that is not one contiguous range of its array needs a tensor map.
  with pytest.raises(ps.KernelError, match="<=256 elements along each dimension"):
    ps.run(bulk_copy_kernel(out_shape=(8, 1024)), x, backend="sim")


def test_log2_and_one_minus_square_as_the_lowering_computes_them():
  x = np.linspace(0.25, 3.0, 128).astype(np.float32)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32))
  def k(x_ref, o_ref):
    o_ref[0] = jnp.log2(x_ref[...])
    o_ref[1] = lax.one_minus_square(x_ref[...])  # (1 + x) * (1 - x)
  out = np.asarray(ps.run(k, x, backend="sim"))
  np.testing.assert_allclose(out[0], np.log2(x), rtol=1e-7)
  one = np.float32(1)
  np.testing.assert_array_equal(out[1], (one + x) * (one - x))


def test_delay_advances_the_threads_clock():
  def kernel(nanos):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
    def k(o_ref):
      pl.delay(nanos)
      o_ref[...] = jnp.zeros((128,), jnp.float32)
    return k
  short, long = (ps.simulate(kernel(n)).report.kernels[0].block_cycles_max
                 for n in (0, 10_000))
  from pallas_sim import gpus
  assert long - short == pytest.approx(10_000 * gpus.H100.clock_hz * 1e-9, rel=0.01)


def reshard_relu():
  """(mesh, x, relu): a kernel run under a 1x1 mesh with explicit axes, where
  jnp.where on a value read from SMEM reshards it; call relu(x) inside
  jax.set_mesh(mesh). (Also tests/test_gpu.py's.)"""
  from jax import sharding
  mesh = jax.make_mesh((1, 1), ("x", "y"), axis_types=(sharding.AxisType.Explicit,) * 2)
  with jax.set_mesh(mesh):
    x = sharding.reshard(jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64) - 2000,
                         sharding.PartitionSpec("x", "y"))

  @jax.jit
  def relu(x):
    spec = jax.typeof(x).sharding.spec

    @jax.shard_map(in_specs=spec, out_specs=spec)
    def shard(xs):
      @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 64), jnp.float32),
                    scratch_types=[plgpu.SMEM((64, 64), jnp.float32)])
      def k(x_ref, o_ref, smem):
        smem[...] = x_ref[...]
        v = smem[...]
        o_ref[...] = jnp.where(v > 0, v, 0)
      return k(xs)
    return shard(x)
  return mesh, x, relu


def test_reshard_in_a_kernel_is_the_identity_as_the_lowering_makes_it():
  mesh, x, relu = reshard_relu()
  with jax.set_mesh(mesh):
    with ps.backend("sim"):
      out = relu(x)
  np.testing.assert_array_equal(np.asarray(out), np.maximum(np.asarray(x), 0))
