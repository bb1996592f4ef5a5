"""debug_print (pl.debug_print, jax.debug.print) inside kernels, with the
Mosaic GPU lowering's rules (jax/_src/pallas/mosaic_gpu/lowering.py,
mosaic/gpu/utils.py and fragmented_array.py in jax 0.11.2):

- scalars: one line per warpgroup (the lowering prints from one thread of
  it), `fmt` with each {} replaced by a printf conversion: integers and
  booleans zero-extended to 64 bits and printed unsigned (%llu, so int32 -1
  prints 4294967295), f32 / f16 / bf16 as %f;
- one array: a line per element, `fmt`'s {} becoming "[i, j]: value".

Lines go to the Python stdout of the moment (so pytest's capture sees them),
in program order per thread, each tagged with its block (and thread, where
the kernel has several): "[block (0, 1) thread 1] ...". Decision: array
elements print in row-major order (on the GPU each thread prints its own
elements, in an order the hardware picks).
"""
import string
import sys

import ml_dtypes
import numpy as np

from pallas_sim.backends.sim.interpret.compiler import rule
from pallas_sim.errors import KernelError, UnsupportedPrimitiveError
from pallas_sim.backends.sim.base import jax_internals as jx

_FLOATS = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


def _conversion(dtype):
  """The printf conversion the lowering picks for a scalar of this type."""
  dtype = np.dtype(dtype)
  if dtype.kind in "iub" and dtype.itemsize <= 8:
    return "%llu"
  if dtype in _FLOATS:
    return "%f"
  if dtype == np.dtype(ml_dtypes.float8_e8m0fnu):
    return "%u"
  raise UnsupportedPrimitiveError(f"Can't print the type {dtype} (debug_print "
                                  "prints integers, f32, f16 and bf16)")


def _printf_value(conv, x):
  """One value as CUDA's printf writes it for `conv`."""
  x = np.asarray(x)
  if conv == "%llu":  # zero-extended to 64 bits
    return str(int(x) & (2 ** (8 * x.dtype.itemsize) - 1))
  if conv == "%u":  # e8m0: its exponent byte
    return str(int(x.view(np.uint8)))
  v = float(x.astype(np.float32))
  if np.isnan(v):
    return "-nan" if np.signbit(v) else "nan"
  return "%f" % v


def _pieces(fmt):
  """fmt split into literal texts and placeholders (None), with printf's
  '%%' written as one '%' (the lowering hands fmt to printf)."""
  out = []
  for text, field, _, _ in string.Formatter().parse(fmt):
    if text:
      out.append(text.replace("%%", "%"))
    if field is not None:
      out.append(None)
  return out


def _render(pieces, values):
  it = iter(values)
  return "".join(p if p is not None else next(it) for p in pieces)


@rule("debug_print")
def _debug_print(eqn, cx):
  p = eqn.params
  if jx.param(eqn, "ordered"):
    raise UnsupportedPrimitiveError("Ordered debug_print is not supported on Pallas.")
  avals = [v.aval for v in eqn.invars]
  args, kwargs = jx.debugging.merge_callback_args(p["in_tree"], avals, p["static_args"])
  if kwargs:
    raise KernelError("Only positional arguments are supported by debug_print on "
                      "Pallas.")
  fmt = p["fmt"]
  try:
    jx.pallas_primitives.check_debug_print_format(fmt, *args)
  except (ValueError, TypeError) as e:
    raise KernelError(str(e)) from None
  if any(getattr(a, "shape", ()) for a in args):
    if len(args) != 1:
      raise UnsupportedPrimitiveError(
          "debug_print only supports printing of scalar values, or a single array "
          "value when using the Mosaic GPU backend.")
    return _print_array(fmt, args[0], p["static_args"], p["in_tree"])
  convs = [_conversion(a.dtype) for a in args]
  pieces = _pieces(fmt)
  in_tree, static = p["in_tree"], p["static_args"]

  def debug_print(wg, *dyn):
    vals, _ = jx.debugging.merge_callback_args(in_tree, dyn, static)
    line = _render(pieces, [_printf_value(c, v) for c, v in zip(convs, vals)])
    print(f"[{wg.name}] {line}", file=sys.stdout, flush=True)
    return []
  return debug_print


def _print_array(fmt, aval, static, in_tree):
  conv = _conversion(aval.dtype)
  # As fragmented_array.debug_print: fmt's {} becomes "[{}, ...]: {}".
  pieces = _pieces(fmt.format("[" + ", ".join(["{}"] * len(aval.shape)) + "]: {}"))

  def debug_print(wg, *dyn):
    [vals], _ = jx.debugging.merge_callback_args(in_tree, dyn, static)
    vals = np.asarray(vals)
    lines = []
    for idx in np.ndindex(vals.shape):
      text = _render(pieces, [str(i) for i in idx] + [_printf_value(conv, vals[idx])])
      lines.append(f"[{wg.name}] {text}")
    print("\n".join(lines), file=sys.stdout, flush=True)
    return []
  return debug_print


@rule("check")
def _debug_check(eqn, cx):
  """pl.debug_check: with debug checks on when the kernel is traced
  (config.jax_pallas_enable_debug_checks, as the lowering reads it), a
  false predicate stops the kernel (the GPU traps on a device-side assert)
  with its message, here a KernelError at the user's line; off, nothing."""
  FailedCheckError, pallas_core = jx.FailedCheckError, jx.pallas_core
  import jax
  p = eqn.params
  if not jx.param(eqn, "debug"):
    raise UnsupportedPrimitiveError(
        "Non-debug checks are not supported by the Mosaic GPU backend. "
        "Functionalize them via `jax.experimental.checkify`.")
  if not pallas_core.debug_checks_enabled():
    return lambda wg, *args: []
  tree = p["err_tree"]

  def check(wg, *args):
    exc = jx.checkify_failure(jax.tree.unflatten(tree, list(args)))
    if exc is None:
      return []
    msg = exc.fmt_string if isinstance(exc, FailedCheckError) else str(exc)
    raise KernelError(f"debug_check failed: {msg}")
  return check
