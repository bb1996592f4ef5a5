"""lab/step_costs.py: a step's fixed cost from two runs of the same work."""
import pytest

from lab import step_costs, timing_suite


def test_fixed_cost_is_independent_of_the_work_and_the_block_overhead():
  # B = W * c + steps * f + O for the same W: f comes out whatever c and O.
  for c, o in ((3.0, 0.0), (0.5, 9000.0)):
    work, f = 4096 * 128, 775.0
    b = {s: work * c + s * f + o for s in (32, 64)}
    assert step_costs.fixed_cost(32, b[32], 64, b[64]) == pytest.approx(f)


def test_fixed_cost_needs_two_step_counts():
  with pytest.raises(ValueError, match="both runs take 32 steps"):
    step_costs.fixed_cost(32, 1.0, 32, 2.0)


def test_every_pair_names_cases_of_its_kind_with_twice_the_steps():
  for kind, fewer, more in step_costs.PAIRS:
    cases = {c.name: c for c in timing_suite.cases(kind)}
    assert step_costs.kv_steps(cases[more]) == 2 * step_costs.kv_steps(cases[fewer])
