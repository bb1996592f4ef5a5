"""benchmarks/micros.py --from-predictions: a blind micro set scored with the
predictions committed before it was measured, not estimated again."""
import json

from benchmarks import micros


def test_blind_predictions_are_scored_as_committed(tmp_path, capsys):
  meas = micros.measured()["row_sum_64x64_1_per_sm"]
  f = tmp_path / "p.json"
  f.write_text(json.dumps({"commit": "0" * 40, "predictions": {
      "row_sum_64x64_1_per_sm": meas / 2}}))
  micros.main(["--from-predictions", str(f)])
  out = capsys.readouterr().out
  rows = [line for line in out.splitlines() if line.startswith("| row_")]
  assert rows == [f"| row_sum_64x64_1_per_sm | {meas:.1f} | {meas / 2:.1f} | -50% |  |"]
  assert "1 measured: mean abs error 50.0%" in out
