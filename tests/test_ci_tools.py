"""The CI entry points: `pytest --pallas-sim` and `pallas-sim check`."""
import os
import subprocess
import sys
import textwrap

KERNELS = textwrap.dedent('''
    import jax, jax.numpy as jnp
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def copy_kernel(wait):
      @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                    scratch_types=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier()])
      def k(x_ref, o_ref, smem, bar):
        plgpu.copy_gmem_to_smem(x_ref, smem, bar)
        if wait:
          plgpu.barrier_wait(bar)
        o_ref[...] = smem[...] + 1
        if not wait:
          plgpu.barrier_wait(bar)
      return k
''')


def run(args, cwd):
  env = dict(os.environ, PYTHONPATH=str(cwd))
  return subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True,
                        text=True, env=env, timeout=300)


def test_pytest_flag_fails_racy_tests_with_the_report(tmp_path):
  (tmp_path / "kernels_mod.py").write_text(KERNELS)
  (tmp_path / "test_user.py").write_text(textwrap.dedent('''
      import jax.numpy as jnp, numpy as np
      from kernels_mod import copy_kernel

      X = jnp.arange(128, dtype=jnp.float32)

      def test_clean():
        np.testing.assert_array_equal(copy_kernel(True)(X), X + 1)

      def test_racy():
        copy_kernel(False)(X)
  '''))
  r = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pallas-sim",
           "test_user.py"], tmp_path)
  out = r.stdout + r.stderr
  assert r.returncode == 1, out
  assert "1 failed, 1 passed" in out
  assert "test_racy" in out and "RaceError" in out
  assert "no barrier_wait between this TMA load" in out
  assert "kernels_mod.py:" in out  # the report names the user's lines
  # (placed by the report's lines, not at the context managers it came out of)
  assert "contextlib.py" not in out and "pallas_sim" + os.sep + "api.py" not in out, out


def test_check_command_exit_codes(tmp_path):
  (tmp_path / "kernels_mod.py").write_text(KERNELS)
  (tmp_path / "good.py").write_text(KERNELS + textwrap.dedent('''
      def check_copy():
        copy_kernel(True)(jnp.ones((128,), jnp.float32))
  '''))
  (tmp_path / "bad.py").write_text(KERNELS + textwrap.dedent('''
      def run_racy():
        copy_kernel(False)(jnp.ones((128,), jnp.float32))

      def run_clean():
        copy_kernel(True)(jnp.ones((128,), jnp.float32))

      PALLAS_SIM_CHECKS = [run_clean, run_racy]
  '''))
  good = run(["-m", "pallas_sim.cli", "check", "good.py"], tmp_path)
  assert good.returncode == 0, good.stdout + good.stderr
  assert "ok   check_copy" in good.stdout and "1 passed, 0 failed" in good.stdout
  bad = run(["-m", "pallas_sim.cli", "check", "bad.py"], tmp_path)
  assert bad.returncode == 1, bad.stdout + bad.stderr
  assert "ok   run_clean" in bad.stdout and "FAIL run_racy: 1 race(s)" in bad.stdout
  assert "bad.py" in bad.stdout  # the report names the user's lines


def test_check_runs_a_script_without_entry_points_as_main(tmp_path):
  (tmp_path / "kernels_mod.py").write_text(KERNELS)
  (tmp_path / "script.py").write_text(KERNELS + textwrap.dedent('''
      import argparse
      if __name__ == "__main__":
        argparse.ArgumentParser().parse_args()  # sees only its own argv
        copy_kernel(False)(jnp.ones((128,), jnp.float32))
  '''))
  r = run(["-m", "pallas_sim.cli", "check", "script.py"], tmp_path)
  assert r.returncode == 1, r.stdout + r.stderr
  assert "FAIL __main__: 1 race(s)" in r.stdout


def test_check_runs_a_plain_script_once(tmp_path):
  """A script that declares no entry points is run once, as __main__: not
  imported first and then run again (its kernels and prints twice)."""
  (tmp_path / "plain.py").write_text(KERNELS + textwrap.dedent('''
      print("ran")
      copy_kernel(False)(jnp.ones((128,), jnp.float32))
  '''))
  r = run(["-m", "pallas_sim.cli", "check", "plain.py"], tmp_path)
  assert r.returncode == 1, r.stdout + r.stderr
  assert r.stdout.count("ran\n") == 1, r.stdout
  assert r.stdout.count("1 race(s)") == 1 and "FAIL __main__: 1 race(s)" in r.stdout
  assert "import of" not in r.stdout and "0 passed, 1 failed\n" in r.stdout


def test_run_says_what_the_simulation_found_without_a_traceback(tmp_path):
  """`pallas-sim run`: the report, then what ended the run in one line, exit 1."""
  (tmp_path / "racy.py").write_text(KERNELS + textwrap.dedent('''
      copy_kernel(False)(jnp.ones((128,), jnp.float32))
  '''))
  r = run(["-m", "pallas_sim.cli", "run", "racy.py"], tmp_path)
  assert r.returncode == 1, r.stdout + r.stderr
  assert "Traceback" not in r.stderr, r.stderr
  assert "no barrier_wait between this TMA load" in r.stdout  # (the report)
  assert "pallas-sim run: RaceError: racy.py:" in r.stderr
  assert "1 race(s) in kernel k (in the report above)" in r.stderr, r.stderr


def test_check_reports_races_of_kernels_run_at_import(tmp_path):
  (tmp_path / "kernels_mod.py").write_text(KERNELS)
  (tmp_path / "imp.py").write_text(KERNELS + textwrap.dedent('''
      copy_kernel(False)(jnp.ones((128,), jnp.float32))  # at import: racy

      def check_clean():
        copy_kernel(True)(jnp.ones((128,), jnp.float32))
  '''))
  r = run(["-m", "pallas_sim.cli", "check", "imp.py"], tmp_path)
  assert r.returncode == 1, r.stdout + r.stderr
  assert "FAIL import of imp.py: 1 race(s)" in r.stdout
  assert "no barrier_wait between this TMA load" in r.stdout
  assert "ok   check_clean" in r.stdout
  assert "1 passed, 0 failed, and the import itself failed" in r.stdout


def test_gpu_choices_come_from_the_model_table(tmp_path):
  from pallas_sim import gpus
  r = run(["-m", "pallas_sim.cli", "run", "--gpu", "a100", "x.py"], tmp_path)
  assert r.returncode == 2
  assert "--gpu {" + ",".join(gpus.NAMES) + "}" in r.stderr, r.stderr
  assert gpus.NAMES == tuple(sorted(gpus.GPUS)) and set(gpus.NAMES) == {"h100", "h200"}


def test_a_unittest_case_shows_the_kernel_error_behind_its_failure(tmp_path):
  # unittest.TestCase failures reach pytest through the item, not as an
  # exception: the kernel's own error must still be what the report shows.
  (tmp_path / "test_unit.py").write_text(textwrap.dedent('''
      import unittest
      import jax, jax.numpy as jnp, numpy as np
      from jax.experimental.pallas import mosaic_gpu as plgpu

      @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                    scratch_types=[plgpu.Barrier()])
      def never_arrives(o_ref, bar):
        plgpu.barrier_wait(bar)
        o_ref[...] = jnp.ones((128,), jnp.float32)

      class KernelTest(unittest.TestCase):
        def test_values(self):
          np.testing.assert_array_equal(never_arrives(), np.ones(128))
  '''))
  r = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pallas-sim",
           "test_unit.py"], tmp_path)
  out = r.stdout + r.stderr
  assert r.returncode == 1, out
  assert "DeadlockError" in out and "the failed kernels' outputs were poison" in out, out
