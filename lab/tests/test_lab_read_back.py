"""lab/read_back.py: a timing plan's steps merged into the measured file
with their provenance; a step that measured nothing stops it."""
import json

import pytest

from lab import read_back


def _plan(tmp_path, step, field, rows):
  d = tmp_path / "plan" / "timing_plan" / step
  d.mkdir(parents=True)
  (d / "h200_measured.json").write_text(json.dumps({"env": {"jax": "0.11.2"}, field: rows}))
  (d / "log.txt").write_text(f"== {step}: rc 0 in 5 s (limit 70): python3 -m lab.x --y\n")
  return tmp_path / "plan"


def test_steps_merge_under_their_keys_with_the_command_and_commit(tmp_path):
  measured = tmp_path / "m.json"
  measured.write_text(json.dumps({"cases": []}, indent=1))
  plan = _plan(tmp_path, "blind3", "cases", [{"name": "a (blind 3)", "median_s": 1e-4}])
  summary = tmp_path / "plan.txt"
  summary.write_text("NVIDIA H200\nproject commit 6a4ebd606c59\n")
  got = read_back.read_back(str(plan), "2026_12_05", [str(summary)], measured=str(measured))
  assert got == {"families_study_3": 1}
  entry = json.loads(measured.read_text())["families_study_3"]
  assert entry["command"] == "python3 -m lab.x --y" and entry["time"] == "2026-12-05"
  assert entry["note"].endswith("at commit 6a4ebd606c59") and entry["cases"][0]["name"]
  with pytest.raises(SystemExit, match="in .* already"):
    read_back.read_back(str(plan), "2026_12_05", measured=str(measured))


def test_a_step_that_measured_nothing_stops_the_read_back(tmp_path):
  measured = tmp_path / "m.json"
  measured.write_text("{}")
  plan = _plan(tmp_path, "l2", "micros", [])
  with pytest.raises(SystemExit, match="no micros measured"):
    read_back.read_back(str(plan), "2026_12_05", measured=str(measured))


def test_every_measure_gpu_step_of_the_timing_plan_is_read_back():
  """A plan step that runs lab.measure_gpu writes an h200_measured.json,
  which only read_back merges: each such step has its key (the traces have
  their own --compare)."""
  from test_lab_plans import _steps
  _, steps = _steps("timing_plan.sh")
  measured = {name for name, (_, command) in steps.items() if "lab.measure_gpu" in command}
  assert measured and measured <= set(read_back.STEPS), measured - set(read_back.STEPS)


def test_a_second_run_of_a_blind_set_is_noise_and_its_late_rows_the_set_s(tmp_path):
  """again5: every row a second time, as the rows' noise; a row the first
  run did not reach (no study holds it) goes to families_study_5_late, which
  accuracy.py scores with the set."""
  measured = tmp_path / "m.json"
  measured.write_text(json.dumps({"families_study_5": {"cases": [
      {"name": "a (blind 5)", "median_s": 1e-4}]}}, indent=1))
  plan = _plan(tmp_path, "again5", "cases", [{"name": "a (blind 5)", "median_s": 1.1e-4},
                                             {"name": "b (blind 5)", "median_s": 2e-4},
                                             {"name": "c (blind 5)", "error": "x"}])
  got = read_back.read_back(str(plan), "2026_12_08", measured=str(measured))
  assert got == {"families_again_2026_12_08_blind5": 3, "families_study_5_late": 1}
  data = json.loads(measured.read_text())
  assert [r["name"] for r in data["families_study_5_late"]["cases"]] == ["b (blind 5)"]
  assert "did not reach" in data["families_study_5_late"]["note"]
  from lab import timing_suite
  rows = timing_suite.study_rows(data, "families")
  assert sorted(r["name"] for r in rows) == ["a (blind 5)", "b (blind 5)"]
