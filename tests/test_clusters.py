"""Clusters: the blocks of a cluster run together (one group), with cluster
axes, TMA multicast into every block of the cluster along its axes, cluster
barriers, and race detection across the cluster's SMEM and GMEM."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

F32 = jnp.float32


def multicast_kernel(issue_all=True, wait_cluster=True, cluster=(2,), tile=(128, 128),
                     clusters=2):
  """Each cluster multicasts tile x[g] into the SMEM of each of its blocks;
  block c writes it scaled by c + 1 to out[g, c]; then a cluster barrier."""
  n = int(np.prod(cluster))
  names = ("c", "d")[:len(cluster)]

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((clusters, n) + tile, F32),
                grid=(clusters,), grid_names=("g",), cluster=cluster, cluster_names=names,
                scratch_types=[plgpu.SMEM(tile, F32), plgpu.Barrier(),
                               plgpu.ClusterBarrier(collective_axes=names)])
  def k(x_ref, o_ref, smem, bar, cbar):
    g = lax.axis_index("g")
    c = lax.axis_index(names)  # (the linear index over the cluster axes)

    @pl.when(jnp.logical_or(issue_all, c == 0))
    def _():
      plgpu.copy_gmem_to_smem(x_ref.at[g], smem, bar, collective_axes=names)
    plgpu.barrier_wait(bar)
    o_ref[g, c] = smem[...] * (c + 1).astype(F32)
    if wait_cluster:
      plgpu.barrier_arrive(cbar)
      plgpu.barrier_wait(cbar)
  return k


def _x(tile=(128, 128)):
  return jnp.asarray(np.random.default_rng(0).standard_normal((2,) + tile), F32)


@pytest.mark.parametrize("cluster", [(2,), (4,), (2, 2)])
def test_multicast_delivers_the_tile_to_every_block_of_the_cluster(cluster):
  x = _x()
  sim = ps.simulate(multicast_kernel(cluster=cluster), x)
  n = int(np.prod(cluster))
  want = np.stack([np.stack([np.asarray(x[g]) * (c + 1) for c in range(n)])
                   for g in range(2)])
  np.testing.assert_array_equal(np.asarray(sim.outputs), want)
  [k] = sim.report.kernels
  assert k.num_blocks == 2 * n and k.grid == (2,)
  # Each block loads its part of the tile only.
  assert k.tma_load_bytes == 2 * 128 * 128 * 4


def test_a_multicast_that_not_every_block_issues_never_completes():
  """Each block loads only its part of a multicast: if block 1 never issues,
  block 0's barrier waits for bytes that never come (a hang on hardware)."""
  with pytest.raises(ps.DeadlockError, match="barrier_wait on bar"):
    ps.run(multicast_kernel(issue_all=False), _x(), backend="sim", check_lowering=False)


def test_cluster_barrier_counts_an_arrival_from_every_block():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 128), F32), grid=(1,),
                grid_names=("g",), cluster=(4,), cluster_names=("c",),
                scratch_types=[plgpu.ClusterBarrier(collective_axes=("c",))])
  def k(o_ref, cbar):
    c = lax.axis_index("c")

    @pl.when(c != 3)  # block 3 never arrives
    def _():
      plgpu.barrier_arrive(cbar)
    plgpu.barrier_wait(cbar)
    o_ref[c] = jnp.full((128,), c, F32)

  with pytest.raises(ps.DeadlockError) as e:
    ps.run(k, backend="sim", check_lowering=False)
  blocked = {name for name, _, _ in e.value.blocked}
  assert blocked == {f"block (0, {c})" for c in range(4)}, blocked


def leader_tracked_gather(followers_wait=False, skip=None, sum_rows=True):
  """Every block of a cluster of 4 writes its row, then arrives on a
  leader-tracked cluster barrier; the leader (block 0) waits for all four
  and sums the rows (sum_rows=False: writes 10s; a non-leader waiting waits
  forever: its copy counts no arrivals). (On an H200 the summing leader
  once read 32 values stale, in ~20600 runs: benchmarks/HISTORY.md.)"""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((5, 128), F32), grid=(1,),
                grid_names=("g",), cluster=(4,), cluster_names=("c",),
                scratch_types=[plgpu.ClusterBarrier(collective_axes=("c",),
                                                    leader_tracked=True)])
  def k(o_ref, cbar):
    c = lax.axis_index("c")
    o_ref[c] = jnp.full((128,), c + 1, F32)

    @pl.when(c != (-1 if skip is None else skip))
    def _():
      plgpu.barrier_arrive(cbar)

    @pl.when(jnp.logical_or(c == 0, followers_wait))
    def _():
      plgpu.barrier_wait(cbar)

    @pl.when(c == 0)
    def _():
      if sum_rows:
        o_ref[4] = o_ref[0] + o_ref[1] + o_ref[2] + o_ref[3]
      else:
        o_ref[4] = jnp.full((128,), 10.0, F32)
  return k


def test_a_leader_tracked_cluster_barrier_completes_in_the_leader_only():
  out = np.asarray(ps.run(leader_tracked_gather(), backend="sim"))
  np.testing.assert_array_equal(out[4], np.full(128, 10.0))
  # Its arrivals are all the leader's: a follower that waits never completes.
  with pytest.raises(ps.DeadlockError) as e:
    ps.run(leader_tracked_gather(followers_wait=True), backend="sim")
  assert {name for name, _, _ in e.value.blocked} == {
      f"block (0, {c})" for c in (1, 2, 3)}
  # And the leader needs every block's arrival.
  with pytest.raises(ps.DeadlockError) as e:
    ps.run(leader_tracked_gather(skip=2), backend="sim")
  assert {name for name, _, _ in e.value.blocked} == {"block (0, 0)"}


def _exchange_kernel(sync):
  """Block 0 of each cluster writes GMEM that block 1 then reads, ordered by
  a cluster barrier (or not)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), F32), grid=(1,),
                grid_names=("g",), cluster=(2,), cluster_names=("c",),
                scratch_types=[plgpu.ClusterBarrier(collective_axes=("c",))])
  def k(x_ref, o_ref, cbar):
    c = lax.axis_index("c")

    @pl.when(c == 0)
    def _():
      o_ref[0] = x_ref[...] + 1.0
    if sync:
      plgpu.barrier_arrive(cbar)
      plgpu.barrier_wait(cbar)

    @pl.when(c == 1)
    def _():
      o_ref[1] = o_ref[0] * 2.0
  return k


def test_a_cluster_barrier_orders_gmem_between_the_blocks_of_a_cluster():
  x = jnp.arange(128, dtype=F32)
  sim = ps.simulate(_exchange_kernel(True), x)
  assert sim.report.races == []
  np.testing.assert_array_equal(np.asarray(sim.outputs)[1], (x + 1) * 2)
  sim = ps.simulate(_exchange_kernel(False), x, on_race="report")
  [race] = sim.report.races
  assert race.kind == "write-read race" and race.second.buffer == "o_ref"


def test_reading_a_multicast_tile_before_its_barrier_races_across_the_cluster():
  """Block 1 reads its SMEM without waiting: the part that block 0's copy
  writes there is unordered with the read."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128, 128), F32), grid=(1,),
                grid_names=("g",), cluster=(2,), cluster_names=("c",),
                scratch_types=[plgpu.SMEM((128, 128), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    c = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_ref.at[0], smem, bar, collective_axes="c")
    o_ref[c] = smem[...]  # too early
    plgpu.barrier_wait(bar)

  sim = ps.simulate(k, _x(), on_race="report", on_uninitialized="report")
  found = {(r.kind, r.first.agent, r.second.agent, r.second.buffer)
           for r in sim.report.races}
  assert ("write-read race", "tma_load", "thread", "smem") in found, found
  assert any(f.kind == "uninitialized read" for f in sim.report.uninitialized)


def cluster_ref_kernel(sync=True, tiled=True, end_sync=True, late=0, clusters=1):
  """Each block of a cluster of 2 loads its half of x into SMEM, then reads
  its peer's SMEM through plgpu.cluster_ref (after a cluster barrier, or
  not), and waits on the cluster barrier again before it ends so that its
  peer is done with its SMEM (`end_sync`), or not. `late`: block 1 sleeps
  that many nanoseconds before its read. `clusters` > 1: a grid of that many
  clusters, each writing its own copy of the output."""
  tr = dict(transforms=(plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))
            ) if tiled else {}

  grid = dict(grid=(clusters,), grid_names=("g",)) if clusters > 1 else {}
  shape = (clusters, 2, 64, 32) if clusters > 1 else (2, 64, 32)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, F32), cluster=(2,),
                cluster_names=("c",), **grid,
                scratch_types=[plgpu.SMEM((64, 32), F32, **tr), plgpu.Barrier(),
                               plgpu.ClusterBarrier(collective_axes=("c",))])
  def k(x_ref, o_ref, smem, bar, cbar):
    c = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_ref.at[c], smem, bar)
    plgpu.barrier_wait(bar)
    if sync:
      plgpu.barrier_arrive(cbar)
      plgpu.barrier_wait(cbar)
    if late:
      @pl.when(c == 1)
      def _():
        pl.delay(late)
    out = o_ref.at[lax.axis_index("g")] if clusters > 1 else o_ref
    out[c] = plgpu.cluster_ref(smem, {"c": 1 - c})[...]
    if end_sync:
      plgpu.barrier_arrive(cbar)
      plgpu.barrier_wait(cbar)
  return k


@pytest.mark.parametrize("tiled", [False, True])
def test_cluster_ref_reads_the_peer_s_smem(tiled):
  x = jnp.arange(2 * 64 * 32, dtype=F32).reshape(2, 64, 32)
  sim = ps.simulate(cluster_ref_kernel(tiled=tiled), x)
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(x)[::-1])


def test_reading_a_peer_s_smem_without_the_cluster_barrier_races():
  x = jnp.arange(2 * 64 * 32, dtype=F32).reshape(2, 64, 32)
  sim = ps.simulate(cluster_ref_kernel(sync=False), x, on_race="report",
                    on_uninitialized="report")
  found = {(r.kind, r.first.agent, r.second.agent, r.second.buffer)
           for r in sim.report.races}
  assert ("write-read race", "tma_load", "thread", "smem") in found, found


@pytest.mark.parametrize("late", [0, 20000])
def test_a_block_that_ends_while_its_peer_reads_its_smem_is_reported(late):
  """Without the cluster barrier at the end, block 0 may end (its SMEM
  released) while block 1 reads that SMEM through cluster_ref: on an H200
  the launch fails (tests/test_gpu.py). Reported with both blocks named,
  whichever comes first in the simulated timing (`late`: the read after the
  end)."""
  x = jnp.arange(2 * 64 * 32, dtype=F32).reshape(2, 64, 32)
  sim = ps.simulate(cluster_ref_kernel(end_sync=False, late=late), x,
                    on_race="report")
  kinds = {r.kind for r in sim.report.races}
  assert "block ends while a peer may access its SMEM" in kinds, kinds
  if late:
    assert "SMEM access after its block ended" in kinds, kinds
  for r in sim.report.races:
    assert {r.first.block, r.second.block} == {(0,), (1,)}, str(r)
    assert "CUDA_ERROR_LAUNCH_FAILED" in r.advice and "cluster barrier" in r.advice
  with pytest.raises(ps.RaceError, match="block ends while a peer"):
    ps.simulate(cluster_ref_kernel(end_sync=False, late=late), x)


def test_a_block_that_ends_after_its_peer_is_done_is_not_reported():
  x = jnp.arange(2 * 64 * 32, dtype=F32).reshape(2, 64, 32)
  sim = ps.simulate(cluster_ref_kernel(late=20000), x)
  assert sim.report.races == []
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(x)[::-1])


def two_thread_cluster_kernel(end_sync=True):
  """Blocks of two threads in a cluster of 2: thread 1 of each block loads
  its half of x, reads its peer's SMEM through cluster_ref between two
  cluster barriers (the second, `end_sync`, so that its own SMEM outlives
  the peer's read), while thread 0 only waits for TMA loads of its own,
  one after another: it ends last, and the block ends after both."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64, 32), F32), cluster=(2,),
                cluster_names=("c",), num_threads=2, thread_name="t",
                scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.Barrier(),
                               plgpu.ClusterBarrier(collective_axes=("c",)),
                               plgpu.SMEM((64, 32), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar, cbar, own, own_bar):
    c = lax.axis_index("c")

    @pl.when(lax.axis_index("t") == 0)
    def _():
      for _ in range(6):
        plgpu.copy_gmem_to_smem(x_ref.at[c], own, own_bar)
        plgpu.barrier_wait(own_bar)

    @pl.when(lax.axis_index("t") == 1)
    def _():
      plgpu.copy_gmem_to_smem(x_ref.at[c], smem, bar)
      plgpu.barrier_wait(bar)
      plgpu.barrier_arrive(cbar)
      plgpu.barrier_wait(cbar)
      o_ref[c] = plgpu.cluster_ref(smem, {"c": 1 - c})[...]
      if end_sync:
        plgpu.barrier_arrive(cbar)
        plgpu.barrier_wait(cbar)
  return k


def test_a_block_ends_when_all_its_threads_have():
  """The block's end is ordered after what each of its threads knew, not
  only the thread that ended last: thread 1 waited for the peer's read,
  thread 0 (the last to end) knows nothing of it."""
  x = jnp.arange(2 * 64 * 32, dtype=F32).reshape(2, 64, 32)
  sim = ps.simulate(two_thread_cluster_kernel(), x)
  assert sim.report.races == []
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(x)[::-1])
  sim = ps.simulate(two_thread_cluster_kernel(end_sync=False), x, on_race="report")
  kinds = {r.kind for r in sim.report.races}
  assert "block ends while a peer may access its SMEM" in kinds, kinds


def test_reports_of_a_grid_of_clusters_fold_by_the_blocks_place_in_its_cluster():
  """Sites name a block by its coordinates in its cluster: a race in every
  cluster of the grid is one report per pair of places, with an occurrence
  per cluster, not a report per block of the grid."""
  x = jnp.arange(2 * 64 * 32, dtype=F32).reshape(2, 64, 32)
  sim = ps.simulate(cluster_ref_kernel(sync=False, clusters=4), x, on_race="report")
  found = [r for r in sim.report.races if r.kind == "write-read race"]
  assert len(found) == 2, "\n".join(map(str, found))
  assert {(r.first.block, r.second.block) for r in found} == {((1,), (0,)), ((0,), (1,))}
  assert all(r.count == 4 and "of cluster block" in str(r) for r in found)
  np.testing.assert_array_equal(
      np.asarray(ps.simulate(cluster_ref_kernel(clusters=4), x).outputs),
      np.broadcast_to(np.asarray(x)[::-1], (4, 2, 64, 32)))


def test_a_peer_past_the_cluster_is_out_of_bounds_at_its_line():
  """cluster_ref's index is checked against the cluster's size in each
  block: block 1 names peer 2 of a cluster of 2."""
  def body(x_ref, o_ref, smem, bar, cbar):
    c = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_ref.at[c], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.barrier_arrive(cbar)
    plgpu.barrier_wait(cbar)
    o_ref[c] = plgpu.cluster_ref(smem, {"c": c + 1})[...]
    plgpu.barrier_arrive(cbar)
    plgpu.barrier_wait(cbar)
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 64, 32), F32), cluster=(2,),
                   cluster_names=("c",),
                   scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.Barrier(),
                                  plgpu.ClusterBarrier(collective_axes=("c",))])
  with pytest.raises(ps.OutOfBoundsError) as e:
    ps.run(k, jnp.ones((2, 64, 32), F32), backend="sim")
  msg = str(e.value)
  assert "index 2 along cluster axis 'c' of size 2" in msg and "block (1,)" in msg
  assert "test_clusters.py:" in msg and 'cluster_ref(smem, {"c": c + 1})' in msg


def test_a_peer_s_reload_before_its_reader_is_done_is_blamed_on_the_cluster_barrier():
  """Each block reloads its tile every iteration while its peer may still be
  reading the last one through cluster_ref: the cluster barrier is passed
  only before the read. The report says so (an arrival after the read, that
  the reloading block waits for), and not that a wait was for an earlier
  phase of the reloading block's own TMA barrier, which the reader never
  waits on."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((3, 2, 64, 32), F32), cluster=(2,),
                cluster_names=("c",),
                scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.Barrier(),
                               plgpu.ClusterBarrier(collective_axes=("c",))])
  def k(x_ref, o_ref, smem, bar, cbar):
    c = lax.axis_index("c")

    @pl.loop(0, 3)
    def _(i):
      plgpu.copy_gmem_to_smem(x_ref.at[i, c], smem, bar)
      plgpu.barrier_wait(bar)
      plgpu.barrier_arrive(cbar)
      plgpu.barrier_wait(cbar)
      o_ref[i, c] = plgpu.cluster_ref(smem, {"c": 1 - c})[...]
    plgpu.barrier_arrive(cbar)
    plgpu.barrier_wait(cbar)

  x = jnp.arange(3 * 2 * 64 * 32, dtype=F32).reshape(3, 2, 64, 32)
  races = ps.simulate(k, x, on_race="report", on_uninitialized="report").report.races
  assert {(r.kind, r.first.agent, r.second.agent) for r in races} == {
      ("read-write race", "thread", "tma_load")}
  for r in races:
    text = str(r)
    assert "arrives on cbar only before its read" in text, text
    assert "it takes an arrival after the read" in text, text
    assert "earlier phase" not in text and "parity" not in text, text
