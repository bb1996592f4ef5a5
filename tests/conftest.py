import os
import sys

import numpy as np
import pytest
from hypothesis import settings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))

# Fixed hypothesis profiles: "ci" is quick (the default), "thorough" for
# longer local or GPU runs: HYPOTHESIS_PROFILE=thorough.
# HYPOTHESIS_MAX_EXAMPLES overrides the count (tests/agreement/run.py --examples).
_n = os.environ.get("HYPOTHESIS_MAX_EXAMPLES")
settings.register_profile("ci", max_examples=int(_n or 15), deadline=None,
                          derandomize=True, print_blob=True)
settings.register_profile("thorough", max_examples=int(_n or 200), deadline=None,
                          print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def rng():
  return np.random.default_rng(1234)


def rel_err(got, want):
  got = np.asarray(got, np.float64)
  want = np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
