"""Semaphores: pl.get_global (shared by the launch's blocks, which then run
together), run_scoped semaphores (one per block), signal / wait / read,
and the happens-before order a signal and its wait make."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

I32 = jnp.int32


def handoff(wait=True, grid=4):
  """The last block writes a row and signals; every other block waits for
  it (in launch order they come first, so run one after another they would
  wait for ever), then copies that row into its own."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((grid, 128), I32), grid=(grid,),
                grid_names=("x",))
  def k(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    b = lax.axis_index("x")

    @pl.when(b == grid - 1)
    def _():
      o_ref[grid - 1] = jnp.full((128,), 7, I32)
      pl.semaphore_signal(sem, grid - 1)

    @pl.when(b < grid - 1)
    def _():
      if wait:
        pl.semaphore_wait(sem, 1)
      o_ref[b] = o_ref[grid - 1] + b
  return k


def test_blocks_wait_for_a_later_block_through_a_global_semaphore():
  sim = ps.simulate(handoff())
  np.testing.assert_array_equal(sim.outputs[:, 0], [7, 8, 9, 7])
  assert sim.report.races == []


def test_without_the_wait_the_blocks_race_on_the_row():
  sim = ps.simulate(handoff(wait=False), on_race="report", on_uninitialized="report")
  kinds = {r.kind for r in sim.report.races}
  assert kinds == {"read-write race"} or kinds == {"write-read race"}, kinds
  assert all("o_ref" in str(r) for r in sim.report.races)


def test_a_wait_no_signal_can_satisfy_is_a_deadlock():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), I32), grid=(2,),
                grid_names=("x",))
  def k(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    pl.semaphore_signal(sem)
    pl.semaphore_wait(sem, 3)  # (two signals in all)
    o_ref[...] = jnp.zeros((128,), I32)
  with pytest.raises(ps.DeadlockError, match="semaphore_wait on global semaphore") as e:
    ps.run(k, backend="sim")
  assert "(for 3; it holds 2)" in str(e.value), str(e.value)  # (what it still lacks)


def values_kernel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4,), I32))
  def k(o_ref):
    g = pl.get_global(plgpu.SemaphoreType.REGULAR)
    pl.semaphore_signal(g, 5)
    o_ref[0] = pl.semaphore_read(g)
    pl.semaphore_wait(g, 2)                   # decrements by 2
    o_ref[1] = pl.semaphore_read(g)
    plgpu.semaphore_wait(g, 3, decrement=False, memory_scope="gpu")
    o_ref[2] = pl.semaphore_read(g)
    plgpu.semaphore_signal(g, -3, memory_scope="gpu")  # (an add of 2^32 - 3)
    o_ref[3] = pl.semaphore_read(g)
  return k


def test_values_signal_wait_and_read_as_the_lowering_defines():
  np.testing.assert_array_equal(ps.run(values_kernel(), backend="sim"), [5, 3, 3, 0])


def per_block_kernel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((3,), I32), grid=(3,),
                grid_names=("x",))
  def k(o_ref):
    b = lax.axis_index("x")

    @functools.partial(pl.run_scoped, sem=plgpu.SemaphoreType.REGULAR)
    def _(sem):
      pl.semaphore_signal(sem, 2)
      o_ref[b] = pl.semaphore_read(sem) + b
      pl.semaphore_wait(sem, 2)
  return k


def test_run_scoped_semaphores_are_per_block_and_start_at_zero():
  np.testing.assert_array_equal(ps.run(per_block_kernel(), backend="sim"), [2, 3, 4])


def parallel_signal_kernel():
  """Block 1 writes its row, then signals two global semaphores at once;
  block 0 waits on both and copies the row."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32), grid=(2,),
                grid_names=("x",))
  def k(o_ref):
    b = lax.axis_index("x")
    sems = pl.get_global(plgpu.SemaphoreType.REGULAR((2,)))

    @pl.when(b == 1)
    def _():
      o_ref[1] = jnp.full((128,), 7.0, jnp.float32)
      plgpu.semaphore_signal_parallel(
          plgpu.SemaphoreSignal(sems.at[0], device_id=None, inc=1),
          plgpu.SemaphoreSignal(sems.at[1], device_id=None, inc=2))

    @pl.when(b == 0)
    def _():
      pl.semaphore_wait(sems.at[1], 2)
      pl.semaphore_wait(sems.at[0], 1)
      o_ref[0] = o_ref[1] + 1.0
  return k


def test_semaphore_signal_parallel_signals_each_and_releases_the_writes_before():
  out = np.asarray(ps.run(parallel_signal_kernel(), backend="sim"))
  np.testing.assert_array_equal(out, [[8.0] * 128, [7.0] * 128])


def test_a_hand_off_through_a_global_semaphore_takes_what_the_h200_took():
  """A round trip between two blocks is two hand-offs, each the measured
  hand-off's latency after the signal (never before it: a block whose clock is
  behind the signal sees the count no sooner); the H200 took 3950 cycles
  (sem_pingpong). A wait whose count is long there costs one poll."""
  from lab import calibrate
  from pallas_sim import gpus
  cyc = []
  for n in (20, 60):
    b = calibrate._build_sem_pingpong(n)
    r = ps.estimate(b.fn, *b.args, gpu="h200", clock_mhz=1980)
    cyc.append(r.kernels[0].block_cycles_max)
  per = (cyc[1] - cyc[0]) / 40
  lat = gpus.H200.semaphore_latency
  assert 2 * lat <= per <= 2 * lat + 60
  assert abs(per - 3950.4) / 3950.4 < 0.02

  def late(wait):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
    def k(o_ref):
      sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
      pl.semaphore_signal(sem, 1)
      o_ref[...] = jnp.zeros((128,), jnp.float32)
      pl.delay(10000)  # (ns: ~20k cycles)
      if wait:
        pl.semaphore_wait(sem, 1)  # (signalled long ago: one poll)
    return ps.estimate(k, gpu="h200", clock_mhz=1980).kernels[0].block_cycles_max
  poll = late(True) - late(False)
  assert gpus.H200.gmem_load_latency <= poll < gpus.H200.gmem_load_latency + 20


def test_a_semaphore_read_is_a_load_of_gmem():
  def k(n_reads):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), I32))
    def kern(o_ref):
      g = pl.get_global(plgpu.SemaphoreType.REGULAR)
      v = I32(0)
      for _ in range(n_reads):
        v = v + pl.semaphore_read(g)
      o_ref[...] = jnp.full((128,), v, I32)
    return kern
  from pallas_sim import gpus
  one, five = (ps.estimate(k(n), gpu="h200", clock_mhz=1980).kernels[0].block_cycles_max
               for n in (1, 5))
  assert five - one >= 4 * gpus.H200.gmem_load_latency
