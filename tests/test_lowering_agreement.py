"""Errors agree with the real Mosaic GPU lowering, which runs on a CPU too:
`jax.export(..., platforms=["cuda"])` lowers a kernel for Hopper without a GPU.
The simulator must reject what the lowering rejects, with the same numbers,
and nothing it accepts."""
import re

import jax
import jax.numpy as jnp
import pytest

import pallas_sim as ps
from test_errors import pipeline_copy
from test_quickstart import matmul_mcs


def lowering_error(fn, *args):
  """The real lowering's error message for this kernel, or None if it lowers."""
  try:
    jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)
  except Exception as e:  # the lowering raises ValueError, NotImplementedError...
    return str(e)
  return None


def real_smem_error(fn, *args):
  """The real lowering's smem_bytes if it rejects the kernel for SMEM, else None."""
  try:
    jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)
  except ValueError as e:
    m = re.search(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)", str(e))
    if m:
      return int(m.group(1)), int(m.group(2))
    raise
  return None


def sim_smem_error(fn, *args):
  try:
    ps.run(fn, *args, backend="sim")
  except ps.SmemOverflowError as e:
    return e.smem_bytes, e.max_smem_bytes
  return None


CASES = [
    ("pipeline f32 64x256 mcs2", lambda x: pipeline_copy(x, (64, 256), 2), (512, 256)),
    ("pipeline f32 32x256 mcs2", lambda x: pipeline_copy(x, (32, 256), 2), (512, 256)),
    ("pipeline f32 32x256 mcs4", lambda x: pipeline_copy(x, (32, 256), 4), (512, 256)),
    ("pipeline f32 64x128 mcs3", lambda x: pipeline_copy(x, (64, 128), 3), (512, 128)),
]


@pytest.mark.parametrize("name,fn,shape", CASES, ids=[c[0] for c in CASES])
def test_smem_verdict_and_numbers_match_the_lowering(name, fn, shape):
  x = jnp.ones(shape, jnp.float32)
  assert sim_smem_error(fn, x) == real_smem_error(fn, x)


@pytest.mark.parametrize("tile_n,tile_k,mcs", [(128, 64, 2), (256, 128, 4),
                                                (256, 64, 3), (128, 128, 4)])
def test_matmul_smem_verdict_matches_the_lowering(tile_n, tile_k, mcs):
  a = jnp.ones((512, 512), jnp.float16)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k,
                               max_concurrent_steps=mcs)
  assert sim_smem_error(fn, a, a) == real_smem_error(fn, a, a)


def test_scoped_gmem_is_rejected_by_both():
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32),
                scratch_types=[plgpu.GMEM((128,), jnp.int32)])
  def k(o_ref, g_ref):
    o_ref[...] = jnp.zeros((128,), jnp.int32)

  assert "Unsupported memory space: gmem" in lowering_error(k)
  with pytest.raises(ps.KernelError, match="Unsupported memory space: gmem"):
    ps.run(k, backend="sim")


def test_small_tma_copies_are_rejected_by_both():
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4,), jnp.int32),
                scratch_types=[plgpu.SMEM((4,), jnp.int32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem.at[0], o_ref.at[3])
    plgpu.wait_smem_to_gmem(0)

  x = jnp.arange(4, dtype=jnp.int32)
  msg = "divisible by 128, but got 32"
  assert msg in lowering_error(k, x)
  with pytest.raises(ps.KernelError, match=msg):
    ps.run(k, x, backend="sim")
