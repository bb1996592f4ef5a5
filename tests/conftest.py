import os
import sys

import numpy as np
import pytest
from hypothesis import settings

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(_HERE), "examples"),
                os.path.join(_HERE, "agreement")]  # (tolerance.py: bits, references)

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


def assert_bit_equal(got, want, what=""):
  """Bit-identical arrays (NaN payloads aside: tolerance.bits)."""
  from tolerance import bit_mismatches
  for g, w in zip(jax_leaves(got), jax_leaves(want)):
    problems = bit_mismatches(g, w)
    assert not problems, f"{what}: {problems}"


def jax_leaves(x):
  import jax
  return [np.asarray(v) for v in jax.tree.leaves(x)]


def store_unoptimized(ref, value):
  """`ref[...] = value` through the lowering's plain per-thread stores: what
  jax 0.11.2 emits for any register array stored to GMEM, and what 0.12
  emits only when asked (plgpu.store(..., optimized=False)). 0.12's default
  needs 4 bytes a thread in whole 32-byte sectors, which 16-bit values in
  the WGMMA layout (2 a thread, 16 bytes a quad) are not: its lowering
  rejects them (TransferPlanDerivationError)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  if hasattr(plgpu, "store"):
    plgpu.store(ref, value, optimized=False)
  else:
    ref[...] = value
