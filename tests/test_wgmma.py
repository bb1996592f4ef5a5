"""wgmma numerics and the lowering's restrictions on operands."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from conftest import rel_err
from test_lowering_agreement import lowering_error
from test_quickstart import matmul_mcs


def tf32_matmul(a, bt):
  """acc = a @ bt.T with f32 operands (tf32 on the tensor core). 32-bit
  operands must be K-minor in SMEM: B is stored (N, K) and passed as .T."""
  m, k = a.shape
  n, _ = bt.shape

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((m, n), jnp.float32),
                scratch_types=dict(a_s=plgpu.SMEM((m, k), jnp.float32),
                                   b_s=plgpu.SMEM((n, k), jnp.float32),
                                   acc=plgpu.ACC((m, n), jnp.float32),
                                   bar=plgpu.Barrier(num_arrivals=2)))
  def kern(a_ref, b_ref, o_ref, a_s, b_s, acc, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    plgpu.barrier_wait(bar)
    plgpu.wgmma(acc, a_s, b_s.T)
    o_ref[...] = acc[...]
  return kern(a, bt)


def to_tf32(x):
  return (np.asarray(x, np.float32).view(np.uint32) & 0xFFFFE000).view(np.float32)


def test_f32_operands_are_truncated_to_tf32(rng):
  a = jnp.asarray(rng.standard_normal((128, 32)), jnp.float32)
  bt = jnp.asarray(rng.standard_normal((128, 32)), jnp.float32)
  a = a.at[0, 0].set(1.0 + 2.0 ** -20)  # bits tf32 drops
  got = np.asarray(ps.run(tf32_matmul, a, bt, backend="sim"), np.float64)
  want_tf32 = to_tf32(a).astype(np.float64) @ to_tf32(bt).astype(np.float64).T
  want_f32 = np.asarray(a, np.float64) @ np.asarray(bt, np.float64).T
  assert rel_err(got, want_tf32) < 1e-6
  assert rel_err(got, want_f32) > 1e-5


def test_tf32_kernel_is_accepted_by_the_real_lowering(rng):
  a = jnp.ones((64, 32), jnp.float32)
  bt = jnp.ones((128, 32), jnp.float32)
  assert lowering_error(tf32_matmul, a, bt) is None


def test_f32_with_natural_b_layout_is_rejected_like_the_lowering():
  a = jnp.ones((256, 256), jnp.float32)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=128, tile_k=32, out_dtype=jnp.float32)
  real = lowering_error(fn, a, a)
  assert real is not None and "Only f16 WGMMA supports transposes" in real
  with pytest.raises(ps.KernelError, match="Only f16 WGMMA supports transposes"):
    ps.run(fn, a, a, backend="sim")


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_types_accumulate_in_f32(rng, dtype):
  a = jnp.asarray(rng.standard_normal((256, 512)), dtype)
  b = jnp.asarray(rng.standard_normal((512, 256)), dtype)
  got = ps.run(lambda a, b: matmul_mcs(a, b, out_dtype=jnp.float32), a, b, backend="sim")
  want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  assert rel_err(got, want) < 1e-6


def test_int8_wgmma_accumulates_exactly_in_int32():
  # Found by the agreement suite: int8 SMEM could not even be poisoned
  # (the sentinel did not fit in a byte).
  T = dict(transforms=(plgpu.TilingTransform((8, 128)), plgpu.SwizzleTransform(128)))
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), jnp.int32),
                scratch_types=dict(a_s=plgpu.SMEM((64, 128), jnp.int8, **T),
                                   b_s=plgpu.SMEM((128, 128), jnp.int8, **T),
                                   bar=plgpu.Barrier(num_arrivals=2),
                                   acc=plgpu.ACC((64, 128), jnp.int32)))
  def k(a_ref, b_ref, o_ref, a_s, b_s, bar, acc):
    plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    plgpu.barrier_wait(bar)
    plgpu.wgmma(acc, a_s, b_s.T)  # 8-bit operands must be K-minor
    o_ref[...] = acc[...]

  r = np.random.default_rng(0)
  a = r.integers(-128, 128, (64, 128)).astype(np.int8)
  b = r.integers(-128, 128, (128, 128)).astype(np.int8)
  out = ps.run(k, jnp.asarray(a), jnp.asarray(b), backend="sim")
  np.testing.assert_array_equal(out, a.astype(np.int64) @ b.astype(np.int64).T)


def test_tensor_core_summation_is_bit_exact_with_an_h200():
  """Outputs measured on an H200 (a slice of benchmarks/wgmma_numerics_probe.py's
  run, tests/data/wgmma_h200.npz): the simulator's tensor-core model
  reproduces every bit, for fp8 (e4m3, e5m2), f16, bf16 and tf32 operands.
  An exact f32 sum does not (the agreement suite found fp8 off by ~2^-14)."""
  import os
  from pallas_sim.backends.sim.machine import tensor_core
  d = np.load(os.path.join(os.path.dirname(__file__), "data", "wgmma_h200.npz"))
  itemsize = {"f8e4m3": 1, "f8e5m2": 1, "f16": 2, "bf16": 2, "f32": 4}
  keys = sorted({k.rsplit("_", 1)[0] for k in d.files})
  assert len(keys) == 15
  naive_equal = []
  for key in keys:
    a, bt, hw = (d[key + s].astype(np.float64) for s in ("_a", "_b", "_out"))
    if key.startswith("f32"):  # the tensor core reads f32 operands as tf32
      from pallas_sim.backends.sim.rules.wgmma import to_tf32
      a, bt = (to_tf32(x).astype(np.float64) for x in (a, bt))
    acc = np.zeros(hw.shape, np.float32)
    tensor_core.mma_f32(acc, a, bt.T, itemsize[key.split("_")[0]])
    np.testing.assert_array_equal(acc, hw.astype(np.float32), err_msg=key)
    naive_equal.append(np.array_equal(np.float32(a @ bt.T), hw.astype(np.float32)))
  assert not all(naive_equal)
