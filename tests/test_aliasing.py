"""plgpu.RefUnion: members alias one byte buffer at the lowering's offsets;
races and uninitialized reads are per byte; reading bytes written through a
member of another physical layout is a named error, not wrong values."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

F32 = jnp.float32


def union_kernel(commit=True):
  """Writes the f32 member, then copies out the i32 member that aliases
  its first 128 elements (the second group starts at the same offset)."""
  @functools.partial(
      plgpu.kernel,
      out_type=(jax.ShapeDtypeStruct((128,), jnp.int32),),
      scratch_types=[plgpu.RefUnion(plgpu.SMEM((256,), F32),
                                    plgpu.SMEM((128,), jnp.int32))])
  def k(x_ref, o_ref, u):
    f, i = u
    f[...] = x_ref[...]
    if commit:
      plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(i, o_ref)
    plgpu.wait_smem_to_gmem(0)
  return k


def test_members_of_a_union_share_their_bytes():
  x = jnp.arange(256, dtype=F32) * 1.5
  sim = ps.simulate(union_kernel(), x)
  want = np.asarray(x[:128]).view(np.int32)
  np.testing.assert_array_equal(sim.outputs[0], want)
  assert sim.report.races == []


def test_a_race_through_two_members_of_a_union_is_caught():
  x = jnp.arange(256, dtype=F32)
  sim = ps.simulate(union_kernel(commit=False), x, on_race="report")
  text = "\n".join(map(str, sim.report.races))
  assert "write-read race" in text and "TMA store" in text, text


def test_reading_through_a_member_of_another_layout_is_a_named_error():
  tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  @functools.partial(
      plgpu.kernel, out_type=jax.ShapeDtypeStruct((64, 64), jnp.float16),
      scratch_types=[plgpu.RefUnion(plgpu.SMEM((64, 64), jnp.float16),
                                    plgpu.SMEM((64, 64), jnp.float16, transforms=tiled))])
  def k(o_ref, u):
    plain, swizzled = u
    plain[...] = jnp.ones((64, 64), jnp.float16)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(swizzled, o_ref)
    plgpu.wait_smem_to_gmem(0)
  with pytest.raises(ps.UnsupportedPrimitiveError, match="another order"):
    ps.run(k, backend="sim")
