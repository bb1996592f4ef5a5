"""ps.estimate of persistent kernels by their loop's iterations
(backends/sim/execute/extrapolate.py), with paths that read the
inputs whose values the estimate has (blocks/paths.py known_reads): the
full simulation's times, to rounding, from a few iterations of a few
blocks."""
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.blocks import paths
from test_estimate import _close, _times

F32 = jnp.float32
S = jax.ShapeDtypeStruct


def _every_block(fn, *args):
  """The launch with every block simulated, as ps.estimate simulates (no
  tensor-core sums, no checks) but for its classes."""
  args = [jnp.zeros(a.shape, a.dtype) if isinstance(a, S) else a for a in args]
  return ps.simulate(fn, *args, numerics=False, block_classes=False, check_races=False,
                     check_uninitialized=False, check_lowering=False, workers=1).report


def _agrees(fn, *args, summed=True):
  """fn's estimate (its one kernel's report), asserted equal to every
  block's simulation to rounding; with `summed`, it must have summed the
  persistent loop's iterations (else its classes may do: few iterations)."""
  with warnings.catch_warnings():
    warnings.simplefilter("error", ps.EstimateWarning)  # (every decision's values known)
    est = ps.estimate(fn, *args)
  full = _every_block(fn, *args)
  assert _close(_times(est), _times(full))
  assert est.kernels[0].hbm_bytes == full.kernels[0].hbm_bytes
  [k] = est.kernels
  assert not summed or "persistent loop's" in k.classes, k.classes
  return k


def _tiles(table, nblocks, tile=64):
  """A persistent kernel of our own: block b takes tiles b, b + nblocks, ...
  of x; tile t's kind, table[t] (a constant of the function, read by the
  kernel from memory), decides its work: 0 copies it, 1 adds exp work, 2
  skips its load and writes zeros, 3 stores only half of it."""
  table = jnp.asarray(np.asarray(table, np.int32))
  tiles = table.shape[0]

  def fn(x):
    @plgpu.kernel(out_type=S((tiles * tile, 128), F32), grid=(nblocks,), grid_names=("b",),
                  scratch_types=[plgpu.SMEM((tile, 128), F32), plgpu.Barrier()])
    def k(kind_ref, x_ref, o_ref, smem, bar):
      b = lax.axis_index("b")

      def step(i, c):
        t = b + i * nblocks
        kind = kind_ref[t]

        @pl.when(kind != 2)
        def _():
          plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(t * tile, tile)], smem, bar)
          plgpu.barrier_wait(bar)

        @pl.when(kind == 1)
        def _():
          smem[...] = jnp.exp(smem[...]) * 0.5

        @pl.when(kind == 2)
        def _():
          smem[...] = jnp.zeros((tile, 128), F32)
        plgpu.commit_smem()

        @pl.when(kind != 3)
        def _():
          plgpu.copy_smem_to_gmem(smem, o_ref.at[pl.ds(t * tile, tile)])

        @pl.when(kind == 3)
        def _():
          plgpu.copy_smem_to_gmem(smem.at[:tile // 2],
                                  o_ref.at[pl.ds(t * tile, tile // 2)])
        plgpu.wait_smem_to_gmem(0)
        return c
      lax.fori_loop(0, (tiles - b + nblocks - 1) // nblocks, step, None)
    return k(table, x)
  return fn, tiles * tile


@settings(max_examples=12, deadline=None)
@given(nblocks=st.integers(2, 7), kinds=st.lists(st.integers(0, 3), min_size=70,
                                                 max_size=140))
def test_a_persistent_loop_over_tiles_of_every_kind_agrees(nblocks, kinds):
  fn, rows = _tiles(kinds, nblocks)
  k = _agrees(fn, S((rows, 128), F32), summed=False)
  if "persistent loop's" in k.classes:
    # (at most: two iterations per kind of tile after a kind, one per first)
    seqs = [kinds[b::nblocks] for b in range(nblocks)]
    pairs = {(q[t - 1], q[t]) for q in seqs for t in range(1, len(q))}
    ran = int(k.classes.split("path(s): ")[1].split(" iterations in ")[0])
    assert ran <= 2 * len(pairs) + len({q[0] for q in seqs if q})


def test_first_tiles_of_each_kind_and_blocks_without_a_tile():
  """First tiles of every kind (each kind timed as a first and after
  another); more blocks than tiles (blocks with no iteration)."""
  kinds = [3, 2, 1, 0, 0, 1] + [0, 1, 2, 3] * 20
  fn, rows = _tiles(kinds, nblocks=6)
  _agrees(fn, S((rows, 128), F32))
  fn, rows = _tiles([1, 2, 3] * 30, nblocks=100)   # (10 blocks take none)
  k = _agrees(fn, S((rows, 128), F32), summed=False)  # (a tile a block: by classes)
  assert k.block_cycles_min < k.block_cycles_max


def _rereads(kinds, nblocks, rows, tile=256):
  """A persistent kernel whose loop reads x's tiles round and round (step s
  of every block's loop reads tile s mod the tiles, so x twice over when
  the steps are twice the tiles) and works on those whose kind is 1."""
  table = jnp.asarray(np.asarray(kinds, np.int32))
  steps, tiles = table.shape[0], rows // tile

  def fn(x):
    @plgpu.kernel(out_type=S((nblocks, tile, 128), F32), grid=(nblocks,),
                  grid_names=("b",),
                  scratch_types=[plgpu.SMEM((tile, 128), F32), plgpu.Barrier()])
    def k(kind_ref, x_ref, o_ref, smem, bar):
      b = lax.axis_index("b")

      def step(i, c):
        s = b + i * nblocks
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(s % tiles * tile, tile)], smem, bar)
        plgpu.barrier_wait(bar)

        @pl.when(kind_ref[s] == 1)
        def _():
          smem[...] = jnp.exp(smem[...])
        return c
      lax.fori_loop(0, (steps - b + nblocks - 1) // nblocks, step, None)
      o_ref[b] = smem[...]
    return k(table, x)
  return fn


def test_a_loop_that_re_reads_more_than_the_l2_holds_keeps_its_tallies():
  """x is 64 MB, more than the H100's L2, and read twice over: the second
  pass misses in the L2 as the first did. An estimate from 7 iterations
  reports the full simulation's bytes (HBM, TMA) exactly, and its time and
  units' busy shares within the estimate check's 2%: an iteration's
  latency follows what the L2 and HBM are doing then, which a few
  iterations stand for only approximately."""
  from pallas_sim.backends.sim.execute import estimate_check
  rows = 1 << 17
  fn = _rereads(([0] * 30 + [1] * 2) * (2 * rows // 256 // 32), 8, rows)
  x = S((rows, 128), F32)
  est = ps.estimate(fn, x).kernels[0]
  full = _every_block(fn, x).kernels[0]
  assert "persistent loop's 1024 iterations" in est.classes, est.classes
  assert full.tma_load_bytes == 2 * rows * 128 * 4
  # (more than x once: the second pass misses too, bar what the L2 kept)
  assert 1.9 * rows * 128 * 4 < full.hbm_bytes <= full.tma_load_bytes
  assert estimate_check.tally_differences(est, full) == {}
  assert abs(est.time_s / full.time_s - 1) < 0.02


rd = pytest.importorskip("jax.experimental.pallas.ops.gpu.ragged_dot_mgpu")
trd = pytest.importorskip("jax.experimental.pallas.ops.gpu.transposed_ragged_dot_mgpu")


def _ragged(m, k, n, sizes, **cfg):
  gs = jnp.asarray(np.asarray(sizes, np.int32))
  fn = lambda lhs, rhs: rd.ragged_dot(lhs, rhs, group_sizes=gs, **cfg)
  return fn, (S((m, k), jnp.float16), S((len(sizes), k, n), jnp.float16))


def test_jaxs_ragged_dot_on_constant_group_sizes():
  """Group sizes captured by the function: the slice reads them, each
  tile's path is its group's edge, and a few iterations stand for 280."""
  fn, args = _ragged(2048, 512, 1024, [300, 0, 1500, 248], block_m=64, block_n=128,
                     block_k=64, max_concurrent_steps=2, grid_block_n=1)
  k = _agrees(fn, *args)
  assert k.simulated_blocks < 20
  assert k.classes.endswith("on the values of the inputs it was given")


def test_jaxs_transposed_ragged_dot_reads_group_tables_per_tile():
  """Its tiles index the group tables by the tile's group: the slice reads
  them lane by lane."""
  sizes = jnp.asarray(np.array([1000, 24, 0, 3072], np.int32))
  fn = lambda lhs, rhs: trd.transposed_ragged_dot(
      lhs, rhs, group_sizes=sizes, block_m=128, block_n=128, block_k=64,
      max_concurrent_steps=2, grid_block_n=1)
  k = _agrees(fn, S((4096, 512), jnp.float16), S((4096, 512), jnp.float16), summed=False)
  assert "not followed" not in k.classes and k.simulated_blocks < 132


def test_group_sizes_given_as_an_array_are_read_too():
  gs = np.array([100, 900, 0, 1048], np.int32)
  fn = functools.partial(rd.ragged_dot, block_m=64, block_n=128, block_k=64,
                         max_concurrent_steps=2, grid_block_n=1)
  est = ps.estimate(lambda l, r, g: fn(l, r, group_sizes=g), S((2048, 512), jnp.float16),
                    S((4, 512, 1024), jnp.float16), jnp.asarray(gs))
  full = _every_block(lambda l, r, g: fn(l, r, group_sizes=g),
                      S((2048, 512), jnp.float16), S((4, 512, 1024), jnp.float16),
                      jnp.asarray(gs))
  assert _close(_times(est), _times(full))
  assert est.kernels[0].simulated_blocks < 132


def _writes_its_counts(counts, as_ref=True):
  """Block b loops counts[b] times, then bumps counts[b]: an input the
  kernel writes (another block could read it changed). `as_ref=False`: the
  array itself, written in place (up to jax 0.12.0.1; an aliased Ref is
  never read by a slice, being an output too)."""
  @plgpu.kernel(out_type=S((4, 128), F32), grid=(4,), grid_names=("b",))
  def k(n_ref, o_ref):
    b = lax.axis_index("b")
    n = n_ref[b]
    o_ref[b] = jnp.full((128,), lax.fori_loop(0, n, lambda i, v: v + 1.0, 0.0))
    n_ref[b] = n + 1
  return k(jax.new_ref(counts) if as_ref else counts)


@pytest.mark.parametrize("as_ref", [True, pytest.param(False, marks=pytest.mark.skipif(
    not jx.KERNELS_WRITE_INPUT_ARRAYS, reason="from jax 0.12.1 a kernel writes only a Ref"))])
def test_an_input_the_kernel_writes_is_not_read_by_the_slice(as_ref):
  fn = functools.partial(_writes_its_counts, as_ref=as_ref)
  counts = jnp.asarray(np.array([3, 80, 0, 7], np.int32))
  est = ps.estimate(fn, counts)
  [k] = est.kernels
  assert k.simulated_blocks == 4 and "values read from memory" in k.classes
  # Equal counts would put every block on one path, were the slice to read
  # them: it does not, so each block runs.
  est = ps.estimate(fn, jnp.full((4,), 5, jnp.int32))
  [k] = est.kernels
  assert k.simulated_blocks == 4 and "values read from memory" in k.classes
