"""When two results "agree": the rule the agreement suite applies.

A family's reference gives, per output element, the closed range [lo, hi] of
values the hardware may produce (float64; NaN where NaN is expected). It is
computed independently of the simulator, with correct rounding per operation
(`round_to`), and it is a single point wherever the hardware's result is
determined bit for bit:

* element-wise f16/bf16/f32 add, sub, mul, neg, abs, max, min, select,
  casts, and the fused multiply-adds the GPU compiler forms (`fma_round`);
* wgmma matmuls of every operand type (tensor_core_ref.py: the summation
  measured on an H200) and data movement (TMA, pipelines, producer/consumer).

The range has width only for the documented exceptions, each named here:

* F32_TRANSCENDENTAL_ULPS: f32 exp/log/tanh. The GPU uses libdevice (within 2
  ulp of the true value), the simulator numpy (within 4 ulp for its SIMD f32
  loops); the range is the true value +-4 ulp, carried through the later
  operations by interval arithmetic. f16/bf16 transcendentals are computed in
  f32 and rounded once, so their range is a point except where the f32
  candidates straddle a rounding boundary of the narrow type.
* F32_ZERO_ADD_FOLDED: x*x + i - y, with i an iota that the GPU compiler
  knows to be 0, loses the add, and x*x - y fuses instead. Along an axis of
  size 1 the iota is 0 everywhere, in every dtype: the simulator folds it too
  (exact). In f32 the compiler also knows it per register (a row of a
  strided layout), which the simulator does not model: where i is 0 there,
  the range takes both results (measured on an H200,
  lab/register_numerics_probe.py).
* sum_error: sums in registers, whose order on the GPU (per lane, then
  across lanes and warps) is not modelled: the range is the exact sum +-
  (n-1) u sum|x| (the bound for any order of additions in a type of unit
  roundoff u). jnp.sum accumulates f16/bf16 in f32 (u = 2^-24) and rounds
  once; lax.reduce_sum accumulates them in their own type.

On a Hopper GPU, outputs of cases that claim exactness (`Case.exact`) must be
bit-identical between the simulator and the hardware (NaN payloads aside);
the others must both fall in the reference range. Integers must be equal.
"""
import ml_dtypes
import numpy as np

F32_TRANSCENDENTAL_ULPS = 4

# (significand bits incl. the implicit one, smallest normal exponent, largest finite)
_FORMATS = {
    np.dtype(np.float32): (24, -126, float(np.finfo(np.float32).max)),
    np.dtype(np.float16): (11, -14, 65504.0),
    np.dtype(ml_dtypes.bfloat16): (8, -126, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)),
    # (fp8: the GPU converts to them only with .satfinite: round_to(...,
    # satfinite=True))
    np.dtype(ml_dtypes.float8_e4m3fn): (4, -6, 448.0),
    np.dtype(ml_dtypes.float8_e5m2): (3, -14, 57344.0),
}


def is_float(dtype):
  return np.dtype(dtype) in _FORMATS


def ulp(x, dtype):
  """The spacing of `dtype`'s values at |x| (float64 array)."""
  p, emin, _ = _FORMATS[np.dtype(dtype)]
  x = np.abs(np.asarray(x, np.float64))
  e = np.frexp(np.where(x > 0, x, 1.0))[1] - 1
  return np.ldexp(1.0, np.maximum(e, emin) - (p - 1))


def round_to(x, dtype, satfinite=False):
  """x (float64) rounded to nearest-even in `dtype`, as float64. Written
  from the formats' parameters, not through numpy/ml_dtypes casts
  (ml_dtypes rounds float64 -> bfloat16 through float32: twice).
  satfinite: PTX cvt's .satfinite (the only fp8 conversion the lowering
  emits): a result beyond the largest finite value, +-inf included, is that
  value with its sign; NaN stays NaN."""
  dtype = np.dtype(dtype)
  x = np.asarray(x, np.float64)
  if not is_float(dtype):
    return x
  _, _, big = _FORMATS[dtype]
  with np.errstate(all="ignore"):
    q = ulp(x, dtype)
    r = np.rint(x / q) * q  # x / q is exact (a power of two) and < 2^p
    r = np.where(np.abs(r) > big, np.copysign(big if satfinite else np.inf, x), r)
    return np.where(np.isfinite(x) | (satfinite & ~np.isnan(x)), r, x)


def round_half_away(x):
  """lax.round(x) (AWAY_FROM_ZERO) of float64 x holding f32/f16/bf16 values:
  exact (|x| + 0.5 is exact in float64 below 2^52), the sign of a zero
  result kept (-0.3 -> -0.0), as PTX's expansion of llvm.round gives."""
  x = np.asarray(x, np.float64)
  with np.errstate(all="ignore"):
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def round_half_even(x):
  """lax.round(x, TO_NEAREST_EVEN) (cvt.rni): exact, zeros keep their sign."""
  return np.rint(np.asarray(x, np.float64))


def div_full(x, y, dtype):
  """The range of x / y (f32, f16, bf16 operands held in float64) as the
  GPU computes it: PTX div.full.f32 (halves in f32, the quotient rounded
  to `dtype`) is RN(x' * rcp.approx(y')), with (x', y') = (x, y) / 4 for
  |y| > 2^126 and (x, y) * 2^24 for subnormal y (machine/numerics/division.py,
  fitted on the H200), and rcp.approx.f32 within one ulp of the correctly
  rounded reciprocal (measured on the H200 for every mantissa): the range
  is RN(x' * r) for r from one ulp below RN(1/y') to one above. Exact where
  the reciprocal is 0 or inf (y' = +-inf, +-0) and for NaN."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  f32 = np.dtype(np.float32)
  with np.errstate(all="ignore"):
    scale = np.where(np.abs(y) > 2.0 ** 126, 0.25,
                     np.where(np.abs(y) < 2.0 ** -126, 2.0 ** 24, 1.0))
    xs, ys = round_to(x * scale, f32), round_to(y * scale, f32)
    r0 = round_to(1.0 / ys, f32).astype(np.float32)
    r_lo = np.nextafter(r0, np.float32(0)).astype(np.float64)
    r_hi = np.nextafter(r0, np.copysign(np.float32(np.inf), r0)).astype(np.float64)
    fixed = ~np.isfinite(r0) | (r0 == 0)
    r_lo = np.where(fixed, r0, r_lo)
    r_hi = np.where(fixed, r0, r_hi)
    a, b = round_to(xs * r_lo, f32), round_to(xs * r_hi, f32)
    lo, hi = np.fmin(a, b), np.fmax(a, b)
    # (0 * r of either sign: fmin/fmax pick a zero's sign arbitrarily)
    zero = (xs == 0) & ~np.isnan(lo)
    z = np.copysign(0.0, xs) * np.copysign(1.0, r0)
    lo, hi = np.where(zero, z, lo), np.where(zero, z, hi)
    nan = np.isnan(a) | np.isnan(b)
    lo, hi = np.where(nan, np.nan, lo), np.where(nan, np.nan, hi)
  return Iv(lo, hi) if np.dtype(dtype) == f32 else Iv(lo, hi).rnd(dtype)


def round_to_odd_sum(a, b):
  """a + b rounded to odd in float64 (then rounding to any narrower type is
  correct: 53 >= p + 2). Exact TwoSum error term decides."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  with np.errstate(all="ignore"):
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    odd = (s.view(np.int64) & 1) == 1
    fix = np.isfinite(s) & (err != 0) & ~odd
    toward = np.where(err > 0, np.inf, -np.inf)
    return np.where(fix, np.nextafter(s, toward), s)


def fma_round(x, y, c, dtype):
  """x*y + c rounded once to `dtype` (x, y of at most 24 significant bits:
  their product is exact in float64)."""
  return round_to(round_to_odd_sum(np.asarray(x, np.float64) * y, c), dtype)


def sum_error(n, abs_sum, dtype):
  """Largest error of an n-term sum accumulated in `dtype`, in any order:
  (n-1) u sum|x| (to first order; u the unit roundoff)."""
  u = 2.0 ** -_FORMATS[np.dtype(dtype)][0]
  return (n - 1) * u * (1 + n * u) * abs_sum


# --- intervals ---------------------------------------------------------------

class Iv:
  """A closed range [lo, hi] per element (float64); NaN bounds mean NaN."""
  __slots__ = ("lo", "hi")

  def __init__(self, lo, hi=None):
    self.lo = np.asarray(lo, np.float64)
    self.hi = self.lo if hi is None else np.asarray(hi, np.float64)

  def monotone(self, f):
    """Image under a non-decreasing f."""
    return Iv(f(self.lo), f(self.hi))

  def rnd(self, dtype):
    return self.monotone(lambda v: round_to(v, dtype))

  def __neg__(self):
    return Iv(-self.hi, -self.lo)

  def abs(self):
    lo, hi = self.lo, self.hi
    return Iv(np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0.0)),
              np.maximum(np.abs(lo), np.abs(hi)))

  def add(self, y):
    return Iv(self.lo + y, self.hi + y)

  def mul(self, y):
    a, b = self.lo * y, self.hi * y
    return Iv(np.fmin(a, b), np.fmax(a, b))

  def hull(self, other):
    return Iv(np.fmin(self.lo, other.lo), np.fmax(self.hi, other.hi))

  @property
  def width(self):
    return self.hi - self.lo


def around(center, ulps, dtype):
  """center +- ulps * ulp(center) in `dtype` (a point where non-finite)."""
  c = np.asarray(center, np.float64)
  d = ulps * ulp(c, dtype)
  fin = np.isfinite(c)
  return Iv(np.where(fin, c - d, c), np.where(fin, c + d, c))


# --- checking ------------------------------------------------------------------

def _f64(x):
  x = np.asarray(x)
  return x.astype(np.float64) if x.dtype != np.float64 else x


def mismatches(got, want):
  """Problems with `got` against a reference range `want` (an Iv); empty
  when every element lies in its range (NaN exactly where expected)."""
  floats = np.asarray(got).dtype.kind in "fV"  # (signed zeros: floats only)
  got = _f64(got)
  lo, hi = np.broadcast_to(want.lo, got.shape), np.broadcast_to(want.hi, got.shape)
  if got.shape != want.lo.shape and want.lo.shape != ():
    return [f"shape {got.shape} != {want.lo.shape}"]
  nan_w = np.isnan(lo) | np.isnan(hi)
  with np.errstate(invalid="ignore"):
    bad = np.where(nan_w, ~np.isnan(got), ~((got >= lo) & (got <= hi)))
    # an exact zero has an exact sign
    if floats:
      bad |= (lo == 0) & (hi == 0) & (got == 0) & (np.signbit(lo) == np.signbit(hi)) & (
          np.signbit(got) != np.signbit(lo))
  if not bad.any():
    return []
  i = tuple(int(v) for v in np.argwhere(bad)[0])
  exact = int((lo == hi)[bad].sum())
  return [f"{int(bad.sum())} of {got.size} elements outside the reference "
          f"({exact} of them where it is exact); first {i}: got {got[i]!r}, "
          f"want [{lo[i]!r}, {hi[i]!r}]"]


def ratio(got, want):
  """How far outside its range the worst element is, in range widths (0
  inside; inf outside a point range)."""
  got = _f64(got)
  lo, hi = np.broadcast_to(want.lo, got.shape), np.broadcast_to(want.hi, got.shape)
  with np.errstate(all="ignore"):
    out = np.where(got < lo, lo - got, np.where(got > hi, got - hi, 0.0))
    out = np.where(np.isfinite(out), out, 0.0)
    w = hi - lo
    r = np.where(out == 0, 0.0, np.where(w > 0, out / np.where(w > 0, w, 1), np.inf))
  return float(r.max()) if r.size else 0.0


def bits(x):
  """The bit pattern of each element, NaNs made canonical (payloads differ
  between numpy and the GPU and carry no meaning here)."""
  x = np.ascontiguousarray(np.asarray(x))
  u = x.view(np.dtype(f"u{x.dtype.itemsize}")).astype(np.uint64)
  if is_float(x.dtype) or x.dtype.kind == "V":
    u = np.where(np.isnan(x.astype(np.float32)), np.uint64(1 << 63), u)
  return u


def bit_mismatches(got, want):
  """Problems unless got and want are bit-identical (same dtype)."""
  got, want = np.asarray(got), np.asarray(want)
  if got.dtype != want.dtype or got.shape != want.shape:
    return [f"{got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"]
  bad = bits(got) != bits(want)
  if not bad.any():
    return []
  i = tuple(int(v) for v in np.argwhere(bad)[0])
  g, w = got.astype(np.float64), want.astype(np.float64)
  zeros = int((bad & (g == w)).sum())  # +0 vs -0
  return [f"{int(bad.sum())} of {got.size} elements not bit-identical"
          + (f" ({zeros} differ only in the sign of zero)" if zeros else "")
          + f"; first {i}: {got[i]!r} vs {want[i]!r}"]


def maximum(x, y):
  """max as the GPU computes it (IEEE 754-2019 maximum): NaN propagates,
  and +0 > -0."""
  with np.errstate(invalid="ignore"):
    r = np.maximum(x, y)
    both = (np.asarray(x) == 0) & (np.asarray(y) == 0)
    return np.where(both, np.where(np.signbit(x) & np.signbit(y), -0.0, 0.0), r)


def minimum(x, y):
  """min as the GPU computes it: NaN propagates, and -0 < +0."""
  with np.errstate(invalid="ignore"):
    r = np.minimum(x, y)
    both = (np.asarray(x) == 0) & (np.asarray(y) == 0)
    return np.where(both, np.where(np.signbit(x) | np.signbit(y), -0.0, 0.0), r)


def math_f64(fn):
  """fn applied in float64 with floating-point warnings off."""
  def g(x):
    with np.errstate(all="ignore"):
      return fn(np.asarray(x, np.float64))
  return g


TRANSCENDENTAL = {"exp": math_f64(np.exp), "log": math_f64(np.log),
                  "tanh": math_f64(np.tanh)}


def transcendental(name, x, dtype):
  """The range of `name`(x) in `dtype` on either backend: evaluated in f32
  within F32_TRANSCENDENTAL_ULPS of the true value, then rounded to dtype;
  exact where the true value is 0 (exp(-inf), log(1), tanh(0)), and at
  exp(0) = 1 and tanh(+-inf) = +-1."""
  x = np.asarray(x, np.float64)
  c = TRANSCENDENTAL[name](x)
  f32 = around(c, F32_TRANSCENDENTAL_ULPS, np.float32).rnd(np.float32)
  exact = (c == 0) | ((x == 0) if name == "exp" else np.isinf(x) if name == "tanh" else False)
  f32 = Iv(np.where(exact, c, f32.lo), np.where(exact, c, f32.hi))
  return f32 if np.dtype(dtype) == np.float32 else f32.rnd(dtype)

