"""The tests' own model of how a Hopper tensor core sums a wgmma, written
apart from the simulator's (backends/sim/machine/numerics/tensor_core.py) so that the
two check each other; both are pinned to outputs measured on an H200
(tests/data/wgmma_h200.npz, tests/test_wgmma.py).

The rule (fitted by lab/wgmma_numerics_fit.py): K is consumed in
slices of 32 bytes of operand. Per output element and slice, the exact
products and the running accumulator are aligned to the largest exponent
among them (a product's exponent being the sum of its operands' exponents),
each is cut toward zero `align` bits below it, the cut terms are added
exactly, and the sum is cut toward zero to `keep` fraction bits.
"""
import numpy as np

SLICE_BYTES = 32
# operand width in bytes -> (align bits, fraction bits kept)
BITS = {4: (25, 23), 2: (25, 23), 1: (13, 13)}


def tf32(x):
  """f32 -> the value a tf32 operand keeps: the top 10 fraction bits."""
  x = np.asarray(x, np.float32)
  m, e = np.frexp(x.astype(np.float64))  # x = m * 2^e, 0.5 <= |m| < 1
  return np.ldexp(np.trunc(np.ldexp(m, 11)), e - 11)


def operand_values(x):
  """What the tensor core reads, as float64: tf32 for f32, else the value."""
  x = np.asarray(x)
  return tf32(x) if x.dtype == np.float32 else x.astype(np.float64)


def _exponent(v):
  """floor(log2 |v|), with zero far below everything else."""
  m, e = np.frexp(v)
  return np.where(v == 0, -(1 << 20), e - 1)


def _cut(v, keep):
  """v cut toward zero to `keep` fraction bits (0 stays 0)."""
  m, e = np.frexp(v)
  return np.ldexp(np.trunc(np.ldexp(m, keep + 1)), e - keep - 1)


def matmul(a, b, itemsize, acc=None):
  """acc + a @ b as the tensor core sums it, for float operands; a (M, K) and
  b (K, N) hold operand values (float64), itemsize their width in bytes.
  Returns float64 values of the f32 accumulator."""
  align, keep = BITS[itemsize]
  m, k = a.shape
  n = b.shape[1]
  s = np.zeros((m, n)) if acc is None else np.asarray(acc, np.float64).copy()
  step = SLICE_BYTES // itemsize
  ea, eb = _exponent(a), _exponent(b)
  for c in range(0, k, step):
    sl = slice(c, min(c + step, k))
    prod = a[:, sl, None] * b[None, sl, :]                # (m, s, n), exact
    e = np.maximum(_exponent(s), (ea[:, sl, None] + eb[None, sl, :]).max(axis=1))
    scale = np.ldexp(1.0, align - e)                       # (m, n)
    finite = np.isfinite(prod).all(axis=1) & np.isfinite(s)
    with np.errstate(all="ignore"):
      cut = np.trunc(prod * scale[:, None, :]).sum(axis=1) + np.trunc(s * scale)
      aligned = _cut(cut / scale, keep)
    plain = s + prod.sum(axis=1)  # non-finite terms propagate as in any sum
    s = np.where(finite, np.where(e < -(1 << 19), s, aligned), plain)
  return s


def matmul_any(a, b):
  """a @ b as a wgmma computes it, for the operands' own dtypes: exact int32
  for 8-bit integers, the tensor core's f32 sums otherwise (float64)."""
  a, b = np.asarray(a), np.asarray(b)
  if a.dtype.kind in "iu":
    return a.astype(np.int64) @ b.astype(np.int64)
  return matmul(operand_values(a), operand_values(b), a.dtype.itemsize)
