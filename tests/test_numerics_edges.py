"""Numerics at the edges: NaN, +-inf, signed zeros, extreme exponents.

The agreement families draw them (tests/agreement/families.py: `edges` for
division, lax.round of both methods and casts; `reduction` with
`specials=True`); the tests here fix the examples that must always run: the
inputs where lax.round and fp8 casts were once wrong. The `gpu` tests
assert the same values on a Hopper GPU (all passed on an H200)."""
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, reject, settings
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "agreement"))
import families as F  # noqa: E402
import tolerance as tol  # noqa: E402
from harness import assert_agree  # noqa: E402


@pytest.mark.parametrize("op", sorted(F.REDUCE))
def test_reductions_of_nan_inf_and_signed_zeros(op):
  """Each of sum/max/min over lines holding a NaN, infinities of one or both
  signs, zeros of both signs, extreme exponents: NaN propagates (max.NaN /
  min.NaN, what the lowering emits), -0 < +0. Stored per thread: an example
  that runs on both JAX releases (the covering rows may draw a 16-bit
  assigned store, which 0.12 rejects)."""
  @settings(max_examples=1, derandomize=True, database=None)
  @given(F.reduction(op=op, specials=True, store="plain", out="gmem"))
  def one(case):
    if assert_agree(case) == "both-rejected":
      reject()  # (the inferred layout)
  one()


def _one(fn, x, out_dtype):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(x.shape, out_dtype))
  def k(x_ref, o_ref):
    o_ref[...] = fn(x_ref[...])
  return k


def _round_inputs(dtype):
  """Where rounding x + 0.5 in x's own type goes wrong: the largest value
  below 0.5 and its negation, -0.0, odd integers in [2^(p-1), 2^p)."""
  p = tol._FORMATS[np.dtype(dtype)][0]
  v = [0.5 - 2.0 ** -(p + 1), -(0.5 - 2.0 ** -(p + 1)), -0.0, 2.0 ** (p - 1) + 1,
       -(2.0 ** (p - 1) + 3), 2.0 ** p - 1, 2.5, -2.5, 0.5, -0.3]
  return np.resize(np.asarray(v, np.float64), 128).astype(dtype)


def _round_check(backend, dtype):
  x = _round_inputs(dtype)
  got = np.asarray(ps.run(_one(lax.round, jnp.asarray(x), dtype), jnp.asarray(x),
                          backend=backend))
  want = tol.round_half_away(x.astype(np.float64))
  assert not tol.mismatches(got, tol.Iv(want)), (x[:10], got[:10], want[:10])


_HALVES_AND_F32 = [np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", _HALVES_AND_F32, ids=["f32", "f16", "bf16"])
def test_round_half_away_below_a_half_odd_integers_and_negative_zero(dtype):
  _round_check("sim", dtype)


def _fp8_inputs():
  return np.resize(np.asarray(
      [500.0, -500.0, 464.0, 1e6, np.inf, -np.inf, 60000.0, 1e30, np.nan, 448.0],
      np.float32), 128)


def _fp8_check(backend, src, f8):
  with np.errstate(over="ignore"):
    x = _fp8_inputs().astype(src)
  got = np.asarray(ps.run(_one(lambda v: v.astype(f8), jnp.asarray(x), f8),
                          jnp.asarray(x), backend=backend))
  want = tol.round_to(x.astype(np.float64), f8, satfinite=True)
  assert not tol.mismatches(got, tol.Iv(want)), (x[:10], got[:10], want[:10])


_FP8 = [(s, d) for s in (np.float32, np.float16)
        for d in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)]
_FP8_IDS = ["f32-e4m3", "f32-e5m2", "f16-e4m3", "f16-e5m2"]


@pytest.mark.parametrize("src,f8", _FP8, ids=_FP8_IDS)
def test_fp8_casts_saturate_as_cvt_satfinite(src, f8):
  _fp8_check("sim", src, f8)


# --- the same on a Hopper GPU --------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", _HALVES_AND_F32, ids=["f32", "f16", "bf16"])
def test_gpu_round_half_away(dtype):
  _round_check("mosaic", dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("src,f8", _FP8, ids=_FP8_IDS)
def test_gpu_fp8_casts_saturate(src, f8):
  _fp8_check("mosaic", src, f8)
