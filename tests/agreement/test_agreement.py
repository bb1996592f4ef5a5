"""The agreement suite: the simulator against the real Mosaic GPU lowering
(on a Hopper GPU) or against NumPy (anywhere), over generated kernels.
See tests/agreement/README in the top-level README ("Agreement")."""
from hypothesis import given

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
