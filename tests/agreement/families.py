"""Hypothesis strategies that draw valid Mosaic GPU kernels (and a family of
kernels the lowering must reject), each as a harness.Case with its inputs and
its NumPy reference. Kernels are ordinary plgpu code."""
import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hypothesis import assume, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import tolerance as tol
from harness import Case

F32, F16, BF16, I32 = jnp.float32, jnp.float16, jnp.bfloat16, jnp.int32
FLOATS = {"f32": F32, "f16": F16, "bf16": BF16}
DTYPES = {**FLOATS, "i32": I32}
MAX_SMEM = 232448


def _name(dtype):
  return np.dtype(dtype).name


def _inputs(seed, shape, dtype, specials=False, lo=-2.0, hi=2.0):
  r = np.random.default_rng(seed)
  if np.dtype(dtype) == np.dtype(np.int32):
    return jnp.asarray(r.integers(-1000, 1000, shape), I32)
  x = r.uniform(lo, hi, shape)
  x[x == 0] = 0.5  # non-zero inputs
  if specials:  # a sprinkling of NaN, +-inf and zeros
    flat = x.reshape(-1)
    idx = r.choice(flat.size, size=max(1, flat.size // 16), replace=False)
    flat[idx] = r.choice([np.nan, np.inf, -np.inf, 0.0], size=idx.size)
  return jnp.asarray(x, dtype)


def _round(x, dtype):
  """x (float64) rounded to dtype and back: what a store in dtype keeps."""
  if np.dtype(dtype) == np.dtype(np.int32):
    return x
  with np.errstate(all="ignore"):
    return np.asarray(x, np.dtype(dtype) if dtype != BF16 else ml_dtypes.bfloat16
                      ).astype(np.float64)


# --- elementwise -----------------------------------------------------------

UNARY_F = {
    "exp": (jnp.exp, np.exp), "log": (jnp.log, np.log), "tanh": (jnp.tanh, np.tanh),
    "neg": (jnp.negative, np.negative), "abs": (jnp.abs, np.abs),
    "square": (lambda x: x * x, lambda x: x * x),
}
UNARY_I = {k: UNARY_F[k] for k in ("neg", "abs", "square")}
BINARY = {
    "add": (jnp.add, np.add), "sub": (jnp.subtract, np.subtract),
    "mul": (jnp.multiply, np.multiply), "max": (jnp.maximum, np.maximum),
    "min": (jnp.minimum, np.minimum),
    "where_gt": (lambda u, y: jnp.where(u > y, u, y + y),
                 lambda u, y: np.where(u > y, u, y + y)),
}


@st.composite
def elementwise(draw):
  dt = draw(st.sampled_from(sorted(DTYPES)))
  dtype = DTYPES[dt]
  nt = draw(st.sampled_from([1, 2]))
  bn = draw(st.sampled_from([128, 256]))
  bm = nt * draw(st.sampled_from([1, 2, 4, 8, 16]))
  gm, gn = draw(st.integers(1, 3)), draw(st.integers(1, 2))
  un = draw(st.sampled_from(sorted(UNARY_F if dt != "i32" else UNARY_I)))
  bi = draw(st.sampled_from(sorted(BINARY)))
  iota_axis = draw(st.sampled_from([None, 0, 1]))
  bcast = draw(st.booleans())  # y is one row, broadcast over the rows
  path = draw(st.sampled_from(["gmem", "smem"]))
  out_dt = draw(st.sampled_from(sorted(DTYPES)))
  specials = dt != "i32" and draw(st.booleans())
  seed = draw(st.integers(0, 2 ** 16))
  out_dtype = DTYPES[out_dt]
  rows_t = bm // nt
  shape = (bm * gm, bn * gn)
  yshape = (1, shape[1]) if bcast else shape
  uf, un_np = (UNARY_F if dt != "i32" else UNARY_I)[un]
  bf, bn_np = BINARY[bi]

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

  def reference(x, y):
    with np.errstate(all="ignore"):
      u0 = u = _round(un_np(x), dtype)
      if iota_axis is not None:
        local = np.indices(shape)[iota_axis] % (rows_t, bn)[iota_axis]  # per tile
        u = _round(u + local, dtype)
      yb = np.broadcast_to(y, shape)
      want = bn_np(u, yb)
      if out_dt == "i32" and dt != "i32":  # cvt.rzi: NaN -> 0, saturating
        want = np.where(np.isnan(want), 0, np.clip(np.trunc(want), -2.0**31, 2.0**31 - 1))
      elif out_dt != "i32":
        want = _round(want, out_dtype)  # overflow to inf as a cast does
      mag = np.maximum(np.maximum(np.abs(u0), np.abs(u)), np.abs(yb))
    # Each rounding step (unary, iota add, binary, cast) may differ by ulps.
    allow = tol.allowed(want, mag, out_dtype) + tol.allowed(0, mag, dtype)
    if out_dt == "i32" and dt != "i32":
      allow = np.where(np.abs(want - np.round(want)) < 1e-3, 1, allow)
    return [(want, allow)]

  desc = (f"{dt}->{out_dt} {un}/{bi} iota={iota_axis} bcast={bcast} path={path} "
          f"block=({bm},{bn}) grid=({gm},{gn}) threads={nt} specials={specials} "
          f"seed={seed}")
  return Case("elementwise", desc, kernel, (x, y), reference)


# --- reductions --------------------------------------------------------------

REDUCE = {"sum": (jnp.sum, np.sum), "max": (jnp.max, np.max), "min": (jnp.min, np.min)}


@st.composite
def reduction(draw):
  dt = draw(st.sampled_from(sorted(DTYPES)))
  dtype = DTYPES[dt]
  op = draw(st.sampled_from(sorted(REDUCE)))
  axis = draw(st.sampled_from([0, 1]))
  rows = draw(st.sampled_from([64, 128]))
  cols = draw(st.sampled_from([128, 256]))
  # Register reductions lower from the WGMMA layout (of an SMEM load or a
  # cast); with the layout left to inference the lowering rejects them.
  layout = draw(st.sampled_from(["load", "cast", "load", "cast", "inferred"]))
  out_path = draw(st.sampled_from(["gmem", "smem"]))
  grid = draw(st.integers(1, 3))
  seed = draw(st.integers(0, 2 ** 16))
  jf, nf = REDUCE[op]
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
    if out_path == "gmem":
      o_ref[g] = jf(x, axis=axis)
    else:
      o_s[...] = jf(x, axis=axis)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(o_s, o_ref.at[g])
      plgpu.wait_smem_to_gmem(0)

  x = _inputs(seed, (grid, rows, cols), dtype)

  def reference(x):
    want = nf(x, axis=1 + axis)
    if op == "sum":
      n = x.shape[1 + axis]
      return [(want, tol.allowed(want, np.sum(np.abs(x), axis=1 + axis), dtype, n=n))]
    return [(want, np.zeros_like(want))]

  desc = (f"{op} axis={axis} {dt} ({rows},{cols}) grid={grid} layout={layout} "
          f"out={out_path} seed={seed}")
  return Case("reduction", desc, kernel, (x,), reference)


# --- emit_pipeline -------------------------------------------------------------

@st.composite
def pipeline(draw):
  dt = draw(st.sampled_from(sorted(DTYPES)))
  dtype = DTYPES[dt]
  tm = draw(st.sampled_from([8, 16, 32, 64, 128]))
  tn = draw(st.sampled_from([64, 128, 256]))
  assume(tm * tn * np.dtype(dtype).itemsize >= 512)
  gm, gn = draw(st.integers(1, 4)), draw(st.integers(1, 3))
  blocks = draw(st.sampled_from([1, 2]))
  mcs = draw(st.integers(1, 4))
  delay_release = draw(st.sampled_from([0, 1]))
  assume(mcs > delay_release)  # emit_pipeline's own precondition
  n_major = draw(st.booleans())  # iterate columns in the outer loop
  scale = draw(st.sampled_from([1, 2, 3]))
  seed = draw(st.integers(0, 2 ** 16))
  shape = (tm * gm * blocks, tn * gn)
  itemsize = np.dtype(dtype).itemsize
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

  def reference(x, y):
    xs = _round(x * scale, dtype)
    want = xs + y
    return [(want, tol.allowed(want, np.maximum(np.abs(xs), np.abs(y)), dtype)
             + tol.allowed(0, np.abs(x * scale), dtype))]

  desc = (f"{dt} tile=({tm},{tn}) grid=({gm},{gn}) blocks={blocks} mcs={mcs} "
          f"delay_release={delay_release} n_major={n_major} seed={seed}")
  return Case("pipeline", desc, kernel, (x, y), reference)


# --- matmuls -------------------------------------------------------------------

def _operands(a, b, transpose_a, transpose_b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return (a.T if transpose_a else a), (b.T if transpose_b else b)


def _matmul_reference(out_dtype, transpose_a, transpose_b, operand_eps,
                      acc_eps=None):
  def reference(a, b):
    a, b = _operands(a, b, transpose_a, transpose_b)
    want = a @ b
    if np.dtype(out_dtype) != np.dtype(I32):
      want = _round(want, out_dtype)
    mag = np.abs(a) @ np.abs(b)
    return [(want, tol.allowed(want, mag, out_dtype, n=a.shape[1], acc_dtype=F32
                               if np.dtype(out_dtype) != np.dtype(I32) else I32,
                               operand_eps=operand_eps, acc_eps=acc_eps))]
  return reference


def _matmul_allow_backends(a, b, out_dtype, transpose_a, transpose_b):
  a, b = _operands(a, b, transpose_a, transpose_b)
  mag = np.abs(a) @ np.abs(b)
  acc = F32 if np.dtype(out_dtype) != np.dtype(I32) else I32
  return lambda real: [tol.allowed(real[0], mag, out_dtype, n=a.shape[1],
                                   acc_dtype=acc)]


@st.composite
def quickstart_matmul(draw):
  import test_quickstart as Q
  dt = draw(st.sampled_from(["f16", "bf16"]))
  dtype = FLOATS[dt]
  out_dt = draw(st.sampled_from(["f16", "f32"]))
  tile_n = draw(st.sampled_from([64, 128, 256]))
  tile_k = draw(st.sampled_from([32, 64, 128]))
  mcs = draw(st.integers(2, 4))
  gm, gn, steps = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 4))
  seed = draw(st.integers(0, 2 ** 16))
  m, n, k = 128 * gm, tile_n * gn, tile_k * steps
  a = _inputs(seed, (m, k), dtype)
  b = _inputs(seed + 1, (k, n), dtype)
  fn = functools.partial(Q.matmul_mcs, tile_n=tile_n, tile_k=tile_k,
                         max_concurrent_steps=mcs, out_dtype=FLOATS[out_dt])
  desc = (f"quickstart {dt}->{out_dt} ({m},{k})x({k},{n}) tile_n={tile_n} "
          f"tile_k={tile_k} mcs={mcs} seed={seed}")
  return Case("matmul", desc, fn, (a, b),
              _matmul_reference(FLOATS[out_dt], False, False, 0.0),
              _matmul_allow_backends(a, b, FLOATS[out_dt], False, False))


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


MMA_DTYPES = {**FLOATS, "i8": jnp.int8, "f8e4m3": jnp.float8_e4m3fn,
              "f8e5m2": jnp.float8_e5m2}


@st.composite
def tma_wgmma_matmul(draw):
  dt = draw(st.sampled_from(sorted(MMA_DTYPES)))
  dtype = MMA_DTYPES[dt]
  itemsize = np.dtype(dtype).itemsize
  # Only 16-bit operands may be transposed: 32- and 8-bit ones must be
  # K-minor (A stored (M, K), B stored (N, K) and passed as `.T`).
  if itemsize == 2:
    transpose_a, transpose_b = draw(st.booleans()), draw(st.booleans())
  else:
    transpose_a, transpose_b = False, True
  swizzle = draw(st.sampled_from([32, 64, 128]))
  transforms = draw(st.booleans())
  tm = draw(st.sampled_from([64, 128]))
  tn = draw(st.sampled_from([64, 128, 256]))
  slots = draw(st.integers(1, 3))
  steps = draw(st.integers(1, 4))
  gm, gn = draw(st.integers(1, 2)), draw(st.integers(1, 2))
  outs = {"i8": ["i32"], "f8e4m3": ["f32"], "f8e5m2": ["f32"]}.get(dt, ["f32", dt])
  out_dt = draw(st.sampled_from(outs))
  out_dtype = DTYPES[out_dt]
  seed = draw(st.integers(0, 2 ** 16))
  tk = swizzle // itemsize
  m, n, k = tm * gm, tn * gn, tk * steps
  r = np.random.default_rng(seed)
  a_shape = (k, m) if transpose_a else (m, k)
  b_shape = (n, k) if transpose_b else (k, n)
  if dt == "i8":
    a = jnp.asarray(r.integers(-8, 8, a_shape), jnp.int8)
    b = jnp.asarray(r.integers(-8, 8, b_shape), jnp.int8)
  else:
    a, b = _inputs(seed, a_shape, dtype), _inputs(seed + 1, b_shape, dtype)
  fn = functools.partial(hand_matmul, tm=tm, tn=tn, swizzle=swizzle, slots=slots,
                         transpose_a=transpose_a, transpose_b=transpose_b,
                         transforms=transforms, out_dtype=out_dtype)
  op_eps = tol.TF32_OPERAND_EPS if dt == "f32" else 0.0
  acc_eps = tol.FP8_ACC_EPS if dt.startswith("f8") else None
  desc = (f"tma+wgmma {dt}->{out_dt} ({m},{k})x({k},{n}) tile=({tm},{tn},{tk}) "
          f"swizzle={swizzle} transforms={transforms} transpose_a={transpose_a} "
          f"transpose_b={transpose_b} slots={slots} seed={seed}")
  return Case("matmul", desc, fn, (a, b),
              _matmul_reference(out_dtype, transpose_a, transpose_b, op_eps, acc_eps),
              _matmul_allow_backends(a, b, out_dtype, transpose_a, transpose_b))


def matmul():
  return st.one_of(quickstart_matmul(), tma_wgmma_matmul())


# --- producer / consumer -------------------------------------------------------

@st.composite
def two_thread(draw):
  """Thread 1 streams row tiles of x into `slots` SMEM slots with TMA; thread 0
  waits for each, computes, stores to GMEM and hands the slot back."""
  dt = draw(st.sampled_from(sorted(DTYPES)))
  dtype = DTYPES[dt]
  tile = draw(st.sampled_from([8, 16, 32, 64]))
  cols = draw(st.sampled_from([128, 256]))
  slots = draw(st.integers(1, 3))
  steps = draw(st.integers(1, 6))
  blocks = draw(st.integers(1, 2))
  seed = draw(st.integers(0, 2 ** 16))
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

  x = _inputs(seed, shape, dtype)

  def reference(x):
    want = _round(x * 2, dtype) + 1
    return [(want, tol.allowed(want, np.abs(x * 2) + 1, dtype))]

  desc = (f"two-thread {dt} tile=({tile},{cols}) slots={slots} steps={steps} "
          f"blocks={blocks} seed={seed}")
  return Case("producer_consumer", desc, kernel, (x,), reference)


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
def warp_specialized(draw):
  dt = draw(st.sampled_from(["f16", "bf16"]))
  dtype = FLOATS[dt]
  tm = draw(st.sampled_from([64, 128]))
  tn = draw(st.sampled_from([64, 128]))
  tk = draw(st.sampled_from([32, 64]))
  wgs = draw(st.integers(1, 2))
  mcs = draw(st.integers(2, 3))
  steps = draw(st.integers(1, 4))
  gm, gn = draw(st.integers(1, 2)), draw(st.integers(1, 2))
  seed = draw(st.integers(0, 2 ** 16))
  m, n, k = tm * gm, tn * wgs * gn, tk * steps
  a, b = _inputs(seed, (m, k), dtype), _inputs(seed + 1, (k, n), dtype)
  fn = functools.partial(ws_matmul, tm=tm, tn=tn, tk=tk, compute_wgs=wgs, mcs=mcs)
  desc = (f"warp-specialized {dt} ({m},{k})x({k},{n}) tile=({tm},{tn},{tk}) "
          f"compute_wgs={wgs} mcs={mcs} seed={seed}")
  return Case("producer_consumer", desc, fn, (a, b),
              _matmul_reference(dtype, False, False, 0.0),
              _matmul_allow_backends(a, b, dtype, False, False))


def producer_consumer():
  return st.one_of(two_thread(), warp_specialized())


# --- kernels the lowering must reject ----------------------------------------------

def _copy_kernel(shape, dtype, box, via="tma"):
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
def rejected(draw):
  what = draw(st.sampled_from(["smem", "wgmma_m", "wgmma_n", "wgmma_dtype",
                               "tma_box", "tma_small"]))
  seed = draw(st.integers(0, 2 ** 16))
  if what == "smem" and draw(st.booleans()):
    # Around the limit: either verdict is right if both give it (and the
    # same smem_bytes); exercises the allocator's rounding and barriers.
    dt = draw(st.sampled_from(sorted(FLOATS)))
    dtype = FLOATS[dt]
    tm = draw(st.sampled_from([64, 128, 256]))
    tn = draw(st.sampled_from([128, 256]))
    mcs = draw(st.integers(2, 6))
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

    def reference(x, y):
      want = x + y
      return [(want, tol.allowed(want, np.abs(x) + np.abs(y), dtype))]
    desc = f"SMEM near the limit: pipeline {dt} tile=({tm},{tn}) mcs={mcs}"
    return Case("rejected", desc, kernel, (x, x), reference)
  if what == "smem":
    # Scratch buffers over the limit once each is rounded up to 1 KiB.
    sizes = draw(st.lists(st.integers(1, 120), min_size=2, max_size=6))
    n_bar = draw(st.integers(0, 4))
    assume(sum(-(-kb * 1000 // 1024) * 1024 for kb in sizes) + 8 * n_bar > MAX_SMEM)
    scratch = [plgpu.SMEM((kb * 250,), F32) for kb in sizes]
    scratch += [plgpu.Barrier(num_barriers=n_bar)] if n_bar else []

    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32), scratch_types=scratch)
    def kernel(x_ref, o_ref, *scr):
      scr[0][pl.ds(0, 128)] = x_ref[...]
      o_ref[...] = scr[0][pl.ds(0, 128)]
    desc = f"SMEM over the limit: scratch {sizes} x 1000 B, {n_bar} barriers"
    return Case("rejected", desc, kernel, (_inputs(seed, (128,), F32),),
                must_reject=True)
  if what in ("wgmma_m", "wgmma_n", "wgmma_dtype"):
    dtype, tm, tn, transpose_b, b_dtype = F16, 64, 128, False, F16
    if what == "wgmma_m":
      tm = draw(st.sampled_from([16, 32, 48, 80, 96]))
    elif what == "wgmma_n":
      tn = draw(st.sampled_from([264, 320, 512]))
    else:
      kind = draw(st.sampled_from(["f32_mn_major_b", "mixed", "i32"]))
      if kind == "f32_mn_major_b":
        dtype = b_dtype = F32
      elif kind == "mixed":
        b_dtype = BF16
      else:
        dtype = b_dtype = I32
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
    return Case("rejected", desc, kernel, args, must_reject=True)
  dt = draw(st.sampled_from(sorted(DTYPES)))
  dtype = DTYPES[dt]
  itemsize = np.dtype(dtype).itemsize
  if what == "tma_box":
    box = (draw(st.sampled_from([8, 64])), draw(st.sampled_from([512, 1024])))
    if draw(st.booleans()):
      box = (box[1], 128 // itemsize * 2)
  else:  # last dimension under 16 bytes
    box = (draw(st.sampled_from([8, 64])), draw(st.sampled_from([1, 2])))
  shape = (box[0] * 2, box[1])
  desc = f"TMA {what}: {dt} box {box}"
  return Case("rejected", desc, _copy_kernel(shape, dtype, box),
              (_inputs(seed, shape, dtype),), must_reject=True)


FAMILIES = {
    "elementwise": elementwise, "reduction": reduction, "pipeline": pipeline,
    "matmul": matmul, "producer_consumer": producer_consumer, "rejected": rejected,
}
