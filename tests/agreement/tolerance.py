"""When two results "agree": the rule the agreement suite applies.

Per element, with `want` the reference (or the other backend's result):

    |got - want| <= ULPS * eps(out) * |want|                      (output rounding)
                  + (ULPS * eps(acc) * sqrt(n) + operand_eps) * mag  (the computation)

* eps(dtype): the unit roundoff of a float dtype (f32 2^-23, f16 2^-10, bf16
  2^-7); 0 for integers, so integer results must be equal.
* ULPS = 4: both sides round each step correctly or nearly (GPU math functions
  are within 2 ulp), but may round intermediate results differently.
* n: the reduction length (K of a matmul, the reduced axis of a sum); 1 for
  elementwise math. Summation order differs between backends, and rounding
  errors of a sum of n terms grow like sqrt(n) in practice.
* mag: the size of what was computed with, per element: sum |a_ik b_kj| for a
  matmul, sum |x| for a sum, the largest intermediate for elementwise math.
* eps(acc): the accumulator's (f32 for wgmma; the dtype itself for a sum in
  registers). For fp8 wgmma against an exact reference, FP8_ACC_EPS = 2^-13:
  the tensor core keeps 13 fraction bits when it sums fp8 products
  (backends/sim/machine/tensor_core.py, measured on an H200); between the
  backends the f32 rule applies, since both sum the same way.
* operand_eps: rounding of the operands the reference does not model: 2^-9 for
  tf32 against an exact reference; 0 between the two backends.

Non-finite values must match exactly: NaN where the other has NaN, +inf/-inf
where the other has the same infinity. max/min and data movement are exact
(eps 0 via integer-like comparisons: the families pass ulps=0).
"""
import numpy as np
import ml_dtypes

ULPS = 4
TF32_OPERAND_EPS = 2.0 ** -9
FP8_ACC_EPS = 2.0 ** -13


def eps(dtype):
  dtype = np.dtype(dtype)
  if dtype == np.dtype(ml_dtypes.bfloat16):
    return 2.0 ** -7
  if np.issubdtype(dtype, np.floating):
    return float(np.finfo(dtype).eps) / 2
  return 0.0


def allowed(want, mag, out_dtype, *, n=1, acc_dtype=None, operand_eps=0.0,
            ulps=ULPS, acc_eps=None):
  """Per-element allowed |got - want| (float64 array)."""
  want = np.abs(np.asarray(want, np.float64))
  mag = np.abs(np.asarray(mag, np.float64))
  if acc_eps is None:
    acc_eps = eps(acc_dtype if acc_dtype is not None else out_dtype)
  return (ulps * eps(out_dtype) * want
          + (ulps * acc_eps * np.sqrt(n) + operand_eps) * mag)


def mismatches(got, want, allow):
  """A list of human-readable problems (empty when they agree)."""
  got = np.asarray(got, np.float64)
  want = np.asarray(want, np.float64)
  if got.shape != want.shape:
    return [f"shape {got.shape} != {want.shape}"]
  problems = []
  nan_g, nan_w = np.isnan(got), np.isnan(want)
  if (nan_g != nan_w).any():
    i = tuple(int(v) for v in np.argwhere(nan_g != nan_w)[0])
    problems.append(f"NaN pattern differs ({int((nan_g != nan_w).sum())} elements, "
                    f"first {i}: got {got[i]}, want {want[i]})")
  inf_g = np.where(np.isinf(got), np.sign(got), 0)
  inf_w = np.where(np.isinf(want), np.sign(want), 0)
  if (inf_g != inf_w).any():
    i = tuple(int(v) for v in np.argwhere(inf_g != inf_w)[0])
    problems.append(f"inf pattern differs ({int((inf_g != inf_w).sum())} elements, "
                    f"first {i}: got {got[i]}, want {want[i]})")
  finite = np.isfinite(got) & np.isfinite(want)
  with np.errstate(invalid="ignore"):
    err = np.where(finite, np.abs(got - want), 0.0)
    allow = np.broadcast_to(np.nan_to_num(allow, nan=0.0, posinf=np.inf), err.shape)
  bad = err > allow
  if bad.any():
    i = tuple(int(v) for v in np.argwhere(bad)[0])
    worst = tuple(int(v) for v in np.unravel_index(np.argmax(err - allow), err.shape))
    problems.append(f"{int(bad.sum())} of {err.size} elements out of tolerance "
                    f"(first {i}: got {got[i]!r}, want {want[i]!r}, allowed "
                    f"{allow[i]:.3g}; worst {worst}: error {err[worst]:.3g} "
                    f"allowed {allow[worst]:.3g})")
  return problems


def worst_ratio(got, want, allow):
  """max |got - want| / allowed over finite elements (0 when all are equal;
  inf when an element differs where nothing is allowed)."""
  got = np.asarray(got, np.float64)
  want = np.asarray(want, np.float64)
  if got.shape != want.shape:
    return float("inf")
  finite = np.isfinite(got) & np.isfinite(want)
  err = np.where(finite, np.abs(got - want), 0.0)
  allow = np.broadcast_to(np.asarray(allow, np.float64), err.shape)
  with np.errstate(divide="ignore", invalid="ignore"):
    r = np.where(err == 0, 0.0, err / allow)
  return float(r.max()) if r.size else 0.0
