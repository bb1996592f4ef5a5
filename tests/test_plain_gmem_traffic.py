"""What plain GMEM loads and stores move (no TMA) counts toward HBM's floor
beside a kernel's TMA traffic: an output written with plain stores is as
many bytes for HBM to take as one written by a TMA store, and a small table
read again and again by plain loads adds no more than its own bytes."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
import pytest

import pallas_sim as ps

ROWS = 128  # a block's rows of x (f32, 128 columns: 64 KiB)


def _scale(x, *, plain_store, table=None):
  """out = 2 x, a block's rows loaded by TMA and written back by TMA or by
  plain GMEM stores; with `table`, each block also reads the table's first
  entry with a plain load and adds it."""
  m, n = x.shape

  def body(*refs):
    if table is None:
      x_gmem, o_gmem, xs, os_, bar = refs
      t_gmem = None
    else:
      x_gmem, t_gmem, o_gmem, xs, os_, bar = refs
    b = lax.axis_index("b")
    rows = pl.ds(b * ROWS, ROWS)
    plgpu.copy_gmem_to_smem(x_gmem.at[rows], xs, bar)
    plgpu.barrier_wait(bar)
    v = xs[...] * 2
    if t_gmem is not None:
      v = v + t_gmem[0]
    if plain_store:
      o_gmem[rows] = v
    else:
      os_[...] = v
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(os_, o_gmem.at[rows])
      plgpu.wait_smem_to_gmem(0)

  args = (x,) if table is None else (x, table)
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
      scratch_types=[plgpu.SMEM((ROWS, n), x.dtype), plgpu.SMEM((ROWS, n), x.dtype),
                     plgpu.Barrier()],
      grid=(m // ROWS,), grid_names=("b",))(*args)


def _estimate(fn, *shapes):
  return ps.estimate(fn, *[jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes],
                     gpu="h200").kernels[0]


def test_plain_stores_to_gmem_are_bytes_hbm_takes_like_a_tma_store_s():
  shape = (1 << 18, 128)  # 128 MiB in, 128 MiB out
  plain = _estimate(lambda x: _scale(x, plain_store=True), shape)
  tma = _estimate(lambda x: _scale(x, plain_store=False), shape)
  nbytes = 2 * shape[0] * shape[1] * 4
  assert plain.hbm_bytes == tma.hbm_bytes == nbytes
  # (both at HBM's floor for reading and writing every byte)
  assert plain.time_s == pytest.approx(tma.time_s, rel=0.1)
  assert plain.time_s > nbytes / ps.gpus.get("h200").hbm_bytes_per_s


def test_a_table_read_again_by_plain_loads_adds_only_its_own_bytes():
  shape = (1 << 16, 128)
  table = (1024, 128)
  got = _estimate(lambda x, t: _scale(x, plain_store=False, table=t), shape, table)
  # (512 blocks read the table's first row: the L2 serves it after the first)
  assert got.hbm_bytes <= 2 * shape[0] * shape[1] * 4 + table[0] * table[1] * 4


def test_the_values_are_the_kernels():
  x = jnp.arange(2 * ROWS * 128, dtype=jnp.float32).reshape(2 * ROWS, 128)
  with ps.backend("sim"):
    got = _scale(x, plain_store=True)
  assert bool(jnp.all(got == 2 * x))
