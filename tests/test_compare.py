"""ps.compare: configurations estimated side by side, ranked, and those the
model cannot tell apart grouped and said to be so."""
import functools

import jax
import jax.numpy as jnp
import pytest

import pallas_sim as ps
from kernels import pipeline_elementwise
from test_quickstart import matmul_mcs

S = jax.ShapeDtypeStruct


def _matmuls():
  return {f"128x{tn}x{tk} mcs={m}": functools.partial(matmul_mcs, tile_n=tn, tile_k=tk,
                                                      max_concurrent_steps=m)
          for tn, tk, m in ((128, 64, 2), (128, 64, 4), (64, 32, 2), (256, 64, 2))}


def test_matmul_configurations_are_ranked_fastest_first():
  a = S((4096, 4096), jnp.float16)
  cmp = ps.compare(_matmuls(), a, a, gpu="h200")
  times = [r.time_s for r in cmp.rows]
  assert times == sorted(times) and len(cmp.rows) == 4
  assert [n for g in cmp.ranking for n in g] == [r.name for r in cmp.rows]
  # each group spans at most the resolution from its fastest
  for g in cmp.groups:
    assert g[-1].time_s <= g[0].time_s * (1 + cmp.resolution)
  # the small tiles run far slower: never tied with the fastest
  assert "128x64x32 mcs=2" not in cmp.best and len(cmp.groups) > 1
  for name, fn in _matmuls().items():   # (the same estimate as ps.estimate's)
    if name in cmp.best[:1]:
      assert ps.estimate(fn, a, a, gpu="h200").time_s == cmp.rows[0].time_s
  table = cmp.table()
  assert all(n in table for n in _matmuls())


def test_configurations_at_the_hbm_floor_are_not_ranked():
  """A + B over 64M f32 through TMA pipelines of different tiles: HBM sets
  every one's time, and the comparison says it cannot order them."""
  x = S((8192, 8192), jnp.float32)
  cands = {f"{tm}x{tn} mcs={m}": functools.partial(pipeline_elementwise, blocks=128,
                                                    tile_m=tm, tile_n=tn, mcs=m)
           for tm, tn, m in ((32, 256, 2), (64, 128, 2), (16, 256, 4))}
  cmp = ps.compare(cands, x, x, gpu="h200")
  assert len(cmp.groups) == 1 and all(r.at_floor for r in cmp.rows)
  assert "not told apart: the HBM floor sets each one's time" in cmp.table()
  assert "ranking: the HBM floor sets this time" in cmp.rows[0].report.summary()
  # not even told apart with no resolution at all: their floors are equal
  assert len(ps.compare(cands, x, x, gpu="h200", resolution=0.0).groups) == 1


def test_bad_candidates_are_named():
  a = S((256, 256), jnp.float16)
  with pytest.raises(TypeError, match="candidate 'b' is int"):
    ps.compare({"a": _matmuls()["128x128x64 mcs=2"], "b": 3}, a, a)
  with pytest.raises(ValueError, match="resolution=-0.1"):
    ps.compare(_matmuls(), a, a, resolution=-0.1)
  with pytest.raises(ValueError, match="no candidates"):
    ps.compare({}, a, a)


def test_a_candidate_the_simulator_refuses_is_listed_and_the_rest_ranked():
  """256x128 tiles at four slots overflow the SMEM: that candidate is named
  with its error, the others are still ranked; all refused, the first's
  error is raised, naming its candidate."""
  a = S((1024, 1024), jnp.float16)
  cands = {**{k: v for k, v in _matmuls().items() if k.endswith("mcs=2")},
           "128x256x128 mcs=4": functools.partial(matmul_mcs, tile_n=256, tile_k=128,
                                                  max_concurrent_steps=4)}
  cmp = ps.compare(cands, a, a, gpu="h200")
  assert [r.name for r in cmp.rows] and "128x256x128 mcs=4" not in [r.name for r in cmp.rows]
  assert isinstance(cmp.failed["128x256x128 mcs=4"], ps.SmemOverflowError)
  assert "| - | 128x256x128 mcs=4 | - | - | refused: SmemOverflowError: " in cmp.table()
  with pytest.raises(ps.SmemOverflowError) as e:
    ps.compare({"too big": cands["128x256x128 mcs=4"]}, a, a, gpu="h200")
  assert "(ps.compare's candidate 'too big')" in e.value.__notes__


def test_a_candidate_jax_refuses_as_it_traces_is_listed_with_the_check_that_failed():
  """A tiling that does not divide the tile (64-wide tiles of a 32-wide
  block): JAX's own tracing fails with a bare assertion, on a GPU too. The
  candidate is listed with where JAX raised it and the line that failed,
  and the others are still ranked."""
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def copy_through(x, cols):
    tiled = dict(transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))

    @plgpu.kernel(out_type=S(x.shape, x.dtype),
                  scratch_types=[plgpu.SMEM((128, cols), x.dtype, **tiled), plgpu.Barrier()])
    def k(x_ref, o_ref, smem, bar):
      plgpu.copy_gmem_to_smem(x_ref.at[:, :cols], smem, bar)
      plgpu.barrier_wait(bar)
      plgpu.copy_smem_to_gmem(smem, o_ref.at[:, :cols])
      plgpu.wait_smem_to_gmem(0)
    return k(x)

  x = S((128, 128), jnp.float16)
  cmp = ps.compare({"64 wide": functools.partial(copy_through, cols=64),
                    "32 wide": functools.partial(copy_through, cols=32)}, x, gpu="h200")
  assert [r.name for r in cmp.rows] == ["64 wide"]
  err = cmp.failed["32 wide"]
  assert type(err) is AssertionError
  row = [line for line in cmp.table().splitlines() if "| 32 wide |" in line]
  assert row and "refused: AssertionError: (JAX's own check failed with no message, at " \
                 "jax/_src/pallas/mosaic_gpu/core.py:" in row[0], cmp.table()
  assert "(transform_type): `assert all(d % t == 0" in row[0], row


def test_a_candidate_whose_grid_misses_part_of_the_output_is_said_to():
  """192-row tiles over 4096 rows: a grid of 21 leaves 64 rows unwritten,
  less work than the others do; the table says so beside its time."""
  a = S((4096, 4096), jnp.float16)
  cmp = ps.compare({"128 rows": matmul_mcs,
                    "192 rows": functools.partial(matmul_mcs, tile_m=192)}, a, a)
  assert cmp.short_writes() == {"192 rows": pytest.approx(21 * 192 / 4096)}
  [row] = [line for line in cmp.table().splitlines() if "| 192 rows |" in line]
  assert "stores 98.4% of the bytes the most storing one does: does its grid cover " \
         "the output?" in row, row
  [row] = [line for line in cmp.table().splitlines() if "| 128 rows |" in line]
  assert "stores" not in row
