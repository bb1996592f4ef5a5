"""benchmarks/tokamax_timing.py compare: a GPU run's times beside the
model's, a case either side lacks named with why; the committed blind set
holds a prediction for each of its 11 cases."""
import json

from benchmarks import tokamax_timing


def test_compare_sets_each_case_beside_the_model_s(tmp_path, capsys):
  gpu = {"rows": [{"name": "a", "median_s": 100e-6, "clock": {"sm_mhz": 1500.0},
                   "kernels": ["k"]},
                  {"name": "b", "error": "RuntimeError: no"}]}
  model = {"rows": [{"name": "a", "predicted_s": 90e-6, "mhz": 1500.0, "kernels": ["k"]},
                    {"name": "b", "predicted_s": 1e-6, "mhz": 1980.0, "kernels": ["k"]},
                    {"name": "c", "error": "SimError: x"}]}
  (tmp_path / "g.json").write_text(json.dumps(gpu))
  (tmp_path / "m.json").write_text(json.dumps(model))
  tokamax_timing.main(["compare", str(tmp_path / "g.json"), str(tmp_path / "m.json")])
  out = capsys.readouterr().out
  assert "| a | 100.0 | 90.0 | -10% | 1500.0 / 1500.0 | 1 / 1 |" in out
  assert "| b | - | - | - | - | RuntimeError: no |" in out
  assert "| c | - | - | - | - | SimError: x |" in out
  assert "1 cases: mean absolute error 10.0%, largest 10.0%" in out


def test_the_blind_set_predicts_every_case_without_error():
  rows = json.load(open("lab/data/blind_predictions_tokamax.json"))["rows"]
  assert len(rows) == 11 and all(r["predicted_s"] > 0 and "error" not in r for r in rows)
