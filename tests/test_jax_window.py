"""The window of JAX releases: declared alike everywhere, refused clearly
outside, and the JAX internals the simulator reads kept in one module."""
import os
import re
import subprocess
import sys
import textwrap
import tomllib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim import jax_window
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.interpret import rules  # noqa: F401  (registers them)
from pallas_sim.backends.sim.interpret.compiler import RULES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINDOW = f"{jax_window.OLDEST} to {jax_window.NEWEST}"


def test_the_window_is_declared_alike_in_pyproject_tox_and_the_check():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
  for name in ("jax", "jaxlib"):
    assert f"{name}>={jax_window.OLDEST},<={jax_window.NEWEST}" in deps, deps
  tox = open(os.path.join(ROOT, "tox.ini")).read()
  envs = dict(re.findall(r"\[testenv:(jax-\w+)\]\ndeps =\n  jax==(\S+)\n  jaxlib==\2", tox))
  assert envs == {"jax-oldest": jax_window.OLDEST, "jax-newest": jax_window.NEWEST}
  assert "envlist = jax-oldest, jax-newest" in tox


def test_the_installed_jax_is_in_the_window():
  assert jax_window.problem(jax_window.installed()) is None
  assert jx.JAX_VERSION == jax_window.parse(jax.__version__)


@pytest.mark.parametrize("jax_v,jaxlib_v,named", [
    ("0.10.2", "0.10.2", "jax 0.10.2, jaxlib 0.10.2"),
    ("0.12.2", "0.12.2", "jax 0.12.2, jaxlib 0.12.2"),
    ("0.12.1", "0.11.1", "jaxlib 0.11.1"),
    ("0.11.2", None, "no jaxlib"),
])
def test_a_jax_outside_the_window_is_refused_naming_the_window(jax_v, jaxlib_v, named):
  with pytest.raises(jax_window.UnsupportedJaxError) as e:
    jax_window.check({"jax": jax_v, "jaxlib": jaxlib_v})
  msg = str(e.value)
  assert isinstance(e.value, ImportError)
  assert WINDOW in msg and f"found {named}." in msg
  assert f"pip install 'jax>={jax_window.OLDEST},<={jax_window.NEWEST}'" in msg


def test_both_ends_and_patch_releases_between_are_in_the_window():
  for v in (jax_window.OLDEST, jax_window.NEWEST, "0.12.0", "0.12.0.1", "0.12.1rc1"):
    assert jax_window.in_window(v), v
  for v in ("0.11.1", "0.12.1.1", "0.12.2", "0.13.0", "1.0"):
    assert not jax_window.in_window(v), v


def test_an_untested_release_may_be_tried_with_a_warning(monkeypatch):
  monkeypatch.setenv(jax_window.UNTESTED_ENV, "1")
  with pytest.warns(UserWarning, match=re.escape(WINDOW)):
    jax_window.check({"jax": "0.12.2", "jaxlib": "0.12.2"})
  with pytest.raises(jax_window.UnsupportedJaxError):  # (not a missing one)
    jax_window.check({"jax": "0.12.2", "jaxlib": None})


# A site that reports another jax release to importlib.metadata, as pip
# would after an install beside an untested JAX.
_FAKE_SITE = """
import importlib.metadata as m
_real = m.version
m.version = lambda name: "0.10.2" if name in ("jax", "jaxlib") else _real(name)
"""


def _with_fake_jax(tmp_path, args):
  site = tmp_path / "site"
  site.mkdir(exist_ok=True)
  (site / "sitecustomize.py").write_text(_FAKE_SITE)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), ROOT]))
  env.pop(jax_window.UNTESTED_ENV, None)
  return subprocess.run([sys.executable, *args], env=env, cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)


def test_import_beside_an_untested_jax_says_the_window_and_nothing_deeper(tmp_path):
  p = _with_fake_jax(tmp_path, ["-c", "import pallas_sim"])
  assert p.returncode != 0
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("pallas_sim.jax_window.UnsupportedJaxError: ")
  assert WINDOW in last and "found jax 0.10.2, jaxlib 0.10.2" in last
  assert "jax/_src" not in p.stderr  # (refused before any internal is read)


def test_pytest_beside_an_untested_jax_runs_and_refuses_only_pallas_sim(tmp_path):
  (tmp_path / "test_plain.py").write_text("def test_ok():\n  assert True\n")
  p = _with_fake_jax(tmp_path, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "test_plain.py"])
  assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout + p.stderr
  p = _with_fake_jax(tmp_path, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "--pallas-sim", "test_plain.py"])
  assert p.returncode == 4, p.stdout + p.stderr  # (pytest's usage error)
  assert "--pallas-sim: pallas-sim supports jax and jaxlib" in p.stderr
  assert WINDOW in p.stderr


def test_only_jax_internals_imports_jax_private_modules():
  """Every `jax._src` import of the simulator and the public API is in
  backends/sim/base/jax_internals.py: a new release's changes
  land there."""
  found = []
  for top in ("pallas_sim", "backends"):
    for d, _, files in os.walk(os.path.join(ROOT, top)):
      for name in files:
        path = os.path.join(d, name)
        if not name.endswith(".py") or path.endswith(os.path.join("base", "jax_internals.py")):
          continue
        for i, line in enumerate(open(path), 1):
          if re.match(r"\s*(from jax\._src\b|import jax\._src\b)", line):
            found.append(f"{os.path.relpath(path, ROOT)}:{i}: {line.strip()}")
  assert not found, "\n".join(found)


def test_rules_speak_the_newest_names_and_the_frontend_maps_the_old():
  assert not set(jx.RENAMED) & set(RULES)
  assert set(jx.RENAMED.values()) & set(RULES) >= {
      "inline_mgpu", "set_max_registers", "wgmma_accumulator_deref",
      "wgmma_accumulator_store"}


def test_every_primitive_the_lowering_accepts_has_a_rule_or_a_named_refusal():
  """What a kernel the GPU runs may contain, in the installed release: each
  primitive is simulated, or refused by name with its reason
  (interpret/rules/unsupported.py), never 'not modelled'."""
  names = jx.lowerable_primitive_names()
  assert len(names) > 100
  missing = sorted(n for n in names if jx.RENAMED.get(n, n) not in RULES)
  assert not missing, missing


def test_jax_interpreter_counts_races_rather_than_raising():
  """examples/kernels.py and benchmarks/sim_speed.py compare with JAX's own
  GPU interpreter, which raises on a race by default from 0.12 on: through
  jx.interpret_params a racy kernel's race is counted on every release."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                num_threads=2, thread_name="wg")
  def racy(o_ref):
    o_ref[...] = jnp.full((128,), 1.0, jnp.float32) * jax.lax.axis_index("wg")

  params = jx.interpret_params(detect_races=True)
  with plgpu.force_gpu_interpret_mode(params), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    jax.block_until_ready(racy())
  assert jx.interpret_pallas_call.get_races().races_found
  jx.interpret_pallas_call.reset_gpu_interpret_mode_state()


def test_the_lowering_check_stops_at_its_time_limit_and_names_the_kernel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), jnp.float32))
  def slowly_lowered(x_ref, o_ref):
    o_ref[...] = jnp.exp(x_ref[...]) * 3.0 + 0.25  # (a kernel not lowered before)

  x = jnp.ones((256,), jnp.float32)
  with pytest.raises(ps.LoweringTimeoutError) as e:
    ps.run(slowly_lowered, x, backend="sim", lowering_timeout_s=1e-4)
  msg = str(e.value)
  assert "kernel slowly_lowered" in msg and "did not finish in 0.0001 s" in msg
  assert "check_lowering=False" in msg and "lowering_timeout_s=None" in msg
  assert "test_jax_window.py:" in e.value.where
  assert isinstance(e.value, ps.LoweringError) and isinstance(e.value, TimeoutError)
  # the interrupted lowering left JAX as it was: the same kernel lowers and runs
  out = ps.run(slowly_lowered, x, backend="sim")
  np.testing.assert_allclose(np.asarray(out), np.exp(1.0) * 3.0 + 0.25, rtol=1e-6)
  with pytest.raises(ValueError, match="lowering_timeout_s"):
    ps.Options(lowering_timeout_s=0)


@pytest.mark.skipif(jx.JAX_VERSION < (0, 12), reason="the search is jax 0.12's")
def test_a_layout_search_that_does_not_end_is_stopped_and_its_pass_named():
  """jax 0.12's layout inference searches for minutes (about 140 s here) on
  a kernel that reads a loop's trip count from the SMEM a wgmma's result was
  stored to; 0.11.2 lowers it in 0.05 s."""
  f32 = jnp.float32

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 64), f32),
                scratch_types=dict(a_s=plgpu.SMEM((64, 32), f32), b_s=plgpu.SMEM((64, 32), f32),
                                   acc=plgpu.ACC((64, 64), f32), o_s=plgpu.SMEM((64, 64), f32),
                                   bar=plgpu.Barrier(num_arrivals=2)))
  def searched(a_ref, b_ref, o_ref, a_s, b_s, acc, o_s, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    plgpu.barrier_wait(bar)
    plgpu.wgmma(acc, a_s, b_s.T)
    o_s[...] = acc[...]
    n = o_s[0, 0].astype(jnp.int32)
    extra = jax.lax.fori_loop(0, n, lambda i, c: c * 0.5 + 1.0, jnp.zeros((64, 64), f32))
    o_ref[...] = o_s[...] + extra

  a = jnp.zeros((64, 32), f32)
  with pytest.raises(ps.LoweringTimeoutError, match=r"it was in experimental/mosaic/gpu/"
                     r"layout_inference\.py, infer_layout"):
    ps.run(searched, a, a, backend="sim", lowering_timeout_s=3)


def test_a_parameter_a_release_renamed_is_named():
  """Rules read the parameters every release binds through jax_internals.param:
  one a new release renamed is an error naming it, not a default."""
  import types
  eqn = types.SimpleNamespace(primitive=types.SimpleNamespace(name="copy_smem_to_gmem"),
                              params={"commit_group": True, "reduction_op": None})
  assert jx.param(eqn, "commit_group") is True
  with pytest.raises(ps.UnsupportedPrimitiveError,
                     match="copy_smem_to_gmem has no parameter 'commit_groups'.*it has "
                           "commit_group, reduction_op"):
    jx.param(eqn, "commit_groups")
