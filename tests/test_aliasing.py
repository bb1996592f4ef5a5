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


def nibble_kernel(dtype=jnp.uint4):
  """Writes int8 bytes, reads them back through a 4-bit member of the same
  bytes (element 2i is byte i's low nibble), in registers and by TMA."""
  @functools.partial(
      plgpu.kernel,
      out_type=(jax.ShapeDtypeStruct((256,), jnp.int32),
                jax.ShapeDtypeStruct((256,), dtype)),
      scratch_types=[plgpu.RefUnion(plgpu.SMEM((128,), jnp.int8),
                                    plgpu.SMEM((256,), dtype))])
  def k(x_ref, o_ref, o4_ref, u):
    bytes_, nibbles = u
    bytes_[...] = x_ref[...]
    o_ref[...] = nibbles[...].astype(jnp.int32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(nibbles, o4_ref)
    plgpu.wait_smem_to_gmem(0)
  return k


@pytest.mark.parametrize("dtype", [jnp.uint4, jnp.int4])
def test_a_4_bit_member_reads_the_nibbles_of_the_unions_bytes(dtype):
  x = np.arange(-64, 64, dtype=np.int8) * 3
  regs, tma = ps.run(nibble_kernel(dtype), x, backend="sim")
  u = x.view(np.uint8)
  nib = np.stack([u & 0xF, u >> 4], axis=-1).reshape(-1).astype(np.int32)
  if dtype == jnp.int4:
    nib = np.where(nib > 7, nib - 16, nib)
  np.testing.assert_array_equal(np.asarray(regs), nib)
  np.testing.assert_array_equal(np.asarray(tma).astype(np.int32), nib)


def test_writes_through_a_4_bit_member_land_in_the_unions_bytes():
  @functools.partial(
      plgpu.kernel, out_type=jax.ShapeDtypeStruct((128,), jnp.int8),
      scratch_types=[plgpu.RefUnion(plgpu.SMEM((256,), jnp.uint4),
                                    plgpu.SMEM((128,), jnp.int8))])
  def k(x_ref, o_ref, u):
    nibbles, bytes_ = u
    nibbles[...] = x_ref[...]
    o_ref[...] = bytes_[...]
  x = (np.arange(256) % 16).astype(jnp.uint4)
  out = np.asarray(ps.run(k, x, backend="sim")).view(np.uint8)
  np.testing.assert_array_equal(out, (np.arange(0, 256, 2) % 16) | ((np.arange(1, 256, 2) % 16) << 4))


def test_a_4_bit_member_of_unwritten_bytes_is_an_uninitialized_read():
  @functools.partial(
      plgpu.kernel, out_type=jax.ShapeDtypeStruct((512,), jnp.int32),
      scratch_types=[plgpu.RefUnion([plgpu.SMEM((128,), jnp.int8),
                                     plgpu.SMEM((128,), jnp.int8)],
                                    plgpu.SMEM((512,), jnp.uint4))])
  def k(o_ref, u):
    [first, _], nibbles = u
    first[...] = jnp.zeros((128,), jnp.int8)  # the first 256 nibbles only
    o_ref[...] = nibbles[...].astype(jnp.int32)
  sim = ps.simulate(k, on_uninitialized="report")
  [read] = sim.report.uninitialized
  assert "u as uint4[512] elements (256,)..(511,) (bytes 128..256 of u)" in str(read)
