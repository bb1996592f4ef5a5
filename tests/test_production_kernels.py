"""JAX's own production Hopper kernels (jax.experimental.pallas.ops.gpu, from
the installed jax, never copied), at small sizes, in the simulator against
their references: with no race and no uninitialized memory where JAX's code
has none. They read device properties while tracing (SM count, CUDA
versions): under the simulator they see the simulated GPU's
(backends/sim/frontend/device.py). tests/test_gpu.py runs the same calls on an H200
and compares bit for bit."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

hm = pytest.importorskip("jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu")
am = pytest.importorskip("jax.experimental.pallas.ops.gpu.attention_mgpu")


def matmul_case(cluster, dtype):
  """(fn, args, reference) for hopper_matmul_mgpu.matmul, 512x256x512."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((512, 256)), dtype)
  b = jnp.asarray(rng.standard_normal((256, 512)), dtype)
  cfg = hm.TuningConfig(
      tile_m=64, tile_n=128, tile_k=64, max_concurrent_steps=2,
      cluster_dimension=None if cluster is None else hm.MatmulDimension[cluster],
      grid_minor_dim=hm.MatmulDimension.N, grid_tile_width=4,
      wg_dimension=hm.MatmulDimension.N, epi_tile_n=64, epi_tile_m=64)
  want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  return (lambda a, b: hm.matmul(a, b, None, cfg)), (a, b), want


def attention_case(causal, pipeline_emitter=False):
  """(fn, args, reference) for attention_mgpu: 2 query heads sharing one
  key/value head (GQA), sequence 256, head 64."""
  rng = np.random.default_rng(1)
  q = jnp.asarray(rng.standard_normal((1, 256, 2, 64)), jnp.float16)
  k = jnp.asarray(rng.standard_normal((1, 256, 1, 64)), jnp.float16)
  v = jnp.asarray(rng.standard_normal((1, 256, 1, 64)), jnp.float16)
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, causal=causal)
  fn = am.attention_with_pipeline_emitter if pipeline_emitter else am.attention
  want = np.asarray(am.attention_reference(q, k, v, causal=causal), np.float32)
  return (lambda q, k, v: fn(q, k, v, cfg)), (q, k, v), want


CASES = {
    **{f"hopper_matmul cluster={c} {jnp.dtype(d).name}": (matmul_case, (c, d))
       for c in (None, "M", "N") for d in (jnp.float16, jnp.bfloat16)},
    "attention": (attention_case, (False,)),
    "attention causal": (attention_case, (True,)),
    "attention_with_pipeline_emitter": (attention_case, (False, True)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_production_kernel_matches_its_reference_without_findings(name):
  make, args = CASES[name]
  fn, inputs, want = make(*args)
  sim = ps.simulate(fn, *inputs)  # races and uninitialized memory raise
  got = np.asarray(sim.outputs, np.float32)
  assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), name
  assert sim.report.kernels


def test_kernels_see_the_simulated_gpu_and_nothing_leaks_out():
  from jax.extend import backend
  from jax._src import lib as jax_lib
  had = hasattr(type(jax.devices()[0]), "core_count")
  with ps.backend("sim", gpu="h200"):
    assert backend.get_default_device().core_count == 132
    assert am.cuda_versions is not None and jax_lib.cuda_versions is not None
  assert hasattr(type(jax.devices()[0]), "core_count") == had
  if jax.devices()[0].platform == "cpu":
    assert am.cuda_versions is None and jax_lib.cuda_versions is None


rd = pytest.importorskip("jax.experimental.pallas.ops.gpu.ragged_dot_mgpu")
trd = pytest.importorskip("jax.experimental.pallas.ops.gpu.transposed_ragged_dot_mgpu")
mt = pytest.importorskip("jax.experimental.pallas.ops.gpu.hopper_mixed_type_matmul_mgpu")


def ragged_dot_case():
  rng = np.random.default_rng(2)
  lhs = jnp.asarray(rng.standard_normal((512, 256)), jnp.float16)
  rhs = jnp.asarray(rng.standard_normal((4, 256, 256)), jnp.float16)
  gs = jnp.array([128, 100, 156, 128], jnp.int32)
  want = np.asarray(jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32))
  fn = lambda a, b, g: rd.ragged_dot(a, b, group_sizes=g, block_m=64, block_n=64,
                                     block_k=64, max_concurrent_steps=2, grid_block_n=2)
  return fn, (lhs, rhs, gs), want


def transposed_ragged_dot_case():
  """Groups along K; its TMA boxes reach past the group (and the array's)
  end, relying on TMA's zero fill."""
  rng = np.random.default_rng(4)
  lhs = jnp.asarray(rng.standard_normal((512, 128)), jnp.float16)
  rhs = jnp.asarray(rng.standard_normal((512, 128)), jnp.float16)
  gs = jnp.array([128, 64, 192, 128], jnp.int32)
  want = np.asarray(trd.ref_transposed_ragged_dot(lhs, rhs, gs), np.float32)
  fn = lambda a, b, g: trd.transposed_ragged_dot(
      a, b, group_sizes=g, block_m=64, block_n=64, block_k=64, max_concurrent_steps=2,
      grid_block_n=1)
  return fn, (lhs, rhs, gs), want


def mixed_type_case():
  rng = np.random.default_rng(3)
  a = jnp.asarray(rng.integers(-128, 127, (256, 256)), jnp.int8)
  b = jnp.asarray(rng.standard_normal((256, 256)), jnp.bfloat16)
  cfg = mt.TuningConfig(tile_m=64, tile_n=128, tile_k=64, max_concurrent_steps=2)
  fn = lambda a, b: mt.mixed_matmul_kernel(a, b, out_dtype=jnp.bfloat16, config=cfg)
  return fn, (a, b), np.asarray(mt.reference(a, b, out_dtype=jnp.float32))


# Kernels of JAX's whose races are JAX's own (library races: warned, not
# raised; benchmarks/RESULTS.md): the values are right in this timing; the
# reports name the two agents.
RACY = {
    # wgmma issued in the pipeline body with delay_release=1 and never
    # awaited: a TMA refill may overwrite SMEM a wgmma group still reads.
    "ragged_dot": (ragged_dot_case, ("wgmma", "tma_load")),
    "transposed_ragged_dot": (transposed_ragged_dot_case, ("wgmma", "tma_load")),
    # plain SMEM reads of an emit_pipeline stage, then its TMA refill with
    # no commit_smem between them.
    "mixed_type_matmul": (mixed_type_case, ("thread", "tma_load")),
}


@pytest.mark.parametrize("name", list(RACY))
def test_production_kernels_with_races_in_jax_s_code(name):
  make, agents = RACY[name]
  fn, inputs, want = make()
  sim = ps.simulate(fn, *inputs, on_race="report")
  got = np.asarray(sim.outputs, np.float32)
  assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), name
  found = {(r.kind, r.first.agent, r.second.agent) for r in sim.report.races}
  assert found == {("read-write race",) + agents}, found
  assert sim.report.uninitialized == []


def test_races_in_jax_s_own_code_warn_by_default_and_raise_when_asked():
  """Both accesses inside jax's package: reported (race.library) and warned,
  not raised, unless library_races="raise"; each says what the timing saw."""
  fn, inputs, _ = ragged_dot_case()
  with pytest.warns(ps.RaceWarning, match="in jax's own code, not yours"):
    sim = ps.simulate(fn, *inputs)  # (on_race="raise", the default)
  assert sim.report.races and all(r.library for r in sim.report.races)
  for r in sim.report.races:
    # Latent on an H200 (bit-identical in 320 runs): here, too, the wgmma had
    # finished before the refill began.
    assert r.overlapped == 0 and r.min_slack > 0, str(r)
    assert "only unordered" in str(r) and "cycles of slack" in str(r)
  with pytest.raises(ps.RaceError, match="read-write race"):
    ps.simulate(fn, *inputs, library_races="raise")


def user_kernel_around_jax_s_matmul(read):
  """A user's kernel whose body is JAX's Hopper matmul kernel body
  (hopper_matmul_mgpu.kernel), then (`read`) a plain read of its output by
  thread 0: JAX's body awaits its TMA stores only with wait_read_only=True,
  so their GMEM writes race with the user's read."""
  import functools
  cfg = hm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                        epi_tile_m=64, epi_tile_n=64)
  out = jax.ShapeDtypeStruct((128, 128), jnp.float16)

  @functools.partial(
      plgpu.kernel, out_type=(out, out), grid=(1,), grid_names=("cluster_grid",),
      cluster=(1,), cluster_names=("cluster",), num_threads=3, thread_name="wg",
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup))
  def k(a, b, o, copy):
    hm.kernel(a, b, None, o, cfg)

    @pl.when(lax.axis_index("wg") == 0)
    def _():
      if read:
        copy[...] = o[...]  # user-read
      else:
        copy[...] = a[...]
  return k


def test_a_race_between_jax_s_code_and_the_user_s_is_the_user_s():
  """One access in jax's package, the other in the user's file: raised (it
  is the user's to fix), not warned as jax's own."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((128, 128)), jnp.float16)
  assert ps.simulate(user_kernel_around_jax_s_matmul(False), a, a).report.races == []
  sim = ps.simulate(user_kernel_around_jax_s_matmul(True), a, a, on_race="report",
                    on_uninitialized="report")
  assert sim.report.races
  for r in sim.report.races:
    files = {side.where.rsplit(":", 1)[0].rsplit("/", 1)[-1]: side.library
             for side in (r.first, r.second)}
    assert files == {"hopper_matmul_mgpu.py": True,
                     "test_production_kernels.py": False}, str(r)
    assert not r.library and "in jax's own code" not in str(r), str(r)
  with warnings.catch_warnings():
    warnings.simplefilter("error", ps.RaceWarning)
    with pytest.raises(ps.RaceError, match="write-read race on o "):
      ps.simulate(user_kernel_around_jax_s_matmul(True), a, a, on_uninitialized="report")


@pytest.mark.parametrize("name", ["hopper_matmul cluster=M float16", "attention causal",
                                  "attention_with_pipeline_emitter"])
def test_estimate_gives_simulates_times_on_jaxs_kernels(name):
  make, args = CASES[name]
  fn, inputs, _ = make(*args)
  full = ps.simulate(fn, *inputs, check_races=False, check_uninitialized=False,
                     workers=1).report
  est = ps.estimate(fn, *[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs])
  for k_full, k_est in zip(full.kernels, est.kernels, strict=True):
    assert k_est.time_s == k_full.time_s and k_est.bound == k_full.bound
    assert k_est.block_cycles_max == k_full.block_cycles_max


def attention_backward_case(compute_wgs):
  """(the loss, q, k, v) of attention at block sizes 64, f16, seq 256, with
  `compute_wgs` compute warpgroups in its backward kernels."""
  from jax.experimental.pallas.ops.gpu import attention_mgpu as am
  cfg = am.TuningConfig(block_q=64, block_kv=64, max_concurrent_steps=2, block_q_dkv=64,
                        block_kv_dkv=64, block_q_dq=64, block_kv_dq=64,
                        compute_wgs_bwd=compute_wgs)
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((1, 256, 1, 64)), jnp.float16)
             for _ in range(3))
  return (lambda q, k, v: am.attention(q, k, v, cfg).astype(jnp.float32).sum()), q, k, v


@pytest.mark.parametrize("compute_wgs", [1, 2])
def test_races_in_a_library_kernel_s_backward_pass_name_its_lines_and_the_call(
    compute_wgs):
  """jax.grad through JAX's attention: its backward kernels are traced by
  autodiff (under the forward call's traceback), yet each access is located
  at the kernel's own line in attention_mgpu.py, the user's call is named,
  and the races (plain reads, then a TMA refill with no commit_smem between:
  JAX's own) are reported, not raised."""
  import inspect
  from jax.experimental.pallas.ops.gpu import attention_mgpu as am
  loss, q, k, v = attention_backward_case(compute_wgs)
  call = inspect.currentframe().f_lineno + 4  # (the jax.grad line)
  with warnings.catch_warnings(record=True) as warned:
    warnings.simplefilter("always")
    with ps.backend("sim") as report:
      grads = jax.block_until_ready(jax.grad(loss, argnums=(0, 1, 2))(q, k, v))
  ref = lambda q, k, v: am.attention_reference(q, k, v).astype(jnp.float32).sum()
  for got, want in zip(grads, jax.grad(ref, argnums=(0, 1, 2))(q, k, v)):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.abs(got - want).max() <= 1e-2 * max(1.0, np.abs(want).max())
  assert report.uninitialized == []
  assert report.races and any(issubclass(w.category, ps.RaceWarning)
                              and "in jax's own code" in str(w.message) for w in warned)
  for r in report.races:
    for side in (r.first, r.second):
      assert side.where.rsplit(":", 1)[0].endswith("attention_mgpu.py"), str(r)
    assert r.library and r.call_site.endswith(f"test_production_kernels.py:{call}"), str(r)
    assert "commit_smem" in r.advice
  with pytest.raises(ps.RaceError, match="the kernel was called from .*test_production"):
    with ps.backend("sim", library_races="raise"):
      jax.block_until_ready(jax.grad(loss, argnums=(0, 1, 2))(q, k, v))
