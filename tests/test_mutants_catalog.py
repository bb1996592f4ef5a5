"""The mutant catalog (./dev mutants) stays applicable: each mutant's text is
found exactly once in today's code, and what it names exists."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "mutants"))
from catalog import MUTANTS  # noqa: E402
from run import apply  # noqa: E402


def test_every_mutant_applies_once_and_names_real_tests():
  assert len(MUTANTS) >= 30
  assert len({m.name for m in MUTANTS}) == len(MUTANTS)
  for m in MUTANTS:
    with open(os.path.join(ROOT, m.path)) as f:
      text = f.read()
    assert apply(m, text) != text, m.name
    for t in m.tests:
      assert os.path.exists(os.path.join(ROOT, t.split("::")[0])), (m.name, t)
