"""lab/block_study.py: a line through a configuration's blocks gives back a
known fixed cost and cost a step; the loads-only rows' rate is their TMA
bytes over their time."""
import math

import pytest

from lab import block_study, families


def _measured(fixed_us, step_us, mhz=1500.0):
  """Every block-study row as if the H200 took `fixed_us + step_us * steps`
  a block, at `mhz`."""
  cases = []
  for c in families.block_study_cases():
    blocks, steps, _ = block_study._blocks_and_steps(c)
    waves = math.ceil(blocks / block_study.NUM_SMS)
    t = waves * (fixed_us + step_us * steps) * 1e-6
    cases.append({"name": c.name, "median_s": t, "clock": {"sm_mhz": mhz}})
  return {"families_study_blocks": {"cases": cases}}


def test_the_line_through_a_configuration_s_blocks_gives_back_its_costs():
  rows = block_study.rows(_measured(3.0, 0.8), {})
  by_cfg = {}
  for c, blocks, steps, _, t, mhz, *_ in rows:
    if "loads only" not in c.name:
      waves = math.ceil(blocks / block_study.NUM_SMS)
      by_cfg.setdefault(block_study._config(c), []).append((steps, t / waves * 1e6))
  assert len(by_cfg) == 4 and all(len(v) == 3 for v in by_cfg.values())
  for pts in by_cfg.values():
    fixed, step = block_study.line(pts)
    assert fixed == pytest.approx(3.0) and step == pytest.approx(0.8)


def test_the_report_prints_both_sides(capsys):
  block_study.report(_measured(3.0, 0.8), {})
  out = capsys.readouterr().out
  assert "3.00 + 0.800 (4500 + 1200 cycles)" in out
  assert out.count("loads only") == 5
