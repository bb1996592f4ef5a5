"""ps.estimate on kernels whose control flow depends on the grid index: each
block's path is followed (backends/sim/blocks/paths.py), one block per path is
simulated, and the report is the full simulation's."""
import jax
import pytest
from hypothesis import given, settings, strategies as st
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.blocks import paths
from test_estimate import _close, _full, _times

F32 = jnp.float32
S = jax.ShapeDtypeStruct


def _estimated(fn, x):
  """fn's estimate from x's shape, its one kernel's report; asserted equal
  to the full simulation's on x (times, tallies, HBM bytes): to the last
  bit where it simulated one block per class, to rounding where it summed
  a persistent loop's iterations (execute/extrapolate.py)."""
  est, full = ps.estimate(fn, S(x.shape, x.dtype)), _full(fn, x)
  if "persistent loop" in est.kernels[0].classes:
    assert _close(_times(est), _times(full))
  else:
    assert _times(est) == _times(full)
  assert est.kernels[0].hbm_bytes == full.kernels[0].hbm_bytes
  return est.kernels[0]


def _grid_paths(nblocks, rows, mod=None, store_every=None):
  """Block b takes tiles b, b + nblocks, ... of 64 of `rows` rows (the last
  cut when rows is not a multiple of 64), loaded by TMA and summed; with
  `mod`, tiles t with t % mod == 0 take extra work; with `store_every`, it
  stores its sum only when b % store_every == 0."""
  tiles = -(-rows // 64)

  def fn(x):
    @plgpu.kernel(out_type=S((nblocks, 64, 128), F32), grid=(nblocks,),
                  grid_names=("b",),
                  scratch_types=[plgpu.SMEM((64, 128), F32), plgpu.SMEM((64, 128), F32),
                                 plgpu.Barrier()])
    def k(x_ref, o_ref, tile, acc, bar):
      b = lax.axis_index("b")
      acc[...] = jnp.zeros((64, 128), F32)

      def step(i, c):
        t = b + i * nblocks
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(t * 64, 64)], tile, bar)
        plgpu.barrier_wait(bar)
        v = tile[...]
        if mod is not None:
          v = lax.cond(t % mod == 0, lambda u: jnp.exp(u) * 0.5 + u, lambda u: u, v)
        acc[...] = acc[...] + v
        return c
      lax.fori_loop(0, (tiles - b + nblocks - 1) // nblocks, step, None)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(acc, o_ref.at[b], predicate=None if store_every is None
                              else b % store_every == 0)
      plgpu.wait_smem_to_gmem(0)
    return k(x)
  return fn


def _persistent(nblocks, tiles):
  """Block b handles tiles b, b + nblocks, ... of a (64 * tiles, 128) array:
  some blocks one more than the others."""
  return _grid_paths(nblocks, 64 * tiles)


def _cluster_paths(nclusters, tiles):
  """Clusters of two blocks: cluster g takes tiles g, g + nclusters, ... of
  64 of (64 * tiles, 128) rows, each multicast into both blocks' SMEM (each
  block loading its half), summed; a cluster barrier between tiles."""
  def fn(x):
    @plgpu.kernel(out_type=S((nclusters, 2, 64, 128), F32), grid=(nclusters,),
                  grid_names=("g",), cluster=(2,), cluster_names=("c",),
                  scratch_types=[plgpu.SMEM((64, 128), F32), plgpu.SMEM((64, 128), F32),
                                 plgpu.Barrier(),
                                 plgpu.ClusterBarrier(collective_axes=("c",))])
    def k(x_ref, o_ref, tile, acc, bar, cbar):
      g, c = lax.axis_index("g"), lax.axis_index("c")
      acc[...] = jnp.zeros((64, 128), F32)

      def step(i, carry):
        t = g + i * nclusters
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(t * 64, 64)], tile, bar,
                                collective_axes="c")
        plgpu.barrier_wait(bar)
        acc[...] = acc[...] + tile[...] * (c + 1).astype(F32)
        plgpu.barrier_arrive(cbar)
        plgpu.barrier_wait(cbar)
        return carry
      lax.fori_loop(0, (tiles - g + nclusters - 1) // nclusters, step, None)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(acc, o_ref.at[g, c])
      plgpu.wait_smem_to_gmem(0)
    return k(x)
  return fn


def test_a_persistent_kernel_simulates_one_block_per_trip_count():
  fn = _persistent(nblocks=6, tiles=15)   # 3 blocks take 3 tiles, 3 take 2
  x = jnp.asarray(np.random.default_rng(0).standard_normal((15 * 64, 128)), F32)
  est = ps.estimate(fn, S(x.shape, F32))
  [k] = est.kernels
  assert k.simulated_blocks == 2
  assert "2 class(es) by the path each block takes" in k.classes
  full = _full(fn, x)
  assert _times(est) == _times(full)
  # every tile read once from HBM, each block's loads at its own sources
  assert k.hbm_bytes == full.kernels[0].hbm_bytes == 15 * 64 * 128 * 4 + 6 * 64 * 128 * 4
  assert k.block_cycles_max > k.block_cycles_min


def test_a_long_persistent_loop_is_timed_by_its_iterations():
  """6 blocks over 483 tiles (81 or 80 each): the classes would simulate
  two blocks of 80 iterations; one block's first iteration and one after
  it stand for all (execute/extrapolate.py), to rounding."""
  fn = _persistent(nblocks=6, tiles=483)
  x = jnp.asarray(np.random.default_rng(0).standard_normal((483 * 64, 128)), F32)
  k = _estimated(fn, x)
  assert k.simulated_blocks == 1
  assert ("persistent loop's 483 iterations over 6 blocks take 1 path(s): 2 iterations "
          "in 1 blocks simulated") in k.classes
  assert k.hbm_bytes == 483 * 64 * 128 * 4 + 6 * 64 * 128 * 4
  assert k.block_cycles_max > k.block_cycles_min


def _inner_trips(x):
  """A loop inside a loop: the inner one's trip count is the block's (a
  loop in another is no persistent loop: its trip count is a decision)."""
  @plgpu.kernel(out_type=S((4, 128), F32), grid=(4,), grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")

    def outer(i, v):
      return lax.fori_loop(0, b + i, lambda j, u: u * 1.5 + 1.0, v)
    o_ref[b] = lax.fori_loop(0, 2, outer, x_ref[b])
  return k(x)


def test_an_inner_loops_trip_count_is_part_of_the_path():
  k = _estimated(_inner_trips, jnp.ones((4, 128), F32))
  assert k.simulated_blocks == 4 and "4 class(es)" in k.classes
  assert k.block_cycles_max > k.block_cycles_min


def _branchy(x):
  """Equal trip counts, but inside the loop a branch (ALU work, no load)
  taken where (block // 2 + step) is even, twice or once in three steps:
  the path, not the loads, tells the blocks apart; a loop that starts where
  the block says (as causal attention's)."""
  @plgpu.kernel(out_type=S((8, 128), F32), grid=(8,), grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")
    row = x_ref[b]

    def step(i, v):
      return lax.cond((b // 2 + i) % 2 == 0, lambda u: jnp.sin(u) * 2.0 + u,
                      lambda u: u, v)
    o_ref[b] = lax.fori_loop(b // 4, b // 4 + 3, step, row)
  return k(x)


def test_a_branch_without_loads_inside_a_loop_is_part_of_the_path():
  k = _estimated(_branchy, jnp.ones((8, 128), F32))
  assert k.block_cycles_max > k.block_cycles_min
  assert 1 < k.simulated_blocks < 8


def _warps_decide(x):
  """Warp 0 of block 1 alone loads a tile (a decision inside a warp_map)."""
  @plgpu.kernel(out_type=S((4, 32, 32), F32), grid=(4,), grid_names=("b",),
                scratch_types=[plgpu.SMEM((32, 32), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    b = lax.axis_index("b")

    @plgpu.warp_map
    def _(warp):
      @pl.when((warp == 0) & (b == 1))
      def _():
        plgpu.copy_gmem_to_smem(x_ref.at[b], smem, bar)
        plgpu.barrier_wait(bar)
        plgpu.copy_smem_to_gmem(smem, o_ref.at[b])
        plgpu.wait_smem_to_gmem(0)
  return k(x)


def test_decisions_inside_a_warp_map_are_followed():
  k = _estimated(_warps_decide, jnp.ones((4, 32, 32), F32))
  assert k.simulated_blocks == 2 and k.block_cycles_max > k.block_cycles_min
  assert "1 of" not in k.classes and "2 class(es)" in k.classes


def _loading_warp(x):
  """A producer warpgroup whose warp 0 streams block b's first b // 2 + 1
  tiles (a causal bound) through two slots to a consumer warpgroup, which sums
  them (as a warp-specialized attention's TMA warp feeds its compute)."""
  nblocks = x.shape[0] // 64

  @plgpu.kernel(out_type=S((nblocks, 64, 128), F32), grid=(nblocks,), grid_names=("b",),
                num_threads=2, thread_name="wg",
                scratch_types=[plgpu.SMEM((2, 64, 128), F32), plgpu.Barrier(num_barriers=2),
                               plgpu.Barrier(num_arrivals=1, num_barriers=2)])
  def k(x_ref, o_ref, tiles, loaded, consumed):
    b, wg = lax.axis_index("b"), lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      @plgpu.warp_map
      def _(warp):
        @pl.when(warp == 0)
        def _():
          @pl.loop(0, b // 2 + 1)
          def _(i):
            s = i % 2

            @pl.when(i >= 2)
            def _():
              plgpu.barrier_wait(consumed.at[s])
            plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * 64, 64)], tiles.at[s], loaded.at[s])

    @pl.when(wg == 1)
    def _():
      def step(i, acc):
        s = i % 2
        plgpu.barrier_wait(loaded.at[s])
        acc = acc + tiles[s]
        plgpu.barrier_arrive(consumed.at[s])
        return acc
      o_ref[b] = lax.fori_loop(0, b // 2 + 1, step, jnp.zeros((64, 128), F32))
  return k(x)


def test_a_warp_s_loads_in_a_loop_bounded_by_the_block_are_followed():
  k = _estimated(_loading_warp, jnp.ones((4 * 64, 128), F32))
  assert k.simulated_blocks == 2 and "2 class(es)" in k.classes
  assert k.block_cycles_max > k.block_cycles_min  # (two tiles against one)


def _warp0_copies(src, dst, smem, bar):
  """Forks the warpgroup's warps; warp 0 copies src to dst through smem."""
  @plgpu.warp_map
  def _(warp):
    @pl.when(warp == 0)
    def _():
      plgpu.copy_gmem_to_smem(src, smem, bar)
      plgpu.barrier_wait(bar)
      plgpu.copy_smem_to_gmem(smem, dst)
      plgpu.wait_smem_to_gmem(0)


def _warps_each_step(x):
  """Warpgroup 0 loops over block b's first b // 2 + 1 tiles, forking its
  warps each step (warp 0 copies the tile through SMEM); warpgroup 1 idles."""
  @plgpu.kernel(out_type=S((4, 32, 32), F32), grid=(4,), grid_names=("b",),
                num_threads=2, thread_name="wg",
                scratch_types=[plgpu.SMEM((32, 32), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    b, wg = lax.axis_index("b"), lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      @pl.loop(0, b // 2 + 1)
      def _(t):
        _warp0_copies(x_ref.at[t], o_ref.at[b], smem, bar)
  return k(x)


def test_a_loop_that_forks_warps_each_step_is_followed():
  k = _estimated(_warps_each_step, jnp.ones((4, 32, 32), F32))
  assert k.simulated_blocks == 2 and k.block_cycles_max > k.block_cycles_min


def _persistent_warps(x):
  """A persistent loop over tiles whose every iteration forks warps."""
  @plgpu.kernel(out_type=S((6, 32, 32), F32), grid=(2,), grid_names=("b",),
                scratch_types=[plgpu.SMEM((32, 32), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    b = lax.axis_index("b")

    @pl.loop(b, 6 - b, step=1)
    def _(t):
      _warp0_copies(x_ref.at[t], o_ref.at[t], smem, bar)
  return k(x)


def test_a_kernel_the_slice_cannot_follow_runs_every_block_and_says_why():
  k = _estimated(_persistent_warps, jnp.ones((6, 32, 32), F32))
  assert k.simulated_blocks == 2
  assert "its paths were not followed (a persistent loop whose iterations fork warps" in (
      k.classes)


def test_the_slice_leaves_out_the_math_no_decision_or_address_needs():
  def k(x, i):
    b = lax.axis_index("b")
    y = jnp.sin(x) * 3.0              # (values only: not in the slice)
    n = b * 2 + i                     # (a trip count: in it)
    return lax.fori_loop(0, n, lambda j, v: v + 1.0, y)
  jaxpr = jax.make_jaxpr(k, axis_env=[("b", 4)])(S((8,), F32), S((), jnp.int32)).jaxpr
  keep = paths.kernel_slice(jaxpr)
  names = {e.primitive.name for e in jaxpr.eqns if id(e) in keep}
  assert {"axis_index", "mul", "add", "while"} <= names
  assert "sin" not in names
  [loop] = [e for e in jaxpr.eqns if e.primitive.name == "while"]
  body = loop.params["body_jaxpr"].jaxpr
  # the body's counter is in the slice, its float add is not
  kept_body = {e.primitive.name for e in body.eqns if id(e) in keep}
  assert kept_body == {"add"} and [str(e.outvars[0].aval.dtype) for e in body.eqns
                                   if id(e) in keep] == ["int32"]


def _cut_tiles(x):
  """Blocks of equal trip counts, one of whose tiles reaches past the
  array's end: TMA cuts its box (fewer bytes), so its path differs."""
  nblocks, rows = 3, x.shape[0]
  tiles = -(-rows // 64)

  @plgpu.kernel(out_type=S((nblocks, 64, 128), F32), grid=(nblocks,), grid_names=("b",),
                scratch_types=[plgpu.SMEM((64, 128), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, tile, bar):
    b = lax.axis_index("b")

    def step(i, c):
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds((b + i * nblocks) * 64, 64)], tile, bar)
      plgpu.barrier_wait(bar)
      return c
    lax.fori_loop(0, (tiles - b + nblocks - 1) // nblocks, step, None)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(tile, o_ref.at[b])
    plgpu.wait_smem_to_gmem(0)
  return k(x)


def test_a_box_cut_at_the_arrays_end_is_part_of_the_path():
  x = jnp.ones((6 * 64 - 40, 128), F32)   # 6 tiles, two per block, the last cut
  k = _estimated(_cut_tiles, x)
  assert k.simulated_blocks == 2 and k.tma_load_bytes == x.size * 4


def _store_when(x):
  """Only block 2 stores: the one decision on the grid index a store's."""
  @plgpu.kernel(out_type=S((4, 64, 128), F32), grid=(4,), grid_names=("b",),
                scratch_types=[plgpu.SMEM((64, 128), F32)])
  def k(x_ref, o_ref, tile):
    b = lax.axis_index("b")
    tile[...] = jnp.full((64, 128), 1.0, F32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(tile, o_ref.at[b], predicate=b == 2)
    plgpu.wait_smem_to_gmem(0)
  return k(x)


def test_a_stores_predicate_on_the_grid_index_is_a_decision():
  k = _estimated(_store_when, jnp.ones((4, 64, 128), F32))
  assert "grid index" in k.classes and k.simulated_blocks == 2
  assert k.tma_store_bytes == 64 * 128 * 4
  assert k.block_cycles_max > k.block_cycles_min


def _block_by_block(monkeypatch):
  def refuse(*a):
    raise paths.NotLanes("test")
  monkeypatch.setattr(paths, "as_lanes", refuse)


@pytest.mark.parametrize("fn, shape", [
    (_persistent(nblocks=64, tiles=150), (150 * 64, 128)),  # (64 lanes: a shape's size)
    (_branchy, (8, 128)), (_cut_tiles, (344, 128)), (_grid_paths(4, 4 * 64, store_every=3), (4 * 64, 128)),
    (_cluster_paths(5, 13), (13 * 64, 128))])  # (clusters: each place's blocks as lanes)
def test_blocks_as_lanes_take_the_paths_they_take_one_by_one(fn, shape, monkeypatch):
  """The slice runs every block at once, as lanes of its values, splitting
  where they decide apart: the same paths, loads and times as block by
  block, and as the full simulation."""
  runs = []
  lanes = paths.as_lanes

  def as_lanes(*a):
    runs.append(lanes(*a))  # (only where the lanes did not give up)
    return runs[-1]
  monkeypatch.setattr(paths, "as_lanes", as_lanes)
  est = ps.estimate(fn, S(shape, F32))
  assert runs  # (as lanes: loops carrying arrays the slice does not compute too)
  _block_by_block(monkeypatch)
  assert _times(est) == _times(ps.estimate(fn, S(shape, F32)))
  assert _times(est) == _times(_full(fn, jnp.ones(shape, F32)))


def _arange_decides(x):
  """A decision on an array of 128 computed from the block index, in a
  127-block launch: 127 lanes and a padding one would pass for the array's
  own axis."""
  @plgpu.kernel(out_type=S((127, 128), F32), grid=(127,), grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")
    iota = plgpu.broadcasted_iota(jnp.int32, (128,), 0, layout=plgpu.Layout.WG_STRIDED((128,), 1))
    n = (iota * b).max() // 1000
    o_ref[b] = lax.fori_loop(0, n, lambda i, v: v * 2.0, x_ref[b])
  return k(x)


def test_lanes_never_pass_for_an_arrays_own_axis():
  k = _estimated(_arange_decides, jnp.ones((127, 128), F32))
  # (trip counts 0..16: 17 classes, or their loops' iterations)
  assert k.simulated_blocks <= 17 and k.block_cycles_max > k.block_cycles_min



@settings(max_examples=25, deadline=None)
@given(nblocks=st.integers(1, 9), rows=st.integers(1, 20 * 64),
       mod=st.integers(1, 4), store_every=st.integers(1, 3))
def test_estimate_equals_the_simulation_on_any_grid_dependent_paths(nblocks, rows, mod,
                                                                     store_every):
  fn = _grid_paths(nblocks, rows, mod, store_every)
  x = jnp.ones((rows, 128), F32)
  _estimated(fn, x)


def _lane_through_a_size_one_axis(x):
  """A decision through an array of size 1 picked by the block index:
  numpy would broadcast the lanes into that axis (found by a review)."""
  @plgpu.kernel(out_type=S((4, 128), F32), grid=(4,), grid_names=("b",),
                compiler_params=plgpu.CompilerParams(
                    lowering_semantics=plgpu.LoweringSemantics.Lane))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")
    v = lax.select_n(b % 2 == 0, jnp.zeros((1,), jnp.int32), jnp.full((1,), 3, jnp.int32))
    n = lax.squeeze(lax.slice(v, (0,), (1,)), (0,))
    o_ref[b] = lax.fori_loop(0, n, lambda i, u: jnp.exp(u) * 0.5 + u, x_ref[b])
  return k(x)


def test_lanes_never_pass_for_an_axis_of_size_one():
  k = _estimated(_lane_through_a_size_one_axis, jnp.ones((4, 128), F32))
  assert k.simulated_blocks == 2 and k.block_cycles_max > k.block_cycles_min


def _barrier_by_block(with_branch):
  """Which barrier a block waits on first comes from its index: a small
  load completes one, a large one the other (found by a review)."""
  def fn(x):
    @plgpu.kernel(out_type=S((4, 8, 128), F32), grid=(4,), grid_names=("b",),
                  scratch_types=[plgpu.SMEM((128, 128), F32), plgpu.SMEM((8, 128), F32),
                                 plgpu.Barrier(num_barriers=2)])
    def k(x_ref, o_ref, big, small, bars):
      b = lax.axis_index("b")
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(0, 8)], small, bars.at[1])
      plgpu.copy_gmem_to_smem(x_ref, big, bars.at[0])
      plgpu.barrier_wait(bars.at[b % 2])
      v = small[...]
      for _ in range(40):
        v = jnp.exp(v) * 0.5 + v
      small[...] = v
      plgpu.barrier_wait(bars.at[1 - b % 2])
      if with_branch:
        @pl.when(b == 0)
        def _():
          small[...] = small[...] * 2.0
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(small, o_ref.at[b])
      plgpu.wait_smem_to_gmem(0)
    return k(x)
  return fn


def _arrive_when(x):
  """Thread 1 arrives early in even blocks, late in odd ones (an arrive's
  predicate on the block index; found by a review)."""
  @plgpu.kernel(out_type=S((4, 128), F32), grid=(4,), grid_names=("b",),
                num_threads=2, thread_name="wg",
                scratch_types=[plgpu.Barrier(num_arrivals=1)])
  def k(x_ref, o_ref, bar):
    b = lax.axis_index("b")
    w = lax.axis_index("wg")

    @pl.when(w == 1)
    def _():
      plgpu.barrier_arrive(bar, predicate=b % 2 == 0)
      v = x_ref[b]
      for _ in range(40):
        v = jnp.exp(v) * 0.5 + v
      plgpu.barrier_arrive(bar, predicate=b % 2 == 1)
      o_ref[b] = v

    @pl.when(w == 0)
    def _():
      plgpu.barrier_wait(bar)
      o_ref[b] = x_ref[b] * 2.0
  return k(x)


def _cut_store(x):
  """The last of three 64-row tiles of 150 rows is cut (found by a review)."""
  @plgpu.kernel(out_type=S((150, 128), F32), grid=(3,), grid_names=("b",),
                scratch_types=[plgpu.SMEM((64, 128), F32)])
  def k(x_ref, o_ref, tile):
    b = lax.axis_index("b")
    tile[...] = jnp.full((64, 128), 1.0, F32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(tile, o_ref.at[pl.ds(b * 64, 64)])
    plgpu.wait_smem_to_gmem(0)
  return k(x)


@pytest.mark.parametrize("fn, shape", [
    (_barrier_by_block(False), (128, 128)), (_barrier_by_block(True), (128, 128)),
    (_arrive_when, (4, 128)), (_cut_store, (150, 128))])
def test_which_barrier_an_arrives_predicate_and_a_cut_box_are_decisions(fn, shape):
  k = _estimated(fn, jnp.ones(shape, F32))
  assert "grid index" in k.classes and k.block_cycles_max > k.block_cycles_min
