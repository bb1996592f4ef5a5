"""Register-level math: lax element-wise ops, casts, shapes, reductions.

Computed with NumPy in the operands' own dtypes (f16/bf16 ops round per op,
as the hardware's). Integer division and remainder follow lax (truncation
toward zero), not NumPy's floor semantics.
"""
import math
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.interpret.compiler import rule
from pallas_sim.backends.sim.timing.model import OpClass
from pallas_sim.backends.sim.machine.numerics import division, rounding
from pallas_sim.backends.sim.machine.memory import is_float
from pallas_sim.errors import not_modelled


def _np_dtype(d):
  return np.dtype(d)


def _unary(name, f, op=OpClass.ALU):
  rule(name, op=op)(lambda eqn, cx: (lambda wg, x: f(x)))


def _binary(name, f, op=OpClass.ALU):
  rule(name, op=op)(lambda eqn, cx: (lambda wg, x, y: f(x, y)))


def _keep_dtype(f):
  """NumPy may promote (e.g. ints in np.sqrt); lax keeps the operand dtype."""
  def g(*xs):
    r = f(*xs)
    dt = np.result_type(xs[0])
    return r.astype(dt, copy=False) if np.result_type(r) != dt else r
  return g


def _float_op(f):
  """Transcendentals on f16/bf16: evaluate in f32, round once (as the GPU's
  approximate functions do on half types)."""
  def g(x):
    x = np.asarray(x)
    if x.dtype.itemsize < 4 and x.dtype.kind != "i":
      return f(x.astype(np.float32)).astype(x.dtype)
    return f(x)
  return g


_erf = np.vectorize(math.erf, otypes=[np.float64])


_GPU_DIV = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}


def _div(x, y):
  dt = np.result_type(x)
  if dt.kind in "iu":
    xa, ya = np.asarray(x, np.int64), np.asarray(y, np.int64)
    q = np.where(ya == 0, -1, np.abs(xa) // np.where(ya == 0, 1, np.abs(ya))
                 * np.sign(xa) * np.sign(ya))
    return q.astype(dt)[()] if np.ndim(q) == 0 else q.astype(dt)
  if dt in _GPU_DIV:  # (div.full.f32: machine/numerics/division.py)
    return division.div_full(x, y, dt)
  return np.true_divide(x, y).astype(dt, copy=False)


def _rem(x, y):
  dt = np.result_type(x)
  if dt.kind in "iu" and type(x) is not np.ndarray and type(y) is not np.ndarray:
    # (scalars, the common case: a loop index mod a slot count)
    xi, yi = int(x), int(y)
    ri = 0 if yi == 0 else abs(xi) % abs(yi) * (1 if xi >= 0 else -1)
    return dt.type(ri)
  if dt.kind in "iu":
    xa, ya = np.asarray(x, np.int64), np.asarray(y, np.int64)
    r = np.fmod(xa, np.where(ya == 0, 1, ya))
    return r.astype(dt)[()] if np.ndim(r) == 0 else r.astype(dt)
  return np.fmod(x, y).astype(dt, copy=False)


def _zeros_ordered(f, negative_wins):
  """max/min as the GPU computes them: NaN propagates and -0 < +0 (numpy
  returns either zero when the two compare equal)."""
  def g(x, y):
    r = f(x, y)
    if not is_float(np.result_type(r)):
      return r
    x, y = np.asarray(x), np.asarray(y)
    both = (x == 0) & (y == 0)
    if not both.any():
      return r
    sx, sy = np.signbit(x), np.signbit(y)
    neg = (sx | sy) if negative_wins else (sx & sy)
    z = np.where(neg, -0.0, 0.0).astype(np.result_type(r))
    return np.where(both, z, r) if np.ndim(r) else (z[()] if both else r)
  return g


_max = _zeros_ordered(np.maximum, negative_wins=False)
_min = _zeros_ordered(np.minimum, negative_wins=True)


def _logistic(x):
  return 1.0 / (1.0 + np.exp(-x))


def _round(x, rounding_method=0):
  """lax.round, exactly, as the GPU rounds (a zero result keeps its sign):
  halves away from zero by default. In float64: x + 0.5 in x's own type
  rounds 0.49999997 up to 1, and an odd integer in [2^(p-1), 2^p) to the
  next even one (H200: tests/test_numerics_edges.py)."""
  if int(rounding_method) == 1:  # TO_NEAREST_EVEN
    return np.round(x)
  x64 = np.asarray(x, np.float64)
  return np.copysign(np.floor(np.abs(x64) + 0.5), x64).astype(x.dtype)


for _name, _f in {
    "abs": np.abs, "sign": np.sign, "floor": np.floor,
    "ceil": np.ceil, "not": np.invert, "is_finite": np.isfinite,
    "log2": _float_op(np.log2),
    # (1 + x) * (1 - x), as the lowering computes it: three roundings
    "one_minus_square": lambda x: (np.asarray(1, np.result_type(x)) + x) * (
        np.asarray(1, np.result_type(x)) - x),
    "sqrt": _float_op(np.sqrt), "rsqrt": _float_op(lambda x: 1.0 / np.sqrt(x)),
    "square": np.square,
    "population_count": _keep_dtype(
        lambda x: np.bitwise_count(x).astype(np.result_type(x))),
    "clz": _keep_dtype(lambda x: _clz(np.asarray(x))),
    "copy": np.copy, "copy_p": np.copy, "real": np.real, "imag": np.imag,
}.items():
  _unary(_name, _f)

# Library functions (libdevice): the transcendental rate, or with
# approx_math one special-function unit op's.
for _name, _f in {
    "exp": _float_op(np.exp), "exp2": _float_op(np.exp2),
    "log": _float_op(np.log), "log1p": _float_op(np.log1p),
    "expm1": _float_op(np.expm1), "tanh": _float_op(np.tanh),
    "logistic": _float_op(_logistic), "sin": _float_op(np.sin),
    "cos": _float_op(np.cos), "tan": _float_op(np.tan),
    "cbrt": _float_op(np.cbrt),
    "erf": _float_op(lambda x: _erf(x).astype(x.dtype)),
}.items():
  _unary(_name, _f, OpClass.TRANSCENDENTAL)

_unary("neg", np.negative, OpClass.FMA)


def _clz(x):
  """Leading zero bits of each integer's bit pattern (its width if 0)."""
  width = x.dtype.itemsize * 8
  u = x.view(f"u{x.dtype.itemsize}")
  bits = np.zeros(u.shape, np.int64)  # bit length, one bit position at a time
  for b in range(width):
    bits += (u >> np.asarray(b, u.dtype)) != 0
  return (width - bits).astype(x.dtype)


@rule("optimization_barrier", op=OpClass.SHAPE_ONLY)
def _optimization_barrier(eqn, cx):
  """Its operands, unchanged (it only fences the compiler's reordering)."""
  return lambda wg, *xs: list(xs)

# Float adds and multiplies run on the FMA pipes (contracted into one
# fused multiply-add where a product feeds an add: compiler.contractions).
for _name, _f in {"add": np.add, "sub": np.subtract, "mul": np.multiply}.items():
  _binary(_name, _f, OpClass.FMA)

for _name, _f in {"pow": np.power, "atan2": np.arctan2}.items():
  _binary(_name, _f, OpClass.TRANSCENDENTAL)

for _name, _f in {
    "div": _div, "rem": _rem, "max": _max, "min": _min,
    "nextafter": np.nextafter,
    # (the lowering's own, 0.12: lax.sign of a float lowers through it)
    "_copysign": np.copysign,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
}.items():
  _binary(_name, _f)


def _shift(kind):
  """Shifts of the bit pattern, whatever the signedness of the type (as XLA
  and the lowering: an arithmetic shift of a uint32 fills with its top bit),
  with amounts at or past the width clamped to it (as PTX shl/shr: 0, or
  all sign bits)."""
  def build(eqn, cx):
    dt = np.dtype(eqn.invars[0].aval.dtype)
    width = 8 * dt.itemsize
    sdt, udt = np.dtype(f"i{dt.itemsize}"), np.dtype(f"u{dt.itemsize}")

    def shift(wg, x, y):
      x = np.asarray(x, dt)
      amount = np.asarray(y, dt).view(udt)
      big = amount >= width
      amount = np.minimum(amount, width - 1).astype(udt)
      if kind == "left":
        out = np.where(big, 0, np.left_shift(x.view(udt), amount))
      elif kind == "logical":
        out = np.where(big, 0, np.right_shift(x.view(udt), amount))
      else:  # (width - 1 already fills every bit with the sign)
        out = np.right_shift(x.view(sdt), amount.astype(sdt)).view(udt)
      out = np.asarray(out, udt).view(dt)
      return out if out.ndim else out[()]
    return shift
  return build


rule("shift_left")(_shift("left"))
rule("shift_right_logical")(_shift("logical"))
rule("shift_right_arithmetic")(_shift("arithmetic"))


@rule("integer_pow")
def _ipow(eqn, cx):
  y = eqn.params["y"]
  return lambda wg, x: _keep_dtype(lambda a: a ** y)(x)


@rule("round")
def _round_rule(eqn, cx):
  m = jx.param(eqn, "rounding_method")
  return lambda wg, x: _round(x, m)


@rule("clamp")
def _clamp(eqn, cx):
  return lambda wg, lo, x, hi: np.minimum(np.maximum(x, lo), hi)


@rule("select_n")
def _select_n(eqn, cx):
  if len(eqn.invars) == 3:
    def sel2(wg, p, a, b):
      if np.ndim(p) == 0:
        return b if p else a
      return np.where(p, b, a)
    return sel2
  return lambda wg, p, *cases: np.choose(np.asarray(p, np.int32), cases)


@rule("fma")
def _fma(eqn, cx):
  """p*x*y + s*c rounded once (interpret.contractions picks these)."""
  dt = np.dtype(eqn.outvars[0].aval.dtype)

  def fma(wg, x, y, c, sp, sc):
    r = rounding.fma(sp * np.asarray(x, np.float64), y, sc * np.asarray(c, np.float64), dt)
    return r if r.ndim else r[()]
  return fma


def _cast_fn(new_dtype):
  nd = _np_dtype(new_dtype)

  def cast(wg, x):
    x = np.asarray(x)
    if x.dtype == nd:
      return x.copy() if x.ndim else x[()]
    # (floating-point warnings are off for the whole simulation: execute/executor.py)
    if nd.kind in "iu" and is_float(x.dtype):
      # lax: float->int truncates toward zero and saturates; NaN -> 0.
      info = np.iinfo(nd)
      y = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0))
      y = np.clip(y, info.min, info.max).astype(nd)
    elif nd.kind == "b":
      y = x != 0
    else:
      y = x.astype(nd)
      if nd.itemsize == 1 and is_float(nd) and is_float(x.dtype):
        # cvt.rn.satfinite (what the lowering emits for fp8): +-inf and values
        # past the largest finite one become it, with their sign; NaN stays.
        over = ~np.isfinite(y.astype(np.float32)) & ~np.isnan(x)
        if over.any():
          top = np.asarray(ml_dtypes.finfo(nd).max, np.float32)
          y = np.where(over, np.copysign(top, x.astype(np.float32)).astype(nd), y)
    return y if y.ndim else y[()]
  return cast


@rule("convert_element_type", op=OpClass.CONVERT)
def _convert(eqn, cx):
  return _cast_fn(eqn.params["new_dtype"])


@rule("bitcast_convert_type")
def _bitcast(eqn, cx):
  nd = _np_dtype(eqn.params["new_dtype"])
  return lambda wg, x: np.asarray(x).view(nd)


@rule("iota")
def _iota(eqn, cx):
  p = eqn.params
  shape, dim, dt = p["shape"], p["dimension"], _np_dtype(p["dtype"])
  r = np.arange(shape[dim], dtype=dt).reshape(
      [shape[dim] if i == dim else 1 for i in range(len(shape))])
  val = np.broadcast_to(r, shape).copy()
  return lambda wg: val


@rule("broadcast_in_dim", op=OpClass.SHAPE_ONLY)
def _bid(eqn, cx):
  shape, bdims = eqn.params["shape"], eqn.params["broadcast_dimensions"]

  def f(wg, x, *dyn):
    x = np.asarray(x)
    exp = [1] * len(shape)
    for src, dst in enumerate(bdims):
      exp[dst] = x.shape[src]
    return np.broadcast_to(x.reshape(exp), shape).copy()
  return f


@rule("reshape", op=OpClass.SHAPE_ONLY)
def _reshape(eqn, cx):
  shape = eqn.params["new_sizes"]
  return lambda wg, x, *dyn: np.reshape(x, shape)


@rule("squeeze", op=OpClass.SHAPE_ONLY)
def _squeeze(eqn, cx):
  dims = tuple(eqn.params["dimensions"])
  return lambda wg, x: np.squeeze(x, dims)


@rule("expand_dims", op=OpClass.SHAPE_ONLY)
def _expand(eqn, cx):
  dims = tuple(eqn.params["dimensions"])
  return lambda wg, x: np.expand_dims(x, dims)


@rule("transpose")
def _transpose(eqn, cx):
  perm = tuple(eqn.params["permutation"])
  return lambda wg, x: np.ascontiguousarray(np.transpose(x, perm))


@rule("rev")
def _rev(eqn, cx):
  dims = tuple(eqn.params["dimensions"])
  return lambda wg, x: np.flip(x, dims).copy()


@rule("concatenate")
def _concat(eqn, cx):
  d = eqn.params["dimension"]
  return lambda wg, *xs: np.concatenate(xs, axis=d)


@rule("slice")
def _slice(eqn, cx):
  p = eqn.params
  strides = p["strides"] or (1,) * len(p["start_indices"])
  idx = tuple(slice(s, e, st) for s, e, st in
              zip(p["start_indices"], p["limit_indices"], strides))
  return lambda wg, x: x[idx].copy()


def _clamped_starts(x, starts, sizes):
  return [min(max(int(s), 0), d - z) for s, d, z in zip(starts, x.shape, sizes)]


@rule("dynamic_slice")
def _dslice(eqn, cx):
  sizes = eqn.params["slice_sizes"]

  def f(wg, x, *starts):
    st = _clamped_starts(x, starts, sizes)
    return x[tuple(slice(s, s + z) for s, z in zip(st, sizes))].copy()
  return f


@rule("dynamic_update_slice")
def _dus(eqn, cx):
  def f(wg, x, upd, *starts):
    st = _clamped_starts(x, starts, upd.shape)
    y = x.copy()
    y[tuple(slice(s, s + z) for s, z in zip(st, upd.shape))] = upd
    return y
  return f


@rule("pad")
def _pad(eqn, cx):
  cfg = eqn.params["padding_config"]
  if any(i for _, _, i in cfg) or any(lo < 0 or hi < 0 for lo, hi, _ in cfg):
    raise not_modelled("pad with interior or negative padding")
  return lambda wg, x, v: np.pad(x, [(lo, hi) for lo, hi, _ in cfg],
                                constant_values=v)


def _reduce(np_fn, f32_halves=False):
  """A reduction; f16/bf16 sums and products in f32, rounded once. (The GPU
  adds f16/bf16 in their own type, in its order: per lane in eight partial
  sums, then across lanes and warps; f32 then one rounding came closer to it
  than any fixed order in the half type we tried: benchmarks/
  register_numerics_probe.py. jnp.sum upcasts half types to f32 anyway.)"""
  def build(eqn, cx):
    axes = tuple(eqn.params["axes"])
    out_dt = np.dtype(eqn.outvars[0].aval.dtype)
    in_dt = np.dtype(eqn.invars[0].aval.dtype)
    up = np.float32 if f32_halves and is_float(in_dt) and in_dt.itemsize < 4 else None

    def f(wg, x):
      r = np.asarray(np_fn(x.astype(up) if up else x, axis=axes)).astype(out_dt, copy=False)
      return r if r.ndim else r[()]
    return f
  return build


def _zeros_ordered_reduce(np_fn, negative_wins):
  """reduce_max/min with -0 < +0, as _max/_min."""
  def f(x, axis):
    r = np_fn(x, axis=axis)
    if not is_float(x.dtype) or not np.any(r == 0):
      return r
    zero = x == 0
    neg = np.signbit(x) & zero
    pick_neg = (np.any(neg, axis=axis) if negative_wins
                else ~np.any(zero & ~neg, axis=axis))
    return np.where(r == 0, np.where(pick_neg, -0.0, 0.0).astype(r.dtype), r)
  return f


# plgpu.sum/prod/max/min (mosaic_gpu_reduce_*) are the same reductions; their
# accumulator_ilp only changes the order of the GPU's partial sums.
_R, _RS = OpClass.REDUCE, OpClass.REDUCE_SUM
rule("reduce_sum", "mosaic_gpu_reduce_sum", op=_RS)(_reduce(np.sum, f32_halves=True))
rule("reduce_prod", "mosaic_gpu_reduce_prod", op=_RS)(_reduce(np.prod, f32_halves=True))
rule("reduce_max", "mosaic_gpu_reduce_max", op=_R)(
    _reduce(_zeros_ordered_reduce(np.max, negative_wins=False)))
rule("reduce_min", "mosaic_gpu_reduce_min", op=_R)(
    _reduce(_zeros_ordered_reduce(np.min, negative_wins=True)))
rule("reduce_and", op=_R)(_reduce(np.all))
rule("reduce_or", op=_R)(_reduce(np.any))
rule("reduce_xor", op=_R)(_reduce(lambda x, axis: np.bitwise_xor.reduce(x, axis=axis)))


def _arg(np_fn):
  def build(eqn, cx):
    axis = eqn.params["axes"][0]
    idt = np.dtype(eqn.params["index_dtype"])
    return lambda wg, x: np.asarray(np_fn(x, axis=axis)).astype(idt)
  return build


rule("argmax")(_arg(np.argmax))
rule("argmin")(_arg(np.argmin))


@rule("cumsum", "cumprod", "cummax", "cummin")
def _cum(eqn, cx):
  name = eqn.primitive.name
  axis, rev = eqn.params["axis"], eqn.params["reverse"]
  fns: dict[str, Callable[..., Any]] = {
      "cumsum": np.cumsum, "cumprod": np.cumprod,
      "cummax": np.maximum.accumulate, "cummin": np.minimum.accumulate}
  fn = fns[name]

  def f(wg, x):
    y = np.flip(x, axis) if rev else x
    y = np.asarray(fn(y, axis=axis)).astype(x.dtype)
    return np.flip(y, axis).copy() if rev else y
  return f


@rule("dot_general")
def _dot_general(eqn, cx):
  (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
  out_dt = np.dtype(eqn.outvars[0].aval.dtype)
  if lb or rb:
    raise not_modelled("batched dot_general in registers")

  def f(wg, x, y):
    acc = np.float32 if is_float(out_dt) else np.int64
    r = np.tensordot(x.astype(acc), y.astype(acc), axes=(tuple(lc), tuple(rc)))
    return r.astype(out_dt)
  return f
