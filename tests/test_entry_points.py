"""The user-facing entry points that are not the Python API: `./dev demo`,
`pallas-sim run`, and the report's summary and trace."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from quickstart import fill_42, iota, matmul

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _venv_ready():
  """./dev sets up .venv itself; here only reuse one (no installing)."""
  stamp = os.path.join(ROOT, ".venv", ".pallas-sim-installed")
  return os.path.exists(stamp) and os.path.realpath(sys.prefix) == os.path.realpath(
      os.path.join(ROOT, ".venv"))


@pytest.mark.skipif(not _venv_ready(), reason="runs ./dev with this checkout's .venv")
def test_dev_demo_runs_the_quickstart_with_a_report(tmp_path):
  trace = tmp_path / "t.json"
  p = subprocess.run(["./dev", "demo", "--trace", str(trace)], cwd=ROOT,
                     capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout + p.stderr
  out = p.stdout
  for line in ("fill_42                ok   relative error 0.00e+00",
               "iota                   ok   relative error 0.00e+00",
               "pallas-sim report (h100): 3 kernel launch(es), 0 race(s)"):
    assert line in out, out
  assert "matmul 512^3 f16       ok" in out
  assert "grid=(4, 4) threads=1 blocks=16 smem=98320B" in out
  names = {e["name"].split()[0] for e in json.load(open(trace))["traceEvents"]
           if e["ph"] in "Xb"}
  assert {"wgmma", "load", "store"} <= names


SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    from quickstart import iota, fill_42
    assert (np.asarray(iota()) == np.arange(1024)).all()
    fill_42()
    print("script args:", sys.argv[1:])
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
''')


def _cli(args, cwd):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "examples")]))
  return subprocess.run([sys.executable, "-m", "pallas_sim.cli", *args], cwd=cwd,
                        env=env, capture_output=True, text=True, timeout=300)


def test_pallas_sim_run_simulates_a_script_and_prints_the_report(tmp_path):
  (tmp_path / "script.py").write_text(SCRIPT)
  p = _cli(["run", "--gpu", "h200", "--trace", "t.json", "script.py", "0"], tmp_path)
  assert p.returncode == 0, p.stdout + p.stderr
  assert "script args: ['0']" in p.stdout
  assert "pallas-sim report (h200): 2 kernel launch(es), 0 race(s)" in p.stdout
  assert "iota (" in p.stdout and "grid=(8,)" in p.stdout and "fill_42 (" in p.stdout
  assert "trace written to t.json" in p.stdout
  assert json.load(open(tmp_path / "t.json"))["traceEvents"]


def test_pallas_sim_run_passes_on_the_scripts_exit_status(tmp_path):
  (tmp_path / "script.py").write_text(SCRIPT)
  p = _cli(["run", "--gpu", "h200", "--clock-mhz", "1400", "script.py", "3"], tmp_path)
  assert p.returncode == 3, p.stdout + p.stderr
  assert "pallas-sim report (h200 at 1400 MHz)" in p.stdout


MATMUL = textwrap.dedent('''
    import sys
    import jax, jax.numpy as jnp
    from quickstart import matmul
    n = int(sys.argv[1])
    a = jnp.ones((n, n), jnp.float16)
    print("out", float(matmul(a, a)[0, 0]))
''')


def test_pallas_sim_estimate_times_a_script_as_ps_estimate_does(tmp_path):
  """A 2048^3 matmul in a script: its time as ps.estimate predicts it,
  without its values (one block of each kind runs), and said so."""
  from quickstart import matmul
  (tmp_path / "mm.py").write_text(MATMUL)
  p = _cli(["estimate", "--gpu", "h200", "mm.py", "2048"], tmp_path)
  assert p.returncode == 0, p.stdout + p.stderr
  spec = jax.ShapeDtypeStruct((2048, 2048), jnp.float16)
  want = ps.estimate(matmul, spec, spec, gpu="h200").kernels[0]
  head = ("pallas-sim report (h200): 1 kernel launch(es), races not checked, "
          "uninitialized memory not checked")
  assert head in p.stdout, p.stdout
  assert f"predicted {want.time_s * 1e6:.1f} us" in p.stdout, p.stdout
  assert "of 256 blocks simulated" in p.stdout, p.stdout
  assert "out 2048.0" not in p.stdout  # (no values)
  assert ("pallas-sim estimate: the kernels' outputs were not computed" in p.stderr
          ), p.stderr


# A script that reads its arguments as it is imported, and simulates with
# ps.simulate itself (on the H200).
OWN = textwrap.dedent('''
    import sys
    import pallas_sim as ps
    from quickstart import iota
    N = int(sys.argv[1])
    if __name__ == "__main__":
        sim = ps.simulate(iota, gpu="h200")
        print("own report:", sim.report.summary().splitlines()[0])
        print("main ran with", N)
''')


def test_the_cli_runs_a_script_with_its_own_argv_and_reports_only_its_own_launches(
    tmp_path):
  """`run` and `check` give the script the sys.argv and __name__ that
  `python script.py 7` would; `run` prints no second report for launches
  the script simulated itself."""
  (tmp_path / "own.py").write_text(OWN)
  p = _cli(["run", "own.py", "7"], tmp_path)
  assert p.returncode == 0, p.stdout + p.stderr
  assert p.stdout.splitlines() == [
      "own report: pallas-sim report (h200): 1 kernel launch(es), 0 race(s), "
      "0 uninitialized-memory finding(s)",
      "main ran with 7"], p.stdout
  assert ("pallas-sim run: no kernel launch outside the script's own simulations"
          in p.stderr), p.stderr
  p = _cli(["check", "own.py", "7"], tmp_path)
  assert p.returncode == 0, p.stdout + p.stderr
  assert "main ran with 7" in p.stdout
  assert p.stdout.splitlines()[-1] == "1 passed, 0 failed", p.stdout


SPIN = """
import jax, jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu


@plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
def counts(o_ref):
  n = lax.while_loop(lambda n: n < 10 ** 9, lambda n: n + 1, jnp.int32(0))
  o_ref[...] = jnp.full((128,), n, jnp.float32)


@plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
              scratch_types=[plgpu.Barrier()])
def stuck(o_ref, bar):
  plgpu.barrier_wait(bar)
  o_ref[...] = jnp.zeros((128,), jnp.float32)


def check_counts():
  counts()


if __name__ == "__main__":
  stuck()
  print("after the kernel")
"""


def test_the_cli_takes_max_cycles_says_a_failed_launch_and_a_missing_file(tmp_path):
  (tmp_path / "spin.py").write_text(SPIN)
  p = _cli(["check", "--max-cycles", "20000", "spin.py"], tmp_path)
  assert p.returncode == 1, p.stdout + p.stderr
  assert "FAIL check_counts: RunawayKernelError: spin.py:9: [while] ran past " \
         "max_cycles=20000 simulated cycles" in p.stdout, p.stdout + p.stderr
  # (the failed launch stops the script where it next waits on JAX: no poison
  # handed on, the launch listed in the report, the error after it)
  p = _cli(["run", "spin.py"], tmp_path)
  assert p.returncode == 1 and "after the kernel" not in p.stdout, p.stdout + p.stderr
  assert "1 kernel launch(es) (1 failed)" in p.stdout, p.stdout
  assert "  stuck (spin.py:13): failed, DeadlockError: spin.py:16: no thread can make " \
         "progress" in p.stdout, p.stdout
  assert "pallas-sim run: DeadlockError: spin.py:16:" in p.stderr, p.stderr
  assert "(the program stopped at spin.py:25, where it next waited on JAX after the " \
         "failed launch)" in p.stderr, p.stderr
  assert "no kernel launch" not in p.stderr, p.stderr
  assert "Traceback" not in p.stdout + p.stderr and "io_callback" not in p.stderr
  p = _cli(["run", "nonexist.py"], tmp_path)
  assert p.returncode == 2 and p.stderr.strip() == "pallas-sim run: no such file: " \
         "nonexist.py", p.stderr
  assert "Traceback" not in p.stdout + p.stderr


def test_report_summary_names_kernels_resources_time_and_races(rng):
  a = jnp.asarray(rng.standard_normal((256, 256)), jnp.float16)
  with ps.backend("sim", gpu="h200", on_race="report") as report:
    matmul(a, a)
    iota()

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier()])
  def racy(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    o_ref[...] = smem[...]  # before the barrier_wait
    plgpu.barrier_wait(bar)

  sim = ps.simulate(racy, jnp.ones((128,), jnp.float32), on_race="report",
                    on_uninitialized="report")
  text = report.summary()
  lines = text.splitlines()
  assert lines[0] == ("pallas-sim report (h200): 2 kernel launch(es), 0 race(s), "
                      "0 uninitialized-memory finding(s); predicted "
                      f"{report.time_s * 1e6:.1f} us in all")
  k = report.kernels[0]
  assert lines[1].startswith(f"  kernel (examples/quickstart.py:{k.where.split(':')[1]}): "
                             "grid=(2, 2) threads=1 blocks=4 smem=98320B waves=1 predicted ")
  assert f"{k.time_s * 1e6:.1f} us ({k.tflops:.0f} TFLOP/s)" in lines[1]
  # then what bounds it, throughput, occupancy, units and thread time
  assert lines[2] == f"    bound: {k.bound} ({k.bound_reason})" and k.bound
  assert lines[3].startswith(f"    achieved: {k.tflops:.1f} TFLOP/s")
  assert lines[4].startswith("    occupancy: 2 block(s) per SM, 1 wave(s) over 132 SMs")
  iotas = [ln for ln in lines if ln.startswith("  iota (examples/quickstart.py:")]
  assert len(iotas) == 1 and "blocks=8" in iotas[0]
  assert str(report) == text
  racy_text = sim.report.summary()
  assert "1 race(s)" in racy_text.splitlines()[0]
  assert "races:" in racy_text and "write-read race on smem" in racy_text
  assert "no barrier_wait between this TMA load" in racy_text
  # The same read, seen by the uninitialized-memory check.
  assert "1 uninitialized-memory finding(s)" in racy_text.splitlines()[0]
  tail = racy_text[racy_text.index("uninitialized memory:"):].splitlines()
  assert tail[1] == "  uninitialized read of smem elements (0,)..(127,) (bytes 0..512):"
  assert tail[2].startswith("      read of smem by thread 0 (load at tests/test_entry_points.py:")


def test_a_kernel_error_is_raised_even_when_the_code_after_it_fails():
  """A test that asserts on a failed kernel's (poison) outputs sees the
  kernel's error, not only its own AssertionError."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.Barrier()])
  def stuck(o_ref, bar):
    plgpu.barrier_wait(bar)

  with pytest.raises(ps.DeadlockError) as e:
    with ps.backend("sim"):
      out = stuck()
      np.testing.assert_array_equal(out, 0.0)  # poison: fails
  assert isinstance(e.value.__cause__, AssertionError)
  assert any("then raised AssertionError" in n for n in e.value.__notes__)


def test_a_failed_launch_is_listed_and_stop_at_error_stops_the_program_there():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.Barrier()])
  def stuck(o_ref, bar):
    plgpu.barrier_wait(bar)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  def fill(o_ref):
    o_ref[...] = jnp.ones((128,), jnp.float32)

  ran = []
  with pytest.raises(ps.DeadlockError):  # (by default: when the block ends)
    with ps.backend("sim") as report:
      fill()
      stuck()
      ran.append(np.asarray(fill())[0])
  assert ran == [1.0]  # (the program ran on, with the poison)
  (failed,) = report.failed
  assert (failed.name, type(failed.error)) == ("stuck", ps.DeadlockError)
  assert len(report.kernels) == 2
  assert "3 kernel launch(es) (1 failed)" in report.summary()
  assert "predicted" in report.summary() and "for the 2 that ran" in report.summary()
  assert f"  stuck ({failed.where}): failed, DeadlockError:" in report.summary()

  ran = []
  with pytest.raises(ps.DeadlockError) as e:
    with ps.backend("sim", stop_at_error=True) as report:
      fill()
      np.asarray(stuck())
      ran.append(np.asarray(fill())[0])
  assert ran == [] and len(report.kernels) == 1 and len(report.failed) == 1
  assert e.value.__cause__ is None
  here = os.path.basename(__file__)
  (note,) = [n for n in e.value.__notes__ if "the program stopped" in n]
  assert f"the program stopped at tests/{here}:" in note or f"stopped at {here}:" in note
