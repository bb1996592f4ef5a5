"""The quickstart's kernels, as written there, through every entry point."""
import contextlib
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from conftest import rel_err
from quickstart import fill_42, iota, matmul

IOTA = np.arange(1024, dtype=np.float32)


def _ab(rng, m, k, n, dtype=jnp.float16):
  a = jnp.asarray(rng.standard_normal((m, k)), dtype)
  b = jnp.asarray(rng.standard_normal((k, n)), dtype)
  return a, b, np.asarray(a, np.float32) @ np.asarray(b, np.float32)


def test_run_fill_and_iota():
  np.testing.assert_array_equal(ps.run(fill_42, backend="sim"), np.full(128, 42.0))
  np.testing.assert_array_equal(ps.run(iota, backend="sim"), IOTA)


def test_simulate_gives_outputs_and_report(rng):
  a, b, want = _ab(rng, 256, 256, 256)
  sim = ps.simulate(matmul, a, b, gpu="h100")
  assert rel_err(sim.outputs, want) < 1e-3
  [k] = sim.report.kernels
  assert k.grid == (2, 2) and k.num_blocks == 4
  assert k.smem_bytes == 98320  # what the real lowering allocates (see analysis/resources.py)
  assert k.wgmma_flops == 2 * 256 ** 3
  assert k.tma_load_bytes == 4 * (128 * 256 * 2 * 2)  # each block: A and B panels
  assert k.time_s > 0 and "quickstart.py" in k.where


def test_backend_context_runs_plain_calls_simulated(rng):
  a, b, want = _ab(rng, 256, 512, 256)
  with ps.backend("sim") as report:
    out = matmul(a, b)
    f = fill_42()
  assert rel_err(out, want) < 1e-3
  np.testing.assert_array_equal(f, 42.0)
  assert [k.name for k in report.kernels] == ["kernel", "fill_42"]


def test_backend_context_under_jit(rng):
  a, b, want = _ab(rng, 256, 256, 256)
  f = jax.jit(lambda a, b: matmul(a, b) * 2)
  with ps.backend("sim") as report:
    out = f(a, b)
  assert rel_err(out, 2 * want) < 1e-3
  assert len(report.kernels) == 1


def test_ps_kernel_decorator():
  @ps.kernel(out_type=jax.ShapeDtypeStruct((1024,), jnp.float32), grid=(8,),
             grid_names=("i",), backend="sim")
  def iota2(o_ref):
    i = jax.lax.axis_index("i")
    o_ref[pl.ds(i * 128, 128)] = jnp.arange(128, dtype=jnp.float32) + i * 128

  np.testing.assert_array_equal(iota2(), IOTA)


def test_auto_picks_sim_without_a_hopper_gpu():
  from pallas_sim.backends import mosaic
  if mosaic.hopper_device() is not None:
    pytest.skip("a Hopper GPU is present")
  np.testing.assert_array_equal(ps.run(iota, backend="auto"), IOTA)


def test_mosaic_backend_fails_clearly_without_hopper():
  from pallas_sim.backends import mosaic
  if mosaic.hopper_device() is not None:
    pytest.skip("a Hopper GPU is present")
  with pytest.raises(ps.BackendError, match="compute capability 9.0"):
    ps.run(iota, backend="mosaic")
  with pytest.raises(ps.BackendError):
    with ps.backend("mosaic"):
      pass


def matmul_mcs(a, b, tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=2,
               delay_release=1, out_dtype=jnp.float16, compiler_params=None,
               step_scopes=True):
  """The quickstart matmul with max_concurrent_steps and delay_release as
  parameters (otherwise the same code). Its body's wgmma and wgmma_wait are
  in named scopes, "issue" and "wait" (unless not step_scopes), and its
  epilogue in "epilogue", which a profiled run (compiler_params with
  profile_space/profile_dir: lab/pipeline_trace.py) records."""
  m, k = a.shape
  _, n = b.shape

  @plgpu.kernel(
      out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
      scratch_types=dict(
          o_smem=plgpu.SMEM((tile_m, tile_n), out_dtype),
          acc=plgpu.ACC((tile_m, tile_n), jnp.float32),
      ),
      grid=(m // tile_m, n // tile_n),
      grid_names=("m", "n"),
      compiler_params=compiler_params,
  )
  def kernel(a_gmem, b_gmem, o_gmem, o_smem, acc):
    pid_m = jax.lax.axis_index("m")
    pid_n = jax.lax.axis_index("n")

    scope = jax.named_scope if step_scopes else lambda _: contextlib.nullcontext()

    def body(_, a_smem, b_smem):
      with scope("issue"):
        plgpu.wgmma(acc, a_smem, b_smem)
      with scope("wait"):
        plgpu.wgmma_wait(1)

    plgpu.emit_pipeline(
        body,
        grid=(k // tile_k,),
        in_specs=[
            plgpu.BlockSpec((tile_m, tile_k), lambda ki: (pid_m, ki),
                            delay_release=delay_release),
            plgpu.BlockSpec((tile_k, tile_n), lambda ki: (ki, pid_n),
                            delay_release=delay_release),
        ],
        max_concurrent_steps=max_concurrent_steps,
    )(a_gmem, b_gmem)
    with jax.named_scope("epilogue"):
      o_smem[...] = acc[...].astype(out_dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(
          o_smem, o_gmem.at[pl.ds(pid_m * tile_m, tile_m), pl.ds(pid_n * tile_n, tile_n)])
      plgpu.wait_smem_to_gmem(0)

  return kernel(a, b)


def _smem_need(tile_m, tile_n, tile_k, mcs, itemsize=2):
  align = lambda x: -(-x // 1024) * 1024
  return (align(tile_m * tile_n * itemsize) + align(mcs * tile_m * tile_k * itemsize)
          + align(mcs * tile_k * tile_n * itemsize) + 8 * mcs)


SWEEP = [  # (m, k, n, tile_n, tile_k, max_concurrent_steps)
    (256, 256, 256, 128, 64, 2),
    (256, 512, 512, 64, 32, 3),
    (512, 256, 256, 256, 64, 2),
    (512, 1024, 256, 128, 128, 4),
    (1024, 512, 512, 256, 32, 4),
    (256, 1024, 1024, 128, 64, 3),
    (1024, 1024, 1024, 128, 64, 2),
    (768, 384, 512, 64, 128, 3),
]


@pytest.mark.parametrize("m,k,n,tile_n,tile_k,mcs", SWEEP)
def test_matmul_sweep_against_f32_reference(rng, m, k, n, tile_n, tile_k, mcs):
  a, b, want = _ab(rng, m, k, n)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k,
                               max_concurrent_steps=mcs)
  need = _smem_need(128, tile_n, tile_k, mcs)
  if need > 232448:
    with pytest.raises(ps.SmemOverflowError, match=f"smem_bytes={need} > "):
      ps.run(fn, a, b, backend="sim")
    return
  got = ps.run(fn, a, b, backend="sim")
  # f16 output: rounding of the result dominates (2^-11 relative).
  assert rel_err(got, want) < 1e-3


def test_matmul_sweep_covers_both_fits_and_overflows():
  needs = [_smem_need(128, tn, tk, mcs) for *_, tn, tk, mcs in SWEEP]
  assert any(n > 232448 for n in needs) and any(n <= 232448 for n in needs)


def test_simulation_is_deterministic(rng):
  a, b, _ = _ab(rng, 256, 512, 256)
  s1 = ps.simulate(matmul, a, b)
  s2 = ps.simulate(matmul, a, b)
  np.testing.assert_array_equal(np.asarray(s1.outputs), np.asarray(s2.outputs))
  k1, k2 = s1.report.kernels[0], s2.report.kernels[0]
  assert (k1.block_cycles_max, k1.time_s) == (k2.block_cycles_max, k2.time_s)
  assert k1.trace == k2.trace


def test_trace_is_written(tmp_path, rng):
  import json
  a, b, _ = _ab(rng, 256, 256, 256)
  sim = ps.simulate(matmul, a, b)
  path = sim.report.save_trace(str(tmp_path / "t.json"))
  events = json.load(open(path))["traceEvents"]
  [k] = sim.report.kernels
  procs = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
  # a process per SM of a traced block (blocks 0 and 1: SMs 0 and 1)
  assert sorted(n for n in procs.values() if "SM" in n) == [
      f"{k.name} #0 · SM 0", f"{k.name} #0 · SM 1"]
  units = {(e["cat"], e["name"].split()[0]) for e in events if e["ph"] == "b"}
  assert ("tensor core", "wgmma") in units and ("TMA engine", "load") in units
  ends = [e for e in events if e["ph"] == "e"]
  assert len(ends) == sum(e["ph"] == "b" for e in events)
  [launch] = [e for e in events if e.get("tid") == "launches"]
  assert launch["dur"] == pytest.approx(k.time_s * 1e6)
  # every async slice ends within the launch
  assert max(e["ts"] for e in ends) <= launch["dur"] + 1e-6
  threads = {e["tid"] for e in events if e["ph"] == "X" and e["pid"] != 0}
  assert threads <= {"block (0, 0)", "block (0, 1)"} and threads


def test_plot_draws_timeline_and_roofline(tmp_path, rng):
  pytest.importorskip("matplotlib")
  a, b, _ = _ab(rng, 256, 256, 256)
  sim = ps.simulate(matmul, a, b)
  path = sim.report.plot(str(tmp_path / "p.png"))
  data = open(path, "rb").read()
  assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_without_matplotlib_says_how_to_get_it(monkeypatch, rng):
  import builtins
  real = builtins.__import__

  def no_matplotlib(name, *args, **kwargs):
    if name.startswith("matplotlib"):
      raise ImportError(name)
    return real(name, *args, **kwargs)
  a, b, _ = _ab(rng, 128, 128, 128)
  report = ps.simulate(matmul, a, b).report
  monkeypatch.setattr(builtins, "__import__", no_matplotlib)
  with pytest.raises(ps.SimError, match=r"pip install 'pallas-sim\[plot\]'"):
    report.plot("never.png")
