"""How a Hopper tensor core sums wgmma products into an f32 accumulator.

Fitted bit for bit on an H200 (lab/wgmma_numerics_probe.py,
lab/wgmma_numerics_fit.py; numbers in benchmarks/HISTORY.md). For each
instruction-wide slice of K (32 bytes of operand: 8 tf32, 16 f16/bf16, 32 fp8
elements), per output element:

1. the products (exact) and the accumulator are aligned to the largest
   exponent among them (a product's exponent is the sum of its operands');
2. each is truncated toward zero to ALIGN_BITS bits below that exponent
   (25 for 16- and 32-bit operands, 13 for fp8) and the truncated terms are
   summed exactly;
3. the sum is truncated toward zero to RESULT_BITS fraction bits (23: an f32;
   13 for fp8: the accumulator is in effect 22 bits wide between slices).

So fp8 matmuls lose ~2^-14 relative per step (what DeepSeek-V3 reported for
H800), and f16/bf16/tf32 ones differ from a round-to-nearest f32 sum in the
last bits. Non-finite terms propagate as in an ordinary sum.
"""
import math
from typing import Any

import numba
import numpy as np

# The kernels run on one thread: a launch's blocks are spread over processes
# instead (backends/sim/execute/parallel.py), which a numba thread pool would not
# survive (GNU OpenMP's kills a forked child) or would slow (its workqueue
# pool costs ~100 us a call, more than a 64x64x64 wgmma's sums).

# (elements per instruction slice by operand width in bytes, align bits, result bits)
SLICE_BYTES = 32
PRECISION = {4: (25, 23), 2: (25, 23), 1: (13, 13)}
_NONE = -(1 << 30)  # the exponent of zero


@numba.njit(cache=True)
def exponents(x):
  """floor(log2|x|) of float64s as int32, from their bits; _NONE where x ==
  0. (Every operand value is a normal float64. Non-finite elements get any
  value: their sums take mma_general's plain path, which ignores it.)"""
  flat = np.ascontiguousarray(x).reshape(-1)
  out = np.empty(flat.size, np.int32)
  bits = flat.view(np.int64)
  for i in range(flat.size):
    out[i] = ((bits[i] >> 52) & 0x7ff) - 1023 if flat[i] != 0.0 else _NONE
  return out.reshape(x.shape)


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def mma_general(acc, a, b, ea, eb, kslice, align_bits, result_bits):
  """acc (M, N) float32, updated in place: acc += a (M, K) @ b (K, N) as the
  tensor core sums, for any operand values (float64; ea, eb their
  exponents()): per slice of `kslice` products, each term truncated at
  `align_bits` below the largest exponent (the accumulator's included), the
  sum cut toward zero to `result_bits` fraction bits; NaN and inf propagate
  as an ordinary sum does. mma_f32 takes it where an operand or the
  accumulator is not finite; tests/test_tensor_core.py holds the faster
  kernels to its bits, and lab/mma_numerics_probe.py sums with it."""
  # Vectorized over output columns j. The truncated terms are integers below
  # 2^53 once scaled, so their sum is exact in any order ("reassoc" is safe).
  m, k = a.shape
  n = b.shape[1]
  s = np.empty(n)
  emax = np.empty(n, np.int32)
  raw = np.empty(n)
  tot = np.empty(n)
  scale = np.empty(n)
  for i in range(m):
    for j in range(n):
      s[j] = acc[i, j]
    for c in range(0, k, kslice):
      hi = min(c + kslice, k)
      for j in range(n):
        emax[j] = _NONE if s[j] == 0.0 else math.frexp(s[j])[1] - 1
        raw[j] = 0.0
        tot[j] = 0.0
      for kk in range(c, hi):
        aik, eik = a[i, kk], ea[i, kk]
        for j in range(n):
          emax[j] = max(emax[j], eik + eb[kk, j])
          raw[j] += aik * b[kk, j]
      for j in range(n):
        scale[j] = math.ldexp(1.0, align_bits - emax[j]) if emax[j] > _NONE // 2 else 0.0
      for kk in range(c, hi):
        aik = a[i, kk]
        for j in range(n):
          tot[j] += math.trunc(aik * b[kk, j] * scale[j])
      for j in range(n):
        sj = s[j]
        if not (math.isfinite(raw[j]) and math.isfinite(sj)):
          s[j] = sj + raw[j]  # NaN/inf: an ordinary sum propagates them
        elif scale[j] != 0.0:  # (all terms zero: unchanged)
          v = (tot[j] + math.trunc(sj * scale[j])) / scale[j]
          if v != 0.0:
            q = math.ldexp(1.0, math.frexp(v)[1] - 1 - result_bits)
            v = math.trunc(v / q) * q
          s[j] = v
    for j in range(n):
      acc[i, j] = s[j]


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def mma_finite(acc, a, b, ea, eb, kslice, align_bits, result_bits):
  """mma_general's sum for finite operands and accumulator, giving the same
  bits. mma_f32 takes it for finite operand values (float32 ones where
  mma_narrow is not exact); tests/test_tensor_core.py holds it to
  mma_general and to the tests' own model."""
  # Nothing to propagate, so no plain sum is needed; the exponent, the
  # scale and the final cut are done on the bits of the float64s: ~4x
  # faster. Same terms, same order of the zero terms (so the same sign of
  # a zero result).
  m, k = a.shape
  n = b.shape[1]
  keep = ~np.int64((1 << (52 - result_bits)) - 1)  # cut to result_bits fraction bits
  s = np.empty(n)
  sbits = s.view(np.int64)
  emax = np.empty(n, np.int64)
  scale_bits = np.empty(n, np.int64)
  scale = scale_bits.view(np.float64)
  inv_bits = np.empty(n, np.int64)
  inv = inv_bits.view(np.float64)
  tot = np.empty(n)
  for i in range(m):
    for j in range(n):
      s[j] = acc[i, j]
    for c in range(0, k, kslice):
      hi = min(c + kslice, k)
      for j in range(n):
        e = ((sbits[j] >> 52) & 0x7ff) - 1023
        emax[j] = e if s[j] != 0.0 else _NONE
        tot[j] = 0.0
      for kk in range(c, hi):
        eik = np.int64(ea[i, kk])
        for j in range(n):
          emax[j] = max(emax[j], eik + eb[kk, j])
      for j in range(n):  # 2^(align - emax) and its inverse, built from bits
        live = emax[j] > _NONE // 2
        scale_bits[j] = ((1023 + align_bits - emax[j]) << 52) if live else 0
        inv_bits[j] = ((1023 - align_bits + emax[j]) << 52) if live else 0
      for kk in range(c, hi):
        aik = a[i, kk]
        for j in range(n):
          tot[j] += np.trunc(aik * b[kk, j] * scale[j])
      for j in range(n):
        if scale[j] != 0.0:  # (all terms zero: unchanged)
          s[j] = (tot[j] + np.trunc(s[j] * scale[j])) * inv[j]
          sbits[j] &= keep  # toward zero: clear the low mantissa bits
    for j in range(n):
      acc[i, j] = s[j]


@numba.njit(cache=True)
def mma_narrow(acc, a, b, ea, eb, kslice, align_bits, result_bits):
  """mma_finite's sum on float32 operand values where narrow_operands() holds
  (ea, eb: the exponents it gives), giving the same bits. mma_f32 takes it
  for float32 operand values where it is exact; tests/test_tensor_core.py
  holds it to mma_general."""
  # mma_finite on float32/int32 vector lanes, where narrow_operands() holds: every
  # product is exact in float32 (at most 24 significant bits, a normal
  # exponent) and so is every scale 2^(align - emax); a truncated term is
  # below 2^(align + 2), so a slice's terms sum exactly in int32, in any
  # order (kslice * 2^(align + 2) <= 2^31 for every entry of PRECISION and
  # SYNC): rows of K are taken eight and four at a time, which keeps the
  # partial sums in registers (~20% faster than one at a time).
  # The accumulator's own term, the sum's scale-back and the final cut are
  # float64 as in mma_finite; a zero sum is +0.0 there too (tot starts at
  # +0.0), and a slice of zero products and a zero s leaves s as it is.
  # The per-slice loops are selects, not branches, so that they vectorize.
  # (Its scratch arrays are allocated here, as mma_finite's are, not by a
  # shared helper: arrays returned by a call lose LLVM's knowledge that they
  # alias nothing, and the loops over them ran 25% slower.)
  m, k = a.shape
  n = b.shape[1]
  keep = ~np.int64((1 << (52 - result_bits)) - 1)
  s = np.empty(n)
  sbits = s.view(np.int64)
  emax = np.empty(n, np.int32)
  sexp = np.empty(n, np.int32)
  scale_bits = np.empty(n, np.int32)
  scale32 = scale_bits.view(np.float32)
  scale64_bits = np.empty(n, np.int64)
  scale64 = scale64_bits.view(np.float64)
  inv_bits = np.empty(n, np.int64)
  inv = inv_bits.view(np.float64)
  tot = np.empty(n, np.int32)
  t64 = np.empty(n)
  t64b = t64.view(np.int64)
  for i in range(m):
    for j in range(n):
      s[j] = acc[i, j]
    for c in range(0, k, kslice):
      hi = min(c + kslice, k)
      for j in range(n):
        emax[j] = _NONE
      kk = c
      while kk + 4 <= hi:
        e0, e1, e2, e3 = ea[i, kk], ea[i, kk + 1], ea[i, kk + 2], ea[i, kk + 3]
        b0, b1, b2, b3 = eb[kk], eb[kk + 1], eb[kk + 2], eb[kk + 3]
        for j in range(n):  # (int32 throughout and selects: it vectorizes)
          v0, v1 = np.int32(e0 + b0[j]), np.int32(e1 + b1[j])
          v2, v3 = np.int32(e2 + b2[j]), np.int32(e3 + b3[j])
          v0 = v0 if v0 > v1 else v1
          v2 = v2 if v2 > v3 else v3
          v0 = v0 if v0 > v2 else v2
          e = emax[j]
          emax[j] = v0 if v0 > e else e
        kk += 4
      while kk < hi:
        eik, ebk = ea[i, kk], eb[kk]
        for j in range(n):
          e, v = emax[j], np.int32(eik + ebk[j])
          emax[j] = v if v > e else e
        kk += 1
      for j in range(n):  # the accumulator's exponent, or none (s is +-0)
        se = np.int32(((sbits[j] >> 52) & 0x7ff) - 1023)
        sexp[j] = se if sbits[j] << 1 != 0 else _NONE
      for j in range(n):
        e0, se = emax[j], sexp[j]
        e = se if se > e0 else e0
        emax[j] = e
        # (no live product: this scale is never used, and may be past float32's)
        scale_bits[j] = (127 + align_bits - e) << 23 if e0 > _NONE // 2 else 0
        scale64_bits[j] = np.int64(1023 + align_bits - e) << 52
        inv_bits[j] = np.int64(1023 - align_bits + e) << 52
        tot[j] = 0
      kk = c
      while kk + 8 <= hi:
        a0, a1, a2, a3 = a[i, kk], a[i, kk + 1], a[i, kk + 2], a[i, kk + 3]
        a4, a5, a6, a7 = a[i, kk + 4], a[i, kk + 5], a[i, kk + 6], a[i, kk + 7]
        b0, b1, b2, b3 = b[kk], b[kk + 1], b[kk + 2], b[kk + 3]
        b4, b5, b6, b7 = b[kk + 4], b[kk + 5], b[kk + 6], b[kk + 7]
        for j in range(n):
          sc = scale32[j]
          tot[j] += ((np.int32(a0 * b0[j] * sc) + np.int32(a1 * b1[j] * sc)
                      + np.int32(a2 * b2[j] * sc) + np.int32(a3 * b3[j] * sc))
                     + (np.int32(a4 * b4[j] * sc) + np.int32(a5 * b5[j] * sc)
                        + np.int32(a6 * b6[j] * sc) + np.int32(a7 * b7[j] * sc)))
        kk += 8
      while kk < hi:
        aik, bk = a[i, kk], b[kk]
        for j in range(n):
          tot[j] += np.int32(aik * bk[j] * scale32[j])
        kk += 1
      for j in range(n):  # (no term and a zero s: s as it was)
        v = (np.float64(tot[j]) + np.trunc(s[j] * scale64[j])) * inv[j]
        t64[j] = v if emax[j] > _NONE // 2 else s[j]
      for j in range(n):  # toward zero: clear the low mantissa bits
        sbits[j] = t64b[j] & keep
    for j in range(n):
      acc[i, j] = s[j]


@numba.njit(cache=True)
def scan32(x):
  """The exponents of float32 values x (as exponents() gives them) and
  whether mma_narrow may take them: every value zero or normal, with at
  most 12 significant bits; with the least and greatest exponent.
  narrow_operands decides by it; tests/test_tensor_core.py checks it on
  f16's largest mantissa."""
  flat = x.reshape(-1)
  bits = flat.view(np.int32)
  e = np.empty(flat.size, np.int32)
  lo, hi, bad = np.int32(1 << 20), np.int32(-(1 << 20)), 0
  for i in range(flat.size):
    field, mant = (bits[i] >> 23) & 0xff, bits[i] & 0x7fffff
    zero = field == 0 and mant == 0
    v = np.int32(field - 127)
    e[i] = _NONE if zero else v
    # (non-finite, subnormal, or bits below the 12th)
    bad |= (field == 0xff) | ((field == 0) & (mant != 0)) | ((mant & 0xfff) != 0)
    if not zero:
      lo, hi = min(lo, v), max(hi, v)
  return bad == 0, e.reshape(x.shape), lo, hi


# mma.sync (plgpu.mma), fitted on an H200 (lab/mma_numerics_probe.py):
# f16/bf16 sum as wgmma does; fp8 in slices of 8 with f16's precision, not
# wgmma's 13 bits. (elements per slice, align bits, result bits) by width.
SYNC = {2: (16, 25, 23), 1: (8, 25, 23)}


def mma_f32(acc, a, b, itemsize, sync=False):
  """acc (M, N) float32, updated in place: acc += a (M, K) @ b (K, N), where
  a and b hold the operand values (as the tensor core sees them) and
  itemsize is the operands' width in bytes; `sync`: as mma.sync sums."""
  if sync:
    kslice, align_bits, result_bits = SYNC[itemsize]
  else:
    (align_bits, result_bits), kslice = PRECISION[itemsize], SLICE_BYTES // itemsize
  out = np.ascontiguousarray(acc, np.float32)
  if a.dtype == np.float32 and b.dtype == np.float32:
    _mma_any32(out, np.ascontiguousarray(a), np.ascontiguousarray(b), kslice,
               align_bits, result_bits)
  else:
    _mma_any(out, np.ascontiguousarray(a, np.float64), np.ascontiguousarray(b, np.float64),
             kslice, align_bits, result_bits)
  if out is not acc:
    acc[...] = out


@numba.njit(cache=True)
def _all_finite(x):
  for v in x.reshape(-1):
    if not math.isfinite(v):
      return False
  return True


@numba.njit(cache=True)
def _mma_any(out, a, b, kslice, align_bits, result_bits):
  # (One call from Python: a wgmma's own cost, not numpy's per-call overheads.)
  ea, eb = exponents(a), exponents(b)
  if _all_finite(a) and _all_finite(b) and _all_finite(out):
    mma_finite(out, a, b, ea, eb, kslice, align_bits, result_bits)
  else:
    mma_general(out, a, b, ea, eb, kslice, align_bits, result_bits)


@numba.njit(cache=True)
def narrow_operands(a, b, out):
  """Whether mma_narrow is exact on float32 operand values a, b and
  accumulator out: products exact and normal in float32, every scale
  2^(align - emax) a normal float32, the accumulator finite; with the
  operands' exponents."""
  oka, ea, loa, hia = scan32(a)
  okb, eb, lob, hib = scan32(b)
  ok = oka and okb and loa + lob >= -100 and hia + hib <= 100 and _all_finite(out)
  return ok, ea, eb


@numba.njit(cache=True)
def _mma_any32(out, a, b, kslice, align_bits, result_bits):
  """_mma_any for float32 operand values: mma_narrow where it is exact."""
  ok, ea, eb = narrow_operands(a, b, out)
  if ok:
    mma_narrow(out, a, b, ea, eb, kslice, align_bits, result_bits)
  else:
    _mma_any(out, a.astype(np.float64), b.astype(np.float64), kslice, align_bits,
             result_bits)


@numba.njit(cache=True)
def _lookup(bits, table):
  """table[bits], element by element: 3.7 us a 128x64 tile, where np.take
  takes 12."""
  flat = bits.reshape(-1)
  out = np.empty(flat.size, np.float32)
  for i in range(flat.size):
    out[i] = table[flat[i]]
  return out.reshape(bits.shape)


_TABLES: dict[Any, Any] = {}  # dtype -> float32 value of each bit pattern


def values_f32(x):
  """The values of x, of a 16- or 8-bit float type, as float32: looked up
  in a table of every bit pattern made by the type's own astype (so the
  same values, NaN payloads included), 3x faster than that astype, which
  a wgmma paid on each operand (bfloat16's astype is a shift: kept)."""
  dt = x.dtype
  if dt.itemsize == 2 and dt != np.float16:
    return x.astype(np.float32)
  bits = np.uint16 if dt.itemsize == 2 else np.uint8
  table = _TABLES.get(dt)
  if table is None:
    table = _TABLES[dt] = (np.arange(1 << (8 * dt.itemsize), dtype=np.uint32)
                           .astype(bits).view(dt).astype(np.float32))
  return _lookup(np.ascontiguousarray(x).view(bits), table)
