"""Kernel families of our own for the timing suite: Pallas Mosaic GPU kernels
written the way users write them, each swept over the tiles and pipeline
depths a user would try, to be measured on an H200 (timing_suite's kind
"families": `python3 -m lab.measure_gpu --only-suite --families`).

Families (every case's name starts with "own "):
  a. warp-specialized f16 matmul (emit_pipeline_warp_specialized): two
     consumer warpgroups splitting the block tile along M or along N, or one;
  b. fp8 e4m3 matmul (wgmma, f32 accumulator, bf16 out) over pipeline depths;
  c. RMSnorm and softmax over rows, two TMA pipelines over column tiles;
  d. a TMA-only tile copy (GMEM -> SMEM -> GMEM, no register work);
  e. out = a*b + c*d through emit_pipeline;
  f. JAX's attention_mgpu at head_dim 128, at shapes the suite lacks;
  g. column sums of a tall matrix, each block down one strip of columns;
  h. a bf16 matmul with a fused bias and SiLU epilogue;
  i. GELU by plain GMEM loads and stores, no TMA;
and a second blind set of a-e at other sizes and tiles (second_cases), a
third of c over longer rows (third_cases), later ones (fourth_cases, ...),
and a sixth of g, h and i, kinds none of the others has (sixth_cases).

Matmul sizes are written M x K x N, as in timing_suite. A library: importing
it builds nothing; timing_suite is imported inside the functions (it imports
this module at its end) and its `_rand` is looked up at call time, so that
timing_suite.shapes_only() gives shapes here too.
"""
from __future__ import annotations

import contextlib
import functools


def _ts():
  from lab import timing_suite
  return timing_suite


def _align(x):
  return -(-x // 1024) * 1024


def _mma_transforms(dtype, row_bytes=128):
  """Tiling and swizzle for a wgmma operand in SMEM whose rows hold
  `row_bytes` bytes (swizzle = the row, up to 128 bytes)."""
  import jax.numpy as jnp
  from jax.experimental.pallas import mosaic_gpu as plgpu
  swizzle = min(128, row_bytes)
  elems = swizzle // jnp.dtype(dtype).itemsize
  return (plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle))


# ---------------------------------------------------------------------------
# a. Warp-specialized f16 matmul.
# ---------------------------------------------------------------------------

def ws_block(tile_m, tile_n, consumers, split):
  """A warp-specialized block's tile (block_m, block_n): its consumers'
  (tile_m, tile_n) accumulators side by side along `split`."""
  return (tile_m * (consumers if split == "M" else 1),
          tile_n * (consumers if split == "N" else 1))


def ws_matmul(a, b, *, tile_m=128, tile_n=128, tile_k=64, mcs=2, consumers=2,
              split="N", compiler_params=None, scopes=False, mma=True):
  """C = A @ B (f16 in, f32 accumulator, f16 out) with
  plgpu.emit_pipeline_warp_specialized: a memory warpgroup streams
  (block_m, tile_k) tiles of A and (tile_k, block_n) tiles of B by TMA into
  `mcs` slots; `consumers` compute warpgroups each own a (tile_m, tile_n)
  accumulator of the block's tile, side by side along `split` ("M": they
  share B's tile and read their own rows of A's; "N": they share A's tile
  and read their own columns of B's). Each consumer carries its
  accumulator through the pipeline (a wgmma per step) and stores its tile
  through SMEM by TMA. `scopes`: each step's run_state in a named scope
  "acc" and its wgmma's issue in "issue", the store in "epilogue" and a
  consumer's whole work in "block", for Mosaic GPU's profiler
  (`compiler_params`; lab/ws_trace.py). `mma=False`: the same loads,
  barriers and stores with no wgmma (the tile stored is zeros): what the
  L2 gives this kernel's loads alone."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a.shape
  n = b.shape[1]
  block_m, block_n = ws_block(tile_m, tile_n, consumers, split)
  assert m % block_m == 0 and n % block_n == 0 and k % tile_k == 0
  dtype = a.dtype
  # (wgmma takes A and B at one swizzle, as wide as A's K rows allow)
  a_tf = b_tf = _mma_transforms(dtype, tile_k * 2)
  o_tf = _mma_transforms(dtype, tile_n * 2)

  scope = jax.named_scope if scopes else lambda _: contextlib.nullcontext()

  def kernel(a_gmem, b_gmem, o_gmem, o_smem):
    wg = lax.axis_index("wg")
    pid_m = lax.axis_index("m")
    pid_n = lax.axis_index("n")
    # This consumer's corner of the block tile.
    row = pid_m * block_m + (wg * tile_m if split == "M" else 0)
    col = pid_n * block_n + (wg * tile_n if split == "N" else 0)

    def compute(pipeline):
      with scope("block"):
        acc = pipeline(plgpu.layout_cast(jnp.zeros((tile_m, tile_n), jnp.float32),
                                         plgpu.Layout.WGMMA))
        with scope("epilogue"):
          o_smem[wg] = acc.astype(dtype)
          plgpu.commit_smem()
          plgpu.copy_smem_to_gmem(o_smem.at[wg],
                                  o_gmem.at[pl.ds(row, tile_m), pl.ds(col, tile_n)])
          plgpu.wait_smem_to_gmem(0)

    def step(_, a_smem, b_smem, carry):
      if not mma:
        return carry
      if consumers > 1 and split == "M":
        a_smem = a_smem.at[pl.ds(wg * tile_m, tile_m)]
      elif consumers > 1:
        b_smem = b_smem.at[:, pl.ds(wg * tile_n, tile_n)]

      def issue(acc_ref):
        with scope("issue"):
          plgpu.wgmma(acc_ref, a_smem, b_smem)
      with scope("acc"):
        return pl.run_state(issue)(plgpu.ACC.init(carry))

    plgpu.emit_pipeline_warp_specialized(
        step,
        in_specs=[plgpu.BlockSpec((block_m, tile_k), lambda kk: (pid_m, kk),
                                  transforms=a_tf),
                  plgpu.BlockSpec((tile_k, block_n), lambda kk: (kk, pid_n),
                                  transforms=b_tf)],
        grid=(k // tile_k,), compute_context=compute, max_concurrent_steps=mcs,
        num_compute_wgs=consumers, memory_registers=40,
        memory_thread_idx=consumers, wg_axis="wg")(a_gmem, b_gmem)

  return plgpu.kernel(
      kernel, out_type=jax.ShapeDtypeStruct((m, n), dtype),
      scratch_types=[plgpu.SMEM((consumers, tile_m, tile_n), dtype, transforms=o_tf)],
      grid=(m // block_m, n // block_n), grid_names=("m", "n"),
      num_threads=consumers + 1, thread_name="wg", compiler_params=compiler_params)(a, b)


def ws_smem(tile_m, tile_n, tile_k, mcs, consumers, split, itemsize=2):
  block_m, block_n = ws_block(tile_m, tile_n, consumers, split)
  return (_align(consumers * tile_m * tile_n * itemsize)
          + mcs * (_align(block_m * tile_k * itemsize) + _align(tile_k * block_n * itemsize)))


def _make_ws(m, k, n, seed=10, **kw):
  import jax.numpy as jnp
  ts = _ts()
  a = ts._rand(seed, (m, k), jnp.float16)
  b = ts._rand(seed + 100, (k, n), jnp.float16)
  ref = ts._matmul_ref if kw.get("mma", True) else _zeros_ref(jnp.float16)
  return ts.Built(functools.partial(ws_matmul, **kw), (a, b), ref, tol=5e-3)


def _zeros_ref(dtype):
  """The reference of a matmul run with no wgmma (mma=False): zeros of
  A @ B's shape (B given as (K, N) or, for fp8, as B^T (N, K))."""
  def ref(a, b, transposed=False):
    import jax.numpy as jnp
    return jnp.zeros((a.shape[0], b.shape[0] if transposed else b.shape[1]), dtype)
  return ref


# (consumers, split, tile_m, tile_n, tile_k, mcs): the block tile 128x256
# split along N (two 128x128 accumulators) and along M (two 64x256), the
# block tile 256x128 split along M (two 128x128), narrower K steps deeper,
# and one consumer.
WS_CONFIGS = (
    (2, "N", 128, 128, 64, 2), (2, "N", 128, 128, 64, 3),
    (2, "M", 64, 256, 64, 2), (2, "M", 64, 256, 64, 3),
    (2, "M", 128, 128, 64, 2), (2, "M", 128, 128, 64, 3),
    (2, "N", 128, 128, 32, 4), (1, "N", 128, 128, 64, 4),
)
WS_SIZES = ((4096, 4096, 4096), (8192, 2048, 8192))   # M x K x N


def _ws_cases(sizes=WS_SIZES, configs=WS_CONFIGS, tag=""):
  out = []
  for m, k, n in sizes:
    for cons, split, tm, tn, tk, mcs in configs:
      assert ws_smem(tm, tn, tk, mcs, cons, split) <= _ts().SMEM_LIMIT
      block = ws_block(tm, tn, cons, split)
      how = f"{cons}x{tm}x{tn} split {split}" if cons > 1 else f"1x{tm}x{tn}"
      out.append(_case(
          f"own ws_matmul f16 {m}x{k}x{n} block {block[0]}x{block[1]}x{tk} {how} mcs={mcs}"
          + tag,
          f"own ws_matmul f16 {m}x{k}x{n}",
          dict(m=m, k=k, n=n, tile_m=tm, tile_n=tn, tile_k=tk, mcs=mcs,
               consumers=cons, split=split),
          flops=2.0 * m * k * n, bytes=2.0 * (m * k + k * n + m * n), make=_make_ws))
  return out


# ---------------------------------------------------------------------------
# b. fp8 matmul.
# ---------------------------------------------------------------------------

def _nt_specs(tile_m, tile_n, tile_k, pid_m, pid_n, transforms):
  """emit_pipeline's in_specs for A (M, K) and B^T (N, K) along K, each
  slot held one step past its own (delay_release=1) for the wgmma left in
  flight."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  return [plgpu.BlockSpec((tile_m, tile_k), lambda kk: (pid_m, kk), transforms=transforms,
                          delay_release=1),
          plgpu.BlockSpec((tile_n, tile_k), lambda kk: (pid_n, kk), transforms=transforms,
                          delay_release=1)]


def fp8_matmul(a, bt, *, tile_m=128, tile_n=128, tile_k=128, mcs=2,
               out_dtype="bfloat16", compiler_params=None, step_scopes=False, mma=True):
  """C = A @ B^T with fp8 (e4m3) A (M, K) and B given as B^T (N, K): the
  tensor core reads 8-bit operands only K-minor, so B's tiles are passed to
  wgmma transposed. One warpgroup per block owns a (tile_m, tile_n) f32
  accumulator; emit_pipeline streams (tile_m, tile_k) and (tile_n, tile_k)
  tiles through `mcs` slots, a wgmma per step with one left in flight; the
  result goes out in out_dtype through SMEM by TMA. `step_scopes`: the
  step's wgmma and wgmma_wait in named scopes "issue" and "wait", and the
  epilogue in "epilogue", as the quickstart's for lab/pipeline_trace.py
  (a profiled run: `compiler_params` with profile_space/profile_dir).
  `mma=False`: the same loads and store with no wgmma (zeros stored)."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a.shape
  n = bt.shape[0]
  assert m % tile_m == 0 and n % tile_n == 0 and k % tile_k == 0
  out_dtype = jnp.dtype(out_dtype)
  tf = _mma_transforms(a.dtype, tile_k)

  def body(a_gmem, b_gmem, o_gmem, o_smem, acc):
    pid_m = lax.axis_index("m")
    pid_n = lax.axis_index("n")

    scope = jax.named_scope if step_scopes else lambda _: contextlib.nullcontext()

    def step(_, a_smem, b_smem):
      if not mma:
        return
      with scope("issue"):
        plgpu.wgmma(acc, a_smem, b_smem.T)
      with scope("wait"):
        plgpu.wgmma_wait(1)  # (the previous step's wgmma: delay_release=1 keeps its slots)

    plgpu.emit_pipeline(
        step, grid=(k // tile_k,),
        in_specs=_nt_specs(tile_m, tile_n, tile_k, pid_m, pid_n, tf),
        max_concurrent_steps=mcs)(a_gmem, b_gmem)
    with scope("epilogue"):
      plgpu.wgmma_wait(0)
      o_smem[...] = (acc[...] if mma else jnp.zeros(acc.shape, jnp.float32)).astype(out_dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(
          o_smem, o_gmem.at[pl.ds(pid_m * tile_m, tile_m), pl.ds(pid_n * tile_n, tile_n)])
      plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
      scratch_types=[plgpu.SMEM((tile_m, tile_n), out_dtype),
                     plgpu.ACC((tile_m, tile_n), jnp.float32)],
      grid=(m // tile_m, n // tile_n), grid_names=("m", "n"),
      compiler_params=compiler_params)(a, bt)


def _matmul_nt_ref(a, bt):
  import jax
  import jax.numpy as jnp
  return jnp.dot(a.astype(jnp.float32), bt.astype(jnp.float32).T,
                 precision=jax.lax.Precision.HIGHEST)


def _make_fp8(m, k, n, seed=20, **kw):
  import jax.numpy as jnp
  ts = _ts()
  a = ts._rand(seed, (m, k), jnp.float8_e4m3fn)
  bt = ts._rand(seed + 100, (n, k), jnp.float8_e4m3fn)
  # The tensor core keeps 13 fraction bits of each fp8 partial sum (and the
  # output is bf16): 2e-3 from an f32 sum at K=4096 in the simulator.
  ref = (_matmul_nt_ref if kw.get("mma", True) else
         functools.partial(_zeros_ref(jnp.bfloat16), transposed=True))
  return ts.Built(functools.partial(fp8_matmul, **kw), (a, bt), ref, tol=1e-2)


# (tile_m, tile_n, tile_k, mcs)
FP8_CONFIGS = tuple((128, 128, 128, s) for s in (2, 3, 4, 5, 6)) + tuple(
    (64, 256, 128, s) for s in (2, 3, 4))
FP8_SIZE = (4096, 4096, 4096)


def fp8_smem(tile_m, tile_n, tile_k, mcs, out_itemsize=2):
  return (_align(tile_m * tile_n * out_itemsize)
          + mcs * (_align(tile_m * tile_k) + _align(tile_n * tile_k)))


def _fp8_cases(size=FP8_SIZE, configs=FP8_CONFIGS, tag=""):
  m, k, n = size
  out = []
  for tm, tn, tk, mcs in configs:
    assert fp8_smem(tm, tn, tk, mcs) <= _ts().SMEM_LIMIT
    out.append(_case(
        f"own fp8 matmul e4m3 {m}x{k}x{n} {tm}x{tn}x{tk} mcs={mcs}" + tag,
        f"own fp8 matmul e4m3 {m}x{k}x{n}",
        dict(m=m, k=k, n=n, tile_m=tm, tile_n=tn, tile_k=tk, mcs=mcs),
        flops=2.0 * m * k * n, bytes=m * k + k * n + 2.0 * m * n, make=_make_fp8))
  return out


# ---------------------------------------------------------------------------
# c. Row kernels: RMSnorm and softmax over rows, two TMA pipelines each.
# ---------------------------------------------------------------------------

def _row_pipeline(step, x_gmem, *, row, block_m, tile_n, mcs, init=None,
                  extra_in=(), out=None):
  """emit_pipeline over the block's `block_m` rows of x in (block_m, tile_n)
  column tiles, left to right; `extra_in`: (gmem, spec) pairs of further
  inputs, `out`: the output gmem (tiles like x's). The step runs in a named
  scope, "body" (what a profiled run times: lab/rows_trace.py; a scope
  costs nothing unprofiled)."""
  import jax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  cols = x_gmem.shape[1]

  def scoped(*args):
    with jax.named_scope("body"):
      return step(*args)

  x_spec = plgpu.BlockSpec((block_m, tile_n), lambda j: (row, j))
  ins = [x_gmem] + [g for g, _ in extra_in]
  return plgpu.emit_pipeline(
      scoped, grid=(cols // tile_n,),
      in_specs=[x_spec] + [s for _, s in extra_in],
      out_specs=[x_spec] if out is not None else [],
      max_concurrent_steps=mcs, init_carry=init)(*ins, *([out] if out is not None else []))


def _done_reading():
  """In a pipeline body that only reads its tile into registers: every warp
  has read the slot (and the reads are ordered before the async proxy's
  writes) before the pipeline refills it by TMA. emit_pipeline puts this
  barrier after the body only when the pipeline has outputs."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  plgpu.commit_smem()


def rms_norm(x, w, *, block_m=64, tile_n=128, mcs=2, eps=1e-6, compiler_params=None):
  """out = x / sqrt(mean(x^2, row) + eps) * w over the rows of x (rows, cols),
  w (cols,); f32 math, out in x's dtype. Each block owns `block_m` rows
  (64 a warpgroup: the WGMMA register layout's row strips) and runs two
  TMA pipelines over their (block_m, tile_n) column tiles: the first sums
  the squares (a carried (block_m,) vector), the second reads the tiles
  again with w's and writes the scaled tiles out."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert rows % block_m == 0 and cols % tile_n == 0 and block_m % 64 == 0
  tile = plgpu.Layout.WGMMA

  def body(x_gmem, w_gmem, o_gmem):
    row = lax.axis_index("r")

    def squares(_, x_smem, acc):
      v = plgpu.load(x_smem, layout=tile).astype(jnp.float32)
      _done_reading()
      return acc + jnp.sum(v * v, axis=1)

    ss = _row_pipeline(squares, x_gmem, row=row, block_m=block_m, tile_n=tile_n,
                       mcs=mcs, init=plgpu.layout_cast(
                           jnp.zeros((block_m,), jnp.float32), tile.reduce(1)))
    inv = lax.rsqrt(ss * (1.0 / cols) + eps)

    def scale(_, x_smem, w_smem, o_smem):
      v = plgpu.load(x_smem, layout=tile).astype(jnp.float32)
      g = plgpu.load(w_smem, layout=tile.reduce(0)).astype(jnp.float32)
      o_smem[...] = (v * inv[:, None] * g[None, :]).astype(o_smem.dtype)

    w_spec = plgpu.BlockSpec((tile_n,), lambda j: (j,))
    _row_pipeline(scale, x_gmem, row=row, block_m=block_m, tile_n=tile_n, mcs=mcs,
                  extra_in=[(w_gmem, w_spec)], out=o_gmem)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                      grid=(rows // block_m,), grid_names=("r",),
                      compiler_params=compiler_params)(x, w)


def _rms_ref(x, w, eps=1e-6):
  import jax.numpy as jnp
  x = x.astype(jnp.float32)
  ms = jnp.mean(x * x, axis=1, keepdims=True)
  return x / jnp.sqrt(ms + eps) * w.astype(jnp.float32)


def softmax_rows(x, *, block_m=64, tile_n=128, mcs=2, compiler_params=None):
  """out = softmax(x) along each row of x (rows, cols): f32 math, out in x's
  dtype. Each block owns `block_m` rows and runs two TMA pipelines over
  their (block_m, tile_n) column tiles: the first carries each row's
  running max and its sum of exp(x - max) (rescaled when the max grows),
  the second reads the tiles again and writes exp(x - max) / sum."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert rows % block_m == 0 and cols % tile_n == 0 and block_m % 64 == 0
  tile = plgpu.Layout.WGMMA

  def body(x_gmem, o_gmem):
    row = lax.axis_index("r")

    def stats(_, x_smem, carry):
      mx, s = carry
      v = plgpu.load(x_smem, layout=tile).astype(jnp.float32)
      _done_reading()
      new = jnp.maximum(mx, jnp.max(v, axis=1))
      s = s * jnp.exp(mx - new) + jnp.sum(jnp.exp(v - new[:, None]), axis=1)
      return new, s

    vec = lambda val: plgpu.layout_cast(jnp.full((block_m,), val, jnp.float32),
                                        tile.reduce(1))
    mx, s = _row_pipeline(stats, x_gmem, row=row, block_m=block_m, tile_n=tile_n,
                          mcs=mcs, init=(vec(-jnp.inf), vec(0.0)))
    inv = 1.0 / s

    def write(_, x_smem, o_smem):
      v = plgpu.load(x_smem, layout=tile).astype(jnp.float32)
      o_smem[...] = (jnp.exp(v - mx[:, None]) * inv[:, None]).astype(o_smem.dtype)

    _row_pipeline(write, x_gmem, row=row, block_m=block_m, tile_n=tile_n, mcs=mcs,
                  out=o_gmem)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                      grid=(rows // block_m,), grid_names=("r",),
                      compiler_params=compiler_params)(x)


def _softmax_ref(x):
  import jax
  import jax.numpy as jnp
  return jax.nn.softmax(x.astype(jnp.float32), axis=1)


ROWS_SIZE = (16384, 8192)   # bf16 rows x cols: 256 MiB in, 256 MiB out
# (block_m, tile_n, mcs)
ROWS_CONFIGS = ((64, 64, 2), (64, 128, 2), (64, 256, 2), (64, 128, 4),
                (128, 128, 2), (128, 64, 3))


def _make_rms(rows, cols, seed=30, **kw):
  import jax.numpy as jnp
  ts = _ts()
  x = ts._rand(seed, (rows, cols), jnp.bfloat16)
  w = ts._rand(seed + 100, (cols,), jnp.bfloat16, shift=1.0)
  return ts.Built(functools.partial(rms_norm, **kw), (x, w), _rms_ref, tol=1e-2)


def _make_softmax(rows, cols, seed=40, **kw):
  import jax.numpy as jnp
  ts = _ts()
  x = ts._rand(seed, (rows, cols), jnp.bfloat16, scale=2.0)
  return ts.Built(functools.partial(softmax_rows, **kw), (x,), _softmax_ref, tol=1e-2)


def _rows_cases(size=ROWS_SIZE, configs=ROWS_CONFIGS, tag=""):
  rows, cols = size
  n = rows * cols
  out = []
  # flops an element: RMSnorm squares and sums, then scales twice (4);
  # softmax takes max, subtracts, exps and sums, then subtracts, exps and
  # scales (7). Bytes: x read once, out written once (and w).
  for what, make, flops, extra in (("rmsnorm", _make_rms, 4, cols),
                                   ("softmax", _make_softmax, 7, 0)):
    for bm, tn, mcs in configs:
      out.append(_case(
          f"own {what} bf16 {rows}x{cols} {bm} rows/block {bm}x{tn} mcs={mcs}" + tag,
          f"own {what} bf16 {rows}x{cols}",
          dict(rows=rows, cols=cols, block_m=bm, tile_n=tn, mcs=mcs),
          flops=flops * n, bytes=2.0 * (2 * n + extra), make=make))
  return out


# ---------------------------------------------------------------------------
# d. TMA-only tile copy.
# ---------------------------------------------------------------------------

def tma_copy(x, *, blocks=512, tile_m=32, tile_n=256, slots=4):
  """out = x, by TMA alone: each of `blocks` blocks owns a run of consecutive
  rows of x and walks its (tile_m, tile_n) tiles row-major through a ring
  of `slots` SMEM buffers, each tile loaded GMEM -> SMEM by TMA (on its
  slot's barrier) and stored SMEM -> GMEM by TMA from the same buffer; no
  register touches the data. A slot is refilled once the store that read
  it is done reading, so one store and up to slots - 1 loads are in
  flight."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert rows % (blocks * tile_m) == 0 and cols % tile_n == 0
  per_row = cols // tile_n
  steps = rows // blocks // tile_m * per_row
  assert steps >= slots

  def body(x_gmem, o_gmem, buf, bars):
    first = lax.axis_index("b") * steps

    def at(ref, i):
      t = first + i
      return ref.at[pl.ds(t // per_row * tile_m, tile_m), pl.ds(t % per_row * tile_n, tile_n)]

    def load(i, slot):
      plgpu.copy_gmem_to_smem(at(x_gmem, i), buf.at[slot], bars.at[slot])

    for i in range(slots):
      load(i, i)

    def step(i, _):
      slot = i % slots
      plgpu.barrier_wait(bars.at[slot])
      plgpu.copy_smem_to_gmem(buf.at[slot], at(o_gmem, i))

      # Refill the previous step's slot once its store has read it.
      @pl.when(jnp.logical_and(i >= 1, i - 1 + slots < steps))
      def _():
        plgpu.wait_smem_to_gmem(1, wait_read_only=True)
        load(i - 1 + slots, (i - 1) % slots)

    lax.fori_loop(0, steps, step, None)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
      scratch_types=[plgpu.SMEM((slots, tile_m, tile_n), x.dtype),
                     plgpu.Barrier(num_barriers=slots)],
      grid=(blocks,), grid_names=("b",))(x)


COPY_SIZE = (16384, 4096)   # f32: 256 MiB in, 256 MiB out
# (blocks, tile_m, tile_n, slots)
COPY_CONFIGS = ((512, 32, 256, 2), (512, 32, 256, 4), (256, 64, 256, 3),
                (1024, 16, 256, 6), (256, 64, 128, 4), (1024, 8, 256, 8))


def _make_copy(rows, cols, seed=50, dtype="float32", **kw):
  import jax.numpy as jnp
  ts = _ts()
  x = ts._rand(seed, (rows, cols), jnp.dtype(dtype))
  return ts.Built(functools.partial(tma_copy, **kw), (x,), lambda x: x, tol=0.0)


def _copy_cases(size=COPY_SIZE, configs=COPY_CONFIGS, dtype="float32", tag=""):
  rows, cols = size
  n = rows * cols
  item, short = _dtype_names(dtype)
  out = []
  for blocks, tm, tn, slots in configs:
    assert slots * tm * tn * item <= _ts().SMEM_LIMIT and rows % (blocks * tm) == 0
    out.append(_case(
        f"own tma copy {short} {rows}x{cols} {blocks} blocks {tm}x{tn} slots={slots}" + tag,
        f"own tma copy {short} {rows}x{cols}",
        dict(rows=rows, cols=cols, blocks=blocks, tile_m=tm, tile_n=tn, slots=slots,
             **({} if dtype == "float32" else {"dtype": dtype})),
        flops=n, bytes=2.0 * n * item, make=_make_copy,
        note="flops: one per element moved (a copy computes nothing)"))
  return out


# ---------------------------------------------------------------------------
# e. Four-input elementwise: out = a*b + c*d.
# ---------------------------------------------------------------------------

def fma4(a, b, c, d, *, blocks=512, tile_m=32, tile_n=256, mcs=2):
  """out = a*b + c*d (all of one shape and dtype) through emit_pipeline:
  each of `blocks` blocks owns a run of rows and pipelines its
  (tile_m, tile_n) tiles, four loaded and one stored by TMA per step, the
  arithmetic in registers."""
  import jax
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = a.shape
  assert rows % (blocks * tile_m) == 0 and cols % tile_n == 0
  tiles_per_block = rows // blocks // tile_m

  def body(a_gmem, b_gmem, c_gmem, d_gmem, o_gmem):
    blk = lax.axis_index("b")

    def step(_, a_s, b_s, c_s, d_s, o_s):
      o_s[...] = a_s[...] * b_s[...] + c_s[...] * d_s[...]

    spec = plgpu.BlockSpec((tile_m, tile_n), lambda i, j: (blk * tiles_per_block + i, j))
    plgpu.emit_pipeline(step, grid=(tiles_per_block, cols // tile_n),
                        in_specs=[spec] * 4, out_specs=[spec],
                        max_concurrent_steps=mcs)(a_gmem, b_gmem, c_gmem, d_gmem, o_gmem)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(a.shape, a.dtype),
                      grid=(blocks,), grid_names=("b",))(a, b, c, d)


def _fma4_ref(a, b, c, d):
  import jax.numpy as jnp
  f = lambda x: x.astype(jnp.float32)
  return f(a) * f(b) + f(c) * f(d)


FMA4_SIZE = (16384, 4096)   # bf16: 4 x 128 MiB in, 128 MiB out
# (blocks, tile_m, tile_n, mcs)
FMA4_CONFIGS = ((1024, 16, 256, 2), (512, 32, 256, 2), (1024, 16, 128, 4),
                (256, 32, 128, 3), (2048, 8, 256, 4), (256, 64, 64, 2))


def _make_fma4(rows, cols, seed=60, dtype="bfloat16", **kw):
  import jax.numpy as jnp
  ts = _ts()
  args = tuple(ts._rand(seed + 100 * i, (rows, cols), jnp.dtype(dtype)) for i in range(4))
  return ts.Built(functools.partial(fma4, **kw), args, _fma4_ref, tol=1e-2)


def _fma4_cases(size=FMA4_SIZE, configs=FMA4_CONFIGS, dtype="bfloat16", tag=""):
  rows, cols = size
  n = rows * cols
  item, short = _dtype_names(dtype)
  out = []
  for blocks, tm, tn, mcs in configs:
    assert 5 * mcs * tm * tn * item <= _ts().SMEM_LIMIT and rows % (blocks * tm) == 0
    out.append(_case(
        f"own a*b+c*d {short} {rows}x{cols} {blocks} blocks {tm}x{tn} mcs={mcs}" + tag,
        f"own a*b+c*d {short} {rows}x{cols}",
        dict(rows=rows, cols=cols, blocks=blocks, tile_m=tm, tile_n=tn, mcs=mcs,
             **({} if dtype == "bfloat16" else {"dtype": dtype})),
        flops=3.0 * n, bytes=5.0 * n * item, make=_make_fma4))
  return out


# ---------------------------------------------------------------------------
# f. JAX's attention_mgpu at head_dim 128, at shapes the suite lacks.
# ---------------------------------------------------------------------------

# (batch, seq, heads, head_dim, block_q, block_kv, causal, mcs)
ATTENTION_CONFIGS = ((2, 4096, 16, 128, 64, 128, False, 2),
                     (2, 4096, 16, 128, 64, 64, False, 3),
                     (1, 16384, 4, 128, 64, 128, True, 2))


def _attention_cases(configs=ATTENTION_CONFIGS, tag=""):
  ts = _ts()
  out = []
  for batch, seq, heads, d, bq, bkv, causal, mcs in configs:
    shape = f"b{batch} s{seq} h{heads} d{d}" + (" causal" if causal else "")
    out.append(_case(
        f"own attention_mgpu fwd {shape} bq{bq} bkv{bkv} mcs={mcs}" + tag,
        f"own attention_mgpu fwd {shape}",
        dict(batch=batch, seq=seq, heads=heads, head_dim=d, block_q=bq,
             block_kv=bkv, causal=causal, mcs=mcs),
        flops=4.0 * batch * seq * seq * heads * d / (2 if causal else 1),
        bytes=4.0 * batch * seq * heads * d * 2, make=ts._make_attention))
  return out


# ---------------------------------------------------------------------------
# g. Column sums: a two-stage reduction's first stage over a tall matrix.
# ---------------------------------------------------------------------------

def col_sums(x, *, tile_m=64, tile_n=128, splits=1, mcs=2):
  """out[s, c] = sum of x[r, c] over the s-th of `splits` runs of rows (f32
  out; the caller sums the splits). Block (j, s) owns column strip j
  (tile_n wide) of row run s and pipelines its (tile_m, tile_n) tiles down
  the rows, adding each to a (tile_m, tile_n) f32 accumulator in registers;
  the accumulator's rows are summed once at the end and written by TMA.
  Few blocks where the strips are wide and the runs long: each streams a
  long run on its own."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert rows % (splits * tile_m) == 0 and cols % tile_n == 0 and tile_m % 64 == 0
  steps = rows // splits // tile_m
  tile = plgpu.Layout.WGMMA

  def body(x_gmem, o_gmem, o_smem):
    j = lax.axis_index("c")
    s = lax.axis_index("s")

    def step(_, x_smem, acc):
      v = plgpu.load(x_smem, layout=tile).astype(jnp.float32)
      _done_reading()
      return acc + v

    spec = plgpu.BlockSpec((tile_m, tile_n), lambda i: (s * steps + i, j))
    acc = plgpu.emit_pipeline(
        step, grid=(steps,), in_specs=[spec], max_concurrent_steps=mcs,
        init_carry=plgpu.layout_cast(jnp.zeros((tile_m, tile_n), jnp.float32), tile),
    )(x_gmem)
    o_smem[...] = jnp.sum(acc, axis=0)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[s, pl.ds(j * tile_n, tile_n)])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((splits, cols), jnp.float32),
                      scratch_types=[plgpu.SMEM((tile_n,), jnp.float32)],
                      grid=(cols // tile_n, splits), grid_names=("c", "s"))(x)


def _col_sums_ref(x, *, splits):
  import jax.numpy as jnp
  return x.astype(jnp.float32).reshape(splits, -1, x.shape[1]).sum(axis=1)


def _make_colsum(rows, cols, seed=70, **kw):
  import jax.numpy as jnp
  ts = _ts()
  x = ts._rand(seed, (rows, cols), jnp.bfloat16)
  # (f32 sums of up to 16384 bf16 values in another order than the reference's)
  return ts.Built(functools.partial(col_sums, **kw), (x,),
                  functools.partial(_col_sums_ref, splits=kw["splits"]), tol=1e-3)


def _colsum_cases(size, configs, tag=""):
  rows, cols = size
  out = []
  for tm, tn, splits, mcs in configs:
    blocks = cols // tn * splits
    out.append(_case(
        f"own colsum bf16 {rows}x{cols} {tm}x{tn} {splits} splits ({blocks} blocks) "
        f"mcs={mcs}" + tag,
        f"own colsum bf16 {rows}x{cols}",
        dict(rows=rows, cols=cols, tile_m=tm, tile_n=tn, splits=splits, mcs=mcs),
        flops=float(rows * cols), bytes=2.0 * rows * cols + 4.0 * splits * cols,
        make=_make_colsum))
  return out


# ---------------------------------------------------------------------------
# h. A bf16 matmul with its epilogue fused: bias, then SiLU.
# ---------------------------------------------------------------------------

def matmul_bias_act(a, bt, bias, *, tile_m=128, tile_n=128, tile_k=64, mcs=3, act="silu"):
  """y = act(A @ B^T + bias), bf16 A (M, K) and B^T (N, K), f32 bias (N,),
  bf16 out; act "silu" (y * sigmoid(y)) or "none". One warpgroup a block:
  the bias tile comes by TMA while emit_pipeline streams the K tiles through
  `mcs` slots (a wgmma a step, one left in flight); the epilogue adds the
  bias to the f32 accumulator, applies act in registers and writes the tile
  out through SMEM by TMA. A short K leaves the epilogue a large share."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a.shape
  n = bt.shape[0]
  assert m % tile_m == 0 and n % tile_n == 0 and k % tile_k == 0
  tf = _mma_transforms(a.dtype, tile_k * a.dtype.itemsize)

  def body(a_gmem, b_gmem, bias_gmem, o_gmem, o_smem, bias_smem, bar, acc):
    pm = lax.axis_index("m")
    pn = lax.axis_index("n")
    plgpu.copy_gmem_to_smem(bias_gmem.at[pl.ds(pn * tile_n, tile_n)], bias_smem, bar)

    def step(_, a_smem, b_smem):
      plgpu.wgmma(acc, a_smem, b_smem.T)
      plgpu.wgmma_wait(1)  # (the previous step's: delay_release=1 keeps its slots)

    plgpu.emit_pipeline(
        step, grid=(k // tile_k,),
        in_specs=_nt_specs(tile_m, tile_n, tile_k, pm, pn, tf),
        max_concurrent_steps=mcs)(a_gmem, b_gmem)
    plgpu.wgmma_wait(0)
    plgpu.barrier_wait(bar)
    y = acc[...] + plgpu.load(bias_smem, layout=plgpu.Layout.WGMMA.reduce(0))[None, :]
    if act == "silu":
      y = y * jax.nn.sigmoid(y)
    o_smem[...] = y.astype(o_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(
        o_smem, o_gmem.at[pl.ds(pm * tile_m, tile_m), pl.ds(pn * tile_n, tile_n)])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((m, n), jnp.bfloat16),
      scratch_types=[plgpu.SMEM((tile_m, tile_n), jnp.bfloat16),
                     plgpu.SMEM((tile_n,), jnp.float32), plgpu.Barrier(num_arrivals=1),
                     plgpu.ACC((tile_m, tile_n), jnp.float32)],
      grid=(m // tile_m, n // tile_n), grid_names=("m", "n"))(a, bt, bias)


def _bias_act_ref(a, bt, bias, *, act):
  import jax
  y = _matmul_nt_ref(a, bt) + bias
  return y * jax.nn.sigmoid(y) if act == "silu" else y


def _make_bias_act(m, k, n, seed=80, **kw):
  import jax.numpy as jnp
  ts = _ts()
  a = ts._rand(seed, (m, k), jnp.bfloat16)
  bt = ts._rand(seed + 100, (n, k), jnp.bfloat16)
  bias = ts._rand(seed + 200, (n,), jnp.float32)
  return ts.Built(functools.partial(matmul_bias_act, **kw), (a, bt, bias),
                  functools.partial(_bias_act_ref, act=kw.get("act", "silu")), tol=1e-2)


def bias_act_smem(tile_m, tile_n, tile_k, mcs):
  return (_align(tile_m * tile_n * 2) + _align(tile_n * 4)
          + mcs * (_align(tile_m * tile_k * 2) + _align(tile_n * tile_k * 2)))


def _bias_act_cases(size, configs, tag=""):
  m, k, n = size
  out = []
  for tm, tn, tk, mcs, act in configs:
    assert bias_act_smem(tm, tn, tk, mcs) <= _ts().SMEM_LIMIT
    out.append(_case(
        f"own matmul+bias+{act} bf16 {m}x{k}x{n} {tm}x{tn}x{tk} mcs={mcs}" + tag,
        f"own matmul+bias+act bf16 {m}x{k}x{n}",
        dict(m=m, k=k, n=n, tile_m=tm, tile_n=tn, tile_k=tk, mcs=mcs, act=act),
        flops=2.0 * m * k * n + (5.0 if act == "silu" else 1.0) * m * n,
        bytes=2.0 * (m * k + k * n + m * n) + 4.0 * n, make=_make_bias_act))
  return out


# ---------------------------------------------------------------------------
# i. GELU with plain GMEM loads and stores (no TMA, no SMEM).
# ---------------------------------------------------------------------------

def gelu_plain(x, *, blocks=512, tile_m=8, tile_n=256, unroll=1):
  """out = x * sigmoid(1.702 x) (the sigmoid GELU), bf16, read and written
  with plain loads and stores of GMEM: each of `blocks` one-warpgroup blocks
  owns a run of rows and walks its (tile_m, tile_n) tiles in a fori_loop
  (`unroll` iterations a trip), a tile loaded into registers, computed in
  f32 and stored back. What hides HBM's latency is the blocks an SM holds
  (no SMEM: as many as threads and registers allow) and the unrolling."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert rows % (blocks * tile_m) == 0 and cols % tile_n == 0
  per_row = cols // tile_n
  tiles = rows // blocks // tile_m * per_row

  def body(x_ref, o_ref):
    first = lax.axis_index("b") * (rows // blocks)

    def step(i, carry):
      r = pl.ds(first + i // per_row * tile_m, tile_m)
      c = pl.ds(i % per_row * tile_n, tile_n)
      v = x_ref[r, c].astype(jnp.float32)
      o_ref[r, c] = (v * jax.nn.sigmoid(1.702 * v)).astype(o_ref.dtype)
      return carry

    lax.fori_loop(0, tiles, step, None, unroll=unroll)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                      grid=(blocks,), grid_names=("b",))(x)


def _gelu_ref(x):
  import jax
  import jax.numpy as jnp
  v = x.astype(jnp.float32)
  return v * jax.nn.sigmoid(1.702 * v)


def _make_gelu_plain(rows, cols, seed=90, **kw):
  import jax.numpy as jnp
  ts = _ts()
  x = ts._rand(seed, (rows, cols), jnp.bfloat16, scale=2.0)
  return ts.Built(functools.partial(gelu_plain, **kw), (x,), _gelu_ref, tol=1e-2)


def _gelu_plain_cases(size, configs, tag=""):
  rows, cols = size
  n = rows * cols
  out = []
  for blocks, tm, tn, unroll in configs:
    out.append(_case(
        f"own gelu plain bf16 {rows}x{cols} {blocks} blocks {tm}x{tn} unroll={unroll}" + tag,
        f"own gelu plain bf16 {rows}x{cols}",
        dict(rows=rows, cols=cols, blocks=blocks, tile_m=tm, tile_n=tn, unroll=unroll),
        flops=5.0 * n, bytes=4.0 * n, make=_make_gelu_plain))
  return out


# ---------------------------------------------------------------------------
# Cases.
# ---------------------------------------------------------------------------

def _dtype_names(dtype):
  """(bytes an element, the name cases give it)."""
  import numpy as np
  import jax.numpy as jnp
  d = jnp.dtype(dtype)
  return d.itemsize, {np.dtype(np.float32): "f32", jnp.dtype(jnp.bfloat16): "bf16"}.get(
      d, d.name)


def _case(name, family, params, *, flops, bytes, make, small=False, note=""):
  return _ts().Case(name=name, family=family, params=params, flops=float(flops),
                    bytes=float(bytes), make=make, small=small, note=note)


# A second blind set: the same families at other sizes and tiles, predicted
# (lab/data/blind_predictions_own_families_2.json) before any was measured,
# by the model with HBM's run costs and queue (gpus.GPU.hbm_runs,
# hbm_queue_cycles). Names end " (blind 2)".
SECOND = " (blind 2)"
WS_CONFIGS_2 = (
    (2, "N", 128, 128, 64, 2), (2, "N", 128, 128, 64, 3), (2, "N", 128, 128, 32, 4),
    (2, "M", 64, 256, 64, 2), (2, "M", 64, 256, 64, 3),
    (2, "M", 128, 128, 64, 3), (1, "N", 128, 128, 64, 3),
)
FP8_CONFIGS_2 = ((128, 128, 128, 2), (128, 128, 128, 4), (64, 256, 128, 2),
                 (64, 256, 128, 4))
ROWS_CONFIGS_2 = ((64, 64, 2), (64, 128, 2), (64, 128, 3), (64, 256, 2), (128, 64, 2),
                  (128, 128, 2), (64, 64, 4))
# bf16 boxes in runs of 128, 256, 64, 256, 512 and 128 bytes
COPY_CONFIGS_2 = ((512, 64, 64, 4), (512, 32, 128, 4), (512, 64, 32, 8),
                  (256, 64, 128, 2), (1024, 16, 256, 4), (512, 64, 64, 2))
# f32 boxes in runs of 128, 256, 256, 512, 512 and 128 bytes
FMA4_CONFIGS_2 = ((256, 32, 32, 2), (512, 16, 64, 2), (256, 32, 64, 3),
                  (1024, 8, 128, 4), (512, 16, 128, 2), (256, 16, 32, 4))


def second_cases():
  return (_ws_cases(((6144, 6144, 6144),), WS_CONFIGS_2, SECOND)
          + _fp8_cases((8192, 4096, 8192), FP8_CONFIGS_2, SECOND)
          + _rows_cases((32768, 4096), ROWS_CONFIGS_2, SECOND)
          + _copy_cases((32768, 4096), COPY_CONFIGS_2, "bfloat16", SECOND)
          + _fma4_cases((8192, 4096), FMA4_CONFIGS_2, "float32", SECOND))


# A third blind set: RMSnorm and softmax over longer rows, predicted
# (lab/data/blind_predictions_own_families_3.json) once reductions cost the
# elements they reduce. Names end " (blind 3)".
THIRD = " (blind 3)"


def third_cases():
  return _rows_cases((8192, 16384), ROWS_CONFIGS_2, THIRD)


# A fourth blind set: the families whose configurations the H200 tells apart
# (the matmuls, the row kernels, attention) at shapes none was run at, and
# attention at head_dim 64, predicted
# (lab/data/blind_predictions_own_families_4.json) once a reduction costs
# what the row micros measured. Names end " (blind 4)".
FOURTH = " (blind 4)"
ATTENTION_CONFIGS_4 = ((2, 4096, 16, 64, 64, 128, False, 2),
                       (2, 4096, 16, 64, 64, 64, False, 3),
                       (2, 4096, 16, 64, 64, 128, False, 3),
                       (1, 8192, 16, 64, 64, 128, True, 2))


def fourth_cases():
  return (_ws_cases(((4096, 8192, 8192),), WS_CONFIGS_2, FOURTH)
          + _fp8_cases((4096, 8192, 8192), FP8_CONFIGS_2, FOURTH)
          + _rows_cases((16384, 16384), ROWS_CONFIGS_2, FOURTH)
          + _attention_cases(ATTENTION_CONFIGS_4, FOURTH))


# A fifth blind set: the matmuls, the row kernels and attention at head_dim
# 128 at shapes none was run at (fp8 at every depth its SMEM allows),
# predicted (lab/data/blind_predictions_own_families_5.json) once the L2
# serves a block's re-reads in a launch it holds whole. Names end " (blind 5)".
FIFTH = " (blind 5)"
ATTENTION_CONFIGS_5 = ((4, 2048, 16, 128, 64, 128, False, 2),
                       (4, 2048, 16, 128, 64, 64, False, 3),
                       (4, 2048, 16, 128, 64, 128, False, 3),
                       (2, 8192, 8, 128, 64, 128, True, 2))


def fifth_cases():
  return (_ws_cases(((8192, 4096, 4096),), WS_CONFIGS_2, FIFTH)
          + _fp8_cases((8192, 8192, 4096), FP8_CONFIGS, FIFTH)
          + _rows_cases((32768, 8192), ROWS_CONFIGS_2, FIFTH)
          + _attention_cases(ATTENTION_CONFIGS_5, FIFTH))


# Where a matmul block's time goes, on the H200 and in the model:
# * its fixed cost against its steps': the warp-specialized matmul's error
#   grows as its blocks take fewer K steps (-8% to -12% at 32 steps a block,
#   -3% to +4% at 96 and 128), where the fp8 matmul's (one warpgroup,
#   emit_pipeline) does not. The same launches at three K each, 15.5 waves
#   of blocks (8192x8192 outputs), fp8 beside them as the control: a line
#   through each configuration's times gives its cost a block apart from
#   its cost a step;
# * its loads alone (no wgmma, zeros stored): the rate the L2 gives the
#   tiles these blocks share, out of step as they run. The model serves the
#   re-reads of a shared tile at the in-step rate (gpus.l2_shared_bytes_per_s)
#   and has the warp-specialized two-slot rows 8-11% fast and fp8's 64x256
#   tiles at four slots 14-19% fast, rows that move the most bytes a FLOP.
# Predicted in lab/data/blind_predictions_own_families_blocks.json before
# they were measured. Names end " (block study)".
BLOCKS = " (block study)"
WS_CONFIGS_K = ((2, "N", 128, 128, 64, 2), (2, "N", 128, 128, 64, 3),
                (1, "N", 128, 128, 64, 3))
BLOCKS_WS_K = (256, 1024, 4096)
BLOCKS_FP8_K = (512, 1024, 4096)
WS_CONFIGS_LOADS = ((2, "N", 128, 128, 64, 2), (2, "N", 128, 128, 64, 3))
FP8_CONFIGS_LOADS = ((128, 128, 128, 4), (64, 256, 128, 2), (64, 256, 128, 4))


def _loads_only(cases):
  """The cases as their loads alone (mma=False): named "... loads only",
  in a family of their own, no FLOPs."""
  out = []
  for c in cases:
    out.append(_case(f"{c.name[:-len(BLOCKS)]} loads only{BLOCKS}", c.family + " loads only",
                     dict(c.params, mma=False), flops=0.0, bytes=c.bytes, make=c.make))
  return out


def block_study_cases():
  return ([c for k in BLOCKS_WS_K for c in _ws_cases(((8192, k, 8192),), WS_CONFIGS_K, BLOCKS)]
          + [c for k in BLOCKS_FP8_K
             for c in _fp8_cases((8192, k, 8192), ((128, 128, 128, 4),), BLOCKS)]
          + _loads_only(_ws_cases(((4096, 4096, 4096),), WS_CONFIGS_LOADS, BLOCKS))
          + _loads_only(_fp8_cases((8192, 8192, 4096), FP8_CONFIGS_LOADS, BLOCKS)))


# A sixth blind set: kernels of kinds none of the sets above has, written as
# a user would: column sums (g: blocks that each stream a long column run on
# their own, from a quarter of the SMs busy to two blocks an SM), a matmul
# with its epilogue fused (h: bias and SiLU on the accumulator, at a short K
# where the epilogue weighs and a long one) and an elementwise kernel of
# plain GMEM loads and stores (i: no TMA; latency hidden by blocks), predicted
# (lab/data/blind_predictions_own_families_6.json) before any was measured.
# Names end " (blind 6)".
SIXTH = " (blind 6)"
# (tile_m, tile_n, splits, mcs)
COLSUM_CONFIGS_WIDE = ((64, 128, 1, 2), (64, 128, 2, 2), (64, 128, 4, 2), (128, 64, 1, 3),
                       (128, 128, 2, 3), (64, 64, 2, 4), (128, 128, 4, 2), (64, 256, 2, 2))
COLSUM_CONFIGS_TALL = ((64, 128, 8, 2), (64, 128, 16, 2), (128, 128, 8, 3), (64, 64, 4, 4),
                       (64, 64, 8, 2), (128, 64, 8, 2))
# (blocks, tile_m, tile_n, unroll)
GELU_PLAIN_CONFIGS = ((256, 8, 256, 1), (512, 8, 256, 1), (1024, 8, 256, 1),
                      (2048, 8, 256, 1), (512, 8, 256, 2), (512, 16, 256, 1),
                      (1024, 4, 512, 1))
# (tile_m, tile_n, tile_k, mcs, act)
BIAS_ACT_CONFIGS = ((128, 128, 64, 3, "silu"), (128, 128, 64, 3, "none"),
                    (128, 128, 64, 4, "silu"), (128, 128, 128, 2, "silu"),
                    (64, 256, 64, 3, "silu"), (64, 128, 64, 4, "silu"),
                    (128, 64, 64, 4, "silu"))


def sixth_cases():
  return (_colsum_cases((16384, 8192), COLSUM_CONFIGS_WIDE, SIXTH)
          + _colsum_cases((65536, 2048), COLSUM_CONFIGS_TALL, SIXTH)
          + _bias_act_cases((8192, 1024, 8192), BIAS_ACT_CONFIGS, SIXTH)
          + _bias_act_cases((4096, 4096, 4096), BIAS_ACT_CONFIGS, SIXTH)
          + _gelu_plain_cases((16384, 4096), GELU_PLAIN_CONFIGS, SIXTH))


def family_cases():
  """Every case of the families, GPU sizes."""
  return (_ws_cases() + _fp8_cases() + _rows_cases() + _copy_cases() + _fma4_cases()
          + _attention_cases() + second_cases() + third_cases() + fourth_cases()
          + fifth_cases() + block_study_cases() + sixth_cases())


def sim_params(case):
  """The case's parameters at a CPU-simulable size (the same kernel and
  configuration, smaller operands)."""
  p = dict(case.params)
  fam = case.family
  if fam.startswith("own ws_matmul"):
    block_m, block_n = ws_block(p["tile_m"], p["tile_n"], p["consumers"], p["split"])
    p.update(m=block_m, n=2 * block_n, k=(p["mcs"] + 2) * p["tile_k"])
  elif fam.startswith(("own fp8", "own matmul+bias")):
    p.update(m=p["tile_m"], n=2 * p["tile_n"], k=(p["mcs"] + 2) * p["tile_k"])
  elif fam.startswith("own gelu plain"):
    p.update(blocks=2, rows=2 * p["tile_m"], cols=2 * p["tile_n"])
  elif fam.startswith("own colsum"):
    p.update(rows=p["splits"] * (p["mcs"] + 1) * p["tile_m"], cols=2 * p["tile_n"])
  elif fam.startswith(("own rmsnorm", "own softmax")):
    p.update(rows=2 * p["block_m"], cols=(p["mcs"] + 1) * p["tile_n"])
  elif fam.startswith("own tma copy"):
    p.update(blocks=2, rows=2 * p["tile_m"], cols=(p["slots"] + 2) * p["tile_n"])
  elif fam.startswith("own a*b+c*d"):
    p.update(blocks=2, rows=2 * p["tile_m"], cols=(p["mcs"] + 1) * p["tile_n"])
  elif fam.startswith("own attention"):
    p.update(seq=256, heads=2, batch=1)
  return p
