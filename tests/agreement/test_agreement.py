"""The agreement suite: the simulator against the real Mosaic GPU lowering
(on a Hopper GPU) or against exact references (anywhere), over generated
kernels. See docs/agreement.md.

Two kinds of test per family: `test_<family>` draws random examples
(hypothesis; 15 derandomized in the CI profile), and
`test_covering[<family>-<row>]` runs one example for each row of
families.covering_rows, so that every dtype, kind and path of every family
runs in CI."""
import itertools

import pytest
from hypothesis import given, reject, settings

import families as F
from harness import assert_agree


@given(F.elementwise())
def test_elementwise(case):
  assert_agree(case)


@given(F.reduction())
def test_reduction(case):
  assert_agree(case)


@given(F.pipeline())
def test_pipeline(case):
  assert_agree(case)


@given(F.matmul())
def test_matmul(case):
  assert_agree(case)


@given(F.producer_consumer())
def test_producer_consumer(case):
  assert_agree(case)


@given(F.rejected())
def test_rejected(case):
  assert_agree(case)


@given(F.edges())
def test_edges(case):
  assert_agree(case)


COVERING = [(f, i, row) for f in F.FAMILIES for i, row in enumerate(F.covering_rows(f))]


@pytest.mark.parametrize("family,i,row", COVERING,
                         ids=[f"{f}-{i}" for f, i, _ in COVERING])
def test_covering(family, i, row):
  """One example with these axes fixed (the rest drawn): one that runs,
  except where the row's own values make the lowering reject it."""
  @settings(max_examples=1, derandomize=True, database=None)
  @given(F.FAMILIES[family](**row))
  def one(case):
    assert all(case.config[a] == v for a, v in row.items())
    if assert_agree(case) == "both-rejected" and not F.may_be_rejected(family, case.config):
      reject()  # e.g. SMEM overflow of the drawn tile sizes: draw another
  one()


def test_covering_rows_take_every_value_of_every_axis():
  for family, axes in F.AXES.items():
    rows = F.covering_rows(family)
    taken = {(a, v) for row in rows for a, v in row.items()}
    assert taken == {(a, v) for a, vs in axes.items() for v in vs}, family
    for names in F.AXES_PAIRS.get(family, ()):
      combos = {tuple(r[n] for n in names) for r in rows if all(n in r for n in names)}
      want = {c for c in itertools.product(*(axes[n] for n in names))
              if F._valid(family, dict(zip(names, c)))}
      assert combos >= want, (family, names, want - combos)


def test_an_integer_negated_to_zero_is_plus_zero_in_a_float():
  """int32 has no -0: -x for x == 0, times y, cast to bf16 is +0.0 on the
  H200 and in the simulator. (The reference once said -0.0: its float64 stand-in
  for the integers negated a 0; agreement run with seed 2026 on the H200.)"""
  @settings(max_examples=1, derandomize=True, database=None)
  @given(F.elementwise(dt="i32", unary="neg", binary="mul", out_dt="bf16", iota=None,
                       bcast=False, path="gmem", threads=1, rows=2, bn=128, gm=2, gn=2,
                       seed=0))
  def one(case):
    x = case.args[0]
    assert (x == 0).any()
    assert assert_agree(case) == "agree"
  one()
