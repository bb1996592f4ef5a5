"""Register arithmetic rounds as the hardware does: once per operation, to
nearest-even, and once for a fused multiply-add. Checked against exact
rational arithmetic (fractions.Fraction), independent of numpy's and
ml_dtypes' casts (the latter round float64 -> bfloat16 twice)."""
import math
import os
from fractions import Fraction

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

# significand bits, smallest normal exponent, largest finite value
FORMATS = {jnp.float32: (24, -126, (2 - 2.0 ** -23) * 2.0 ** 127),
           jnp.float16: (11, -14, 65504.0),
           jnp.bfloat16: (8, -126, (2 - 2.0 ** -7) * 2.0 ** 127)}


def round_exact(q, dtype):
  """The rational q rounded to nearest-even in `dtype`, as a float."""
  p, emin, big = FORMATS[dtype]
  if q == 0:
    return 0.0
  a = abs(q)
  e = a.numerator.bit_length() - a.denominator.bit_length()
  while Fraction(2) ** e > a:
    e -= 1
  while Fraction(2) ** (e + 1) <= a:
    e += 1
  ulp = Fraction(2) ** (max(e, emin) - p + 1)
  n = a / ulp
  f = math.floor(n)
  if n - f > Fraction(1, 2) or (n - f == Fraction(1, 2) and f % 2):
    f += 1
  r = f * ulp
  v = math.inf if r > big else float(r)
  return math.copysign(v, q)


def _values(dtype, seed, spread, n=128):
  """Full significands over `spread` binades either side of 1, signs mixed:
  a product plus an addend then needs far more bits than the result keeps."""
  r = np.random.default_rng(seed)
  x = r.uniform(1, 2, n) * 2.0 ** r.integers(-spread, spread + 1, n)
  return np.where(r.random(n) < 0.5, -x, x).astype(dtype)


def fma_kernel(dtype):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), dtype))
  def k(x_ref, y_ref, c_ref, o_ref):
    x, y, c = x_ref[...], y_ref[...], c_ref[...]
    o_ref[0] = x * y + c  # contracted into one fused multiply-add on the GPU
    o_ref[1] = x + c      # one rounding of the exact sum
  return k


@pytest.mark.parametrize("dtype", list(FORMATS), ids=["f32", "f16", "bf16"])
@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), spread=st.integers(0, 40))
def test_fma_and_add_round_once_to_nearest_even(dtype, seed, spread):
  spread = min(spread, 12) if dtype == jnp.float16 else spread
  x, y, c = (_values(dtype, seed + i, spread) for i in range(3))
  out = np.asarray(ps.run(fma_kernel(dtype), jnp.asarray(x), jnp.asarray(y),
                          jnp.asarray(c), backend="sim"), np.float64)
  F = lambda v: Fraction(float(v))
  want_fma = [round_exact(F(a) * F(b) + F(d), dtype) for a, b, d in zip(x, y, c)]
  want_add = [round_exact(F(a) + F(d), dtype) for a, d in zip(x, c)]
  np.testing.assert_array_equal(out[0], want_fma)
  np.testing.assert_array_equal(out[1], want_add)


def test_bfloat16_fma_just_above_a_tie_rounds_once():
  # (1 + 2^-4)^2 + 2^-30 = 1 + 2^-3 + 2^-8 + 2^-30: just above a bfloat16
  # tie, so it rounds up to 1 + 2^-3 + 2^-7. Through float32 first, the
  # 2^-30 is lost, the tie goes to even, and the result is 1 + 2^-3.
  bf = ml_dtypes.bfloat16
  x = np.full(128, 1 + 2.0 ** -4, bf)
  c = np.full(128, 2.0 ** -30, bf)
  out = np.asarray(ps.run(fma_kernel(jnp.bfloat16), jnp.asarray(x), jnp.asarray(x),
                          jnp.asarray(c), backend="sim"), np.float64)
  assert (out[0] == 1 + 2.0 ** -3 + 2.0 ** -7).all()


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int16", "uint8"])
def test_count_leading_zeros(dtype):
  from jax import lax
  info = np.iinfo(dtype)
  x = np.random.default_rng(0).integers(info.min, info.max, 256, endpoint=True)
  x = jnp.asarray(x, dtype).at[0].set(0).at[1].set(1)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), dtype))
  def k(x_ref, o_ref):
    o_ref[...] = lax.clz(x_ref[...])

  np.testing.assert_array_equal(ps.run(k, x, backend="sim"), lax.clz(x))


def div_kernel(shape, dtype):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, dtype))
  def k(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] / y_ref[...]
  return k


def test_f32_division_is_the_h200s_div_full():
  # Quotients the H200 computed (lab/division_probe.py) that are not
  # the correctly rounded ones (div.full.f32 = x * rcp.approx(y), 1-2 ulp
  # off), and divisions by subnormals (which div.full.f32 rescales).
  x, y, want = np.load(os.path.join(DATA, "division_h200.npz"))["float32"].view(np.float32)
  got = np.asarray(ps.run(div_kernel((256,), jnp.float32), x, y, backend="sim"))
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  with np.errstate(over="ignore"):  # (quotients past float32's range: inf)
    ieee = (x.astype(np.float64) / y.astype(np.float64)).astype(np.float32)
  assert (ieee[:64].view(np.uint32) != want[:64].view(np.uint32)).all()


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1))
def test_division_is_within_two_ulp_and_halves_round_the_f32_quotient(seed):
  from pallas_sim.backends.sim.machine.numerics import division
  r = np.random.default_rng(seed)
  x = (r.uniform(-2, 2, 256) * 2.0 ** r.integers(-60, 60, 256)).astype(np.float32)
  y = (r.uniform(-2, 2, 256) * 2.0 ** r.integers(-60, 60, 256)).astype(np.float32)
  q = division.div_full(x, y, np.float32)
  exact = x.astype(np.float64) / y.astype(np.float64)
  ulps = np.abs(q.view(np.int32).astype(np.int64) - exact.astype(np.float32).view(np.int32))
  assert ulps.max() <= 2
  for dt in (np.float16, ml_dtypes.bfloat16):
    with np.errstate(over="ignore"):  # (operands and quotients past float16's range: inf)
      xs, ys = x.astype(dt), y.astype(dt)
    got = np.asarray(ps.run(div_kernel((256,), dt), xs, ys, backend="sim"))
    with np.errstate(over="ignore"):
      want = division.div_full(xs.astype(np.float32), ys.astype(np.float32),
                               np.float32).astype(dt)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_subnormals_are_kept_not_flushed():
  # XLA:CPU runs host callbacks with flush-to-zero on; the simulator restores
  # IEEE subnormals, as a Hopper GPU computes f32 without .ftz.
  tiny = (np.arange(1, 129) * 2.0 ** -149).astype(np.float32)
  got = np.asarray(ps.run(div_kernel((128,), jnp.float32), tiny,
                          np.full(128, 0.5, np.float32), backend="sim"))
  np.testing.assert_array_equal(got, tiny * np.float32(2))
