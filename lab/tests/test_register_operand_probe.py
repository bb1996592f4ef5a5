"""lab/register_operand_probe.py's device step: every case runs end to end in
the simulator (the same kernels the GPU runs), the real lowering takes each,
and the GPU mode refuses a machine without a GPU rather than measure nothing."""
import json
import os
import sys

import pytest

from lab import register_operand_probe as rop

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests"))
from test_lowering_agreement import lowering_error  # noqa: E402


def test_every_case_lowers_and_runs_in_the_simulator(tmp_path, monkeypatch):
  monkeypatch.setattr(rop, "ROUNDS", 2)
  for case in rop.CASES:
    w, x, _ = rop.inputs(*case[1:3], rounds=2)
    assert lowering_error(rop.kernel(*case[1:], rounds=2), w, x) is None, case
  assert rop.main(["--sim", "--out", str(tmp_path)]) == 0
  got = json.load(open(tmp_path / "register_operand.json"))
  assert [r["name"] for r in got["rows"]] == [c[0] for c in rop.CASES]
  for r in got["rows"]:
    assert r["wrong_elements"] == 0 and r["max_rel_err"] < 1e-4, r
    assert r["predicted_us"] > 0 and r["races"] == []


def test_the_gpu_mode_fails_without_a_gpu(tmp_path):
  with pytest.raises(SystemExit, match="no GPU"):
    rop.main(["--out", str(tmp_path)])
