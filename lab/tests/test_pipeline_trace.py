"""lab/pipeline_trace.py's device step for our fp8 matmul (`--fp8`): every
case's profiled kernel keeps SMEM to spare with a buffer of whole 16-byte
groups of ranges, and a case that fails stops the step loudly with the cases
before it written."""
import functools
import json

import jax
import jax.numpy as jnp
import pytest

import stand_in_smi

from lab import pipeline_trace as pt
from pallas_sim import gpus


def _shapes(size):
  return [jax.ShapeDtypeStruct((size, size), jnp.float8_e4m3fn)] * 2


@pytest.mark.parametrize("case", pt.FP8_CASES)
def test_each_fp8_case_profiles_with_smem_to_spare(case):
  import pallas_sim as ps
  size, tn, tk, mcs, *tm = case
  fn = functools.partial(pt.traced_fp8, tile_m=tm[0] if tm else 128)
  space, truncate = pt.fitting_space(fn, _shapes(size), pt.profile_space(size, tk),
                                     tile_n=tn, tile_k=tk, mcs=mcs)
  assert space % 4 == 0 and space >= 8
  r = ps.estimate(lambda x, y: fn(x, y, tile_n=tn, tile_k=tk, mcs=mcs, profile_dir="/tmp",
                                  space=space, truncate=truncate), *_shapes(size), gpu="h200")
  limit = gpus.H200.max_smem_per_block - pt.PROFILE_SMEM_MARGIN
  assert max(k.smem_bytes for k in r.kernels) <= limit


def test_a_failing_case_stops_the_step_with_the_cases_before_it_written(tmp_path, monkeypatch):
  calls = []

  def fake(a, fn, name, size, tn, tk, mcs, tm=128):
    calls.append(mcs)
    if len(calls) == 2:
      raise RuntimeError("INTERNAL: invalid argument")
    return {"name": name, "mcs": mcs, "error": "no trace written"} if mcs is None else {
        "name": name, "mcs": mcs, "step": {"median": 1.0, "p10": 1.0, "p90": 1.0},
        "issue": {"median": 1.0}, "wait": {"median": 0.0, "p90": 0.0},
        "rest": {"median": 0.0, "p90": 0.0}, "blocks": 1, "sms": 1,
        "block_cycles_median": 10.0, "steps": 10, "blocks_at_launch_per_sm": 1.0,
        "second_block_after_us": 0.0, "unprofiled_call_s": 1e-4}

  monkeypatch.setattr(pt, "trace_case", fake)
  assert pt.main(["--fp8", "--out", str(tmp_path)]) == 1
  rows = json.load(open(tmp_path / "pipeline_trace.json"))["rows"]
  assert calls == [2, 4]  # (nothing after the failure: the device is not to be trusted)
  assert "error" not in rows[0] and "invalid argument" in rows[1]["error"]


def test_the_device_step_runs_end_to_end_in_the_simulator(tmp_path, monkeypatch):
  import pallas_sim as ps
  stand_in_smi.install(tmp_path, monkeypatch, 1980)
  with ps.backend("sim"):
    assert pt.main(["--fp8", "--case", "1024", "128", "128", "2", "--warm-s", "0.05",
                    "--out", str(tmp_path)]) == 0
  row, = json.load(open(tmp_path / "pipeline_trace.json"))["rows"]
  assert row["mhz"] == 1980.0 and row["space"] == pt.profile_space(1024, 128)
  assert row["step"]["median"] > 0 and row["blocks"] == 64


def test_a_case_of_other_tile_rows_runs_and_compares_in_the_simulator(tmp_path, monkeypatch,
                                                                       capsys):
  import pallas_sim as ps
  stand_in_smi.install(tmp_path, monkeypatch, 1500)
  monkeypatch.setattr(pt, "FP8_CASES", [(1024, 256, 128, 2, 64)])
  with ps.backend("sim"):
    assert pt.main(["--fp8", "--warm-s", "0.05", "--out", str(tmp_path)]) == 0
  row, = json.load(open(tmp_path / "pipeline_trace.json"))["rows"]
  assert row["name"] == "own fp8 1024 64x256x128 mcs=2" and row["tile"] == [64, 256, 128]
  assert row["blocks"] == 64 and row["step"]["median"] > 0
  capsys.readouterr()
  pt.compare(str(tmp_path / "pipeline_trace.json"))
  out = capsys.readouterr().out
  assert "| own fp8 1024 64x256x128 mcs=2 | 1500.0 |" in out
