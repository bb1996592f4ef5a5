"""Agreement with the real Mosaic GPU lowering on a Hopper GPU (H100/H200).
Marked `gpu`: skipped where there is none (CI). Run with `./dev test -m gpu`
on a GPU machine, or see docs/gpu-lab.md."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernels as K
import pallas_sim as ps
from conftest import assert_bit_equal, rel_err
from quickstart import fill_42, iota, matmul
from test_errors import pipeline_copy
from test_quickstart import SWEEP, _ab, _smem_need, matmul_mcs

pytestmark = pytest.mark.gpu


def both(fn, *args):
  # Values only: race reports are checked by the CPU tests.
  sim = ps.run(fn, *args, backend="sim", on_race="report")
  real = ps.run(fn, *args, backend="mosaic")
  return jax.tree.map(np.asarray, (sim, real))


def test_auto_picks_mosaic_on_hopper():
  from pallas_sim.api import resolve_backend
  assert resolve_backend("auto") == "mosaic"


def test_quickstart_fill_and_iota_agree():
  for fn in (fill_42, iota):
    sim, real = both(fn)
    assert_bit_equal(sim, real)


@pytest.mark.parametrize("m,k,n,tile_n,tile_k,mcs", SWEEP)
def test_matmul_sweep_agrees(rng, m, k, n, tile_n, tile_k, mcs):
  a, b, want = _ab(rng, m, k, n)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k,
                               max_concurrent_steps=mcs)
  if _smem_need(128, tile_n, tile_k, mcs) > 232448:
    with pytest.raises(ps.SmemOverflowError) as sim_e:
      ps.run(fn, a, b, backend="sim")
    with pytest.raises(Exception) as real_e:
      ps.run(fn, a, b, backend="mosaic")
    assert f"smem_bytes={sim_e.value.smem_bytes}" in str(real_e.value)
    return
  sim, real = both(fn, a, b)
  assert rel_err(real, want) < 1e-3
  # The tensor core's summation is modelled bit for bit.
  assert_bit_equal(sim, real, "matmul")


def test_quickstart_matmul_as_written_agrees(rng):
  a, b, want = _ab(rng, 512, 512, 512)
  sim, real = both(matmul, a, b)
  assert rel_err(real, want) < 1e-3
  assert_bit_equal(sim, real, "quickstart matmul")


def test_tf32_matmul_is_bit_exact(rng):
  from test_wgmma import tf32_matmul
  a = jnp.asarray(rng.standard_normal((128, 32)), jnp.float32)
  b = jnp.asarray(rng.standard_normal((256, 32)), jnp.float32)
  sim, real = both(tf32_matmul, a, b)
  assert_bit_equal(sim, real, "tf32")


RUNNABLE = [e for e in K.EXAMPLES if e[0] not in K.NOT_LOWERABLE]


@pytest.mark.parametrize("name,fn,make_args,reference", RUNNABLE,
                         ids=[e[0] for e in RUNNABLE])
def test_example_kernels_agree(name, fn, make_args, reference):
  args = make_args(3)
  sim, real = both(fn, *args)
  K._outputs_match(name, real, reference(*args))
  if name in K.INEXACT:  # (documented exceptions: f32 libdevice functions)
    K._outputs_match(name, sim, real)
  else:
    assert_bit_equal(sim, real, name)


def test_smem_overflow_error_agrees():
  x = jnp.ones((512, 256), jnp.float32)
  with pytest.raises(ps.SmemOverflowError) as sim_e:
    ps.run(pipeline_copy, x, backend="sim")
  with pytest.raises(Exception) as real_e:
    ps.run(pipeline_copy, x, backend="mosaic")
  assert "smem_bytes=262160 > max_smem_bytes=232448" in str(real_e.value)
  assert "smem_bytes=262160 > max_smem_bytes=232448" in str(sim_e.value)


@pytest.mark.parametrize("which", ["matmul", "matmul_warp_specialized"])
def test_pipelining_guide_kernels_agree(which):
  import pipelining_guide as G
  a, b = G.guide_inputs()  # the guide's own shapes
  sim, real = both(getattr(G, which), a, b)
  want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  assert rel_err(real, want) < 1e-3
  assert_bit_equal(sim, real, which)


def test_store_through_an_all_integer_index_agrees():
  import jax.numpy as jnp
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.SMEM((2, 128), jnp.float32)])
  def k(x_ref, o_ref, smem):
    smem[...] = jnp.zeros((2, 128), jnp.float32)
    smem.at[1, 5][...] = x_ref[5]
    o_ref[...] = smem[1]

  x = jnp.arange(128, dtype=jnp.float32) + 1
  sim, real = both(k, x)
  assert_bit_equal(sim, real)


@pytest.mark.parametrize("op", ["inc", "dec"])
def test_tma_reduction_inc_and_dec_agree(op):
  from test_semantics import WRAP_BOUND, WRAP_OLD, reduction_store
  x = jnp.asarray(np.stack([WRAP_OLD, WRAP_BOUND]).view(np.int32))
  sim, real = both(reduction_store(op, jnp.int32), x)
  assert_bit_equal(sim, real)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_float_to_int_cast_of_specials_agrees(dtype):
  # NaN -> 0 and saturation, as found by the agreement suite (bf16 differed).
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32))
  def k(x_ref, o_ref):
    o_ref[...] = jnp.log(x_ref[...]).astype(jnp.int32)

  x = np.full(128, 2.0, np.float32)
  x[:4] = [-1.0, 0.0, np.inf, 6e4]
  sim, real = both(k, jnp.asarray(x, dtype))
  assert_bit_equal(sim, real)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_fused_multiply_add_agrees_bit_for_bit(dtype):
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), dtype))
  def k(x_ref, y_ref, o_ref):
    x = x_ref[...]
    o_ref[0] = x * x - y_ref[...]
    p = x * x
    o_ref[1] = p - y_ref[...] + p * y_ref[...]  # two products: one is fused

  r = np.random.default_rng(0)
  x = jnp.asarray(r.uniform(-2, 2, 128), dtype)
  y = jnp.asarray(r.uniform(-2, 2, 128), dtype)
  sim, real = both(k, x, y)
  assert_bit_equal(sim, real)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_adds_of_known_zeros_fold_as_on_hardware(dtype):
  from test_semantics import KNOWN_ZEROS, known_zero_kernel
  r = np.random.default_rng(3)
  x = jnp.asarray(r.uniform(-2, 2, (1, 256)), dtype)
  y = jnp.asarray(r.uniform(-2, 2, (1, 256)), dtype)
  zeros = dict(KNOWN_ZEROS, not_known=lambda v: v * jnp.asarray(0, dtype))
  for name, zero in zeros.items():
    sim, real = both(known_zero_kernel(dtype, zero), x, y)
    assert_bit_equal(sim, real, name)


def test_debug_print_writes_what_the_gpu_prints(capfd):
  """The same lines as the GPU's printf, tags aside (the GPU's order across
  threads is its own: compared as multisets)."""
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32), grid=(2,),
                grid_names=("b",), num_threads=2, thread_name="t")
  def k(x_ref, i_ref, o_ref):
    t = lax.axis_index("t")
    b = lax.axis_index("b")
    pl.debug_print("b={} t={} i={} u8={} flag={} 100%% done", b, t, i_ref[0],
                   i_ref[1].astype(jnp.uint8), i_ref[0] < 0)
    pl.debug_print("f32 {} f16 {} bf16 {} nan {} -inf {} -0 {}", x_ref[0],
                   x_ref[1].astype(jnp.float16), x_ref[1].astype(jnp.bfloat16),
                   x_ref[2], x_ref[3], x_ref[4])

    @pl.when(jnp.logical_and(t == 0, b == 1))
    def _():
      pl.debug_print("x: {}", x_ref[...])
      pl.debug_print("i: {}", i_ref[...])
    o_ref[t] = x_ref[...]

  x = np.arange(128, dtype=np.float32) / 3 + 1
  x[2:5] = [np.nan, -np.inf, -0.0]
  i = np.array([-1, 255] + list(range(-63, 63)), np.int32)
  args = (jnp.asarray(x), jnp.asarray(i))
  capfd.readouterr()
  jax.block_until_ready(ps.run(k, *args, backend="mosaic"))
  real = capfd.readouterr().out.splitlines()
  ps.run(k, *args, backend="sim", on_race="report")
  sim = [ln.split("] ", 1)[1] for ln in capfd.readouterr().out.splitlines()
         if ln.startswith("[block")]
  assert len(real) == 2 * 2 * 2 + 2 * 128, real[:10]
  assert sorted(sim) == sorted(real), sorted(set(sim) ^ set(real))[:10]


@pytest.mark.parametrize("name", [
    "hopper_matmul cluster=None float16", "hopper_matmul cluster=M bfloat16",
    "hopper_matmul cluster=N float16", "attention", "attention causal",
    "attention_with_pipeline_emitter"])
def test_production_kernels_agree(name):
  """JAX's own kernels: the matmuls bit for bit; attention within the f32
  exp's last bits (the documented libdevice exception)."""
  from test_production_kernels import CASES
  make, args = CASES[name]
  fn, inputs, want = make(*args)
  sim, real = both(fn, *inputs)
  if name.startswith("hopper_matmul"):
    assert_bit_equal(sim, real, name)
  else:
    sim, real = np.asarray(sim, np.float32), np.asarray(real, np.float32)
    assert np.abs(sim - real).max() <= 4e-3 * np.abs(real).max(), name


@pytest.mark.parametrize("compute_wgs", [1, 2])
def test_attention_backward_agrees(compute_wgs):
  """jax.grad through JAX's attention: its backward kernels' gradients
  against the GPU's, within the f32 exp's last bits (its races are JAX's,
  reported, not raised). On an H200: dk and dv bit for bit, dq 3 of 16384
  elements apart, by 1.8e-7 of the largest."""
  from test_production_kernels import attention_backward_case
  loss, *inputs = attention_backward_case(compute_wgs)
  grad = jax.grad(loss, argnums=(0, 1, 2))
  sim, real = both(grad, *inputs)
  for s, r in zip(sim, real, strict=True):
    s, r = np.asarray(s, np.float32), np.asarray(r, np.float32)
    assert np.abs(s - r).max() <= 1e-5 * np.abs(r).max(), compute_wgs


@pytest.mark.parametrize("cluster", [(2,), (4,), (2, 2)])
def test_cluster_multicast_agrees(cluster):
  from test_clusters import _x, multicast_kernel
  sim, real = both(multicast_kernel(cluster=cluster), _x())
  assert_bit_equal(sim, real, f"multicast {cluster}")


def test_cluster_barrier_exchange_agrees():
  from test_clusters import _exchange_kernel
  sim, real = both(_exchange_kernel(True), jnp.arange(128, dtype=jnp.float32))
  assert_bit_equal(sim, real, "cluster exchange")


@pytest.mark.parametrize("name", ["ragged_dot", "transposed_ragged_dot",
                                  "mixed_type_matmul"])
def test_production_kernels_with_races_agree(name):
  """JAX's kernels whose races are latent on the H200: same values."""
  from test_production_kernels import RACY
  fn, inputs, _ = RACY[name][0]()
  sim, real = both(fn, *inputs)
  assert_bit_equal(sim, real, name)


def test_tma_boxes_past_the_end_agree():
  from test_semantics import tma_past_the_end_kernel
  x = jnp.arange(100 * 128, dtype=jnp.float32).reshape(100, 128)
  sim, real = both(tma_past_the_end_kernel(), x)
  assert_bit_equal(sim, real, "TMA past the end")


@pytest.mark.parametrize("tiled", [False, True])
def test_cluster_ref_agrees(tiled):
  from test_clusters import cluster_ref_kernel
  x = jnp.arange(2 * 64 * 32, dtype=jnp.float32).reshape(2, 64, 32)
  sim, real = both(cluster_ref_kernel(tiled=tiled), x)
  assert_bit_equal(sim, real, "cluster_ref")


_CLUSTER_END = """
import sys, os
sys.path[:0] = [os.path.join(os.getcwd(), "tests"), os.path.join(os.getcwd(), "examples")]
import jax, jax.numpy as jnp, numpy as np
from test_clusters import cluster_ref_kernel
x = jnp.arange(2 * 64 * 32, dtype=jnp.float32).reshape(2, 64, 32)
for _ in range(20):
  out = np.asarray(jax.block_until_ready(cluster_ref_kernel(end_sync={}, late=20000)(x)))
  assert (out == np.asarray(x)[::-1]).all()
print("ok")
"""


def test_a_block_ending_while_its_peer_reads_its_smem_fails_the_launch():
  """What the simulator reports as "block ends while a peer may access its
  SMEM" (tests/test_clusters.py): on the GPU the launch fails; with the
  cluster barrier at the end it runs. In subprocesses: a failed launch
  leaves the process's CUDA context unusable."""
  import subprocess
  import sys
  run = lambda end_sync: subprocess.run(
      [sys.executable, "-c", _CLUSTER_END.format(end_sync)], capture_output=True,
      text=True, timeout=300)
  good = run(True)
  assert good.returncode == 0 and "ok" in good.stdout, good.stderr[-2000:]
  bad = run(False)
  assert bad.returncode != 0, bad.stdout
  assert "LAUNCH_FAILED" in bad.stderr or "launch failure" in bad.stderr, (
      bad.stderr[-2000:])


def test_warp_level_kernels_agree():
  import test_warps as W
  x = jax.random.uniform(jax.random.key(0), (64, 32), jnp.float32)
  for name, fn, args in [("warp ids", W.warp_ids(), ()),
                         ("ping-pong", W.ping_pong(), ()),
                         ("TMA between warps", W.tma_between_warps(), (x,)),
                         ("GMEM between warps", W.gmem_between_warps(True),
                          (jnp.array([7], jnp.int32),)),
                         ("barrier_test", W.barrier_test_kernel(), ())]:
    sim, real = both(fn, *args)
    assert_bit_equal(sim, real, name)


def test_semaphore_kernels_agree():
  import test_semaphores as S
  for name, fn in [("handoff", S.handoff()), ("values", S.values_kernel()),
                   ("per block", S.per_block_kernel())]:
    sim, real = both(fn)
    assert_bit_equal(sim, real, name)


def test_atomics_and_async_store_smem_agree():
  import test_atomics as A
  for op in ("add", "max", "xor"):
    x = A._inputs(jnp.int32)
    sim, real = both(A.two_thread_atomic(op), x)
    assert_bit_equal(sim, real, f"atomic_{op}")
  for atomic in (None, "add"):
    sim, real = both(A.exchange(atomic), *A._exchange_args())
    assert_bit_equal(sim, real, f"async_store_smem atomic={atomic}")


@pytest.mark.parametrize("per_warp", [False, True])
def test_profiler_traces_have_the_gpus_structure(tmp_path, per_warp):
  """The same ranges on the same tracks as the real profiler's trace (the
  times are the simulated clock's; the GPU's are not compared)."""
  from test_profiler import _trace, _x, scoped_kernel
  out = {}
  for backend in ("sim", "mosaic"):
    d = tmp_path / backend
    d.mkdir()  # (the real profiler writes into an existing directory)
    ps.run(scoped_kernel(d, per_warp=per_warp), _x(), backend=backend)
    by_tid = out[backend] = {}
    for e in _trace(d):
      by_tid.setdefault(e["tid"], []).append((e["name"], e["ph"]))
  assert out["sim"] == out["mosaic"]


def test_ref_union_aliasing_agrees():
  from test_aliasing import union_kernel
  x = jnp.arange(256, dtype=jnp.float32) * 1.5
  sim, real = both(union_kernel(), x)
  assert_bit_equal(sim, real, "RefUnion")


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint32])
def test_shifts_agree(dtype):
  from test_semantics import shifts_kernel
  # (amounts in range: past it the GPU's answer is the compiler's choice)
  k, args = shifts_kernel(dtype, 32)
  sim, real = both(k, *args)
  assert_bit_equal(sim, real, "shifts")


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn,
                                   jnp.float8_e5m2, jnp.int8, jnp.int4])
def test_mma_sync_agrees(dtype):
  from test_wgmma import mma_sync_kernel, mma_sync_operands
  a, bt = mma_sync_operands(dtype, seed=3)
  sim, real = both(mma_sync_kernel(dtype), a, bt)
  assert_bit_equal(sim, real, f"mma {jnp.dtype(dtype).name}")


def test_bulk_copies_and_their_limit_agree():
  from test_semantics import bulk_copy_kernel
  x = jnp.arange(8 * 512, dtype=jnp.float32).reshape(8, 512)
  sim, real = both(bulk_copy_kernel(), x)
  assert_bit_equal(sim, real, "bulk copy")
  with pytest.raises(Exception, match="<=256 elements along each dimension"):
    ps.run(bulk_copy_kernel(out_shape=(8, 1024)), x, backend="mosaic")


def test_the_tensor_cores_sum_is_the_gpus_reference_not_xla_cpus():
  """JAX's PipelineTest.test_realistic_matmul compares with `a @ b` at
  16896x640x512: on the GPU, at that shape, XLA's matmul sums as the tensor
  core does (bit for bit the kernel's, and ours); on a CPU, XLA:CPU rounds
  its f32 sums differently, so that test's own reference fails there, not
  the simulator. (At other shapes XLA:GPU may sum otherwise: 512x640x512
  differs in 579 elements.)"""
  import jax.random as jr
  k1, k2 = jr.split(jr.key(42))
  a = jr.uniform(k1, (132 * 128, 640), jnp.float16)
  b = jr.uniform(k2, (640, 512), jnp.float16)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=128, tile_k=64, max_concurrent_steps=2)
  sim, real = both(fn, a, b)
  assert_bit_equal(sim, real, "pipelined matmul")
  assert_bit_equal(real, np.asarray(a @ b), "XLA:GPU a @ b")
  cpu = jax.devices("cpu")[0]
  on_cpu = np.asarray(jax.device_put(a, cpu) @ jax.device_put(b, cpu))
  assert (on_cpu != real).any()  # (XLA:CPU's sums: not the tensor core's)


def test_inline_mgpu_agrees():
  import test_inline_mgpu as T
  rng = np.random.default_rng(5)
  x = rng.integers(-10, 10, (128, 128)).astype(np.int8)
  s = rng.uniform(-100, 100, 128).astype(jnp.bfloat16)
  for layout in (plgpu.Layout.WGMMA, plgpu.Layout.WGMMA_UPCAST_2X):
    sim, real = both(T.scaled_rows, x, s, layout)
    assert_bit_equal(sim, real, "inline_mgpu broadcast and product")
  for dtype in (jnp.bfloat16, jnp.int16, jnp.uint16):
    xs = rng.uniform(-10, 10, (2, 128, 128)).astype(dtype)
    sim, real = both(T.twice_plus_one_swizzled, xs)
    assert_bit_equal(sim, real, f"inline_mgpu swizzled SMEM {jnp.dtype(dtype).name}")
  for grid, cluster in [((2, 3), (2,)), ((2, 3, 4, 5), (2,))]:
    sim, real = both(T.cuda_block_index, grid, cluster)
    assert_bit_equal(sim, real, f"CUDA block ids {grid} {cluster}")
  sim, real = both(T.warp_scalar)
  assert_bit_equal(sim, real, "inline_mgpu in a warp")
  for dtype in (np.float32, np.float16, jnp.bfloat16):
    x, y, z = (rng.uniform(-4, 4, (128, 128)).astype(dtype) for _ in range(3))
    sim, real = both(T.float_ops, x, y, z)
    for a, b, what in zip(sim, real, ("x*y+z", "(x+z)/y", "x*y", "z-x*y")):
      assert_bit_equal(a, b, f"inline_mgpu {what} {np.dtype(dtype).name}")



def test_dequantized_weights_and_transposed_store_agree():
  from test_wgmma import dequantized_matmul_t
  r = np.random.default_rng(11)
  for m in (8, 64):
    w = jnp.asarray(r.integers(-127, 128, (64, 128)), jnp.int8)
    s = jnp.asarray(r.uniform(0.001, 0.01, 64), jnp.bfloat16)
    x = jnp.asarray(r.standard_normal((m, 128)), jnp.bfloat16)
    sim, real = both(dequantized_matmul_t, w, s, x)
    assert_bit_equal(sim, real, f"int8 weights upcast in registers, transposed store, m={m}")

def test_leader_tracked_cluster_barrier_agrees():
  from test_clusters import leader_tracked_gather
  # (no cross-block GMEM reads: the summing leader once read stale rows on
  # the H200, benchmarks/HISTORY.md)
  sim, real = both(leader_tracked_gather(sum_rows=False))
  assert_bit_equal(sim, real, "leader-tracked cluster barrier")


def test_division_and_subnormals_agree():
  from test_numerics import div_kernel
  rng = np.random.default_rng(9)
  for dtype in (np.float32, np.float16, jnp.bfloat16):
    x = (rng.uniform(-2, 2, 4096) * 2.0 ** rng.integers(-30, 30, 4096)).astype(dtype)
    y = (rng.uniform(-2, 2, 4096) * 2.0 ** rng.integers(-30, 30, 4096)).astype(dtype)
    sim, real = both(div_kernel((4096,), dtype), x, y)
    assert_bit_equal(sim, real, f"x / y {np.dtype(dtype).name}")
  # Subnormal operands and results are kept (no flush to zero), both sides.
  tiny = (np.arange(1, 4097) * 2.0 ** -149).astype(np.float32)
  sim, real = both(div_kernel((4096,), np.float32), tiny, np.full(4096, 3.0, np.float32))
  assert_bit_equal(sim, real, "subnormal / 3")
  assert (np.asarray(real) != 0).any()


def test_4_bit_union_members_agree():
  from test_aliasing import nibble_kernel
  x = np.arange(-64, 64, dtype=np.int8) * 3
  for dtype in (jnp.uint4, jnp.int4):
    sim, real = both(nibble_kernel(dtype), x)
    assert_bit_equal(sim[0], real[0], f"{jnp.dtype(dtype).name} member in registers")
    np.testing.assert_array_equal(np.asarray(sim[1]).astype(np.int32),
                                  np.asarray(real[1]).astype(np.int32))


def test_the_gpus_division_is_the_references_on_the_gpu_not_xla_cpus():
  """JAX's PallasCallTest.test_binary_op (lax.div, f32) compares the kernel's
  x / y with `lax.div(x, y)` outside it. On the H200 the kernel divides by
  div.full.f32 (as the simulator does, bit for bit); on a CPU the reference
  is XLA:CPU's correctly rounded division, which differs: that test's own
  reference fails there, not the simulator."""
  from test_numerics import div_kernel
  import jax.random as jr
  key0, key1 = jr.split(jr.key(0), 2)
  x = (jr.uniform(key0, [256]) * 42 - 21).astype(jnp.float32)
  y = (jr.uniform(key1, [256]) * 42 - 21).astype(jnp.float32)
  sim, real = both(div_kernel((256,), jnp.float32), x, y)
  assert_bit_equal(sim, real, "kernel x / y")
  cpu = jax.devices("cpu")[0]
  on_cpu = np.asarray(jax.lax.div(jax.device_put(x, cpu), jax.device_put(y, cpu)))
  assert (on_cpu != real).any()  # (XLA:CPU rounds correctly; div.full does not)
  print("XLA:GPU's lax.div equals the kernel's:",
        bool((np.asarray(jax.lax.div(x, y)) == real).all()))


def test_inline_mgpu_lax_ops_agree():
  import test_inline_mgpu as T
  rng = np.random.default_rng(11)
  for name in ("max", "min", "sub", "div", "rem", "shift_right_arithmetic"):
    for dtype in (np.float32, jnp.bfloat16, np.float16, np.int32, np.int16):
      isf = np.dtype(dtype).kind == "f" or dtype == jnp.bfloat16
      if isf and name in ("rem", "shift_right_arithmetic"):
        continue
      x, y = T._operands(rng, name, dtype)
      sim, real = both(T.binary_two_ways, name, x, y)
      for a, b, path in zip(sim, real, ("lax", "inline_mgpu")):
        assert_bit_equal(a, b, f"{path} {name} {np.dtype(dtype).name}")


def test_small_additions_agree():
  """semaphore_signal_parallel, one_minus_square and log2, and reshard inside
  a kernel (the identity), against the real lowering."""
  from jax import lax
  from test_semaphores import parallel_signal_kernel
  sim, real = both(parallel_signal_kernel())
  assert_bit_equal(sim, real, "semaphore_signal_parallel")

  x = np.linspace(0.25, 3.0, 128).astype(np.float32)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.float32))
  def k(x_ref, o_ref):
    o_ref[0] = jnp.log2(x_ref[...])
    o_ref[1] = lax.one_minus_square(x_ref[...])
  sim, real = both(k, x)
  assert_bit_equal(sim[1], real[1], "one_minus_square")
  assert rel_err(sim[0], real[0]) < 1e-6  # (log2: libdevice, within 2 ulp)

  from test_semantics import reshard_relu
  mesh, xs, relu = reshard_relu()
  with jax.set_mesh(mesh):
    sim, real = both(relu, xs)
  assert_bit_equal(sim, real, "reshard in a kernel")


@pytest.mark.parametrize("form", ["ptx", "nvvm"])
@pytest.mark.parametrize("fence", ["producer", "consumer"])
def test_named_barrier_producer_consumer_agrees(form, fence):
  import named_barriers as nb
  args = nb.producer_consumer_args(0)
  sim, real = both(lambda *a: nb.producer_consumer(*a, form=form, fence=fence), *args)
  np.testing.assert_allclose(real, nb.producer_consumer_reference(*args), rtol=1e-5,
                             atol=1e-4)
  assert_bit_equal(sim, real, "named barriers")


def test_named_barrier_ping_pong_agrees():
  import named_barriers as nb
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 64, 128), jnp.float32)
  sim, real = both(nb.ping_pong, x)
  assert_bit_equal(sim, real, "ping pong")
  assert_bit_equal(real, np.asarray(x).sum(0), "ping pong's sum")


def test_a_named_barrier_phase_that_never_completes_hangs_the_gpu_too():
  """The simulator's DeadlockError for a bar.sync that only one consumer
  releases: on the H200 the same launch never finishes (run in a child
  process, killed after 25 s)."""
  import subprocess
  import sys
  import textwrap
  code = textwrap.dedent('''
      import sys; sys.path[:0] = ["examples"]
      import jax, named_barriers as nb
      args = nb.producer_consumer_args(0)
      jax.block_until_ready(nb.producer_consumer(*args, bug="one_consumer"))
      print("FINISHED")
  ''')
  try:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=25, cwd=os.path.dirname(os.path.dirname(__file__)))
    finished = "FINISHED" in p.stdout
  except subprocess.TimeoutExpired:
    finished = False
  assert not finished
  with pytest.raises(ps.DeadlockError):
    import named_barriers as nb
    ps.run(lambda *a: nb.producer_consumer(*a, bug="one_consumer"),
           *nb.producer_consumer_args(0), backend="sim")


def test_a_declared_unwritten_tail_agrees_where_written():
  from test_libraries import N, X, _rows_below_n, ragged_rows
  with ps.leave_unwritten("ragged_rows", _rows_below_n):
    sim, real = both(ragged_rows, X, N)
  n = int(N[0])
  assert_bit_equal(sim[:n], real[:n], "ragged rows")


def test_a_warp_waiting_alone_map_after_map_agrees():
  from test_warps import one_warp_waits_each_map
  x = jnp.arange(3 * 128, dtype=jnp.float32).reshape(3, 128)
  sim, real = both(one_warp_waits_each_map(), x)
  assert_bit_equal(sim, real, "one warp waits")
  assert_bit_equal(real, np.asarray(x), "one warp waits, values")
