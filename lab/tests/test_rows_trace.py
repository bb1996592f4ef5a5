"""lab/rows_trace.py: our row kernels with emit_pipeline's waits and their
step bodies in named scopes for Mosaic GPU's profiler; each step read back
part by part, and the device script run end to end in the simulator (a
stand-in nvidia-smi giving the clock)."""
import json

import numpy as np
import pytest

import stand_in_smi

import pallas_sim as ps

from lab import rows_trace as rt

SMALL = ("rmsnorm", 128, 1024, 64, 64, 2)  # (2 blocks, 16 steps a pass)


def test_the_scoped_kernel_still_normalizes_and_each_step_has_its_parts(tmp_path):
  from pallas_sim.backends.sim.base.jax_internals import gpu_pipeline
  real = gpu_pipeline.gpu_primitives
  run, args = rt.call(SMALL, str(tmp_path))
  with ps.backend("sim"):
    out = run(*args)
  assert gpu_pipeline.gpu_primitives is real  # (the module's own again)
  ref = rt.built(SMALL).reference(*args)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref), atol=2e-2, rtol=2e-2)
  m = rt.steps_of(rt.pt.newest_trace(str(tmp_path)), SMALL)
  assert m["blocks"] == 2 and m["steps"] == 32
  for p in rt.PASSES:
    for q in rt.PARTS:
      assert m[f"{p} {q}"] is not None and m[f"{p} {q}"]["median"] >= 0, (p, q)
    # (a step's parts run one after another: they add up to it)
    parts = sum(m[f"{p} {q}"]["median"] for q in rt.PARTS if q != "step")
    assert parts == pytest.approx(m[f"{p} step"]["median"], rel=0.1)
  assert m["first wait store"]["median"] == 0  # (the first pass stores nothing)


def test_the_device_script_writes_each_case_as_it_ends(tmp_path, monkeypatch):
  stand_in_smi.install(tmp_path, monkeypatch)
  with ps.backend("sim"):
    rows = rt.measure([SMALL], str(tmp_path), warm_s=0.05)
  saved = json.load(open(tmp_path / "rows_trace.json"))["rows"]
  assert [r["name"] for r in saved] == [rt.name_of(SMALL)] == [r["name"] for r in rows]
  assert saved[0]["mhz"] == 1980.0 and saved[0]["second body"]["median"] > 0


def test_a_step_that_measures_nothing_fails_loudly(tmp_path, monkeypatch):
  stand_in_smi.install(tmp_path, monkeypatch)
  monkeypatch.setattr(rt, "CASES", [SMALL])
  monkeypatch.setattr(rt.pt, "newest_trace", lambda d: None)
  with ps.backend("sim"), pytest.raises(SystemExit, match="1 of 1 cases measured nothing"):
    rt.main(["--out", str(tmp_path)])
  assert json.load(open(tmp_path / "rows_trace.json"))["rows"][0]["error"] == "no trace written"


def test_the_device_s_case_at_two_blocks_an_sm_keeps_them_profiled():
  """The device step's case whose occupancy the profiler's buffer could
  change (two blocks an SM), profiled in the simulator as the GPU will run
  it: it fits in SMEM and keeps both (`--check` runs every case)."""
  case = ("rmsnorm", 16384, 8192, 64, 64, 2)
  assert case in rt.CASES
  rows = rt.check([case])
  assert rows[0]["blocks"] == 256 and rows[0]["steps"] == 256
