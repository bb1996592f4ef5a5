"""benchmarks/accuracy.py's ranking figures: which configurations the H200
tells apart (past its run-to-run noise), and whether the model orders those
the same way. The figures the issue's proof reads must count no ordering
inside the noise, and must not reward a model that ties everything."""
import collections

import pytest

from benchmarks import accuracy

Case = collections.namedtuple("Case", "name family small")


def rows(measured, predicted):
  return [(Case(f"c{i}", "f", False), m, p, p / m - 1)
          for i, (m, p) in enumerate(zip(measured, predicted))]


def test_pairs_within_noise_are_not_apart():
  fr = rows([100.0, 101.0, 110.0], [1, 2, 3])
  noise = {r[0].name: 0.02 for r in fr}
  pairs = accuracy.apart(fr, noise)
  assert {(lo[0].name, hi[0].name) for lo, hi in pairs} == {("c0", "c2"), ("c1", "c2")}


def test_a_row_measured_twice_takes_its_own_difference_as_noise():
  # (its second run 8% off: a 5% gap to its neighbour is inside that)
  fr = rows([100.0, 105.0], [1.0, 2.0])
  again = {"c0": 108.0}
  noise = {r[0].name: accuracy.noise_of(r[0].name, r[1], again, {}) for r in fr}
  assert noise["c0"] == pytest.approx(1 - 100 / 108)
  assert accuracy.apart(fr, noise) == []
  assert noise["c1"] == accuracy.RESOLUTION


@pytest.mark.parametrize("predicted, share", [
    ([1.0, 2.0, 3.0], 1.0),        # ordered as measured
    ([3.0, 2.0, 1.0], 0.0),        # reversed
    ([1.0, 1.0, 1.0], 0.5),        # all tied: half, not full credit
])
def test_ordered_share(predicted, share):
  fr = rows([100.0, 120.0, 140.0], predicted)
  noise = {r[0].name: 0.02 for r in fr}
  assert accuracy.ordered_share(accuracy.apart(fr, noise)) == share


def test_noise_ranks_tie_what_the_gpu_cannot_tell_apart():
  # 100 and 101 are one group; 130 and 131 another
  fr = rows([101.0, 130.0, 100.0, 131.0], [2.0, 3.0, 1.0, 4.0])
  noise = {r[0].name: 0.02 for r in fr}
  tied = accuracy.noise_ranks(fr, noise)
  assert tied == [100.0, 130.0, 100.0, 130.0]
  # an order inside a group costs the model nothing
  assert accuracy.spearman(tied, [2.0, 3.0, 1.0, 4.0]) == pytest.approx(
      accuracy.spearman(tied, [1.0, 4.0, 2.0, 3.0]))
  # but an order across groups does
  assert accuracy.spearman(tied, [3.0, 1.0, 4.0, 2.0]) < 0
