"""The tensor core's summation kernels against each other and the tests' own
model (tests/agreement/tensor_core_ref.py): the fast kernels for finite
operands (float64 lanes, and float32/int32 lanes where their products are
exact) must give every bit the general one gives, signs of zeros included,
over operands of every exponent an operand type has (subnormals too)."""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tensor_core_ref
from pallas_sim.backends.sim.machine.numerics import tensor_core as tc

# name -> (numpy dtype, bits of its encoding)
OPERANDS = {"f16": (np.float16, np.uint16), "bf16": (ml_dtypes.bfloat16, np.uint16),
            "f8e4m3": (ml_dtypes.float8_e4m3fn, np.uint8),
            "f8e5m2": (ml_dtypes.float8_e5m2, np.uint8), "f32": (np.float32, np.uint32)}


def operand(rng, name, shape, zeros, narrow):
  """Finite values of the type from random encodings; `zeros` of them
  (either sign) zero; `narrow`: exponents within a few octaves of 1."""
  dt, bits = OPERANDS[name]
  if narrow:
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-3, 4, shape)).astype(dt)
  else:
    x = rng.integers(0, np.iinfo(bits).max, shape, dtype=bits, endpoint=True).view(dt)
  x = np.where(np.isfinite(x.astype(np.float32)), x, dt(1.5))
  x = np.where(rng.random(shape) < zeros, dt(0.0) * np.where(rng.random(shape) < .5, 1, -1)
               .astype(dt), x)
  return tensor_core_ref.operand_values(np.asarray(x, dt))


def accumulator(rng, shape, zeros, narrow):
  if narrow:
    acc = (rng.standard_normal(shape) * 8).astype(np.float32)
  else:  # (f32 encodings with exponents a matmul can reach, subnormals included)
    acc = rng.integers(0, 0x4F000000, shape, dtype=np.uint32).view(np.float32)
    acc = np.where(rng.random(shape) < .5, acc, -acc)
  zero = np.where(rng.random(shape) < .5, np.float32(0.0), np.float32(-0.0))
  return np.where(rng.random(shape) < zeros, zero, acc).astype(np.float32)


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(sorted(OPERANDS)), m=st.integers(1, 9),
       k=st.integers(1, 70), n=st.integers(1, 17), zeros=st.sampled_from([0, .3, .9, 1]),
       narrow=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
def test_fast_kernel_equals_the_general_one_and_the_reference(name, m, k, n, zeros,
                                                              narrow, seed):
  rng = np.random.default_rng(seed)
  a = operand(rng, name, (m, k), zeros, narrow)
  b = operand(rng, name, (k, n), zeros, narrow)
  acc = accumulator(rng, (m, n), zeros, narrow)
  itemsize = np.dtype(OPERANDS[name][0]).itemsize
  (align, result), kslice = tc.PRECISION[itemsize], tc.SLICE_BYTES // itemsize
  ea, eb = tc.exponents(a), tc.exponents(b)
  fast, general = acc.copy(), acc.copy()
  tc.mma_finite(fast, a, b, ea, eb, kslice, align, result)
  tc.mma_general(general, a, b, ea, eb, kslice, align, result)
  np.testing.assert_array_equal(fast.view(np.uint32), general.view(np.uint32))
  with np.errstate(over="ignore"):  # (sums past f32's range are inf in both)
    ref = tensor_core_ref.matmul(a, b, itemsize, acc).astype(np.float32)
  np.testing.assert_array_equal(fast.view(np.uint32), ref.view(np.uint32))
  # the public entry on float32 values: the narrow kernel where it applies
  a32, b32 = a.astype(np.float32), b.astype(np.float32)
  public = acc.copy()
  tc.mma_f32(public, a32, b32, itemsize)
  np.testing.assert_array_equal(public.view(np.uint32), general.view(np.uint32))
  ok, ea32, eb32 = tc.narrow_operands(a32, b32, acc)
  if ok:
    np.testing.assert_array_equal(ea32, ea)
    np.testing.assert_array_equal(eb32, eb)
    narrow = acc.copy()
    tc.mma_narrow(narrow, a32, b32, ea32, eb32, kslice, align, result)
    np.testing.assert_array_equal(narrow.view(np.uint32), general.view(np.uint32))


def test_narrow_kernel_takes_f16_operands_and_its_int32_sums_hold_the_largest():
  """Sixteen products of the largest f16 mantissa, one sign, in one slice:
  the int32 sum of their truncated terms is at its bound and still exact.
  Wide bf16 exponents (products past float32's range) take the float64
  kernel and give the same bits."""
  top = np.float32(np.float16(2 - 2 ** -10))
  for sign in (1, -1):
    a = np.full((2, 32), sign * top, np.float32)
    b = np.full((32, 3), top, np.float32)
    acc = np.array([[0, 1e-3, -7], [1e6, -0.0, 3]], np.float32)
    ok, _, lo, hi = tc.scan32(a)
    assert ok and (lo, hi) == (0, 0) and tc.narrow_operands(a, b, acc)[0]
    got, want = acc.copy(), acc.copy()
    tc.mma_f32(got, a, b, 2)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    tc.mma_general(want, a64, b64, tc.exponents(a64), tc.exponents(b64), 16, 25, 23)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  wide = np.array([[2.0 ** 100, 1.0], [3.0, 2.0 ** -120]], np.float32)
  assert not tc.narrow_operands(wide, wide, np.ones((2, 2), np.float32))[0]
  got, want = np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)
  tc.mma_f32(got, wide, wide, 2)
  tc.mma_f32(want, wide.astype(np.float64), wide.astype(np.float64), 2)
  np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_non_finite_operands_take_the_general_kernel():
  """An inf or NaN anywhere propagates as an ordinary sum does."""
  a = np.array([[1.0, np.inf], [2.0, 3.0]])
  b = np.array([[1.0, 2.0], [1.0, 0.5]])
  acc = np.zeros((2, 2), np.float32)
  tc.mma_f32(acc, a, b, 2)
  np.testing.assert_array_equal(acc, [[np.inf, np.inf], [5.0, 5.5]])
  acc = np.array([[np.nan, 0], [0, 0]], np.float32)
  tc.mma_f32(acc, np.ones((2, 2)), np.ones((2, 2)), 2)
  assert np.isnan(acc[0, 0]) and (acc.ravel()[1:] == 2).all()


def test_a_strided_accumulator_view_is_updated_in_place_in_f32():
  """An accumulator that is a view (columns of a larger one) gets the same
  f32 bits a contiguous one does, and nothing outside it changes."""
  rng = np.random.default_rng(3)
  a = rng.standard_normal((8, 32)).astype(np.float16).astype(np.float32)
  b = rng.standard_normal((32, 16)).astype(np.float16).astype(np.float32)
  big = (rng.standard_normal((8, 48)) * 100).astype(np.float32)
  before = big.copy()
  view = big[:, 16:32]
  assert not view.flags.c_contiguous
  want = view.copy()
  tc.mma_f32(want, a, b, 2)
  tc.mma_f32(view, a, b, 2)
  np.testing.assert_array_equal(big[:, 16:32].view(np.uint32), want.view(np.uint32))
  np.testing.assert_array_equal(big[:, :16], before[:, :16])
  np.testing.assert_array_equal(big[:, 32:], before[:, 32:])
  assert not np.array_equal(want, want.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("name", ["f16", "bf16", "f8e4m3", "f8e5m2"])
def test_operand_values_are_the_types_own_for_every_bit_pattern(name):
  """wgmma operands become float32 values through a table (f16, fp8): the
  values, NaN payloads included, are what the type's astype gives, on
  strided views too."""
  dt = np.dtype(OPERANDS[name][0])
  bits = np.uint16 if dt.itemsize == 2 else np.uint8
  every = np.arange(1 << (8 * dt.itemsize), dtype=np.uint32).astype(bits).view(dt)
  for x in (every.reshape(-1, 16), every.reshape(-1, 16)[::3, 1::2]):
    got = tc.values_f32(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint32), x.astype(np.float32).view(np.uint32))
