"""Warp-level code (plgpu.warp_map, pl.kernel over a WarpMesh): the four
warps of a warpgroup run as tasks of their own between a fork and a join,
each with a clock of its own for race detection."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

I32 = jnp.int32


def _sim(*args, **kw):
  sim = ps.simulate(*args, **kw)
  return sim.outputs, sim.report


def warp_ids():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((8,), I32), num_threads=2,
                thread_name="wg")
  def k(out_ref):
    wg = lax.axis_index("wg")

    @plgpu.warp_map
    def _(warp):
      out_ref[wg * 4 + warp] = warp * 10 + wg
  return k


def test_each_warp_runs_with_its_warp_id():
  out = ps.run(warp_ids(), backend="sim")
  np.testing.assert_array_equal(out, [0, 10, 20, 30, 1, 11, 21, 31])


def ping_pong(rounds=3):
  """Warps 0 and 1 hand a counter back and forth through two barriers:
  each waits for the other every round, so run one after the other they
  would deadlock."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2 * rounds,), I32),
                scratch_types=[plgpu.Barrier(), plgpu.Barrier()])
  def k(out_ref, ping, pong):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        @pl.loop(0, rounds)
        def _(i):
          out_ref[2 * i] = 2 * i
          plgpu.barrier_arrive(ping)
          plgpu.barrier_wait(pong)

      @pl.when(warp == 1)
      def _():
        @pl.loop(0, rounds)
        def _(i):
          plgpu.barrier_wait(ping)
          out_ref[2 * i + 1] = out_ref[2 * i] + 1
          plgpu.barrier_arrive(pong)
  return k


def test_warps_run_concurrently_and_synchronize_through_barriers():
  out, report = _sim(ping_pong(), check_uninitialized=False)
  np.testing.assert_array_equal(out, np.arange(6))
  assert report.races == []


def tma_between_warps(wait=True):
  """Warp 0 issues a TMA load; warp 1 waits on its barrier (or not) and
  stores the SMEM back with a TMA store."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((32, 32), jnp.float32),
                scratch_types=[plgpu.SMEM((32, 32), jnp.float32), plgpu.Barrier()])
  def k(x_ref, y_ref, smem, bar):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        plgpu.copy_gmem_to_smem(x_ref.at[32:64], smem, bar)

      @pl.when(warp == 1)
      def _():
        if wait:
          plgpu.barrier_wait(bar)
        plgpu.copy_smem_to_gmem(smem, y_ref)
        plgpu.wait_smem_to_gmem(0)
    if not wait:
      plgpu.barrier_wait(bar)
  return k


def test_a_tma_load_issued_by_one_warp_is_awaited_by_another():
  x = jax.random.uniform(jax.random.key(0), (64, 32), jnp.float32)
  out, report = _sim(tma_between_warps(), x)
  np.testing.assert_array_equal(out, x[32:64])
  assert report.races == []


def test_a_warp_that_does_not_wait_for_another_warps_tma_load_races():
  x = jax.random.uniform(jax.random.key(0), (64, 32), jnp.float32)
  _, report = _sim(tma_between_warps(wait=False), x, on_race="report",
                          check_uninitialized=False)
  text = "\n".join(str(r) for r in report.races)
  # (the store's read came first in this timing: read-write)
  assert "read-write race on smem" in text, text
  assert "TMA load issued by thread 0 warp 0" in text
  assert "TMA store issued by thread 0 warp 1" in text


def gmem_between_warps(sync):
  """Warp 0 stores a scalar; warp 1 (unsynchronized) or the warpgroup after
  the warp_map (ordered by its join) copies it."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2,), I32))
  def k(x_ref, out_ref):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        out_ref[0] = x_ref[0]

      if not sync:
        @pl.when(warp == 1)
        def _():
          out_ref[1] = out_ref[0]
    if sync:
      out_ref[1] = out_ref[0]
  return k


def test_plain_accesses_of_two_warps_race_unless_the_join_orders_them():
  x = jnp.array([7], I32)
  out, report = _sim(gmem_between_warps(sync=True), x)
  np.testing.assert_array_equal(out, [7, 7])
  assert report.races == []
  _, report = _sim(gmem_between_warps(sync=False), x, on_race="report")
  text = "\n".join(str(r) for r in report.races)
  assert len(report.races) == 1, text
  assert "write-read race" in text
  assert "write of out_ref by thread 0 warp 0" in text
  assert "read of out_ref by thread 0 warp 1" in text


def barrier_test_kernel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((5,), I32),
                scratch_types=[plgpu.Barrier(num_barriers=2)])
  def k(o_ref, bars):
    def body():
      o_ref[0] = plgpu.barrier_test(bars.at[0]).astype(I32)
      o_ref[1] = plgpu.barrier_test(bars.at[1]).astype(I32)
      plgpu.barrier_arrive(bars.at[0])
      o_ref[2] = plgpu.barrier_test(bars.at[0]).astype(I32)
      o_ref[3] = plgpu.barrier_test(bars.at[1]).astype(I32)
      plgpu.barrier_arrive(bars.at[1])
      o_ref[4] = plgpu.barrier_test(bars.at[1]).astype(I32)
    plgpu.warp_map(lambda w: pl.when(w == 0)(body))
  return k


def test_barrier_test_is_a_wait_that_does_not_block():
  np.testing.assert_array_equal(ps.run(barrier_test_kernel(), backend="sim"),
                                [0, 0, 1, 0, 1])


def test_warps_that_waited_unequally_leave_the_barrier_phase_undefined():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), I32),
                scratch_types=[plgpu.Barrier()])
  def k(o_ref, bar):
    plgpu.barrier_arrive(bar)

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        plgpu.barrier_wait(bar)
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = jnp.zeros((128,), I32)
  with pytest.raises(ps.KernelError, match="warps waited on this barrier different"):
    ps.run(k, backend="sim")


def test_what_the_lowering_rejects_in_a_warp_raises_the_lowerings_error():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2,), I32))
  def k(x_ref, y_ref):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 1)
      def _():
        y_ref[...] = x_ref[...]  # (a vector load: warps load scalars only)
  # As on the GPU: the lowering's ValueError, also one of ours.
  with pytest.raises(ValueError, match="Can only load scalars") as e:
    ps.run(k, jnp.ones((2,), I32), backend="sim")
  assert isinstance(e.value, ps.LoweringError)
  assert "test_warps.py" in str(e.value)


def one_warp_waits_each_map(maps=3, warpgroup_waits=False):
  """A warp_map per step in which warp 1 alone waits on a barrier warp 0's
  TMA load completes (tokamax's quantized ragged dot waits on its output
  barrier so, tile after tile): warp 1's lanes keep their own phase, map
  after map. A wait of the whole warpgroup after that is an error: its
  lanes disagree on the phase."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((maps, 128), jnp.float32),
                scratch_types=[plgpu.SMEM((maps, 128), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    for m in range(maps):
      @plgpu.warp_map
      def _(warp):
        @pl.when(warp == 0)
        def _():
          plgpu.copy_gmem_to_smem(x_ref.at[m], smem.at[m], bar)

        @pl.when(warp == 1)
        def _():
          plgpu.barrier_wait(bar)
    if warpgroup_waits:
      plgpu.barrier_wait(bar)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)
  return k


def test_a_warp_that_alone_waits_on_a_barrier_keeps_its_phase_across_maps():
  x = jnp.arange(3 * 128, dtype=jnp.float32).reshape(3, 128)
  out, report = _sim(one_warp_waits_each_map(), x)
  np.testing.assert_array_equal(out, x)
  assert report.races == []
  with pytest.raises(ps.KernelError, match="its warps waited on this barrier different "
                                           "numbers of times"):
    ps.run(one_warp_waits_each_map(warpgroup_waits=True), x, backend="sim")
