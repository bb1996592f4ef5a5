"""Correctly rounded results computed through float64.

numpy rounds float64 -> float32/float16 once, to nearest-even, but ml_dtypes
rounds float64 -> bfloat16 through float32, twice, and a float64 sum may
itself be inexact: either can land one ulp off the hardware's single
rounding. Rounding the float64 step to odd makes any later rounding to a
type of at most 51 bits correct (the round-to-odd property), and a float32
step rounded to odd does the same for bfloat16 and the fp8 types.
"""
import numpy as np

_F32 = np.dtype(np.float32)


def odd_sum(a, b):
  """a + b in float64, rounded to odd: an inexact sum gets its last bit set
  (moved one ulp toward the exact value, from the TwoSum error term)."""
  s = a + b
  bb = s - a
  err = (a - (s - bb)) + (b - bb)
  fix = (err != 0) & ((s.view(np.int64) & 1) == 0) & np.isfinite(s)
  if fix.any():
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
  return s


def _odd_f32(x):
  """float64 -> float32 rounded to odd (a float32 that is not exact keeps a
  set last bit)."""
  r = x.astype(_F32)
  back = r.astype(np.float64)
  fix = (back != x) & ((r.view(np.int32) & 1) == 0) & np.isfinite(back)
  if fix.any():
    toward = np.where(x > back, np.float32(np.inf), np.float32(-np.inf))
    r = np.where(fix, np.nextafter(r, toward), r)
  return r


def to_dtype(x, dtype):
  """float64 x (exact, or already rounded to odd) rounded once to `dtype`."""
  dtype = np.dtype(dtype)
  with np.errstate(over="ignore"):  # (past the largest finite: inf, as IEEE rounds)
    if dtype.kind == "V":  # bfloat16, float8_* (ml_dtypes' own kind)
      return _odd_f32(x).astype(dtype)
    return x.astype(dtype)


def fma(x, y, c, dtype):
  """x*y + c rounded once to `dtype` (operands of at most 26 significant
  bits: their product is exact in float64)."""
  with np.errstate(all="ignore"):
    p = np.asarray(x, np.float64) * np.asarray(y, np.float64)
    return to_dtype(odd_sum(p, np.asarray(c, np.float64)), dtype)
