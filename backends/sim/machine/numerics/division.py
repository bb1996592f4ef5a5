"""Float division as a Hopper GPU computes it.

Mosaic GPU lowers `x / y` (arith.divf) to PTX `div.full.f32` for f32, f16
and bf16 alike (halves are divided in f32, then rounded). Measured on an
H200 (lab/division_probe.py): div.full.f32 is x times
`rcp.approx.f32(y)` rounded once, and rcp.approx.f32 is within one ulp of
the correctly rounded reciprocal: for 13% of mantissas it is one ulp off.
That table of differences, for every f32 mantissa, measured on the H200, is
`rcp_approx_sm90.npz` (int8, -1/0/+1); the reciprocal of any other exponent
is the same mantissa's, scaled.
"""
import functools
import os

import numpy as np

from pallas_sim.backends.sim.machine.numerics import rounding

_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rcp_approx_sm90.npz")


@functools.cache
def _rcp_mantissa():
  """rcp.approx.f32 of 1.m for every 23-bit m, as a float32 in (0.5, 1]."""
  delta = np.load(_TABLE)["delta"].astype(np.int32)
  y = (np.arange(2 ** 23, dtype=np.uint32) | np.uint32(127 << 23)).view(np.float32)
  rn = (1.0 / y.astype(np.float64)).astype(np.float32)
  return (rn.view(np.int32) + delta).view(np.float32)


def rcp_approx(y):
  """PTX rcp.approx.f32 of float32 y (any shape)."""
  y = np.asarray(y, np.float32)
  m, e = np.frexp(y.astype(np.float64))          # y = m * 2^e, 0.5 <= |m| < 1
  mant = ((np.abs(m) * 2 ** 24).astype(np.int64) - 2 ** 23) & (2 ** 23 - 1)
  r = _rcp_mantissa()[mant].astype(np.float64)   # rcp of 2|m|, in (0.5, 1]
  with np.errstate(all="ignore"):
    out = np.ldexp(r, 1 - e.astype(np.int64)) * np.sign(m)
    out = np.where(y == 0, np.copysign(np.inf, y), out)
    out = np.where(np.isinf(y), np.copysign(0.0, y), out)
    out = np.where(np.isnan(y), np.nan, out)
  return out.astype(np.float32)


def div_full(x, y, dtype):
  """x / y by div.full.f32, then rounded to `dtype` (f16, bf16) as the GPU
  converts it: RN(x * rcp.approx(y)); for |y| > 2^126 both are scaled by
  1/4 first, and for subnormal y by 2^24, so that the reciprocal stays
  finite and normal (div.full is "full-range": fitted on the H200, any
  scale from 2^23 up gives the same quotients)."""
  x = np.asarray(x, np.float32)
  y = np.asarray(y, np.float32)
  big = np.abs(y) > np.float32(2.0 ** 126)
  small = np.abs(y) < np.float32(2.0 ** -126)  # (subnormal: rcp would overflow)
  with np.errstate(all="ignore"):
    scale = np.where(big, np.float32(0.25), np.where(small, np.float32(2.0 ** 24), 1))
    xs, ys = x * scale.astype(np.float32), y * scale.astype(np.float32)
  with np.errstate(all="ignore"):
    q = (xs.astype(np.float64) * rcp_approx(ys).astype(np.float64)).astype(np.float32)
  dtype = np.dtype(dtype)
  return q if dtype == np.float32 else rounding.to_dtype(q.astype(np.float64), dtype)
