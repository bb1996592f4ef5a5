"""What jax 0.12 added to plgpu, against its documented semantics, with the
real lowering's acceptance checked on the CPU (every ps.run lowers the
kernel first). Skipped on older releases of the window, which lack it."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.base import jax_internals as jx

pytestmark = pytest.mark.skipif(jx.JAX_VERSION < (0, 12),
                                reason="plgpu.store and the rest are new in jax 0.12")
S = jax.ShapeDtypeStruct
WGMMA = plgpu.Layout.WGMMA


def _store_kernel(dtype, optimized, to_smem=False):
  shape = (64, 128)
  scratch = [plgpu.SMEM(shape, dtype)] if to_smem else []

  @plgpu.kernel(out_type=S(shape, dtype), scratch_types=scratch)
  def k(x_ref, o_ref, *s):
    v = plgpu.load(x_ref, layout=WGMMA, optimized=False) * 2
    if to_smem:
      plgpu.store(s[0], v)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(s[0], o_ref)
      plgpu.wait_smem_to_gmem(0)
    else:
      plgpu.store(o_ref, v, optimized=optimized)
  return k


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("to_smem", [False, True])
def test_store_writes_its_value(dtype, to_smem):
  x = jnp.asarray(np.random.default_rng(0).uniform(-4, 4, (64, 128)), dtype)
  out = ps.run(_store_kernel(dtype, optimized=False, to_smem=to_smem), x, backend="sim")
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(x * 2, np.float32))


def test_an_optimised_16_bit_store_to_gmem_is_the_lowerings_to_refuse():
  x = jnp.ones((64, 128), jnp.bfloat16)
  with pytest.raises(ps.LoweringError, match="TransferPlanDerivationError"):
    ps.run(_store_kernel(jnp.bfloat16, optimized=True), x, backend="sim")
  # (4 bytes a thread: the optimised path takes it)
  out = ps.run(_store_kernel(jnp.float32, optimized=True), jnp.ones((64, 128)), backend="sim")
  assert (np.asarray(out) == 2).all()


def _handoff(num_arrivals):
  @plgpu.kernel(out_type=S((128, 128), jnp.float32), num_threads=2, thread_name="wg",
                scratch_types=[plgpu.SMEM((128, 128), jnp.float32),
                               plgpu.Barrier(num_arrivals=num_arrivals)])
  def k(x_ref, o_ref, s, bar):
    wg = jax.lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      s[...] = x_ref[...] * 3

    plgpu.barrier_arrive_and_wait(bar)

    @pl.when(wg == 1)
    def _():
      o_ref[...] = s[...]
  return k


def test_barrier_arrive_and_wait_orders_what_each_thread_did_before():
  x = jnp.arange(128 * 128, dtype=jnp.float32).reshape(128, 128)
  sim = ps.simulate(_handoff(2), x)
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(x) * 3)
  assert not sim.report.races


def test_barrier_arrive_and_wait_with_too_few_arrivals_races():
  # (one arrival completes the phase: thread 1 may read before thread 0 wrote)
  x = jnp.ones((128, 128), jnp.float32)
  sim = ps.simulate(_handoff(1), x, on_race="report", on_uninitialized="report")
  assert sim.report.races


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("axis,ilp", [(1, None), (1, 2), (0, 4)])
def test_reductions_reduce_as_documented(op, axis, ilp):
  x = np.random.default_rng(1).uniform(0.9, 1.1, (64, 128)).astype(np.float32)
  x[3, 5] = 7.0 if op != "min" else 0.125
  n = x.shape[1 - axis]

  @plgpu.kernel(out_type=S((n,), jnp.float32))
  def k(x_ref, o_ref):
    v = plgpu.load(x_ref, layout=WGMMA, optimized=False)
    o_ref[...] = getattr(plgpu, op)(v, axis=axis, accumulator_ilp=ilp)

  try:
    out = np.asarray(ps.run(k, jnp.asarray(x), backend="sim"))
  except ps.LoweringError as e:  # (what the lowering refuses, it refuses on the GPU)
    pytest.skip(f"the real lowering rejects {op} over axis {axis}: {str(e)[:120]}")
  want = getattr(np, op)(x.astype(np.float64), axis=axis)
  if op in ("max", "min"):
    np.testing.assert_array_equal(out, want.astype(np.float32))
  else:  # (the GPU's order of partial sums is not modelled: rounding apart)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_a_reduction_without_accumulator_ilp_is_lax_s():
  x = jnp.asarray(np.random.default_rng(2).normal(size=(64, 128)), jnp.float16)

  @plgpu.kernel(out_type=(S((64,), jnp.float16),) * 2)
  def k(x_ref, a_ref, b_ref):
    v = plgpu.load(x_ref, layout=WGMMA, optimized=False)
    plgpu.store(a_ref, plgpu.sum(v, axis=1), optimized=False)
    plgpu.store(b_ref, jax.lax.reduce_sum(v, axes=(1,)), optimized=False)

  a, b = ps.run(k, x, backend="sim")
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _semaphore_handoff(wait):
  def f(x):
    sem = plgpu.alloc_semaphore((2,))

    @plgpu.kernel(out_type=S(x.shape, x.dtype), grid=(2,), grid_names=("b",))
    def k(sem_ref, x_ref, o_ref):
      b = jax.lax.axis_index("b")

      @pl.when(b == 0)
      def _():
        o_ref[0] = x_ref[0]
        pl.semaphore_signal(sem_ref.at[1])

      @pl.when(b == 1)
      def _():
        if wait:
          pl.semaphore_wait(sem_ref.at[1])
        o_ref[1] = o_ref[0] + 1
    return k(sem, x)
  return jax.jit(f)  # (alloc_semaphore needs a trace: JAX refuses it eagerly)


def test_alloc_semaphore_hands_off_between_blocks():
  x = jnp.arange(256, dtype=jnp.float32).reshape(2, 128)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # (the semaphore ends at zero: no warning)
    sim = ps.simulate(_semaphore_handoff(wait=True), x)
  np.testing.assert_array_equal(np.asarray(sim.outputs)[1], np.asarray(x)[0] + 1)
  assert not sim.report.races


def test_alloc_semaphore_without_the_wait_is_a_race_and_a_leftover_is_said():
  x = jnp.ones((2, 128), jnp.float32)
  with pytest.warns(UserWarning, match=r"leaves semaphores of sem_ref at \[0, 1\]"):
    sim = ps.simulate(_semaphore_handoff(wait=False), x, on_race="report")
  assert sim.report.races


def test_atomics_take_optimized_and_cost_estimate_is_accepted():
  @plgpu.kernel(out_type=S((128,), jnp.float32),
                cost_estimate=pl.CostEstimate(flops=256, transcendentals=0,
                                              bytes_accessed=1024))
  def add_twice(x_ref, o_ref):
    o_ref[...] = jnp.zeros((128,), jnp.float32)
    plgpu.atomic_add(o_ref, x_ref[...], optimized=False)
    plgpu.atomic_add(o_ref, x_ref[...] * 2, optimized=False)

  out = ps.run(add_twice, jnp.ones((128,), jnp.float32), backend="sim")
  np.testing.assert_array_equal(np.asarray(out), 3.0)


def test_im2col_is_refused_by_name_when_the_kernel_is_compiled():
  x = jnp.zeros((1, 8, 8, 64), jnp.float32)

  @plgpu.kernel(out_type=S((64, 64), jnp.float32),
                scratch_types=[plgpu.SMEM((64, 64), jnp.float32), plgpu.Barrier()],
                compiler_params=plgpu.CompilerParams(
                    lowering_semantics=plgpu.LoweringSemantics.Lane))
  def k(x_ref, o_ref, s, bar):
    view = plgpu.im2col_ref(x_ref, window_shape=(3, 3), padding=((1, 1), (1, 1)))
    plgpu.copy_gmem_to_smem(view.at[pl.ds(0, 64), 1, 1, pl.ds(0, 64)], s, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = s[...]

  with pytest.raises(ps.UnsupportedPrimitiveError, match="im2col_ref is not modelled") as e:
    ps.run(k, x, backend="sim")
  assert "in block" not in str(e.value)  # (at compile time, before any block ran)
  assert "test_plgpu_012.py:" in e.value.where


def test_wait_gmem_to_smem_is_refused_as_a_pre_hopper_wait():
  @plgpu.kernel(out_type=S((128,), jnp.float32))
  def k(x_ref, o_ref):
    plgpu.wait_gmem_to_smem(0)
    o_ref[...] = x_ref[...]

  with pytest.raises(ps.UnsupportedPrimitiveError, match="cp.async"):
    ps.run(k, jnp.ones((128,), jnp.float32), backend="sim")


@pytest.mark.skipif(not hasattr(plgpu, "get_barrier_semaphore"),
                    reason="plgpu.get_barrier_semaphore came in jax 0.12.1")
def test_barrier_semaphores_of_a_device_clique_are_refused_by_name():
  @plgpu.kernel(out_type=S((128,), jnp.float32),
                compiler_params=plgpu.CompilerParams(collective_id=0))
  def k(x_ref, o_ref):
    sems = plgpu.get_barrier_semaphore()
    pl.semaphore_signal(sems.at[0])
    o_ref[...] = x_ref[...]

  with pytest.raises(ps.UnsupportedPrimitiveError, match="get_barrier_semaphore.*one GPU") as e:
    ps.run(k, jnp.ones((128,), jnp.float32), backend="sim")
  assert "test_plgpu_012.py:" in e.value.where
