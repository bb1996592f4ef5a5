"""wgmma numerics and the lowering's restrictions on operands."""
import json
import os

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
  with pytest.raises(ps.KernelError, match="Only f16 WGMMA supports transposes") as e:
    ps.run(fn, a, a, backend="sim")
  assert "K as their contiguous axis" in str(e.value)  # (the fix, for who wrote no .T)


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



def dequantized_matmul_t(w, s, x):
  """x @ (w * s[:, None]).T, weight-only quantized: int8 weights (N, K) upcast
  in registers (WGMMA_UPCAST_2X, then WGMMA), scaled by a per-row bf16 scale
  loaded from GMEM straight into the WGMMA row layout, and multiplied as
  wgmma's register operand against the activations' SMEM tile (M, K)
  transposed. The (N, M) accumulator is stored through the output tile's
  transposed view (WGMMA_TRANSPOSED), so the kernel writes (M, N)."""
  n, k = w.shape
  m = x.shape[0]
  def swz(tile):
    return dict(transforms=(plgpu.TilingTransform(tile), plgpu.SwizzleTransform(128)))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
                scratch_types=dict(w_s=plgpu.SMEM((n, k), jnp.int8, **swz((8, 128))),
                                   x_s=plgpu.SMEM((m, k), jnp.bfloat16, **swz((8, 64))),
                                   o_s=plgpu.SMEM((m, n), jnp.bfloat16, **swz((1, 64))),
                                   bar=plgpu.Barrier(num_arrivals=2),
                                   acc=plgpu.ACC((n, m), jnp.float32)))
  def kern(w_ref, s_ref, x_ref, o_ref, w_s, x_s, o_s, bar, acc):
    plgpu.copy_gmem_to_smem(w_ref, w_s, bar)
    plgpu.copy_gmem_to_smem(x_ref, x_s, bar)
    scale = plgpu.load(s_ref, layout=plgpu.Layout.WGMMA.reduce(1), optimized=False)
    plgpu.barrier_wait(bar)
    wr = plgpu.load(w_s, layout=plgpu.Layout.WGMMA_UPCAST_2X)
    wr = plgpu.layout_cast(wr, plgpu.Layout.WGMMA).astype(jnp.bfloat16)
    wr = wr * jax.lax.broadcast_in_dim(scale, wr.shape, (0,))
    plgpu.wgmma(acc, wr, x_s.T)
    o_s.T[...] = plgpu.layout_cast(acc[...].astype(jnp.bfloat16),
                                   plgpu.Layout.WGMMA_TRANSPOSED)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_ref)
    plgpu.wait_smem_to_gmem(0)
  return kern(w, s, x)


@pytest.mark.parametrize("m", [8, 64])
def test_int8_weights_dequantized_in_registers_store_through_a_transposed_view(m):
  r = np.random.default_rng(m)
  w = jnp.asarray(r.integers(-127, 128, (64, 128)), jnp.int8)
  s = jnp.asarray(r.uniform(0.001, 0.01, 64), jnp.bfloat16)
  x = jnp.asarray(r.standard_normal((m, 128)), jnp.bfloat16)
  assert lowering_error(dequantized_matmul_t, w, s, x) is None
  sim = ps.simulate(dequantized_matmul_t, w, s, x)
  assert not sim.report.races and not sim.report.uninitialized
  # (the scaled weights are bf16, as the kernel's product is; the sum is f32)
  wq = np.asarray(w.astype(jnp.bfloat16) * s[:, None], np.float64)
  want = np.asarray(x, np.float64) @ wq.T
  got = np.asarray(sim.outputs, np.float64)
  assert got.shape == (m, 64)
  assert rel_err(got, want) < 4e-3
  # (each output row is its own: a transposed store that wrote the (N, M)
  # accumulator as if it were (M, N) would misplace all but the diagonal)
  assert np.abs(got - want).max() < 2e-2 * np.abs(want).max()

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "wgmma_h200.npz")
ITEMSIZE = {"f8e4m3": 1, "f8e5m2": 1, "f16": 2, "bf16": 2, "f32": 4}
GOLDEN_DTYPES = {"f8e4m3": jnp.float8_e4m3fn, "f8e5m2": jnp.float8_e5m2,
                 "f16": jnp.float16, "bf16": jnp.bfloat16, "f32": jnp.float32}


def golden(path=GOLDEN):
  """(key, A rows, B rows (N, K), the H200's outputs) of a golden file
  (tests/data/wgmma_h200.npz by default), and its provenance."""
  d = np.load(path)
  keys = sorted({k.rsplit("_", 1)[0] for k in d.files if k != "provenance"})
  return [(k, d[k + "_a"], d[k + "_b"], d[k + "_out"]) for k in keys], json.loads(
      str(d["provenance"]))


def test_golden_data_says_how_it_was_made():
  cases, prov = golden()
  assert len(cases) == 15
  assert "H200" in prov["gpu"] and prov["backend"] == "mosaic"
  assert prov["jax"] == "0.11.2" and len(prov["commit"]) == 40
  assert prov["command"].startswith(("python3 -m lab.wgmma_numerics_probe",
                                     "python3 benchmarks/wgmma_numerics_probe.py"))


def test_tests_own_tensor_core_model_matches_the_h200():
  """tests/agreement/tensor_core_ref.py (the agreement suite's reference,
  written apart from the simulator's) reproduces every bit; an exact sum
  rounded once does not (fp8 differs by ~2^-14)."""
  import tensor_core_ref
  naive_equal = []
  for key, a, bt, hw in golden()[0]:
    a, bt = (np.asarray(x, GOLDEN_DTYPES[key.split("_")[0]]) for x in (a, bt))
    got = tensor_core_ref.matmul(tensor_core_ref.operand_values(a),
                                 tensor_core_ref.operand_values(bt).T,
                                 ITEMSIZE[key.split("_")[0]])
    np.testing.assert_array_equal(got.astype(np.float32), hw, err_msg=key)
    naive = np.float32(tensor_core_ref.operand_values(a) @ tensor_core_ref.operand_values(bt).T)
    naive_equal.append(np.array_equal(naive, hw))
  assert not all(naive_equal)


def test_simulated_wgmma_is_bit_exact_with_the_h200():
  """The simulator, through a whole wgmma kernel (the probe's own: f32
  operands read as tf32 included), gives the H200's bits."""
  from families import hand_matmul
  for key, a, bt, hw in golden()[0]:
    dtype = GOLDEN_DTYPES[key.split("_")[0]]
    k = a.shape[1]
    A = np.zeros((64, k), np.float32)
    B = np.zeros((64, k), np.float32)
    A[:a.shape[0]], B[:bt.shape[0]] = a, bt
    out = ps.run(hand_matmul, jnp.asarray(A, dtype), jnp.asarray(B, dtype), backend="sim",
                 tm=64, tn=64, swizzle=32, slots=1, transpose_a=False, transpose_b=True,
                 transforms=True, out_dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(out)[:hw.shape[0], :hw.shape[1]], hw,
                                  err_msg=key)


def mma_sync_kernel(dtype, m=128, k=128, n=8):
  """plgpu.mma: acc + a @ b from registers (mma.sync); b is given (n, k)."""
  dtype = jnp.dtype(dtype)
  acc_dtype = jnp.int32 if jnp.issubdtype(dtype, jnp.integer) else jnp.float32

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((m, n), acc_dtype))
  def kern(a_ref, b_ref, o_ref):
    acc = plgpu.layout_cast(jnp.zeros((m, n), acc_dtype), plgpu.Layout.MMA_ACC(dtype))
    a = plgpu.load(a_ref, layout=plgpu.Layout.MMA_LHS(dtype), optimized=False)
    b = plgpu.load(b_ref.T, layout=plgpu.Layout.MMA_RHS(dtype), optimized=False)
    o_ref[...] = plgpu.mma(acc, a, b)
  return kern


def mma_sync_operands(dtype, m=128, k=128, n=8, seed=0):
  rng = np.random.default_rng(seed)
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.integer):
    info = jnp.iinfo(dtype)
    return (rng.integers(info.min, info.max + 1, (m, k)).astype(dtype),
            rng.integers(info.min, info.max + 1, (n, k)).astype(dtype))
  return (rng.uniform(-1, 1, (m, k)).astype(dtype), rng.uniform(-1, 1, (n, k)).astype(dtype))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn,
                                   jnp.int8, jnp.int4])
def test_mma_sync_computes_acc_plus_a_b(dtype):
  a, bt = mma_sync_operands(dtype)
  out = np.asarray(ps.run(mma_sync_kernel(dtype), a, bt, backend="sim"))
  if jnp.issubdtype(dtype, jnp.integer):
    np.testing.assert_array_equal(out, a.astype(np.int64) @ bt.T.astype(np.int64))
  else:
    want = a.astype(np.float64) @ bt.T.astype(np.float64)
    # (fp8 sums keep 13 fraction bits between slices of K)
    assert rel_err(out, want) < (1e-3 if jnp.dtype(dtype).itemsize == 1 else 1e-5)
    # (the tensor core truncates: not numpy's rounded f32 sum, bit for bit)


MMA_GOLDEN = os.path.join(os.path.dirname(__file__), "data", "mma_sync_h200.npz")


def mma_golden():
  """golden() of tests/data/mma_sync_h200.npz: rows of A, all of B, the
  H200's output rows."""
  return golden(MMA_GOLDEN)


def test_mma_sync_golden_data_says_how_it_was_made():
  cases, prov = mma_golden()
  assert len(cases) == 12
  assert "H200" in prov["gpu"] and prov["backend"] == "mosaic"
  assert prov["jax"] == "0.11.2" and len(prov["commit"]) == 40
  assert prov["command"].startswith(("python3 -m lab.mma_numerics_probe --golden",
                                     "python3 benchmarks/mma_numerics_probe.py --golden"))


@pytest.mark.parametrize("key", [c[0] for c in mma_golden()[0]])
def test_mma_sync_sums_as_the_h200_does_bit_for_bit(key):
  """plgpu.mma (mma.sync) against the H200's own outputs: every bit, for fp8,
  f16 and bf16 operands, random and structured (a large product among
  small ones, where the order and rounding of the sum show)."""
  (case,) = [c for c in mma_golden()[0] if c[0] == key]
  _, a_rows, bt, hw = case
  dtype = jnp.dtype(key.rsplit("_", 2)[0])
  a = np.zeros((128, 128), np.float32)
  a[:len(a_rows)] = a_rows  # (an output row depends on its row of A alone)
  out = np.asarray(ps.run(mma_sync_kernel(dtype), jnp.asarray(a, dtype),
                          jnp.asarray(bt, dtype), backend="sim"))
  np.testing.assert_array_equal(out[:len(hw)].view(np.int32), hw.view(np.int32))


def test_an_operand_outside_smem_is_rejected_at_its_line():
  a = jnp.ones((64, 64), jnp.float16)
  b = jnp.ones((64, 128), jnp.float16)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                scratch_types=[plgpu.SMEM((64, 64), jnp.float16),
                               plgpu.ACC((64, 128), jnp.float32)])
  def kern(a_ref, b_ref, o_ref, a_smem, acc):
    a_smem[...] = a_ref[...]
    plgpu.commit_smem()
    plgpu.wgmma(acc, a_smem, b_ref)  # b_ref: GMEM
    o_ref[...] = acc[...]

  assert lowering_error(kern, a, b) is not None  # (the real lowering refuses it too)
  with pytest.raises(ps.KernelError) as e:
    ps.run(kern, a, b, backend="sim")
  msg = str(e.value)
  assert "wgmma rhs must be in SMEM" in msg and "rhs rhs" not in msg
  assert "test_wgmma.py:" in msg and "plgpu.wgmma(acc, a_smem, b_ref)" in msg
