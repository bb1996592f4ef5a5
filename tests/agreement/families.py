"""Hypothesis strategies that draw valid Mosaic GPU kernels (and a family of
kernels the lowering must reject), each as a harness.Case with its inputs and
its reference. Kernels are ordinary plgpu code.

Every drawn choice is a named axis (`AXES` lists the ones the CI profile must
cover); a family called with some axes fixed (`elementwise(dt="bf16")`) draws
only the rest. `covering_rows(family)` gives rows of fixed axes that together
take every value of every listed axis at least once (tests/agreement/
test_agreement.py runs one example per row).

References are exact (tolerance.py): correct rounding per operation, the
GPU compiler's fused multiply-adds, the tensor core's summation
(tensor_core_ref.py), with ranges only for the documented exceptions."""
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import assume, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import tensor_core_ref
import tolerance as tol
from conftest import store_unoptimized
from harness import Case
from pallas_sim import jax_window
from tolerance import Iv

# jax 0.12's default store of registers to GMEM (an optimised transfer) needs
# 4 bytes a thread in whole 32-byte sectors: 16-bit rows of the WGMMA layout
# are rejected (TransferPlanDerivationError); 0.11.2 stores them lane by lane.
STORE_16_BIT_REJECTED = jax_window.parse(jax.__version__) >= (0, 12)

F32, F16, BF16, I32 = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32
FLOATS = {"f32": F32, "f16": F16, "bf16": BF16}
DTYPES = {**FLOATS, "i32": I32}
MAX_SMEM = 232448


def _name(dtype):
  return np.dtype(dtype).name


class Picker:
  """Draws named axes, or takes the values fixed by the caller; records
  what was picked (Case.config)."""

  def __init__(self, draw, fixed):
    self.draw, self.fixed, self.config = draw, dict(fixed), {}

  def __call__(self, name, options):
    options = list(options)
    if name in self.fixed:
      v = self.fixed.pop(name)
      assume(v in options)  # (a combination the drawn context rules out)
    else:
      v = self.draw(st.sampled_from(options))
    self.config[name] = v
    return v

  def integer(self, name, lo, hi):
    return self(name, range(lo, hi + 1)) if name in self.fixed else self._int(name, lo, hi)

  def _int(self, name, lo, hi):
    v = self.draw(st.integers(lo, hi))
    self.config[name] = v
    return v

  def done(self):
    # Axes fixed by the caller that this draw never reached (they belong to
    # another kind of kernel): not this draw.
    assume(not self.fixed)
    return self.config


def _inputs(seed, shape, dtype, specials=False, lo=-2.0, hi=2.0):
  r = np.random.default_rng(seed)
  if np.dtype(dtype) == np.dtype(np.int32):
    return jnp.asarray(r.integers(-1000, 1000, shape), I32)
  x = r.uniform(lo, hi, shape)
  x[x == 0] = 0.5  # non-zero inputs
  if specials:  # a sprinkling of NaN, +-inf and zeros (each at least once)
    flat = x.reshape(-1)
    idx = r.choice(flat.size, size=max(4, flat.size // 16), replace=False)
    vals = r.choice([np.nan, np.inf, -np.inf, 0.0], size=idx.size)
    vals[:4] = [np.nan, np.inf, -np.inf, 0.0]
    flat[idx] = vals
  return jnp.asarray(x, dtype)


def _rnd(x, dtype):
  """Correct rounding to dtype (integers pass through)."""
  return tol.round_to(x, dtype)


def _to_int32(v):
  """float -> int32 as cvt.rzi: truncate, saturate, NaN -> 0 (monotone)."""
  with np.errstate(invalid="ignore"):
    return np.where(np.isnan(v), 0.0, np.clip(np.trunc(v), -2.0 ** 31, 2.0 ** 31 - 1))


# --- elementwise -----------------------------------------------------------

UNARY = ["exp", "log", "tanh", "neg", "abs", "square"]
UNARY_JNP = {"exp": jnp.exp, "log": jnp.log, "tanh": jnp.tanh,
             "neg": jnp.negative, "abs": jnp.abs, "square": lambda x: x * x}
BINARY = ["add", "sub", "mul", "max", "min", "where_gt"]
BINARY_JNP = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply,
              "max": jnp.maximum, "min": jnp.minimum,
              "where_gt": lambda u, y: jnp.where(u > y, u, y + y)}


def elementwise_reference(x, y, *, dt, out_dt, un, bi, iota_axis, shape, tile):
  """Exact per operation, as the hardware computes it (f16/bf16 arithmetic
  rounds once per op; a square feeding an add/sub is one fused
  multiply-add); ranges only for the documented exceptions (tolerance.py)."""
  dtype, out_dtype = DTYPES[dt], DTYPES[out_dt]
  ints = dt == "i32"
  yb = np.broadcast_to(y, shape)
  prod = None  # x*x not yet rounded: a following add/sub fuses with it
  with np.errstate(all="ignore"):
    if un in tol.TRANSCENDENTAL:
      u = tol.transcendental(un, x, dtype)
    elif un == "neg":
      u = Iv(-x)
    elif un == "abs":
      u = Iv(np.abs(x))
    else:
      prod = x * x
      u = Iv(_rnd(prod, dtype))
    folded = None  # where the iota is 0, f32 x*x + 0 - y can fuse as x*x - y
    if iota_axis is not None and tile[iota_axis] == 1 and prod is not None and not ints:
      pass  # an iota along an axis of size 1 is a known 0: the add folds away
    elif iota_axis is not None:
      local = (np.indices(shape)[iota_axis] % tile[iota_axis]).astype(np.float64)
      if prod is not None and dt == "f32":
        folded = local == 0
      u = (Iv(tol.fma_round(x, x, local, dtype)) if prod is not None and not ints
           else u.add(local).rnd(dtype))
      prod = None
    if bi in ("add", "sub"):
      c = yb if bi == "add" else -yb
      w = (Iv(tol.fma_round(x, x, c, dtype)) if prod is not None and not ints
           else u.add(c).rnd(dtype))
      if folded is not None:  # tolerance.py: F32_ZERO_ADD_FOLDED
        alt = Iv(np.where(folded, tol.fma_round(x, x, c, dtype), w.lo))
        w = w.hull(alt)
    elif bi == "mul":
      w = u.mul(yb).rnd(dtype)
    elif bi == "max":
      w = u.monotone(lambda v: tol.maximum(v, yb))
    elif bi == "min":
      w = u.monotone(lambda v: tol.minimum(v, yb))
    else:  # where(u > y, u, y + y)
      two_y = _rnd(yb + yb, dtype)
      above, below = u.lo > yb, ~(u.hi > yb)
      lo = np.where(above, u.lo, np.where(below, two_y, np.fmin(yb, two_y)))
      hi = np.where(above, u.hi, np.where(below, two_y, np.fmax(u.hi, two_y)))
      w = Iv(lo, hi)
    if ints:  # (an integer has no -0: neg of a 0 is +0, as -0.0 + 0.0 is)
      w = w.add(0.0)
    if out_dt == dt:
      return w
    if out_dt == "i32":
      return w.monotone(_to_int32)
    return w.rnd(out_dtype)


@st.composite
def elementwise(draw, **fixed):
  p = Picker(draw, fixed)
  dt = p("dt", sorted(DTYPES))
  dtype = DTYPES[dt]
  nt = p("threads", [1, 2])
  bn = p("bn", [128, 256])
  bm = nt * p("rows", [1, 2, 4, 8, 16])
  gm, gn = p.integer("gm", 1, 3), p.integer("gn", 1, 2)
  un = p("unary", UNARY if dt != "i32" else ["neg", "abs", "square"])
  bi = p("binary", BINARY)
  iota_axis = p("iota", [None, 0, 1])
  bcast = p("bcast", [False, True])  # y is one row, broadcast over the rows
  path = p("path", ["gmem", "smem"])
  out_dt = p("out_dt", sorted(DTYPES))
  specials = p("specials", [False, True] if dt != "i32" else [False])
  seed = p.integer("seed", 0, 2 ** 16)
  config = p.done()
  out_dtype = DTYPES[out_dt]
  rows_t = bm // nt
  shape = (bm * gm, bn * gn)
  yshape = (1, shape[1]) if bcast else shape
  uf, bf = UNARY_JNP[un], BINARY_JNP[bi]

  def compute(x, y):
    u = uf(x)
    if iota_axis is not None:
      u = u + lax.broadcasted_iota(I32, x.shape, iota_axis).astype(dtype)
    return bf(u, y).astype(out_dtype)

  scratch = {}
  if path == "smem":
    scratch = dict(x_s=plgpu.SMEM((nt, rows_t, bn), dtype),
                   y_s=plgpu.SMEM((nt, yshape[0] if bcast else rows_t, bn), dtype),
                   o_s=plgpu.SMEM((nt, rows_t, bn), out_dtype),
                   bar=plgpu.Barrier(num_arrivals=2, num_barriers=nt))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, out_dtype), grid=(gm, gn),
                grid_names=("m", "n"), num_threads=nt, thread_name="t",
                scratch_types=scratch)
  def kernel(x_ref, y_ref, o_ref, **s):
    t = lax.axis_index("t")
    rs = pl.ds(lax.axis_index("m") * bm + t * rows_t, rows_t)
    cs = pl.ds(lax.axis_index("n") * bn, bn)
    ys = pl.ds(0, 1) if bcast else rs
    if path == "gmem":
      y = y_ref[ys, cs]
      o_ref[rs, cs] = compute(x_ref[rs, cs], jnp.broadcast_to(y, (rows_t, bn)))
    else:
      x_s, y_s, o_s, bar = s["x_s"].at[t], s["y_s"].at[t], s["o_s"].at[t], s["bar"].at[t]
      plgpu.copy_gmem_to_smem(x_ref.at[rs, cs], x_s, bar)
      plgpu.copy_gmem_to_smem(y_ref.at[ys, cs], y_s, bar)
      plgpu.barrier_wait(bar)
      o_s[...] = compute(x_s[...], jnp.broadcast_to(y_s[...], (rows_t, bn)))
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_s, o_ref.at[rs, cs])
      plgpu.wait_smem_to_gmem(0)

  x = _inputs(seed, shape, dtype, specials)
  y = _inputs(seed + 1, yshape, dtype, specials)
  reference = lambda x, y: [elementwise_reference(
      x, y, dt=dt, out_dt=out_dt, un=un, bi=bi, iota_axis=iota_axis, shape=shape,
      tile=(rows_t, bn))]
  desc = (f"{dt}->{out_dt} {un}/{bi} iota={iota_axis} bcast={bcast} path={path} "
          f"block=({bm},{bn}) grid=({gm},{gn}) threads={nt} specials={specials} "
          f"seed={seed}")
  # Bit-exact on the GPU except where an f32 transcendental (libdevice) feeds
  # it, or an f32 iota add that can fold away (tolerance.py).
  exact = not (dt == "f32" and (un in tol.TRANSCENDENTAL or (
      un == "square" and iota_axis is not None and bi in ("add", "sub")
      and (rows_t, bn)[iota_axis] > 1)))
  return Case("elementwise", desc, kernel, (x, y), reference, exact=exact,
              config=config)


# --- reductions --------------------------------------------------------------

REDUCE = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min}
REDUCE_LAX = {"sum": lax.reduce_sum, "max": lax.reduce_max, "min": lax.reduce_min}


def reduction_reference(x, *, op, axis, dt, api):
  """max/min: exact, as max.NaN/min.NaN (what the lowering emits, f32, f16
  and bf16): NaN propagates, -0 < +0. Sums: NaN where a NaN or both
  infinities are summed, the infinity where one is."""
  dtype = DTYPES[dt]
  ax = 1 + axis
  if op in ("max", "min"):
    pick = tol.maximum if op == "max" else tol.minimum
    return Iv(functools.reduce(pick, np.moveaxis(x, ax, 0)))
  if dt == "i32":
    return Iv(np.sum(x, axis=ax))
  # Register sums: the order on the GPU is not modelled (tolerance.py).
  # jnp.sum upcasts f16/bf16 to f32 and rounds once; lax.reduce_sum sums in
  # the half type itself.
  with np.errstate(invalid="ignore"):
    s, n, mag = np.sum(x, axis=ax), x.shape[ax], np.sum(np.abs(x), axis=ax)
    if api == "lax" and dt != "f32":
      err = tol.sum_error(n, mag, dtype)
      r = Iv(s - err, s + err).rnd(dtype)
    else:
      err = tol.sum_error(n, mag, F32)
      r = Iv(s - err, s + err).rnd(F32).rnd(dtype)
  fin = np.isfinite(s)  # (NaN, or an infinity: exact)
  return Iv(np.where(fin, r.lo, s), np.where(fin, r.hi, s))


# What a reduced line of a `specials` reduction holds (each line one kind).
LINE_KINDS = ["plain", "nan", "+inf", "-inf", "+-inf", "zeros", "signed_zeros",
              "extreme"]


def _wide(r, n, dtype, hi_exp=None):
  """n values of random sign and mantissa, exponents drawn over the whole
  range of `dtype` (subnormals included) up to hi_exp, rounded to it."""
  p, emin, big = tol._FORMATS[np.dtype(dtype)]
  emax = int(np.floor(np.log2(big)))
  e = r.integers(emin - p + 1, (emax if hi_exp is None else hi_exp) + 1, n)
  v = np.ldexp(r.uniform(1.0, 2.0, n), e) * r.choice([-1.0, 1.0], n)
  return np.clip(tol.round_to(v, dtype), -big, big)


def _reduction_inputs(seed, shape, dtype, axis, op):
  """Every line reduced over (axis 1 + axis of shape (grid, rows, cols)) one
  of LINE_KINDS: a NaN, infinities, zeros of both signs where they decide a
  max/min (-|x| and zeros for max, |x| and zeros for min), lines of zeros
  only, or exponents over the type's whole range (below 1/(2n) of its
  largest value for sums, which then cannot overflow in any order)."""
  r = np.random.default_rng(seed)
  if np.dtype(dtype) == np.dtype(np.int32):
    return jnp.asarray(r.integers(-1000, 1000, shape), I32)
  ax = 1 + axis
  x = np.moveaxis(r.uniform(-2.0, 2.0, shape), ax, -1).copy()  # lines last
  n = x.shape[-1]
  lines = x.reshape(-1, n)
  kinds = r.choice(len(LINE_KINDS), lines.shape[0])
  kinds[:len(LINE_KINDS)] = r.permutation(len(LINE_KINDS))  # each at least once
  _, _, big = tol._FORMATS[np.dtype(dtype)]
  for line, k in zip(lines, kinds):
    kind = LINE_KINDS[k]
    pos = r.choice(n, size=4, replace=False)
    if kind == "nan":
      line[pos[0]] = np.nan
      line[pos[1]] = r.choice([np.inf, -np.inf, 0.0])
    elif kind in ("+inf", "-inf"):
      line[pos[:2]] = np.inf if kind == "+inf" else -np.inf
    elif kind == "+-inf":
      line[pos[0]], line[pos[1]] = np.inf, -np.inf
    elif kind == "zeros":  # -|x| (|x| for min) and a zero of each sign
      line[:] = np.abs(line) * (1.0 if op == "min" else -1.0)
      line[pos[0]], line[pos[1]] = -0.0, 0.0
      line[pos[2]] = r.choice([0.0, -0.0, line[pos[2]]])
    elif kind == "signed_zeros":  # only zeros, of both signs
      line[:] = r.choice([0.0, -0.0], n)
      line[pos[0]], line[pos[1]] = 0.0, -0.0
    elif kind == "extreme":
      hi = None if op != "sum" else int(np.floor(np.log2(big / (2 * n))))
      line[:] = _wide(r, n, dtype, hi)
      if op != "sum":
        line[pos[0]] = r.choice([big, -big])
  x = np.moveaxis(lines.reshape(x.shape), -1, ax)
  return jnp.asarray(x, dtype)


@st.composite
def reduction(draw, **fixed):
  p = Picker(draw, fixed)
  dt = p("dt", sorted(DTYPES))
  dtype = DTYPES[dt]
  op = p("op", sorted(REDUCE))
  api = p("api", ["jnp", "lax"])
  axis = p("axis", [0, 1])
  rows = p("rows", [64, 128])
  cols = p("cols", [128, 256])
  # Register reductions lower from the WGMMA layout (of an SMEM load or a
  # cast); with the layout left to inference the lowering rejects them.
  layout = p("layout", ["load", "cast", "load", "cast", "inferred"])
  out_path = p("out", ["gmem", "smem"])
  # How a GMEM result is stored: "assign" (o_ref[g] = v) takes the lowering's
  # default, which on jax 0.12 is an optimised path that rejects 16-bit rows
  # (2 bytes a thread, below its 4: STORE_16_BIT_REJECTED); "plain", the
  # per-thread stores that 0.11.2 always emits (plgpu.store(...,
  # optimized=False) on 0.12), keeps 16-bit stores to GMEM covered on both.
  store = p("store", ["assign", "plain"])
  grid = p.integer("grid", 1, 3)
  # NaN, infinities, signed zeros, extreme exponents (LINE_KINDS)
  specials = p("specials", [False, True] if dt != "i32" else [False])
  seed = p.integer("seed", 0, 2 ** 16)
  config = p.done()
  jf = REDUCE[op] if api == "jnp" else (
      lambda x, axis: REDUCE_LAX[op](x, axes=(axis,)))
  out_len = cols if axis == 0 else rows

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((grid, out_len), dtype),
                grid=(grid,), grid_names=("g",),
                scratch_types=[plgpu.SMEM((rows, cols), dtype),
                               plgpu.SMEM((out_len,), dtype), plgpu.Barrier()])
  def kernel(x_ref, o_ref, x_s, o_s, bar):
    g = lax.axis_index("g")
    plgpu.copy_gmem_to_smem(x_ref.at[g], x_s, bar)
    plgpu.barrier_wait(bar)
    if layout == "load":
      x = plgpu.load(x_s, layout=plgpu.Layout.WGMMA)
    elif layout == "cast":
      x = plgpu.layout_cast(x_s[...], plgpu.Layout.WGMMA)
    else:
      x = x_s[...]
    if out_path == "gmem" and store == "plain":
      store_unoptimized(o_ref.at[g], jf(x, axis=axis))
    elif out_path == "gmem":
      o_ref[g] = jf(x, axis=axis)
    else:
      o_s[...] = jf(x, axis=axis)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_s, o_ref.at[g])
      plgpu.wait_smem_to_gmem(0)

  x = (_reduction_inputs(seed, (grid, rows, cols), dtype, axis, op) if specials
       else _inputs(seed, (grid, rows, cols), dtype))
  desc = (f"{api}.{op} axis={axis} {dt} ({rows},{cols}) grid={grid} layout={layout} "
          f"out={out_path} store={store} specials={specials} seed={seed}")
  exact = op != "sum" or dt == "i32"
  return Case("reduction", desc, kernel, (x,),
              lambda x: [reduction_reference(x, op=op, axis=axis, dt=dt, api=api)],
              exact=exact, config=config)


# --- emit_pipeline -------------------------------------------------------------

@st.composite
def pipeline(draw, **fixed):
  p = Picker(draw, fixed)
  dt = p("dt", sorted(DTYPES))
  dtype = DTYPES[dt]
  tm = p("tm", [8, 16, 32, 64, 128])
  tn = p("tn", [64, 128, 256])
  itemsize = np.dtype(dtype).itemsize
  assume(tm * tn * itemsize >= 512)
  gm, gn = p.integer("gm", 1, 4), p.integer("gn", 1, 3)
  blocks = p("blocks", [1, 2])
  mcs = p.integer("mcs", 1, 4)
  delay_release = p("delay_release", [0, 1])
  assume(mcs > delay_release)  # emit_pipeline's own precondition
  n_major = p("n_major", [False, True])  # iterate columns in the outer loop
  scale = p("scale", [1, 2, 3])
  seed = p.integer("seed", 0, 2 ** 16)
  config = p.done()
  shape = (tm * gm * blocks, tn * gn)
  assume(3 * mcs * -(-tm * tn * itemsize // 1024) * 1024 + 3 * 8 * mcs <= MAX_SMEM)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, dtype), grid=(blocks,),
                grid_names=("b",))
  def kernel(x_ref, y_ref, o_ref):
    b = lax.axis_index("b")

    def body(_, x, y, o):
      o[...] = x[...] * jnp.asarray(scale, dtype) + y[...]

    if n_major:
      grid, imap = (gn, gm), lambda j, i: (b * gm + i, j)
    else:
      grid, imap = (gm, gn), lambda i, j: (b * gm + i, j)
    ins = [plgpu.BlockSpec((tm, tn), imap, delay_release=delay_release)] * 2
    plgpu.emit_pipeline(body, grid=grid, in_specs=ins,
                        out_specs=[plgpu.BlockSpec((tm, tn), imap)],
                        max_concurrent_steps=mcs)(x_ref, y_ref, o_ref)

  x, y = _inputs(seed, shape, dtype), _inputs(seed + 1, shape, dtype)
  # x * scale + y is one fused multiply-add on the GPU.
  reference = lambda x, y: [Iv(tol.fma_round(x, scale, y, dtype))]
  desc = (f"{dt} tile=({tm},{tn}) grid=({gm},{gn}) blocks={blocks} mcs={mcs} "
          f"delay_release={delay_release} n_major={n_major} seed={seed}")
  return Case("pipeline", desc, kernel, (x, y), reference, config=config)


# --- matmuls -------------------------------------------------------------------

def matmul_reference(out_dtype, transpose_a=False, transpose_b=False):
  """The tensor core's sum (tensor_core_ref), rounded to the output type."""
  def reference(a, b):
    return [Iv(_rnd(tensor_core_ref.matmul_any(a.T if transpose_a else a,
                                               b.T if transpose_b else b),
                    out_dtype))]
  return reference


def _operands_as_drawn(case_args, dtypes):
  """The reference gets the inputs in float64; the tensor core needs their
  own types back (tf32 truncation, int8 products)."""
  return [np.asarray(a, dt) for a, dt in zip(case_args, dtypes)]


def _typed(reference, dtypes):
  return lambda *args: reference(*_operands_as_drawn(args, dtypes))


MMA_DTYPES = {**FLOATS, "i8": jnp.int8, "f8e4m3": jnp.float8_e4m3fn,
              "f8e5m2": jnp.float8_e5m2}


def hand_matmul(a, b, *, tm, tn, swizzle, slots, transpose_a, transpose_b,
                transforms, out_dtype):
  """Hand-pipelined TMA + wgmma, one warpgroup: `slots` SMEM slots filled by
  TMA ahead of the wgmma that reads them; a slot is refilled only after the
  wgmma reading it finished (wgmma_wait(0)). a is (M, K), or (K, M) with
  transpose_a; b is (K, N), or (N, K) with transpose_b (transposed operands
  are passed to wgmma as `.T`)."""
  dtype = a.dtype
  k, m = a.shape if transpose_a else a.shape[::-1]
  n = b.shape[0] if transpose_b else b.shape[1]
  tk = swizzle // np.dtype(dtype).itemsize
  steps = k // tk
  T = dict(transforms=(plgpu.TilingTransform((8, tk)), plgpu.SwizzleTransform(swizzle))
           ) if transforms else {}
  a_tile = (tk, tm) if transpose_a else (tm, tk)
  b_tile = (tn, tk) if transpose_b else (tk, tn)
  acc_dtype = I32 if np.dtype(dtype) == np.dtype(jnp.int8) else F32

  @plgpu.kernel(
      out_type=jax.ShapeDtypeStruct((m, n), out_dtype), grid=(m // tm, n // tn),
      grid_names=("m", "n"),
      scratch_types=dict(
          a_s=plgpu.SMEM((slots, *a_tile), dtype, **T),
          b_s=plgpu.SMEM((slots, *b_tile), dtype, **T),
          o_s=plgpu.SMEM((tm, tn), out_dtype),
          bars=plgpu.Barrier(num_arrivals=2, num_barriers=slots),
          acc=plgpu.ACC((tm, tn), acc_dtype)))
  def kernel(a_ref, b_ref, o_ref, a_s, b_s, o_s, bars, acc):
    ms = pl.ds(lax.axis_index("m") * tm, tm)
    ns = pl.ds(lax.axis_index("n") * tn, tn)

    def load(step, slot):
      ks = pl.ds(step * tk, tk)
      plgpu.copy_gmem_to_smem(a_ref.at[ks, ms] if transpose_a else a_ref.at[ms, ks],
                              a_s.at[slot], bars.at[slot])
      plgpu.copy_gmem_to_smem(b_ref.at[ns, ks] if transpose_b else b_ref.at[ks, ns],
                              b_s.at[slot], bars.at[slot])

    for s in range(min(slots, steps)):
      load(s, s)

    def step(i, carry):
      slot = i % slots
      plgpu.barrier_wait(bars.at[slot])
      at, bt = a_s.at[slot], b_s.at[slot]
      plgpu.wgmma(acc, at.T if transpose_a else at, bt.T if transpose_b else bt)
      plgpu.wgmma_wait(0)

      @pl.when(i + slots < steps)
      def _():
        load(i + slots, slot)
      return carry

    lax.fori_loop(0, steps, step, ())
    o_s[...] = acc[...].astype(out_dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_s, o_ref.at[ms, ns])
    plgpu.wait_smem_to_gmem(0)

  return kernel(a, b)


@st.composite
def matmul(draw, **fixed):
  p = Picker(draw, fixed)
  kind = p("kind", ["quickstart", "tma_wgmma"])
  quick = kind == "quickstart"
  dt = p("dt", ["f16", "bf16"] if quick else sorted(MMA_DTYPES))
  dtype = MMA_DTYPES[dt]
  itemsize = np.dtype(dtype).itemsize
  # Only 16-bit operands may be transposed: 32- and 8-bit ones must be
  # K-minor (A stored (M, K), B stored (N, K) and passed as `.T`).
  transpose_a = p("transpose_a", [False] if quick or itemsize != 2 else [False, True])
  transpose_b = p("transpose_b", [False] if quick else [True] if itemsize != 2
                  else [False, True])
  out_dt = p("out_dt", ["f16", "f32"] if quick else {
      "i8": ["i32"], "f8e4m3": ["f32"], "f8e5m2": ["f32"]}.get(dt, ["f32", dt]))
  if quick:
    tile_n = p("tile_n", [64, 128, 256])
    tile_k = p("tile_k", [32, 64, 128])
    mcs = p.integer("mcs", 2, 4)
    gm, gn, steps = p.integer("gm", 1, 2), p.integer("gn", 1, 2), p.integer("steps", 1, 4)
    seed = p.integer("seed", 0, 2 ** 16)
    config = p.done()
    import test_quickstart as Q
    m, n, k = 128 * gm, tile_n * gn, tile_k * steps
    a, b = _inputs(seed, (m, k), dtype), _inputs(seed + 1, (k, n), dtype)
    fn = functools.partial(Q.matmul_mcs, tile_n=tile_n, tile_k=tile_k,
                           max_concurrent_steps=mcs, out_dtype=FLOATS[out_dt])
    desc = (f"quickstart {dt}->{out_dt} ({m},{k})x({k},{n}) tile_n={tile_n} "
            f"tile_k={tile_k} mcs={mcs} seed={seed}")
    return Case("matmul", desc, fn, (a, b),
                _typed(matmul_reference(FLOATS[out_dt]), (dtype, dtype)),
                config=config)
  swizzle = p("swizzle", [32, 64, 128])
  transforms = p("transforms", [False, True])
  tm = p("tm", [64, 128])
  tn = p("tn", [64, 128, 256])
  slots = p.integer("slots", 1, 3)
  steps = p.integer("steps", 1, 4)
  gm, gn = p.integer("gm", 1, 2), p.integer("gn", 1, 2)
  seed = p.integer("seed", 0, 2 ** 16)
  config = p.done()
  out_dtype = DTYPES[out_dt]
  tk = swizzle // itemsize
  m, n, k = tm * gm, tn * gn, tk * steps
  r = np.random.default_rng(seed)
  a_shape = (k, m) if transpose_a else (m, k)
  b_shape = (n, k) if transpose_b else (k, n)
  if dt == "i8":
    a = jnp.asarray(r.integers(-128, 128, a_shape), jnp.int8)
    b = jnp.asarray(r.integers(-128, 128, b_shape), jnp.int8)
  else:
    a, b = _inputs(seed, a_shape, dtype), _inputs(seed + 1, b_shape, dtype)
  fn = functools.partial(hand_matmul, tm=tm, tn=tn, swizzle=swizzle, slots=slots,
                         transpose_a=transpose_a, transpose_b=transpose_b,
                         transforms=transforms, out_dtype=out_dtype)
  desc = (f"tma+wgmma {dt}->{out_dt} ({m},{k})x({k},{n}) tile=({tm},{tn},{tk}) "
          f"swizzle={swizzle} transforms={transforms} transpose_a={transpose_a} "
          f"transpose_b={transpose_b} slots={slots} seed={seed}")
  return Case("matmul", desc, fn, (a, b),
              _typed(matmul_reference(out_dtype, transpose_a, transpose_b),
                     (dtype, dtype)),
              config=config, inferred_transforms=not transforms)


# --- producer / consumer -------------------------------------------------------

def two_thread(x_dtype, tile, cols, slots, steps, blocks):
  """Thread 1 streams row tiles of x into `slots` SMEM slots with TMA; thread 0
  waits for each, computes, stores to GMEM and hands the slot back."""
  dtype = x_dtype
  rows = tile * steps
  shape = (rows * blocks, cols)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, dtype), grid=(blocks,),
                grid_names=("b",), num_threads=2, thread_name="t",
                scratch_types=dict(buf=plgpu.SMEM((slots, tile, cols), dtype),
                                   full=plgpu.Barrier(num_barriers=slots),
                                   free=plgpu.Barrier(num_barriers=slots)))
  def kernel(x_ref, o_ref, buf, full, free):
    t = lax.axis_index("t")
    base = lax.axis_index("b") * rows

    @pl.when(t == 1)
    def _producer():
      def body(i, c):
        slot = i % slots

        @pl.when(i >= slots)
        def _():
          plgpu.barrier_wait(free.at[slot])
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(base + i * tile, tile)],
                                buf.at[slot], full.at[slot])
        return c
      lax.fori_loop(0, steps, body, ())

    @pl.when(t == 0)
    def _consumer():
      def body(i, c):
        slot = i % slots
        plgpu.barrier_wait(full.at[slot])
        v = buf[slot]
        o_ref[pl.ds(base + i * tile, tile)] = v * jnp.asarray(2, dtype) + jnp.asarray(1, dtype)
        plgpu.commit_smem()  # our plain reads, before TMA may overwrite the slot

        @pl.when(i + slots < steps)
        def _():
          plgpu.barrier_arrive(free.at[slot])
        return c
      lax.fori_loop(0, steps, body, ())
  return kernel


def ws_matmul(a, b, *, tm, tn, tk, compute_wgs, mcs):
  """Warp-specialized matmul: `compute_wgs` warpgroups each own a (tm, tn)
  output tile; the last warpgroup is emit_pipeline_warp_specialized's memory
  thread."""
  m, k = a.shape
  n = b.shape[1]
  dtype = a.dtype
  cta_n = tn * compute_wgs

  def kernel(a_ref, b_ref, o_ref, o_s):
    wg = lax.axis_index("wg")
    pm, pn = lax.axis_index("m"), lax.axis_index("n")

    def compute(pipe):
      acc = pipe(plgpu.layout_cast(jnp.zeros((tm, tn), F32), plgpu.Layout.WGMMA))
      o_s[wg] = acc.astype(dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(
          o_s.at[wg], o_ref.at[pl.ds(pm * tm, tm), pl.ds(pn * cta_n + wg * tn, tn)])
      plgpu.wait_smem_to_gmem(0)

    def step(_, a_s, b_s, carry):
      def mma(acc_ref):
        plgpu.wgmma(acc_ref, a_s, b_s.at[:, pl.ds(wg * tn, tn)])
      return pl.run_state(mma)(plgpu.ACC.init(carry))

    plgpu.emit_pipeline_warp_specialized(
        step, grid=(k // tk,),
        in_specs=[plgpu.BlockSpec((tm, tk), lambda kk: (pm, kk)),
                  plgpu.BlockSpec((tk, cta_n), lambda kk: (kk, pn))],
        compute_context=compute, max_concurrent_steps=mcs,
        num_compute_wgs=compute_wgs, memory_registers=40,
        memory_thread_idx=compute_wgs, wg_axis="wg")(a_ref, b_ref)

  return plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct((m, n), dtype),
      scratch_types=[plgpu.SMEM((compute_wgs, tm, tn), dtype)],
      grid=(m // tm, n // cta_n), grid_names=("m", "n"),
      num_threads=compute_wgs + 1, thread_name="wg")(a, b)


@st.composite
def producer_consumer(draw, **fixed):
  p = Picker(draw, fixed)
  kind = p("kind", ["two_thread", "warp_specialized"])
  ws = kind == "warp_specialized"
  dt = p("dt", ["f16", "bf16"] if ws else sorted(DTYPES))
  dtype = DTYPES[dt]
  steps = p.integer("steps", 1, 4 if ws else 6)
  if not ws:
    tile = p("tile", [8, 16, 32, 64])
    cols = p("cols", [128, 256])
    slots = p.integer("slots", 1, 3)
    blocks = p.integer("blocks", 1, 2)
    seed = p.integer("seed", 0, 2 ** 16)
    config = p.done()
    shape = (tile * steps * blocks, cols)
    x = _inputs(seed, shape, dtype)
    desc = (f"two-thread {dt} tile=({tile},{cols}) slots={slots} steps={steps} "
            f"blocks={blocks} seed={seed}")
    return Case("producer_consumer", desc,
                two_thread(dtype, tile, cols, slots, steps, blocks), (x,),
                lambda x: [Iv(tol.fma_round(x, 2.0, 1.0, dtype))], config=config)
  tm = p("tm", [64, 128])
  tn = p("tn", [64, 128])
  tk = p("tk", [32, 64])
  wgs = p.integer("compute_wgs", 1, 2)
  mcs = p.integer("mcs", 2, 3)
  gm, gn = p.integer("gm", 1, 2), p.integer("gn", 1, 2)
  seed = p.integer("seed", 0, 2 ** 16)
  config = p.done()
  m, n, k = tm * gm, tn * wgs * gn, tk * steps
  a, b = _inputs(seed, (m, k), dtype), _inputs(seed + 1, (k, n), dtype)
  fn = functools.partial(ws_matmul, tm=tm, tn=tn, tk=tk, compute_wgs=wgs, mcs=mcs)
  desc = (f"warp-specialized {dt} ({m},{k})x({k},{n}) tile=({tm},{tn},{tk}) "
          f"compute_wgs={wgs} mcs={mcs} seed={seed}")
  return Case("producer_consumer", desc, fn, (a, b),
              _typed(matmul_reference(dtype), (dtype, dtype)), config=config)


# --- numerics at the edges: division, lax.round, casts ------------------------------

EDGE_OPS = ["div", "round_away", "round_even", "cast"]
CAST_TO = {**DTYPES, "f8e4m3": jnp.float8_e4m3fn, "f8e5m2": jnp.float8_e5m2}


def _edge_pool(r, role, dtype, out_dtype=None):
  """Values that decide the op's edge cases, in float64 (rounded later)."""
  p, emin, big = tol._FORMATS[np.dtype(dtype)]
  tiny, sub = 2.0 ** emin, 2.0 ** (emin - p + 1)
  pool = [np.nan, np.inf, -np.inf, 0.0, -0.0, big, -big, tiny, -tiny, sub, -sub,
          3 * sub, -0.75 * tiny]
  if role == "div_y":
    # past 2^126 div.full rescales (f32, bf16); subnormal divisors too
    pool += list(np.ldexp(r.uniform(1.0, 2.0, 24), r.choice([125, 126, 127], 24))
                 * r.choice([-1.0, 1.0], 24))
    pool += list(r.uniform(0.5, 2.0, 8) * sub * 2 ** r.integers(0, p - 1, 8))
  elif role == "div_x":
    pool += list(np.ldexp(r.uniform(1.0, 2.0, 24), r.integers(120, 128, 24))
                 * r.choice([-1.0, 1.0], 24))
  elif role == "round":
    k = r.integers(-64, 64, 24).astype(np.float64)
    pool += list(k + 0.5) + list(k + 0.5 + r.choice([-1, 1], 24) * 2.0 ** (4 - p))
    pool += [-0.3, -0.5, 0.5, 1.5, 2.5, -2.5, 2.0 ** (p - 1) - 0.5, 2.0 ** p]
    # (where x + 0.5 in x's own type rounds wrong: below a half, odd integers
    # in [2^(p-1), 2^p); and -0.0, whose sign round keeps)
    pool += [0.5 - 2.0 ** -(p + 1), -(0.5 - 2.0 ** -(p + 1)), -0.0,
             2.0 ** (p - 1) + 1, -(2.0 ** (p - 1) + 3)]
  elif role == "cast":
    od = np.dtype(out_dtype)
    if od == np.dtype(np.int32):
      pool += [2.0 ** 31, -2.0 ** 31, 2.0 ** 31 - 128, -2.0 ** 31 + 128, 3e9, -3e9,
               0.99, -0.99, 1e20, -1e20]
    else:
      op_, oemin, obig = tol._FORMATS[od]
      oulp = 2.0 ** (np.floor(np.log2(obig)) - op_ + 1)
      near = [0.5, 0.99, 1.0, 1.001, 1.5, 2.0]
      pool += [s * obig * f for f in near for s in (1, -1)]
      # halfway to the next (infinite) value: ties to even go up
      pool += [obig + oulp / 2, -(obig + oulp / 2), obig + oulp / 4]
      osub = 2.0 ** (oemin - op_ + 1)
      pool += [s * osub * f for f in (0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 3.5)
               for s in (1, -1)]
      pool += [s * 2.0 ** oemin * f for f in (0.999, 1.0, 1.001) for s in (1, -1)]
  pool = np.asarray(pool, np.float64)
  return pool[np.abs(np.nan_to_num(pool)) <= big]


def _edge_inputs(seed, shape, dtype, role, out_dtype=None):
  """Half the elements from the op's edge pool (NaN, +-inf, signed zeros,
  the dtype's extremes and the op's own: huge and subnormal divisors,
  halves for round, the narrower type's overflow and subnormal range for
  casts), half random over the dtype's whole exponent range."""
  r = np.random.default_rng(seed)
  n = int(np.prod(shape))
  x = _wide(r, n, dtype)
  if role == "round":  # mostly moderate values: the halves are where it matters
    x = np.where(r.random(n) < 0.7, r.uniform(-40, 40, n), x)
  pool = _edge_pool(r, role, dtype, out_dtype)
  pick = r.random(n) < 0.5
  x = np.where(pick, r.choice(pool, n), x)
  x[:pool.size] = r.permutation(pool)[:n]  # each at least once
  return jnp.asarray(tol.round_to(x, dtype).reshape(shape), dtype)


def edges_reference(x, y, *, op, dt, out_dt):
  dtype = DTYPES[dt]
  if op == "div":
    return tol.div_full(x, y, dtype)
  if op == "round_away":
    return Iv(tol.round_half_away(x))
  if op == "round_even":
    return Iv(tol.round_half_even(x))
  od = np.dtype(CAST_TO[out_dt])
  if od == np.dtype(np.int32):
    return Iv(_to_int32(x))
  return Iv(tol.round_to(x, od, satfinite=od.itemsize == 1))


@st.composite
def edges(draw, **fixed):
  p = Picker(draw, fixed)
  op = p("op", EDGE_OPS)
  dt = p("dt", sorted(FLOATS))
  dtype = DTYPES[dt]
  out_dt = dt
  if op == "cast":
    out_dt = p("out_dt", [o for o in sorted(CAST_TO) if o != dt and not (
        dt == "bf16" and o.startswith("f8"))])  # (bf16 -> fp8: PTX ISA 9.2 only)
  rows = p("rows", [2, 8])
  seed = p.integer("seed", 0, 2 ** 16)
  config = p.done()
  out_dtype = CAST_TO[out_dt]
  shape = (rows, 256)
  fn = {"div": lambda a, b: a / b,
        "round_away": lambda a, b: lax.round(a),
        "round_even": lambda a, b: lax.round(a, lax.RoundingMethod.TO_NEAREST_EVEN),
        "cast": lambda a, b: a.astype(out_dtype)}[op]

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, out_dtype))
  def kernel(x_ref, y_ref, o_ref):
    o_ref[...] = fn(x_ref[...], y_ref[...])

  role = {"div": "div_x", "cast": "cast"}.get(op, "round")
  x = _edge_inputs(seed, shape, dtype, role, out_dtype)
  y = (_edge_inputs(seed + 1, shape, dtype, "div_y") if op == "div"
       else _inputs(seed + 1, shape, dtype))
  desc = f"{op} {dt}->{out_dt} {shape} seed={seed}"
  return Case("edges", desc, kernel, (x, y),
              lambda x, y: [edges_reference(x, y, op=op, dt=dt, out_dt=out_dt)],
              config=config)


# --- kernels the lowering must reject ----------------------------------------------

def _copy_kernel(shape, dtype, box):
  """Copies x through SMEM in `box`-shaped TMA transfers."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, dtype),
                scratch_types=[plgpu.SMEM(box, dtype), plgpu.Barrier()])
  def kernel(x_ref, o_ref, smem, bar):
    idx = tuple(pl.ds(0, b) for b in box)
    plgpu.copy_gmem_to_smem(x_ref.at[idx], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref.at[idx])
    plgpu.wait_smem_to_gmem(0)
  return kernel


@st.composite
def rejected(draw, **fixed):
  p = Picker(draw, fixed)
  what = p("what", ["smem", "smem_near", "wgmma_m", "wgmma_n", "wgmma_dtype",
                    "tma_box", "tma_small"])
  seed = p.integer("seed", 0, 2 ** 16)
  if what == "smem_near":
    # Around the limit: either verdict is right if both give it (and the
    # same smem_bytes); exercises the allocator's rounding and barriers.
    dt = p("dt", sorted(FLOATS))
    dtype = FLOATS[dt]
    tm = p("tm", [64, 128, 256])
    tn = p("tn", [128, 256])
    mcs = p.integer("mcs", 2, 6)
    config = p.done()
    tile = tm * tn * np.dtype(dtype).itemsize
    assume(MAX_SMEM // 2 < 3 * mcs * tile < 2 * MAX_SMEM)

    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((tm * 2, tn), dtype))
    def kernel(x_ref, y_ref, o_ref):
      def body(_, x, y, o):
        o[...] = x[...] + y[...]
      spec = plgpu.BlockSpec((tm, tn), lambda i: (i, 0))
      plgpu.emit_pipeline(body, grid=(2,), in_specs=[spec, spec], out_specs=[spec],
                          max_concurrent_steps=mcs)(x_ref, y_ref, o_ref)
    x = _inputs(seed, (tm * 2, tn), dtype)
    desc = f"SMEM near the limit: pipeline {dt} tile=({tm},{tn}) mcs={mcs}"
    return Case("rejected", desc, kernel, (x, x),
                lambda x, y: [Iv(_rnd(x + y, dtype))], config=config)
  if what == "smem":
    # Scratch buffers over the limit once each is rounded up to 1 KiB.
    sizes = draw(st.lists(st.integers(1, 120), min_size=2, max_size=6))
    n_bar = p.integer("barriers", 0, 4)
    config = p.done()
    assume(sum(-(-kb * 1000 // 1024) * 1024 for kb in sizes) + 8 * n_bar > MAX_SMEM)
    scratch = [plgpu.SMEM((kb * 250,), F32) for kb in sizes]
    scratch += [plgpu.Barrier(num_barriers=n_bar)] if n_bar else []

    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32), scratch_types=scratch)
    def kernel(x_ref, o_ref, *scr):
      scr[0][pl.ds(0, 128)] = x_ref[...]
      o_ref[...] = scr[0][pl.ds(0, 128)]
    desc = f"SMEM over the limit: scratch {sizes} x 1000 B, {n_bar} barriers"
    return Case("rejected", desc, kernel, (_inputs(seed, (128,), F32),),
                must_reject=True, model_rejects=True, config=config)
  if what in ("wgmma_m", "wgmma_n", "wgmma_dtype"):
    dtype, tm, tn, b_dtype = F16, 64, 128, F16
    if what == "wgmma_m":
      tm = p("tm", [16, 32, 48, 80, 96])
    elif what == "wgmma_n":
      tn = p("tn", [264, 320, 512])
    else:
      kind = p("kind", ["f32_mn_major_b", "mixed", "i32"])
      if kind == "f32_mn_major_b":
        dtype = b_dtype = F32
      elif kind == "mixed":
        b_dtype = BF16
      else:
        dtype = b_dtype = I32
    config = p.done()
    tk = 64

    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((tm, tn), F32),
                  scratch_types=dict(a_s=plgpu.SMEM((tm, tk), dtype),
                                     b_s=plgpu.SMEM((tk, tn), b_dtype),
                                     bar=plgpu.Barrier(num_arrivals=2),
                                     acc=plgpu.ACC((tm, tn), F32)))
    def kernel(a_ref, b_ref, o_ref, a_s, b_s, bar, acc):
      plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
      plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
      plgpu.barrier_wait(bar)
      plgpu.wgmma(acc, a_s, b_s)
      o_ref[...] = acc[...]
    args = (_inputs(seed, (tm, tk), dtype), _inputs(seed + 1, (tk, tn), b_dtype))
    desc = (f"wgmma {what}: a {_name(dtype)} ({tm},{tk}), b {_name(b_dtype)} "
            f"({tk},{tn})")
    return Case("rejected", desc, kernel, args, must_reject=True, model_rejects=True, config=config)
  dt = p("dt", sorted(DTYPES))
  dtype = DTYPES[dt]
  itemsize = np.dtype(dtype).itemsize
  if what == "tma_box":
    box = (p("box0", [8, 64]), p("box1", [512, 1024]))
    if p("box_tall", [False, True]):
      box = (box[1], 128 // itemsize * 2)
  else:  # last dimension under 16 bytes
    box = (p("box0", [8, 64]), p("box1", [1, 2]))
  config = p.done()
  # (an array wider than the box: one as narrow as a unit box is a copy TMA
  # takes from jax 0.12.1, jx.TMA_DROPS_UNIT_DIMS)
  shape = (box[0] * 2, box[1] * 2)
  desc = f"TMA {what}: {dt} box {box}"
  return Case("rejected", desc, _copy_kernel(shape, dtype, box),
              (_inputs(seed, shape, dtype),), must_reject=True, model_rejects=True, config=config)


FAMILIES = {
    "elementwise": elementwise, "reduction": reduction, "pipeline": pipeline,
    "matmul": matmul, "producer_consumer": producer_consumer, "rejected": rejected,
    "edges": edges,
}

# The axes whose every value the CI profile draws at least once, and which
# combinations of them are valid (the strategies assume() the same).
AXES = {
    "elementwise": dict(dt=sorted(DTYPES), out_dt=sorted(DTYPES), unary=UNARY,
                        binary=BINARY, path=["gmem", "smem"], threads=[1, 2],
                        iota=[None, 0, 1], bcast=[False, True],
                        specials=[False, True]),
    "reduction": dict(dt=sorted(DTYPES), op=sorted(REDUCE), api=["jnp", "lax"], axis=[0, 1],
                      layout=["load", "cast", "inferred"], out=["gmem", "smem"],
                      store=["assign", "plain"], specials=[False, True]),
    "pipeline": dict(dt=sorted(DTYPES), delay_release=[0, 1], n_major=[False, True],
                     mcs=[1, 2, 3, 4], blocks=[1, 2]),
    "matmul": dict(kind=["quickstart", "tma_wgmma"], dt=sorted(MMA_DTYPES),
                   out_dt=["f32", "f16", "bf16", "i32"], transpose_a=[False, True],
                   transpose_b=[False, True], swizzle=[32, 64, 128],
                   transforms=[False, True], slots=[1, 2, 3]),
    "producer_consumer": dict(kind=["two_thread", "warp_specialized"],
                              dt=sorted(DTYPES), steps=[1, 2, 3, 4, 5, 6],
                              slots=[1, 2, 3], compute_wgs=[1, 2]),
    "rejected": dict(what=["smem", "smem_near", "wgmma_m", "wgmma_n", "wgmma_dtype",
                           "tma_box", "tma_small"]),
    "edges": dict(op=EDGE_OPS, dt=sorted(FLOATS), out_dt=sorted(CAST_TO)),
}


# Pairs of axes whose every combination the CI profile draws: the dtype
# against what is computed with it (a reduction's accumulator, a cast).
AXES_PAIRS = {
    "elementwise": [("dt", "out_dt"), ("dt", "binary"), ("binary", "specials")],
    "reduction": [("dt", "op"), ("dt", "api"), ("dt", "store"), ("op", "specials"),
                  ("dt", "specials")],
    "edges": [("op", "dt"), ("dt", "out_dt")],
}


def may_be_rejected(family, config):
  """Whether the real lowering may reject a kernel drawn with these values
  (a covering row whose own values make it so counts as run)."""
  g = config.get
  if family == "rejected" or g("layout") == "inferred":
    return True
  return (family == "reduction" and STORE_16_BIT_REJECTED and g("out") == "gmem"
          and g("store") == "assign" and "dt" in config
          and np.dtype(DTYPES[g("dt")]).itemsize == 2)


def _valid(family, row):
  """Whether the fixed axes of `row` can be completed: the same rules the
  strategies apply when they narrow an axis's options."""
  g = row.get
  if family == "elementwise" and g("dt") == "i32":
    return g("unary", "neg") in ("neg", "abs", "square") and not g("specials", False)
  if family == "reduction" and g("dt") == "i32":
    return not g("specials", False)
  if family == "edges":
    if "out_dt" in row:
      return (g("op", "cast") == "cast" and g("out_dt") != g("dt")
              and not (g("dt") == "bf16" and g("out_dt").startswith("f8")))
  if family == "pipeline":
    return g("mcs", 4) > g("delay_release", 0)
  if family == "matmul":
    # (a transposed 16-bit A tile narrower than 128 bytes with inferred
    # transforms is rejected by the lowering: legal to draw, but a covering
    # row should run)
    if g("transpose_a") and not g("transforms", True) and g("swizzle", 128) != 128:
      return False
    if g("kind") == "quickstart":
      return (g("dt", "f16") in ("f16", "bf16") and not g("transpose_a", False)
              and not g("transpose_b", False) and g("out_dt", "f32") in ("f16", "f32")
              and not {"swizzle", "transforms", "slots"} & set(row))
    dt = g("dt")
    if dt is None:
      return g("out_dt") != "i32" or "transpose_a" not in row
    if np.dtype(MMA_DTYPES[dt]).itemsize != 2 and (
        g("transpose_a", False) or not g("transpose_b", True)):
      return False
    return g("out_dt", "f32" if dt != "i8" else "i32") in {
        "i8": ["i32"], "f8e4m3": ["f32"], "f8e5m2": ["f32"]}.get(dt, ["f32", dt])
  if family == "producer_consumer":
    ws_only, tt_only = "compute_wgs" in row, "slots" in row
    if g("kind") == "two_thread" or tt_only:
      return not ws_only and g("kind", "two_thread") == "two_thread"
    if g("kind") == "warp_specialized" or ws_only:
      return g("dt", "f16") in ("f16", "bf16") and g("steps", 1) <= 4
  return True


def _targets(family):
  """(axes, values) pairs to cover: an axis name with one value, or a tuple
  of names with every combination of their values (AXES_PAIRS)."""
  out = [((a,), (v,)) for a, vs in AXES[family].items() for v in vs]
  for names in AXES_PAIRS.get(family, ()):
    out += [(names, combo) for combo in itertools.product(
        *(AXES[family][n] for n in names)) if _valid(family, dict(zip(names, combo)))]
  return out


def covering_rows(family):
  """Rows of fixed axis values that, together, take every value of every
  axis in AXES[family], and every combination of the AXES_PAIRS, at least
  once; greedy, deterministic."""
  todo = _targets(family)
  rows = []
  while todo:
    row = {}
    for names, vals in todo:
      want = dict(zip(names, vals))
      if all(row.get(n, v) == v for n, v in want.items()) and _valid(family, {**row, **want}):
        row.update(want)
    if not row:
      raise ValueError(f"{family}: no valid row takes {todo}")
    rows.append(row)
    todo = [(names, vals) for names, vals in todo
            if not all(n in row and row[n] == v for n, v in zip(names, vals))]
  return rows
