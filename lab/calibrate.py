"""Micro-benchmarks, as Pallas Mosaic GPU kernels, for the hardware figures
the simulator's timing model reads (pallas_sim/gpus.py).

Every figure is measured by a DIFFERENCE: the same kernel is built with an
in-kernel loop of n1 and of n2 iterations (or, for the launch overhead, a
jitted program of n1 and n2 launches), and

    per_iteration = (t(n2) - t(n1)) / (n2 - n1)

so the launch, the prologue and the epilogue cancel. A rate is the work of
one iteration (bytes, flops) over that. Times are device seconds per jitted
call, measured by lab/measure_gpu.py (which runs these on the GPU);
cycles are seconds times the SM clock read with nvidia-smi during the run.

    (a) tma_latency_*   one block, a chain of dependent TMA loads (each awaited
                        before the next): same tile (L2 hit) or a new tile far
                        away each time with L2 flushed between calls (HBM)
    (a') plain_load_*   one block, plain GMEM loads: a dependent scalar chain
                        (j = x[j]) and a loop adding a row each iteration, over
                        16 KiB (L1), 1 MiB (L2) or 256 MiB with L2 flushed (HBM)
    (b) stream_*, copy  all SMs streaming GMEM->SMEM (TMA, 4 slots in flight)
                        from a 1 GiB array; one SM alone; a GMEM->SMEM->GMEM copy
    (c) l2_reuse        all SMs re-reading the same 8 MiB region
    (d) wgmma_*         wgmma loop on one accumulator, operands SMEM-resident,
                        by N and operand type, 1 and 2 blocks per SM, all SMs
    (e) wgmma_lat_*     one block: wgmma then wgmma_wait(0), in a loop
    (f) barrier_pingpong two Pallas threads handing a token over two Barriers
    (g) launch_*        n tiny kernels chained in one jitted program
    (h) spill_*         (d) with a 128xN f32 accumulator, N = 128, 192, 224, 256

`MICROS` is the list; `m.build(n)` gives `Built(fn, args, reference)` at the
GPU sizes, `m.build(n, cpu=True)` a small version for the simulator.

    ./dev python -m lab.calibrate --sim-check [SUBSTRING]

runs each kernel (two small n) in the simulator on the CPU (which also runs
JAX's real Mosaic lowering) against its reference, and prints the simulator's
per-iteration figure beside the model's. On the GPU, measure_gpu.py runs
them (`python3 -m lab.measure_gpu --only-micros --filter SUBSTRING`): this
module is its library and imports nothing of it.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
import threading
from typing import Callable

import numpy as np

from lab.timing_suite import Built  # (a plain dataclass, no side effects)

NUM_SMS = 132
F32 = 4


# ---------------------------------------------------------------------------
# Inputs, memoized (several micro-benchmarks read the same large arrays).
# ---------------------------------------------------------------------------

_ARRAYS = {}
_LOCK = threading.Lock()


def _array(shape, dtype="float32", seed=0, kind="uniform"):
  """A random array (never zeros), cached by its recipe."""
  import jax.numpy as jnp
  key = (tuple(shape), str(dtype), seed, kind)
  with _LOCK:
    return _make_array(key, shape, dtype, seed, kind)


def _make_array(key, shape, dtype, seed, kind):
  import jax.numpy as jnp
  if key not in _ARRAYS:
    rng = np.random.default_rng(seed)
    if kind == "uniform":  # [0.5, 1.5): positive, far from zero
      x = rng.random(shape, dtype=np.float32) + np.float32(0.5)
    elif kind == "normal":  # what a model's data looks like to the tensor cores
      x = rng.standard_normal(shape, dtype=np.float32)
    else:                  # small integers: exact in every operand type here
      x = rng.integers(-3, 4, shape).astype(np.float32)
      x[x == 0] = 1.0
    _ARRAYS[key] = jnp.asarray(x, jnp.dtype(dtype))
  return _ARRAYS[key]


def clear_cache():
  _ARRAYS.clear()


def _flush_l2(junk):
  """A 256 MiB elementwise op (read and write): run between two timed calls,
  it evicts the L2 (50 MiB), so every call of the kernel starts cold. Its own
  time is the same for n1 and n2 and cancels in the difference."""
  return junk * 1.0001 + 1.0


def _cold(fn, x, ref, tol):
  """fn(x) with the L2 flushed after it (_flush_l2): each timed call of the
  kernel starts with nothing of x in the L2."""
  junk = _array((64 << 20,), seed=11)
  return Built(lambda x, junk: (fn(x), _flush_l2(junk)), (x, junk),
               lambda x, junk: ref(x), tol=tol)


# ---------------------------------------------------------------------------
# (a) TMA load latency: a chain of dependent loads, one block.
# ---------------------------------------------------------------------------

def tma_chain(x, *, n, tile_rows, hop):
  """One block loads tile (i * hop) % T of x into SMEM, awaits it, then the
  next: n dependent TMA round trips. Writes the last tile it loaded."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  T = rows // tile_rows

  def body(x_ref, o_ref, smem, bar):
    def step(i, c):
      t = lax.rem(i * hop, T)
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(t * tile_rows, tile_rows)], smem, bar)
      plgpu.barrier_wait(bar)
      return c
    lax.fori_loop(0, n, step, None)
    o_ref[...] = smem[...]

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((tile_rows, cols), x.dtype),
      scratch_types=[plgpu.SMEM((tile_rows, cols), x.dtype), plgpu.Barrier()],
      grid=(1,), grid_names=("b",))(x)


def _build_tma_chain(n, *, tile_rows, cols, hbm, region_mib=None, cpu=False):
  if cpu:
    rows = 16 * tile_rows
  else:                                        # a 256 MiB array, or the region
    rows = ((region_mib or 256) << 20) // (cols * F32)
  T = rows // tile_rows
  # odd and prime to T at the sizes used (256 MiB, and 8 and 48 MiB regions):
  # visits n distinct tiles, or all of a region's
  hop = (T // 16 + 1) | 1 if hbm or region_mib else 0
  x = _array((rows, cols), seed=10)
  last = ((n - 1) * hop) % T
  ref = lambda x, *_: x[last * tile_rows:(last + 1) * tile_rows]
  fn = functools.partial(tma_chain, n=n, tile_rows=tile_rows, hop=hop)
  if hbm and not cpu:
    return _cold(fn, x, ref, 0.0)
  return Built(fn, (x,), ref, tol=0.0)


# ---------------------------------------------------------------------------
# (a') Plain GMEM loads (no TMA), one block: a chain of dependent scalar
# loads (j = x[j]: how a kernel reads page tables, group offsets and indices),
# and a loop adding a 64-float row read in the WGMMA row layout each
# iteration (as a split-K reduction reads its partials).
# ---------------------------------------------------------------------------

def gmem_chain(x, *, n):
  """One block follows n dependent plain loads j = x[j] from GMEM; writes the
  last j (128 copies)."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(x_ref, o_ref):
    j = lax.fori_loop(0, n, lambda i, j: x_ref[j], jnp.int32(0))
    o_ref[...] = jnp.broadcast_to(j, (128,))

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.int32),
                      grid=(1,), grid_names=("b",))(x)


def gmem_rows(x, *, n, hop):
  """One block adds n rows of 64 floats, row (i * hop) % R of x (R, 64), each
  read from GMEM in the WGMMA row layout; writes the sum."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows = x.shape[0]
  lay = plgpu.Layout.WGMMA.reduce(1)

  def body(x_ref, o_ref):
    def step(i, acc):
      r = lax.rem(i * hop, rows)
      return acc + plgpu.load(x_ref.at[r], layout=lay, optimized=False)
    zero = plgpu.layout_cast(jnp.zeros((64,), jnp.float32), lay)
    o_ref[...] = lax.fori_loop(0, n, step, zero)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64,), jnp.float32),
                      grid=(1,), grid_names=("b",))(x)


def _gmem_hop(count, unit):
  """A hop of about count / 16 items of `unit` bytes (count a power of two):
  odd, so prime to count, and landing on a new 128-byte line each time."""
  return count // 16 + (33 if unit < 128 else 1)


GMEM_REGIONS = {"l1": 16 << 10, "l2": 1 << 20, "hbm": 256 << 20}  # bytes


def _build_gmem(n, *, what, where, cpu=False):
  import jax.numpy as jnp
  nbytes = min(GMEM_REGIONS[where], 1 << 20) if cpu else GMEM_REGIONS[where]
  if what == "chain":
    count = nbytes // 4
    hop = _gmem_hop(count, 4)
    x = jnp.asarray((np.arange(count, dtype=np.int64) + hop) % count, jnp.int32)
    j = n * hop % count  # (where n hops from 0 land)
    fn, ref = functools.partial(gmem_chain, n=n), (
        lambda x, *_: jnp.full((128,), j, jnp.int32))
  else:
    rows = nbytes // (64 * F32)
    hop = _gmem_hop(rows, 64 * F32)
    x = _array((rows, 64), seed=12)
    picks = jnp.asarray((np.arange(n) * hop) % rows, jnp.int32)

    def ref(x, *_):  # (traced: the GPU's harness jits it)
      return jnp.take(x, picks, axis=0).sum(0)
    fn = functools.partial(gmem_rows, n=n, hop=hop)
  # (the rows summed in another order than the kernel's: f32 rounding)
  if where == "hbm" and not cpu:
    return _cold(fn, x, ref, 1e-3)
  return Built(fn, (x,), ref, tol=1e-3)


# ---------------------------------------------------------------------------
# (b, c) Streaming GMEM->SMEM with TMA, and a copy through SMEM.
# ---------------------------------------------------------------------------

def _load_ring(n, slots, issue, bars):
  """Loads 0..n-1, issue(i, slot), through a ring of `slots` SMEM buffers:
  `slots` in flight, each awaited (bars[slot]) before its slot is refilled."""
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  for s in range(slots):
    issue(s, s)

  def step(i, c):
    slot = lax.rem(i, slots)
    plgpu.barrier_wait(bars.at[slot])

    @pl.when(i + slots < n)
    def _():
      issue(i + slots, slot)
    return c

  lax.fori_loop(0, n, step, None)


def tma_stream(x, *, n, blocks, tile_rows, slots, region_tiles=None, same=False,
               readers=1, lag=0, swizzle=None, compiler_params=None, grouped=False):
  """Block b loads tiles t = (i * blocks + b) [mod region_tiles] of x, i < n,
  (`same`: t = i mod region_tiles, every block the same tile at once;
  `readers`: groups of that many blocks (b // readers) each read one tile at
  once, t = i * (blocks // readers) + b // readers; `lag`: out of step, the
  group's r-th reader reads at step i what its first read at i + r * lag,
  as a matmul's blocks that share a tile but run apart) into a ring of
  `slots` SMEM buffers (slots loads in flight; `swizzle`: tiled and swizzled
  that many bytes, as a matmul's operands), awaiting each before refilling
  its slot. Writes the last tile each block loaded. `grouped`: the same
  kernel with the group and the reader as grid axes (g, r), b = g * readers
  + r, as the model's analysis of a load's address needs them to see which
  blocks share its tile (b // readers it takes for the block's own); the
  GPU's rows were measured without."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert n >= slots
  R = region_tiles or rows // tile_rows
  assert R * tile_rows <= rows

  groups = blocks // readers
  assert not grouped or groups * readers == blocks

  def body(x_ref, o_ref, smem, bars):
    if grouped:
      g, r = lax.axis_index("g"), lax.axis_index("r")
      b = g * readers + r
    else:
      b = lax.axis_index("b")

    def issue(i, slot):
      # (the group and reader worked out here, as the pinned model figures
      # were: the model does not hoist a loop's invariant scalars, the GPU
      # does; and no term in the reader without a lag, or the model's
      # analysis would take the readers for apart)
      grp, rdr = (g, r) if grouped else (b // readers, lax.rem(b, readers) if lag else 0)
      step = i + rdr * lag if lag else i
      t = lax.rem(i if same else step * groups + grp, R)
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(t * tile_rows, tile_rows)],
                              smem.at[slot], bars.at[slot])

    _load_ring(n, slots, issue, bars)
    with jax.named_scope("epilogue"):  # (a profiled run's block end: pipeline_trace)
      if swizzle:  # (a swizzled tile goes out as it came in: TMA)
        plgpu.copy_smem_to_gmem(smem.at[(n - 1) % slots], o_ref.at[b])
        plgpu.wait_smem_to_gmem(0)
      else:
        o_ref[b] = smem[(n - 1) % slots]

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks, tile_rows, cols), x.dtype),
      scratch_types=[plgpu.SMEM((slots, tile_rows, cols), x.dtype,
                                **(_mma_transforms((tile_rows, cols), x.dtype, swizzle)
                                   if swizzle else {})),
                     plgpu.Barrier(num_barriers=slots)],
      grid=(groups, readers) if grouped else (blocks,),
      grid_names=("g", "r") if grouped else ("b",), compiler_params=compiler_params)(x)


def _stream_ref(x, *, n, blocks, tile_rows, region_tiles=None, same=False, readers=1,
                lag=0):
  import jax.numpy as jnp
  rows, cols = x.shape
  R = region_tiles or rows // tile_rows
  ts = [((n - 1) if same else ((n - 1 + b % readers * lag) * (blocks // readers)
                               + b // readers)) % R
        for b in range(blocks)]
  return jnp.stack([x[t * tile_rows:(t + 1) * tile_rows] for t in ts])


def _build_stream(n, *, blocks, tile_rows, cols, slots, n_max, region_mib=None,
                  flush=False, same=False, readers=1, lag=0, swizzle=None, cpu=False):
  if cpu:  # (cpu_n runs up to slots + 2: eight slots take ten loads)
    blocks, n_max = min(blocks, 2), 16
    readers = min(readers, blocks)
    assert n <= n_max
    region_tiles = 3 if region_mib else None
  else:
    region_tiles = (region_mib << 20) // (tile_rows * cols * F32) if region_mib else None
  # The array holds every tile read (or just the region re-read).
  rows = (region_tiles or blocks * n_max) * tile_rows
  x = _array((rows, cols), seed=12)
  kw = dict(n=n, blocks=blocks, tile_rows=tile_rows, region_tiles=region_tiles,
            same=same, readers=readers, lag=lag)
  fn = functools.partial(tma_stream, slots=slots, swizzle=swizzle, **kw)
  ref = functools.partial(_stream_ref, **kw)
  if flush and not cpu:
    return _cold(fn, x, ref, 0.0)
  return Built(fn, (x,), ref, tol=0.0)


def stream_case(mib, per_sm, slots, tile_rows, cols, swizzle, n=2000, readers=12):
  """Every SM streaming tiles that groups of `readers` blocks share, over a
  region of `mib` MiB (pipeline_trace.py --stream-case, ncu_sections.py
  "stream ..."): n loads a block, per_sm blocks an SM. Built(fn, args); fn
  takes compiler_params too (a profiled run)."""
  return _build_stream(n, blocks=NUM_SMS * per_sm, tile_rows=tile_rows, cols=cols,
                       slots=slots, n_max=n, region_mib=mib, readers=readers,
                       swizzle=swizzle)


def tma_panel(x, *, n, blocks, tile_rows, box_cols, slots, swizzle=None):
  """Block b walks its own panel of x (rows b * tile_rows on) along the
  columns, one (tile_rows, box_cols) box a load, `slots` in flight: how a
  matmul reads its A tiles, each box row box_cols elements of a long row.
  Past the panel's end it starts again at its first column (x small enough
  for the L2: the loads hit there). Writes each block's last box (TMA
  store)."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  assert n >= slots
  per_row = x.shape[1] // box_cols

  def body(x_ref, o_ref, smem, bars):
    b = lax.axis_index("b")

    def issue(i, slot):
      c = lax.rem(i, per_row)
      plgpu.copy_gmem_to_smem(
          x_ref.at[pl.ds(b * tile_rows, tile_rows), pl.ds(c * box_cols, box_cols)],
          smem.at[slot], bars.at[slot])

    _load_ring(n, slots, issue, bars)
    plgpu.copy_smem_to_gmem(smem.at[(n - 1) % slots], o_ref.at[b])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks, tile_rows, box_cols), x.dtype),
      # (swizzle: SMEM tiled and swizzled as a matmul's operand tiles are, each
      # box row `swizzle` bytes)
      scratch_types=[plgpu.SMEM((slots, tile_rows, box_cols), x.dtype,
                                **(_mma_transforms((tile_rows, box_cols), x.dtype, swizzle)
                                   if swizzle else {})),
                     plgpu.Barrier(num_barriers=slots)],
      grid=(blocks,), grid_names=("b",))(x)


def tma_panel_copy(x, *, n, blocks, tile_rows, box_cols, slots):
  """out = x[:, :n * box_cols]: block b walks its own
  panel (rows b * tile_rows on) along the columns, each (tile_rows,
  box_cols) box loaded by TMA (`slots` in flight) and stored back by TMA
  to the same place in out; a slot is refilled once its store has read
  it. The stores' rows are as strided as the loads'."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  assert n >= slots

  def body(x_ref, o_ref, smem, bars):
    b = lax.axis_index("b")
    box = lambda ref, i: ref.at[pl.ds(b * tile_rows, tile_rows), pl.ds(i * box_cols, box_cols)]

    def issue(i, slot):
      plgpu.copy_gmem_to_smem(box(x_ref, i), smem.at[slot], bars.at[slot])

    for s in range(slots):
      issue(s, s)

    def step(i, c):
      slot = lax.rem(i, slots)
      plgpu.barrier_wait(bars.at[slot])
      plgpu.copy_smem_to_gmem(smem.at[slot], box(o_ref, i))

      @pl.when(i + slots < n)
      def _():
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        issue(i + slots, slot)
      return c

    lax.fori_loop(0, n, step, None)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((x.shape[0], n * box_cols), x.dtype),
      scratch_types=[plgpu.SMEM((slots, tile_rows, box_cols), x.dtype),
                     plgpu.Barrier(num_barriers=slots)],
      grid=(blocks,), grid_names=("b",))(x)


def _build_panel_copy(n, *, blocks, box_cols, cols, slots, tile_rows=64, dtype="float16",
                      cpu=False):
  if cpu:
    blocks, cols = 2, max(16, n) * box_cols
  x = _array((blocks * tile_rows, cols), dtype=dtype, seed=15)
  w = n * box_cols
  return Built(functools.partial(tma_panel_copy, n=n, blocks=blocks, tile_rows=tile_rows,
                                 box_cols=box_cols, slots=slots),
               (x,), lambda x: x[:, :w], tol=0.0)


def _build_panel(n, *, blocks, box_cols, cols, slots, dtype="float16", tile_rows=128,
                 swizzle=None, cpu=False):
  import jax.numpy as jnp
  if cpu:
    blocks, cols = 2, 16 * box_cols
  x = _array((blocks * tile_rows, cols), dtype=dtype, seed=14)
  c = (n - 1) % (cols // box_cols)
  ref = lambda x: jnp.stack([x[b * tile_rows:(b + 1) * tile_rows,
                               c * box_cols:(c + 1) * box_cols] for b in range(blocks)])
  return Built(functools.partial(tma_panel, n=n, blocks=blocks, tile_rows=tile_rows,
                                 box_cols=box_cols, slots=slots, swizzle=swizzle),
               (x,), ref, tol=0.0)


def tma_copy(x, *, n, blocks, tile_rows, slots):
  """out = x[:n * blocks tiles]: block b copies tiles i * blocks + b, i < n,
  GMEM -> SMEM (TMA load, `slots` in flight) -> GMEM (TMA store, one in
  flight: a slot is refilled once the store that read it has read it)."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert n >= slots

  def body(x_ref, o_ref, smem, bars):
    b = lax.axis_index("b")
    tile = lambda i: pl.ds((i * blocks + b) * tile_rows, tile_rows)

    def issue(i, slot):
      plgpu.copy_gmem_to_smem(x_ref.at[tile(i)], smem.at[slot], bars.at[slot])

    for s in range(slots):
      issue(s, s)

    def step(i, c):
      slot = lax.rem(i, slots)
      plgpu.barrier_wait(bars.at[slot])
      plgpu.copy_smem_to_gmem(smem.at[slot], o_ref.at[tile(i)])
      # The store of step i - 1 has read its slot: refill it.
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)

      @pl.when(jnp_logical_and(i >= 1, i - 1 + slots < n))
      def _():
        issue(i - 1 + slots, lax.rem(i - 1 + slots, slots))
      return c

    lax.fori_loop(0, n, step, None)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((n * blocks * tile_rows, cols), x.dtype),
      scratch_types=[plgpu.SMEM((slots, tile_rows, cols), x.dtype),
                     plgpu.Barrier(num_barriers=slots)],
      grid=(blocks,), grid_names=("b",))(x)


def jnp_logical_and(a, b):
  import jax.numpy as jnp
  return jnp.logical_and(a, b)


def _build_copy(n, *, blocks, tile_rows, cols, slots, n_max, cpu=False):
  if cpu:
    blocks, n_max = 2, 8
  x = _array((blocks * n_max * tile_rows, cols), seed=13)
  m = n * blocks * tile_rows
  return Built(functools.partial(tma_copy, n=n, blocks=blocks, tile_rows=tile_rows,
                                 slots=slots),
               (x,), lambda x: x[:m], tol=0.0)


# ---------------------------------------------------------------------------
# (d, e, h) wgmma throughput and latency.
# ---------------------------------------------------------------------------

# Operand type -> (jnp dtype name, K per wgmma call = one 128-byte swizzle
# row, B stored (N, K) and passed transposed: 8- and 32-bit operands must be
# K-minor in SMEM).
WGMMA_TYPES = {
    "f16": ("float16", 64, False),
    "bf16": ("bfloat16", 64, False),
    "fp8": ("float8_e4m3fn", 128, True),
    "tf32": ("float32", 32, True),
}


def wgmma_steps(a_ref, b_ref, a_s, b_s, bar, acc, n, wait=1, b_transposed=False):
  """A and B into SMEM (one TMA load each, on `bar`), then n times
  `wgmma(acc, A, B)` + `wgmma_wait(wait)`, then all awaited: the loop the
  wgmma micro-benchmarks (and tests/test_timing_model.py) time."""
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
  plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
  plgpu.barrier_wait(bar)
  b_op = b_s.T if b_transposed else b_s

  def step(i, c):
    plgpu.wgmma(acc, a_s, b_op)
    plgpu.wgmma_wait(wait)
    return c
  lax.fori_loop(0, n, step, None)
  plgpu.wgmma_wait(0)


def wgmma_loop(a, b, *, n, blocks, wait, b_transposed, pad_kib=0):
  """Each block: A (M, K) and B SMEM-resident (one TMA load each), then n
  times `wgmma(acc, A, B)` on one (M, N) f32 accumulator followed by
  `wgmma_wait(wait)` (wait=1: one group left in flight, as pipelined kernels
  do; wait=0: each wgmma awaited, the latency). out[b] = n * (A @ B).
  pad_kib: that much more SMEM, unused, which takes its size out of the
  SM's L1 (they share 256 KiB): where spilled registers go."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a.shape
  nn = b.shape[0] if b_transposed else b.shape[1]
  isz = jnp.dtype(a.dtype).itemsize
  # (the swizzle of K's bytes, up to 128, for both operands: a K=32 f16 A
  # has 64-byte rows, as the quickstart's tile_k=32 A tiles do)
  swz = min(128, k * isz)
  T = lambda x: _mma_transforms(x.shape, x.dtype, swz)

  def body(a_ref, b_ref, o_ref, a_s, b_s, acc, bar, *pad):
    wgmma_steps(a_ref, b_ref, a_s, b_s, bar, acc, n, wait, b_transposed)
    o_ref[lax.axis_index("b")] = acc[...]

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks, m, nn), jnp.float32),
      scratch_types=[plgpu.SMEM(a.shape, a.dtype, **T(a)), plgpu.SMEM(b.shape, b.dtype, **T(b)),
                     plgpu.ACC((m, nn), jnp.float32), plgpu.Barrier(num_arrivals=2)]
      + ([plgpu.SMEM((pad_kib * 8, 64), jnp.float16)] if pad_kib else []),
      grid=(blocks,), grid_names=("b",))(a, b)


def _build_wgmma(n, *, dtype, N, M=128, bps=1, wait=1, blocks=None, pad_kib=0,
                 data="int", cpu=False):
  import jax
  import jax.numpy as jnp
  name, K, bt = WGMMA_TYPES[dtype]
  if blocks is None:
    blocks = NUM_SMS * bps
  if cpu:
    blocks = min(blocks, 2)
  # data="int": small integers (exact sums: the check is the timed run);
  # "normal": random normal operands, whose bits toggle as real data's do
  # (the tensor cores' power, hence the clock, depends on them), checked on
  # the integer operands.
  a = _array((M, K), name, seed=20, kind=data)
  b = _array((N, K) if bt else (K, N), name, seed=21, kind=data)

  def ref(a, b):
    af = a.astype(jnp.float32)
    bf = b.astype(jnp.float32)
    p = jnp.dot(af, bf.T if bt else bf, precision=jax.lax.Precision.HIGHEST)
    return jnp.broadcast_to(p * n, (blocks, M, N))

  check = None
  if dtype == "fp8":
    # The tensor core sums fp8 products in fewer bits than f32 (the H200
    # drifts far from an f32 sum over thousands of accumulations of random
    # data), so the check runs the same kernel on inputs whose every partial
    # sum is exact there: each row of A has one +-1, B holds +-1 and +-0.5.
    rng = np.random.default_rng(22)
    a_chk = np.zeros((M, K), np.float32)
    a_chk[np.arange(M), rng.integers(0, K, M)] = rng.choice([-1.0, 1.0], M)
    b_chk = rng.choice([-1.0, -0.5, 0.5, 1.0], (N, K) if bt else (K, N))
    check = (jnp.asarray(a_chk, name), jnp.asarray(b_chk.astype(np.float32), name))
  elif data != "int":
    check = (_array((M, K), name, seed=20, kind="int"),
             _array((N, K) if bt else (K, N), name, seed=21, kind="int"))
  return Built(functools.partial(wgmma_loop, n=n, blocks=blocks, wait=wait,
                                 b_transposed=bt, pad_kib=pad_kib), (a, b), ref, tol=1e-6,
               check_args=check)


# ---------------------------------------------------------------------------
# (e') SMEM under a wgmma: one warpgroup's wgmma loop on SMEM-resident
# operands beside another's TMA loads into SMEM, of one tile every block
# reads (the L2's fast shared path): does either slow the other?
# ---------------------------------------------------------------------------

# 16 KiB loads per wgmma: 2 take about a 128x128x64 wgmma's time at the ~50
# B/clk that 4 in flight get (H200); the micro-benchmarks run both 2 and 6.
SMEM_LOADS_PER_WGMMA = (2, 6)


def _mma_transforms(shape, dtype, swizzle=None):
  """SMEM transforms for a wgmma operand of this shape: `swizzle` bytes, or
  the widest its rows allow (128; 64 for a K=32 f16 A), as Mosaic's
  find_swizzle."""
  import jax.numpy as jnp
  from jax.experimental.pallas import mosaic_gpu as plgpu
  bits = jnp.dtype(dtype).itemsize * 8
  swz = swizzle or plgpu.find_swizzle(shape[1] * bits, "micro-benchmark operand")
  return dict(transforms=(plgpu.TilingTransform((8, swz * 8 // bits)),
                          plgpu.SwizzleTransform(swz)))


def wgmma_beside_loads(a, b, x, *, n, blocks, mode, per, slots=4, x_swizzle=None):
  """Thread 0: A, B into SMEM once, then n x (wgmma 128x128x64 + wgmma_wait(1))
  unless mode == "loads"; thread 1: n * per TMA loads of
  x's first 16 KiB tile into a ring of `slots` (each awaited before its slot
  is refilled) unless mode == "wgmma". Output per block: n * A @ B (or
  zeros) above the ring's last tile (or zeros)."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a.shape
  nn = b.shape[1]
  rows, cols = x.shape
  loads = n * per
  swz = min(128, k * a.dtype.itemsize)

  def body(a_ref, b_ref, x_ref, o_ref, a_s, b_s, ring, bar, bars):
    blk = lax.axis_index("b")
    t = lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      def compute(acc):
        if mode != "loads":
          wgmma_steps(a_ref, b_ref, a_s, b_s, bar, acc, n)
        o_ref[blk, pl.ds(0, m)] = acc[...]
      pl.run_scoped(compute, plgpu.ACC((m, nn), jnp.float32))

    @pl.when(t == 1)
    def _():
      if mode != "wgmma":
        def issue(i, slot):
          plgpu.copy_gmem_to_smem(x_ref, ring.at[slot], bars.at[slot])
        _load_ring(loads, slots, issue, bars)
        o_ref[blk, pl.ds(m, rows)] = ring[(loads - 1) % slots].astype(jnp.float32)
      else:
        o_ref[blk, pl.ds(m, rows)] = jnp.zeros((rows, cols), jnp.float32)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks, m + rows, nn), jnp.float32),
      # (one swizzle for both, K's bytes up to 128: a K=32 f16 B takes A's 64)
      scratch_types=[plgpu.SMEM(a.shape, a.dtype, **_mma_transforms(a.shape, a.dtype, swz)),
                     plgpu.SMEM(b.shape, b.dtype, **_mma_transforms(b.shape, b.dtype, swz)),
                     # (x_swizzle: the ring's rows as TMA boxes of that many
                     # bytes, as a swizzled matmul tile is loaded)
                     plgpu.SMEM((slots, rows, cols), x.dtype,
                                **(_mma_transforms(x.shape, x.dtype, x_swizzle)
                                   if x_swizzle else {})),
                     plgpu.Barrier(num_arrivals=2), plgpu.Barrier(num_barriers=slots)],
      grid=(blocks,), grid_names=("b",), num_threads=2, thread_name="t")(a, b, x)


def _build_smem(n, *, mode, per, k=64, x_swizzle=None, bps=1, blocks=None, cpu=False):
  import jax
  import jax.numpy as jnp
  blocks = blocks or bps * NUM_SMS
  if cpu:
    blocks = min(blocks, 2)
  a = _array((128, k), "float16", seed=40, kind="normal")
  b = _array((k, 128), "float16", seed=41, kind="normal")
  # 16 KiB: f32 rows of 512 bytes, or f16 rows loaded as x_swizzle-byte boxes
  x = (_array((64, 128), "float16", seed=42) if x_swizzle
       else _array((32, 128), "float32", seed=42))

  def ref(a, b, x):
    p = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32),
                precision=jax.lax.Precision.HIGHEST) * n
    z = jnp.zeros((blocks, 128, 128), jnp.float32)
    return jnp.concatenate([z if mode == "loads" else z + p,
                            jnp.zeros((blocks,) + x.shape, jnp.float32)
                            + (0 if mode == "wgmma" else x.astype(jnp.float32))], axis=1)
  return Built(functools.partial(wgmma_beside_loads, n=n, blocks=blocks, mode=mode,
                                 per=per, x_swizzle=x_swizzle),
               (a, b, x), ref, tol=1e-3)


# ---------------------------------------------------------------------------
# (e'') A wgmma whose A comes from registers, as a mixed-type matmul feeds it
# (JAX's hopper_mixed_type_matmul_mgpu: an int8 tile loaded from SMEM,
# converted to bf16 in registers, wgmma, wgmma_wait(0)), in 1 or 2 warpgroups
# a block: what the load, the conversion and the register operand cost.
# ---------------------------------------------------------------------------

REGA_MODES = {
    "int8": "A int8 SMEM -> registers, to bf16, wgmma, wgmma_wait(0)",
    "bf16": "A bf16 SMEM -> registers, wgmma, wgmma_wait(0)",
    "smem": "A bf16 from SMEM (no registers), wgmma, wgmma_wait(0)",
    "int8_convert": "A int8 SMEM -> registers, to bf16, no wgmma (a running max in registers)",
    "bf16_load": "A bf16 SMEM -> registers, no wgmma (a running max in registers)",
}


def wgmma_register_a(a, b, *, n, blocks, mode, wgs):
  """Each of `wgs` warpgroups of a block: n x (A from SMEM into registers
  (int8 converted to bf16), wgmma(acc, A, B) with B in SMEM, wgmma_wait(0));
  or the wgmma from SMEM alone ("smem"), or the load (and conversion) alone,
  a running maximum of its values kept in registers so that it is not
  dropped. Output per block and warpgroup: the accumulator (n * A @ B), or
  the maximum (A) in the first 64 columns."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a.shape
  nn = b.shape[1]
  bf16 = jnp.bfloat16

  # A is in SMEM twice and iteration i reads copy i % 2: a load whose
  # address changes is not hoisted out of the loop.
  def a_tile(a_s, i):
    return a_s.at[pl.ds(lax.rem(i, 2) * m, m)]

  def body(a_ref, b_ref, o_ref, a_s, b_s, bar):
    blk = lax.axis_index("b")
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      plgpu.copy_gmem_to_smem(a_ref, a_s.at[pl.ds(0, m)], bar)
      plgpu.copy_gmem_to_smem(a_ref, a_s.at[pl.ds(m, m)], bar)
      plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    plgpu.barrier_wait(bar)

    if mode in ("int8_convert", "bf16_load"):
      def step(i, c):  # (a max: one ALU op an element, exact in bf16)
        return jnp.maximum(c, a_tile(a_s, i)[...].astype(bf16))
      tot = lax.fori_loop(0, n, step, jnp.full((m, k), -1e30, bf16))
      o_ref[blk, wg, :, pl.ds(0, k)] = tot.astype(jnp.float32)
      o_ref[blk, wg, :, pl.ds(k, nn - k)] = jnp.zeros((m, nn - k), jnp.float32)
      return

    def compute(acc):
      def step(i, c):
        lhs = a_tile(a_s, i) if mode == "smem" else a_tile(a_s, i)[...].astype(bf16)
        plgpu.wgmma(acc, lhs, b_s)
        plgpu.wgmma_wait(0)
        return c
      lax.fori_loop(0, n, step, None)
      o_ref[blk, wg] = acc[...]
    pl.run_scoped(compute, plgpu.ACC((m, nn), jnp.float32))

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks, wgs, m, nn), jnp.float32),
      scratch_types=[plgpu.SMEM((2 * m, k), a.dtype, **_mma_transforms(a.shape, a.dtype)),
                     plgpu.SMEM(b.shape, b.dtype, **_mma_transforms(b.shape, b.dtype)),
                     plgpu.Barrier(num_arrivals=3)],
      grid=(blocks,), grid_names=("b",), num_threads=wgs, thread_name="wg",
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup))(a, b)


def _build_rega(n, *, mode, wgs, blocks=None, cpu=False):
  import jax
  import jax.numpy as jnp
  blocks = blocks or NUM_SMS
  if cpu:
    blocks = min(blocks, 2)
  a_dtype = "int8" if mode.startswith("int8") else "bfloat16"
  a = _array((128, 64), a_dtype, seed=50, kind="int")
  b = _array((64, 128), "bfloat16", seed=51, kind="int")

  def ref(a, b):
    af = a.astype(jnp.float32)
    if mode in ("int8_convert", "bf16_load"):
      out = jnp.concatenate([af, jnp.zeros((128, 64), jnp.float32)], axis=1)
    else:
      out = jnp.dot(af, b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST) * n
    return jnp.broadcast_to(out, (blocks, wgs, 128, 128))
  return Built(functools.partial(wgmma_register_a, n=n, blocks=blocks, mode=mode,
                                 wgs=wgs), (a, b), ref, tol=1e-6)


# ---------------------------------------------------------------------------
# (e''') A row kernel's body without its pipeline: a warpgroup's bf16 tile
# loaded from SMEM in the WGMMA layout, scaled in f32 and stored back to SMEM
# (RMSnorm's and softmax's second pass, which the H200 runs in about 1.6
# times the model's cycles: lab/data/rows_trace_h200.json), or only loaded,
# or only stored. The scratch has no transforms, as emit_pipeline's slots
# have none: the lowering gives it its own swizzle and transfer plan.
# ---------------------------------------------------------------------------

SMEM_RW_MODES = {
    "load": "tile SMEM -> registers (f32), a running max",
    "store": "a register tile negated (f32) and stored to SMEM as bf16",
    "rw": "tile SMEM -> registers (f32), negated, stored back to SMEM as bf16",
    # RMSnorm's second body itself: beside "rw", the row vector (w's tile,
    # loaded from SMEM each step) and the column vector (a row statistic)
    # broadcast into two multiplies; whether the H200's 1.6x is this body's
    # own work or the pipeline's TMA beside it
    "scale": "tile and a row vector SMEM -> registers (f32), x * inv[:, None] * "
             "w[None, :], stored back to SMEM as bf16 (RMSnorm's second body)",
}


def smem_rewrite(x, w=None, *, n, blocks, mode):
  """Each block: x (rows, cols) bf16 into both SMEM slots by TMA, then n
  iterations of `mode` over the two slots (iteration i reads slot i % 2 and
  writes the other, so that no load or store is the same address twice
  running; negation is exact). Each iteration ends in commit_smem, as a row
  kernel's body ends before its pipeline's TMA: the fence also keeps the
  compiler from moving loads or stores out of the loop. Output per block:
  the slot the last iteration wrote, as f32 ("load": the running max).
  "scale" (`w`, (cols,) bf16 of ones, in SMEM beside x): the statistic is
  -1 from data (a sum of the tile times 0, less 1), so that each step is
  an exact negation the compiler cannot see."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  tile = plgpu.Layout.WGMMA

  scale = mode == "scale"

  def body(x_ref, *refs):
    if scale:
      w_ref, o_ref, buf, wbuf, bar = refs
      plgpu.copy_gmem_to_smem(w_ref, wbuf, bar)
    else:
      o_ref, buf, bar = refs
    blk = lax.axis_index("b")
    for slot in range(2):
      plgpu.copy_gmem_to_smem(x_ref, buf.at[slot], bar)
    plgpu.barrier_wait(bar)

    def load(i):
      return plgpu.load(buf.at[lax.rem(i, 2)], layout=tile).astype(jnp.float32)
    if mode == "load":
      def look(i, m):
        m = jnp.maximum(m, load(i))
        plgpu.commit_smem()
        return m
      init = plgpu.layout_cast(jnp.full((rows, cols), -1e30, jnp.float32), tile)
      o_ref[blk] = lax.fori_loop(0, n, look, init)
      return

    if scale:
      inv = jnp.sum(load(0) * 0.0, axis=1) - 1.0

    def step(i, v):
      if scale:
        g = plgpu.load(wbuf, layout=tile.reduce(0)).astype(jnp.float32)
        v = load(i) * inv[:, None] * g[None, :]
      else:
        v = -(load(i) if mode == "rw" else v)
      buf[lax.rem(i + 1, 2)] = v.astype(buf.dtype)
      plgpu.commit_smem()
      return v
    lax.fori_loop(0, n, step, load(0))
    o_ref[blk] = buf[lax.rem(n, 2)].astype(jnp.float32)

  scratch = [plgpu.SMEM((2, rows, cols), x.dtype)]
  scratch += [plgpu.SMEM((cols,), x.dtype)] if scale else []
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks, rows, cols), jnp.float32),
      scratch_types=scratch + [plgpu.Barrier(num_arrivals=3 if scale else 2)],
      grid=(blocks,), grid_names=("b",))(x, *(() if w is None else (w,)))


def _build_smem_rw(n, *, mode, rows, cols, bps=1, cpu=False):
  import jax.numpy as jnp
  blocks = 2 if cpu else bps * NUM_SMS
  x = _array((rows, cols), "bfloat16", seed=60, kind="int")

  args = (x, jnp.ones((cols,), jnp.bfloat16)) if mode == "scale" else (x,)

  def ref(x, *_):
    xf = x.astype(jnp.float32)
    return jnp.broadcast_to(xf if mode == "load" else xf * (-1.0) ** n,
                            (blocks, rows, cols))
  return Built(functools.partial(smem_rewrite, n=n, blocks=blocks, mode=mode), args, ref,
               tol=0)


# ALU work in one warpgroup beside another's wgmma loop (its A from SMEM, or
# from registers): does it slow down? WG1 runs `reps` iterations of its work
# for each of WG0's wgmma iterations.
BESIDE_WORK = {
    "convert": "a running max of an int8 128x64 tile converted to bf16",
    "fma": "v * 0.999 + 0.001 on 128x64 f32 in registers",
    "exp": "v = exp(-v) on 128x64 f32 in registers",
}
# (each more than a wgmma's time alone, so that a slowdown shows)
BESIDE_REPS = {"convert": 3, "fma": 16, "exp": 2}


def alu_beside_wgmma(a8, a16, b, *, n, blocks, wgmma, work):
  """WG0: n x (wgmma(acc, A, B) + wgmma_wait(0)), A bf16 from SMEM
  (wgmma="smem") or loaded into registers ("bf16"), or nothing ("none");
  WG1: reps * n iterations of `work` (BESIDE_WORK). Output per block: WG0's
  accumulator, then WG1's result in the first 64 columns."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a16.shape
  nn = b.shape[1]
  reps = BESIDE_REPS[work]
  tile = lambda ref, i: ref.at[pl.ds(lax.rem(i, 2) * m, m)]  # (not hoisted)

  def body(a8_ref, a16_ref, b_ref, o_ref, a8_s, a16_s, b_s, bar):
    blk = lax.axis_index("b")
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      for half in (0, 1):
        plgpu.copy_gmem_to_smem(a8_ref, a8_s.at[pl.ds(half * m, m)], bar)
        plgpu.copy_gmem_to_smem(a16_ref, a16_s.at[pl.ds(half * m, m)], bar)
      plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    plgpu.barrier_wait(bar)

    @pl.when(wg == 0)
    def _():
      def compute(acc):
        def step(i, c):
          lhs = tile(a16_s, i) if wgmma == "smem" else tile(a16_s, i)[...]
          plgpu.wgmma(acc, lhs, b_s)
          plgpu.wgmma_wait(0)
          return c
        if wgmma != "none":
          lax.fori_loop(0, n, step, None)
        o_ref[blk, 0] = acc[...]
      pl.run_scoped(compute, plgpu.ACC((m, nn), jnp.float32))

    @pl.when(wg == 1)
    def _():
      if work == "convert":
        def step(i, c):
          return jnp.maximum(c, tile(a8_s, i)[...].astype(jnp.bfloat16))
        init = jnp.full((m, k), -1e30, jnp.bfloat16)
      else:  # (from A's values: a constant would be one register a lane, a splat)
        init = tile(a16_s, 0)[...].astype(jnp.float32)
        if work == "fma":
          def step(i, c):
            return c * 0.999 + 0.001
        else:
          def step(i, c):
            return jnp.exp(-c)
      r = lax.fori_loop(0, reps * n, step, init)
      o_ref[blk, 1, :, pl.ds(0, k)] = r.astype(jnp.float32)
      o_ref[blk, 1, :, pl.ds(k, nn - k)] = jnp.zeros((m, nn - k), jnp.float32)

  T = lambda x: _mma_transforms(x.shape, x.dtype)
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((blocks, 2, m, nn), jnp.float32),
      scratch_types=[plgpu.SMEM((2 * m, k), a8.dtype, **T(a8)),
                     plgpu.SMEM((2 * m, k), a16.dtype, **T(a16)),
                     plgpu.SMEM(b.shape, b.dtype, **T(b)),
                     plgpu.Barrier(num_arrivals=5)],
      grid=(blocks,), grid_names=("b",), num_threads=2, thread_name="wg",
      compiler_params=plgpu.CompilerParams(
          lowering_semantics=plgpu.LoweringSemantics.Warpgroup))(a8, a16, b)


def _build_beside(n, *, wgmma, work, blocks=None, cpu=False):
  import jax
  import jax.numpy as jnp
  blocks = blocks or NUM_SMS
  if cpu:
    blocks = min(blocks, 2)
  a8 = _array((128, 64), "int8", seed=52, kind="int")
  a16 = _array((128, 64), "bfloat16", seed=53, kind="int")
  b = _array((64, 128), "bfloat16", seed=54, kind="int")
  reps = BESIDE_REPS[work]

  def ref(a8, a16, b):
    acc = (jnp.zeros((128, 128), jnp.float32) if wgmma == "none" else
           jnp.dot(a16.astype(jnp.float32), b.astype(jnp.float32),
                   precision=jax.lax.Precision.HIGHEST) * n)
    if work == "convert":
      r = a8.astype(jnp.float32)
    else:  # (the same f32 recurrence, in f32)
      f = (lambda i, c: c * 0.999 + 0.001) if work == "fma" else (lambda i, c: jnp.exp(-c))
      r = jax.lax.fori_loop(0, reps * n, f, a16.astype(jnp.float32))
    r = jnp.concatenate([r, jnp.zeros((128, 64), jnp.float32)], axis=1)
    return jnp.broadcast_to(jnp.stack([acc, r]), (blocks, 2, 128, 128))
  return Built(functools.partial(alu_beside_wgmma, n=n, blocks=blocks, wgmma=wgmma,
                                 work=work), (a8, a16, b), ref, tol=1e-4)


# ---------------------------------------------------------------------------
# (f) Barrier round trip between two Pallas threads.
# ---------------------------------------------------------------------------

def _ping_or_pong(n, first, send, recv):
  """n rounds of send(0) then recv(1) (the ping: `first`), or recv(0) then
  send(1) (the pong); the rounds counted, as an f32."""
  import jax.numpy as jnp
  from jax import lax

  def step(i, c):
    if first:
      send(0)
      recv(1)
    else:
      recv(0)
      send(1)
    return c + 1.0
  return lax.fori_loop(0, n, step, jnp.float32(0))


def barrier_pingpong(x, *, n):
  """Thread 0 arrives on bars[0] and waits on bars[1]; thread 1 waits on
  bars[0] and arrives on bars[1]: n round trips. Each thread then writes
  x + (round trips it counted)."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(x_ref, o_ref, bars):
    def play(t, arrive_first):
      """Thread t: arrive on bars[0] then wait on bars[1] (the ping), or
      the other way round (the pong), n times."""
      send = lambda k: plgpu.barrier_arrive(bars.at[k])
      recv = lambda k: plgpu.barrier_wait(bars.at[k])
      o_ref[t] = x_ref[t] + _ping_or_pong(n, arrive_first, send, recv)

    t = lax.axis_index("t")
    pl.when(t == 0)(lambda: play(0, True))
    pl.when(t == 1)(lambda: play(1, False))

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
      scratch_types=[plgpu.Barrier(num_barriers=2)],
      num_threads=2, thread_name="t")(x)


def _build_pingpong(n, cpu=False):
  x = _array((2, 128), seed=30)
  return Built(functools.partial(barrier_pingpong, n=n), (x,), lambda x: x + n,
               tol=0.0)


def semaphore_pingpong(x, *, n):
  """Two blocks (on two SMs) hand a token back and forth n times through two
  global semaphores: block 0 signals sems[0] and waits on sems[1], block 1
  waits on sems[0] and signals sems[1]. Each block then writes x + (round
  trips it counted)."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(x_ref, o_ref):
    sems = pl.get_global(plgpu.SemaphoreType.REGULAR((2,)))
    b = lax.axis_index("b")

    def play(first):
      return _ping_or_pong(n, first, lambda k: pl.semaphore_signal(sems.at[k]),
                           lambda k: pl.semaphore_wait(sems.at[k]))

    pl.when(b == 0)(lambda: o_ref.__setitem__(0, x_ref[0] + play(True)))
    pl.when(b == 1)(lambda: o_ref.__setitem__(1, x_ref[1] + play(False)))

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                      grid=(2,), grid_names=("b",))(x)


def semaphore_signals(x, *, n):
  """One block signals a global semaphore n times in a row, then waits for
  all n (one wait, decrementing them): what a signal holds its own thread,
  apart from the hand-off it starts (sem_pingpong). Writes x + n."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(x_ref, o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)

    def step(i, c):
      pl.semaphore_signal(sem)
      return c + 1.0
    count = lax.fori_loop(0, n, step, jnp.float32(0))
    pl.semaphore_wait(sem, n)
    o_ref[...] = x_ref[...] + count

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                      grid=(1,), grid_names=("b",))(x)


def _build_sem_signals(n, cpu=False):
  x = _array((128,), seed=32)
  return Built(functools.partial(semaphore_signals, n=n), (x,), lambda x: x + n, tol=0.0)


def _build_sem_pingpong(n, cpu=False):
  x = _array((2, 128), seed=31)
  return Built(functools.partial(semaphore_pingpong, n=n), (x,), lambda x: x + n,
               tol=0.0)


# ---------------------------------------------------------------------------
# (i) ALU: a warpgroup's elementwise ops on a 128x128 f32 tile in registers.
# ---------------------------------------------------------------------------

ALU_OPS = {
    "fma": (lambda v: v * 0.999 + 0.001, "v * 0.999 + 0.001 (one FMA)"),
    "add": (lambda v: v + 1.0, "v + 1"),
    "exp": (lambda v: __import__("jax").numpy.exp(-v), "exp(-v) (ex2 and a multiply)"),
    # with CompilerParams(approx_math=True), as JAX's attention kernels use
    # it: one special-function-unit op (ex2.approx) per element
    "exp2_approx": (lambda v: __import__("jax").numpy.exp2(-v),
                    "exp2(-v), approx_math (ex2.approx)"),
}


def alu_loop(x, *, n, blocks, op):
  """Block b loads x (128x128 f32) into registers, applies `op` n times
  (a loop carrying the tile) and writes it to o[b]."""
  import jax
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  f = ALU_OPS[op][0]

  def body(x_ref, o_ref):
    b = lax.axis_index("b")
    v = lax.fori_loop(0, n, lambda i, v: f(v), x_ref[...])
    o_ref[b] = v

  params = plgpu.CompilerParams(approx_math=op.endswith("_approx"))
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((blocks,) + x.shape, x.dtype),
                      grid=(blocks,), grid_names=("b",), compiler_params=params)(x)


def _build_alu(n, *, op, blocks, cpu=False):
  import jax.numpy as jnp
  if cpu:
    blocks = min(blocks, 2)
  x = _array((128, 128), seed=40)
  f = ALU_OPS[op][0]

  def ref(x):
    from jax import lax
    v = lax.fori_loop(0, n, lambda i, v: f(v), x.astype(jnp.float32))
    return jnp.broadcast_to(v, (blocks, 128, 128))
  return Built(functools.partial(alu_loop, n=n, blocks=blocks, op=op), (x,), ref,
               tol=1e-3)


def _scalar_round(c, i):
  """One round of scalar int32 work, four equations that no compiler folds
  together: a multiply, an add of the loop index, a shift and an xor."""
  from jax import lax
  c = c * 1664525 + i
  return c ^ lax.shift_right_logical(c, 13)


def scalar_loop(x, *, n, blocks, rounds):
  """Block b carries a scalar through n iterations of `rounds` dependent
  rounds (_scalar_round), then writes it (o[b], 128 copies): the cost of a
  scalar equation, a pipeline's bookkeeping (indices, slots, predicates)."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(x_ref, o_ref):
    b = lax.axis_index("b")

    def step(i, c):
      for _ in range(rounds):
        c = _scalar_round(c, i)
      return c
    c = lax.fori_loop(0, n, step, x_ref[0] + b)
    o_ref[b] = jnp.broadcast_to(c, (128,))

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((blocks, 128), jnp.int32),
                      grid=(blocks,), grid_names=("b",))(x)


def _build_scalar(n, *, rounds, blocks, cpu=False):
  import jax.numpy as jnp
  from jax import lax
  if cpu:
    blocks = min(blocks, 2)
  x = jnp.arange(128, dtype=jnp.int32) + 7

  def ref(x):
    def one(b):
      def step(i, c):
        for _ in range(rounds):
          c = _scalar_round(c, i)
        return c
      return lax.fori_loop(0, n, step, x[0] + b)
    return jnp.broadcast_to(jnp.stack([one(b) for b in range(blocks)])[:, None],
                            (blocks, 128))
  return Built(functools.partial(scalar_loop, n=n, blocks=blocks, rounds=rounds), (x,),
               ref, tol=0.0)


# ---------------------------------------------------------------------------
# (j) Row reductions in the WGMMA layout, as row kernels (RMSnorm, softmax)
# reduce their tiles: a lane's own columns, then an exchange across the four
# lanes that share a row. One iteration: v - 0.001 * reduce(v, rows), so
# each depends on the last.
# ---------------------------------------------------------------------------

ROW_REDUCE_OPS = ("max", "sum")


def _row_step(op):
  import jax.numpy as jnp
  red = jnp.max if op == "max" else jnp.sum
  return lambda i, v: v - (0.001 * red(v, axis=1))[:, None]


def row_reduce_loop(x, *, n, blocks, op):
  """Block b puts x (64 x W, f32) into SMEM, loads it in the WGMMA layout,
  runs n dependent iterations of _row_step(op) on it in registers and
  writes the result to o[b]."""
  import jax
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(x_ref, o_ref, x_s, bar):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref, x_s, bar)
    plgpu.barrier_wait(bar)
    v = lax.fori_loop(0, n, _row_step(op), plgpu.load(x_s, layout=plgpu.Layout.WGMMA))
    x_s[...] = v
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(x_s, o_ref.at[b])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((blocks,) + x.shape, x.dtype),
                      scratch_types=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()],
                      grid=(blocks,), grid_names=("b",))(x)


def _build_row_reduce(n, *, op, width, blocks, cpu=False):
  import jax.numpy as jnp
  from jax import lax
  if cpu:
    blocks = min(blocks, 2)
  x = _array((64, width), seed=44)

  def ref(x):
    v = lax.fori_loop(0, n, _row_step(op), x.astype(jnp.float32))
    return jnp.broadcast_to(v, (blocks, 64, width))
  return Built(functools.partial(row_reduce_loop, n=n, blocks=blocks, op=op), (x,), ref,
               tol=1e-3)


# ---------------------------------------------------------------------------
# (g) Launch overhead: n tiny kernels chained in one jitted program.
# ---------------------------------------------------------------------------

def tiny(x):
  """out = x + 1, one 128-float row per block (grid = rows of x)."""
  import jax
  from jax import lax
  from jax.experimental.pallas import mosaic_gpu as plgpu

  def body(x_ref, o_ref):
    b = lax.axis_index("b")
    o_ref[b] = x_ref[b] + 1.0

  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
                      grid=(x.shape[0],), grid_names=("b",))(x)


@functools.cache
def _tiny_jit():
  import jax
  return jax.jit(tiny)   # traced and lowered once, however many launches


def tiny_chain(x, *, n):
  t = _tiny_jit()
  for _ in range(n):
    x = t(x)
  return x


def _build_launch(n, *, blocks, cpu=False):
  x = _array((blocks if not cpu else min(blocks, 2), 128), seed=31)
  return Built(functools.partial(tiny_chain, n=n), (x,), lambda x: x + n, tol=0.0)


# ---------------------------------------------------------------------------
# The list.
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Micro:
  name: str
  figure: str          # what it measures (the gpus.py figure it informs)
  make: Callable       # make(n, cpu=False, **params) -> Built
  params: dict
  n1: int
  n2: int
  work: float          # work of one iteration: bytes, flops or 1 (an event)
  unit: str            # "bytes", "flop", "load", "round trip", "launch", "wgmma"
  note: str = ""
  cpu_n: tuple = (2, 4)

  def __post_init__(self):
    slots = self.params.get("slots", 0)
    if slots:
      self.cpu_n = (slots, slots + 2)

  def build(self, n, cpu=False):
    return self.make(n, cpu=cpu, **self.params)

  def derive(self, t1, t2, clock_hz):
    """Figures from the two times (seconds per jitted call)."""
    per = (t2 - t1) / (self.n2 - self.n1)
    d = dict(per_iter_s=per, per_iter_cycles=per * clock_hz if clock_hz else None,
             intercept_s=t1 - self.n1 * per)
    if self.unit in ("bytes", "flop", "elements"):
      rate = self.work / per if per > 0 else float("nan")
      d["rate_per_s"] = rate
      sms = self.params.get("blocks", NUM_SMS) or NUM_SMS
      sms = min(sms, NUM_SMS)
      d["rate_per_sm_per_s"] = rate / sms
      if clock_hz:
        d["per_sm_per_clk"] = rate / sms / clock_hz
    return d


HBM_ROWS_BYTES = 32768  # (the arrays' rows)


def _hbm_rows_micro(row_bytes, slots, bps, copy):
  """hbm_rows[_copy]_{row_bytes}b_{slots}slots_{bps}_per_sm (_micros, c3')."""
  dtype, item = ("float32", 4) if row_bytes > 512 else ("float16", 2)
  box, cols, blocks = row_bytes // item, HBM_ROWS_BYTES // item, 128 * bps
  what = "copying" if copy else "reading"
  return Micro(
      f"hbm_rows{'_copy' if copy else ''}_{row_bytes}b_{slots}slots_{bps}_per_sm",
      "HBM " + ("read + write" if copy else "bandwidth") + " by the TMA box's row bytes "
      "(strided rows)", _build_panel_copy if copy else _build_panel,
      dict(blocks=blocks, box_cols=box, cols=cols, slots=slots, tile_rows=64, dtype=dtype),
      2 * slots, cols // box, work=(2 if copy else 1) * blocks * 64 * row_bytes,
      unit="bytes", cpu_n=(slots, slots + 2),
      note=f"{blocks} blocks {what} boxes of 64 rows x {row_bytes} B along rows of 32 KiB, "
           f"{slots} in flight" + (", bytes read + written" if copy else ""))


def _micros():
  out = []
  # (a) TMA latency.
  for rows, cols, hbm, n1, n2 in [(8, 128, False, 400, 2000),    # 4 KiB, L2
                                  (64, 128, False, 400, 2000),   # 32 KiB, L2
                                  (8, 128, True, 200, 1000)]:    # 4 KiB, HBM
    kib = rows * cols * F32 // 1024
    out.append(Micro(
        f"tma_latency_{'hbm' if hbm else 'l2'}_{kib}k", "tma_latency",
        _build_tma_chain, dict(tile_rows=rows, cols=cols, hbm=hbm), n1, n2,
        work=1, unit="load",
        note=("a new tile each load, 256 MiB apart / 16, L2 flushed between calls"
              if hbm else "the same tile each load (L2 hit after the first)")))
  # (a') plain GMEM loads: a dependent scalar chain, a loop of row loads.
  for what, where in (("chain", "l1"), ("chain", "l2"), ("chain", "hbm"), ("rows", "l2"),
                      ("rows", "hbm")):
    out.append(Micro(
        f"plain_load_{what}_{where}", "gmem_load_latency", _build_gmem,
        dict(what=what, where=where), 200, 1000, work=1, unit="load",
        note=("j = x[j], one int32 a load" if what == "chain" else
              "acc + a 64-float row in the WGMMA row layout, a new row each load")
             + {"hbm": ", a new 128-byte line each load over 256 MiB, L2 flushed between "
                       "calls",
                "l2": ", a new line each load over 1 MiB (L2 hits after the first call)",
                "l1": ", over 16 KiB (the block's L1 holds it after the first pass)"}[where]))
  # (b) HBM streaming, all SMs and one; copy through SMEM. (c) L2 reuse.
  tile = dict(tile_rows=64, cols=128)          # 32 KiB f32 tiles
  tb = 64 * 128 * F32
  out.append(Micro("stream_hbm_all_sms", "hbm_bytes_per_s / TMA bandwidth",
                   _build_stream, dict(blocks=NUM_SMS, slots=4, n_max=240, **tile),
                   48, 240, work=NUM_SMS * tb, unit="bytes",
                   note="132 blocks x 4 loads of 32 KiB in flight, 1 GiB array"))
  out.append(Micro("stream_hbm_2_per_sm", "hbm_bytes_per_s / TMA bandwidth",
                   _build_stream, dict(blocks=2 * NUM_SMS, slots=3, n_max=120, **tile),
                   24, 120, work=2 * NUM_SMS * tb, unit="bytes",
                   note="264 blocks x 3 loads of 32 KiB in flight"))
  out.append(Micro("stream_hbm_one_sm", "per-SM TMA bandwidth",
                   _build_stream, dict(blocks=1, slots=4, n_max=1000, flush=True, **tile),
                   200, 1000, work=tb, unit="bytes",
                   note="one block, 4 loads of 32 KiB in flight, L2 flushed between calls"))
  out.append(Micro("stream_hbm_one_sm_6slots", "per-SM TMA bandwidth",
                   _build_stream, dict(blocks=1, slots=6, n_max=1000, flush=True, **tile),
                   200, 1000, work=tb, unit="bytes",
                   note="one block, 6 loads of 32 KiB in flight"))
  out.append(Micro("copy_gmem_smem_gmem_all_sms", "hbm_bytes_per_s (read + write)",
                   _build_copy, dict(blocks=NUM_SMS, slots=4, n_max=160, **tile),
                   32, 160, work=2 * NUM_SMS * tb, unit="bytes",
                   note="bytes counted read + written"))
  # (b') Each block streaming tiles of its own from HBM with two slots, a
  # block an SM (and on 64 SMs), reading only and copying back by TMA store:
  # a row kernel's two passes (RMSnorm, softmax), whose second the H200 runs
  # 20-39% slower a step than the model: does a store ahead of a load in the
  # SM's TMA queue, or its bytes on the way out, delay the load?
  for kib, blocks in ((16, NUM_SMS), (16, 64), (32, NUM_SMS)):
    own = dict(blocks=blocks, slots=2, n_max=160, tile_rows=kib * 1024 // (128 * F32),
               cols=128)
    where = "an SM" if blocks == NUM_SMS else f"on {blocks} SMs"
    for copy in (False, True):
      out.append(Micro(
          f"{'copy' if copy else 'stream'}_own_{kib}k_2slots_{blocks}_blocks",
          "TMA loads behind stores (one block an SM, two slots)",
          _build_copy if copy else _build_stream, own, 32, 160,
          work=(2 if copy else 1) * blocks * kib * 1024, unit="bytes",
          note=f"a block {where} {'copying' if copy else 'reading'} its own {kib} KiB f32 "
               "tiles, 2 loads in flight" + (", bytes read + written" if copy else "")))
  out.append(Micro("l2_reuse_all_sms", "L2 bandwidth (reuse)",
                   _build_stream, dict(blocks=NUM_SMS, slots=4, n_max=240,
                                       region_mib=8, **tile),
                   80, 400, work=NUM_SMS * tb, unit="bytes",
                   note="all blocks re-read one 8 MiB region"))
  # (c') L2 streaming with more in flight: 2 blocks per SM, 6 slots, a
  # 32 MiB region (still L2-resident): what a matmul's co-resident blocks do.
  # (c'') every block reading the same tile at once (a matmul's A and B tiles
  # are read by many blocks together): 32 KiB, and 16 KiB of 128-byte rows.
  for name, blocks, rows_, cols_ in (("l2_same_tile", NUM_SMS, 64, 128),
                                     ("l2_same_tile_2_per_sm", 2 * NUM_SMS, 64, 128),
                                     ("l2_same_tile_128b_rows", NUM_SMS, 128, 32)):
    out.append(Micro(name, "L2 bandwidth (shared tiles)", _build_stream,
                     dict(blocks=blocks, slots=4, n_max=240, region_mib=8, same=True,
                          tile_rows=rows_, cols=cols_),
                     80, 400, work=blocks * rows_ * cols_ * F32, unit="bytes",
                     note=f"{blocks} blocks loading the same {rows_}x{cols_} f32 tile at "
                          "once, 4 in flight"))
  # (c6) groups of `readers` blocks each reading one tile at once (a matmul's
  # blocks that share a row of A), 16 KiB f32 tiles into SMEM swizzled 64 or
  # 128 bytes (TMA boxes of 64- or 128-byte rows), 4 in flight, over 8 MiB.
  for readers in (1, 4, 12, 33, 132):
    for swz in (64, 128):
      out.append(Micro(f"l2_shared_{readers}_readers_swz{swz}", "L2 bandwidth (shared tiles)",
                       _build_stream, dict(blocks=NUM_SMS, slots=4, n_max=240, region_mib=8,
                                           readers=readers, swizzle=swz, tile_rows=32,
                                           cols=128),
                       400, 2000, work=NUM_SMS * 32 * 128 * F32, unit="bytes",
                       note=f"groups of {readers} blocks each loading one 32x128 f32 tile "
                            f"at once, SMEM swizzled {swz} B, 4 in flight, 8 MiB region"))
  # (c7) The L2's two halves: a launch that reads 8 MiB (it fits in one
  # partition, half the L2) against one that reads 48 MiB (it does not): one
  # block's chain of dependent 32 KiB loads walking the region, and every
  # SM loading tiles 12 blocks share (as a matmul's), 1 to 8 in flight (8:
  # 128 KiB an SM, as a deep pipeline's first burst),
  # whose loads' round trip is slots x the time an iteration.
  for mib in (8, 48):
    out.append(Micro(f"l2_half_chain_{mib}mib", "L2 latency, near and far", _build_tma_chain,
                     dict(tile_rows=64, cols=128, hbm=False, region_mib=mib), 400, 2000,
                     work=1, unit="load",
                     note=f"one block, a chain of 32 KiB loads over a {mib} MiB region"))
    for slots in (1, 2, 4, 8):
      out.append(Micro(f"l2_half_{mib}mib_{slots}slots", "L2 latency, near and far",
                       _build_stream, dict(blocks=NUM_SMS, slots=slots, n_max=2000,
                                           region_mib=mib, readers=12, swizzle=128,
                                           tile_rows=32, cols=128),
                       400, 2000, work=NUM_SMS * 32 * 128 * F32, unit="bytes",
                       note=f"groups of 12 blocks each loading one 32x128 f32 tile at once, "
                            f"{slots} in flight, over {mib} MiB"))
  # (c8) The same streams with each group's readers out of step: its r-th
  # reader reads the tile its first reads r * lag loads later (1: each
  # reader one load apart from the next; 16: far apart, as a matmul's blocks
  # that share a tile but whose waves smear). Beside the in-step l2_half_*
  # streams: what sharing in step saves, and the L2's round trip under a
  # matmul's kind of load (slots x an iteration's time, Little's law).
  for mib in (8, 48):
    for slots in (2, 4, 8):
      for lag in (1, 16):
        out.append(Micro(f"l2_lag{lag}_{mib}mib_{slots}slots", "L2 latency, readers apart",
                         _build_stream, dict(blocks=NUM_SMS, slots=slots, n_max=2000,
                                             region_mib=mib, readers=12, lag=lag,
                                             swizzle=128, tile_rows=32, cols=128),
                         400, 2000, work=NUM_SMS * 32 * 128 * F32, unit="bytes",
                         note=f"groups of 12 blocks sharing 32x128 f32 tiles, the r-th "
                              f"reading r * {lag} loads behind the first, {slots} in "
                              f"flight, over {mib} MiB"))
  for name, blocks, slots, mib in (("l2_stream_2_per_sm", 2 * NUM_SMS, 3, 8),
                                   ("l2_stream_6slots", NUM_SMS, 6, 8),
                                   ("l2_stream_32mib", NUM_SMS, 4, 32),
                                   ("l2_stream_32mib_2_per_sm", 2 * NUM_SMS, 3, 32)):
    out.append(Micro(name, "L2 bandwidth (streaming)", _build_stream,
                     dict(blocks=blocks, slots=slots, n_max=240, region_mib=mib, **tile),
                     80, 400, work=blocks * tb, unit="bytes",
                     note=f"{blocks} blocks x {slots} loads of 32 KiB in flight over a "
                          f"{mib} MiB region"))
  # (c3) HBM read as a matmul reads its A tiles: each block its own panel of
  # rows 16 KiB long (8192 f16), a box of 128 rows a load, the box's rows 64,
  # 128 or 256 bytes wide; one and two blocks per SM (264 and 528 MiB: every
  # byte from HBM once a call).
  for bps, row_bytes, slots in ((1, 64, 4), (1, 128, 4), (1, 256, 4), (2, 64, 4),
                                (2, 128, 4), (1, 64, 8)):
    box = row_bytes // 2
    n2 = 8192 // box
    out.append(Micro(
        f"hbm_panel_{row_bytes}b_rows_{bps}_per_sm" + ("" if slots == 4 else f"_{slots}slots"),
        "HBM bandwidth by the TMA box's row bytes", _build_panel,
        dict(blocks=bps * NUM_SMS, box_cols=box, cols=8192, slots=slots), n2 // 4, n2,
        work=bps * NUM_SMS * 128 * row_bytes, unit="bytes", cpu_n=(slots, slots + 2),
        note=f"{bps * NUM_SMS} blocks, boxes of 128 rows x {row_bytes} B along rows "
             f"of 16 KiB, {slots} in flight"))
  # (c3') HBM read as a row kernel reads its tiles (RMSnorm, softmax): 128
  # blocks per `bps` (one, two or four an SM), each walking its own 64 rows
  # of an array with rows of 32 KiB, one pass (256 MiB a block an SM), in
  # boxes of 64 rows whose rows are 64 to 1024 bytes of a long row: every box
  # row its own piece of DRAM. What is in flight an SM, bps * slots boxes,
  # and the rows' length vary. n1 is a few loads (launch and ramp), n2 the
  # whole panel. (1024-byte rows: f32, a box row is at most 256 elements.)
  for row_bytes, slots, bps in ((64, 16, 2), (128, 8, 2), (256, 4, 2), (512, 2, 2),
                                (128, 2, 2), (128, 4, 2), (256, 1, 2), (256, 2, 2),
                                (512, 1, 2), (512, 4, 2), (1024, 2, 2),
                                (256, 1, 1), (256, 2, 1), (256, 4, 1),
                                (256, 1, 4), (256, 2, 4), (256, 4, 4),
                                (128, 1, 1), (128, 2, 1), (128, 4, 1),
                                # (rows under 64 bytes: a 4- or 8-wide f32 tile of
                                # a long row, whose cost the model takes as 64's)
                                (16, 32, 2), (32, 32, 2)):
    out.append(_hbm_rows_micro(row_bytes, slots, bps, copy=False))
  # (c3'') The same, each box stored back to its place in a second array:
  # bytes counted read + written.
  for row_bytes, slots in ((128, 8), (256, 4), (512, 2), (128, 2), (64, 16), (1024, 2)):
    out.append(_hbm_rows_micro(row_bytes, slots, 2, copy=True))
  # (c4) The same from the L2: each block's panel 1 KiB wide (33 MiB in all
  # at two blocks per SM), walked round and round.
  # (and 32- and 16-byte rows: a tile_k=16 f16 A tile, a 4-wide f32 one)
  for bps, row_bytes in ((2, 64), (2, 128), (2, 256), (1, 64), (1, 128), (1, 32), (2, 32),
                         (1, 16), (2, 16)):
    out.append(Micro(
        f"l2_panel_{row_bytes}b_rows_{bps}_per_sm", "L2 bandwidth by the TMA box's row bytes",
        _build_panel, dict(blocks=bps * NUM_SMS, box_cols=row_bytes // 2, cols=512, slots=4),
        400, 2000, work=bps * NUM_SMS * 128 * row_bytes, unit="bytes", cpu_n=(4, 6),
        note=f"{bps * NUM_SMS} blocks, boxes of 128 rows x {row_bytes} B, 4 in flight, "
             "from an L2-resident panel of 1 KiB rows"))
  # (c4') One SM's TMA engine in narrow rows with the L2 all but idle: 16
  # blocks (one an SM), 8 in flight, where every SM busy shares the L2's
  # tag lookups (gpus.GPU.l2_requests_per_s).
  for row_bytes in (16, 32, 64):
    out.append(Micro(
        f"tma_rows_alone_{row_bytes}b_16_sms_8slots", "one TMA engine's rows a cycle",
        _build_panel, dict(blocks=16, box_cols=row_bytes // 2, cols=512, slots=8),
        400, 2000, work=16 * 128 * row_bytes, unit="bytes", cpu_n=(8, 10),
        note=f"16 blocks, boxes of 128 rows x {row_bytes} B, 8 in flight, "
             "from an L2-resident panel of 1 KiB rows"))
  # (c4'') HBM to SMEM to HBM in narrow rows: the stores' rows too (a
  # 4-wide f32 elementwise tile's), beside 128-byte rows.
  for cols in (4, 32):
    out.append(Micro(
        f"tma_rows_copy_{cols * 4}b_all_sms", "TMA loads and stores by the box's row bytes",
        _build_copy, dict(blocks=NUM_SMS, slots=4, n_max=400, tile_rows=256, cols=cols),
        80, 400, work=2 * NUM_SMS * 256 * cols * 4, unit="bytes",
        note=f"{NUM_SMS} blocks copying 256x{cols} f32 tiles ({cols * 4}-byte rows), "
             "4 loads in flight, bytes read + written"))
  # (c5) The same with SMEM swizzled as a matmul's tiles: a box of 64-byte
  # rows (a tile_k=32 f16 A tile: the 64-byte swizzle) and of 128-byte rows,
  # swizzled 128 or split into two 64-byte swizzled boxes.
  for row_bytes, swz in ((64, 64), (128, 128), (128, 64)):
    out.append(Micro(
        f"l2_panel_{row_bytes}b_rows_swz{swz}_2_per_sm",
        "L2 bandwidth by the TMA box's row bytes, swizzled",
        _build_panel, dict(blocks=2 * NUM_SMS, box_cols=row_bytes // 2, cols=512, slots=4,
                           swizzle=swz),
        400, 2000, work=2 * NUM_SMS * 128 * row_bytes, unit="bytes", cpu_n=(4, 6),
        note=f"l2_panel_{row_bytes}b_rows_2_per_sm into SMEM swizzled {swz} bytes"))
  # (d) wgmma throughput, (h) the spill cliff.
  for dt in ("f16", "bf16", "fp8", "tf32"):
    for N in (64, 128, 256):
      for bps in ((1, 2) if dt == "f16" or N == 128 else (1,)):
        K = WGMMA_TYPES[dt][1]
        n2 = int(2000 * 256 / N / bps)
        out.append(Micro(
            f"wgmma_{dt}_m128n{N}_{bps}per_sm", "tensor_flop_per_clk",
            _build_wgmma, dict(dtype=dt, N=N, bps=bps), n2 // 5, n2,
            work=2.0 * 128 * N * K * NUM_SMS * bps, unit="flop",
            note=f"{NUM_SMS * bps} blocks, wgmma 128x{N}x{K} + wgmma_wait(1)"))
  for N in (192, 224):
    n2 = int(2000 * 256 / N)
    out.append(Micro(
        f"spill_f16_m128n{N}", "register spills (accumulator size)",
        _build_wgmma, dict(dtype="f16" if N % 64 == 0 else "f16t", N=N), n2 // 5, n2,
        work=2.0 * 128 * N * 64 * NUM_SMS, unit="flop",
        note="compare wgmma_f16_m128n128/n256_1per_sm"))
  # (d'') on random normal operands (the figures above are for small
  # integers): the power they draw, and so the clock, for power_study.py.
  for dt, bps in (("f16", 1), ("f16", 2), ("bf16", 1), ("fp8", 1)):
    N, K = 128, WGMMA_TYPES[dt][1]
    n2 = int(2000 * 256 / N / bps)
    out.append(Micro(
        f"wgmma_{dt}_m128n{N}_{bps}per_sm_normal", "tensor_flop_per_clk (random data)",
        _build_wgmma, dict(dtype=dt, N=N, bps=bps, data="normal"), n2 // 5, n2,
        work=2.0 * 128 * N * K * NUM_SMS * bps, unit="flop",
        note=f"{NUM_SMS * bps} blocks, wgmma 128x{N}x{K} + wgmma_wait(1), random "
             "normal operands"))
  # (d') K = 32 a wgmma (half the FLOPs of a call, the same issue work).
  for N, bps in ((128, 1), (128, 2), (256, 1)):
    n2 = int(2000 * 256 / N / bps)
    out.append(Micro(
        f"wgmma_f16k32_m128n{N}_{bps}per_sm", "tensor_flop_per_clk (K=32)",
        _build_wgmma, dict(dtype="f16k32", N=N, bps=bps), n2 // 5, n2,
        work=2.0 * 128 * N * 32 * NUM_SMS * bps, unit="flop",
        note=f"{NUM_SMS * bps} blocks, wgmma 128x{N}x32 + wgmma_wait(1)"))
  # (h') where spilled registers go: the L1 is what SMEM leaves of the SM's
  # 256 KiB, so more SMEM (an unused pad) leaves the spills less L1. The
  # 128x128 loop with the largest pad is the control (no spills: unchanged).
  for N, pad in ((256, 64), (256, 112), (256, 160), (128, 160)):
    n2 = int(2000 * 256 / N)
    out.append(Micro(
        f"spill_f16_m128n{N}_pad{pad}k", "register spills (L1 left by SMEM)",
        _build_wgmma, dict(dtype="f16", N=N, pad_kib=pad), n2 // 5, n2,
        work=2.0 * 128 * N * 64 * NUM_SMS, unit="flop",
        note=f"wgmma_f16_m128n{N}_1per_sm with {pad} KiB more SMEM, unused"))
  # (e) wgmma latency: one block, each wgmma awaited.
  for M, N in ((64, 64), (64, 256), (128, 256)):
    out.append(Micro(
        f"wgmma_latency_f16_m{M}n{N}", "wgmma_latency",
        _build_wgmma, dict(dtype="f16", N=N, M=M, blocks=1, wait=0), 800, 4000,
        work=1, unit="wgmma", note="one block; wgmma + wgmma_wait(0)"))
  # (f) barrier round trip.
  # (i) ALU: an elementwise op on 128x128 f32 in one warpgroup's registers.
  for op in ALU_OPS:
    for bps in (1, 2):
      out.append(Micro(f"alu_{op}_{bps}_per_sm", "alu_cycles_per_vector", _build_alu,
                       dict(op=op, blocks=bps * NUM_SMS), 200, 1000, work=128 * 128,
                       unit="elements", cpu_n=(2, 4),
                       note=f"{ALU_OPS[op][1]} over 128x128 f32 in registers, "
                            f"{bps} block(s) per SM"))
  # (j) row reductions over 64 x W f32 in the WGMMA layout: cycles an
  # iteration by W (the per-element part, and the exchange's, which W does
  # not change), one and two blocks to an SM.
  for op in ROW_REDUCE_OPS:
    for width in (64, 128, 256):
      for bps in (1, 2):
        out.append(Micro(
            f"row_{op}_64x{width}_{bps}_per_sm", "reduce_exchange_cycles",
            _build_row_reduce, dict(op=op, width=width, blocks=bps * NUM_SMS), 200, 1000,
            work=1, unit="iteration", cpu_n=(2, 4),
            note=f"v - 0.001 * {op}(v, rows) over 64x{width} f32 in the WGMMA layout, "
                 f"{bps} block(s) per SM"))
  # (i') scalar equations: a dependent chain of 4 or 32 a loop iteration.
  for rounds in (1, 8):
    out.append(Micro(f"scalar_chain_{4 * rounds}_ops", "op_overhead_cycles",
                     _build_scalar, dict(rounds=rounds, blocks=NUM_SMS), 2000, 10000,
                     work=1, unit="iteration", cpu_n=(2, 4),
                     note=f"one warpgroup a block, a loop of {4 * rounds} dependent "
                          "scalar int32 equations (mul, add, shift, xor)"))
  # (i'') the same chain, 2 and 4 blocks to an SM: do co-resident warpgroups
  # share an equation's cycles (as vector ops share the ALUs) or overlap them?
  for bps in (2, 4):
    out.append(Micro(f"scalar_chain_32_ops_{bps}_per_sm", "op_overhead_cycles (shared?)",
                     _build_scalar, dict(rounds=8, blocks=bps * NUM_SMS), 2000, 10000,
                     work=1, unit="iteration", cpu_n=(2, 4),
                     note=f"scalar_chain_32_ops with {bps} blocks to an SM"))
  # (e') SMEM under a wgmma: each alone, then both.
  for per in SMEM_LOADS_PER_WGMMA:
    for mode in ("wgmma", "loads", "both") if per == 2 else ("loads", "both"):
      out.append(Micro(f"smem_{mode}" + ("_alone" if mode != "both" else "")
                       + ("" if mode == "wgmma" else f"_{per}_loads"),
                       "SMEM shared by wgmma reads and TMA writes?", _build_smem,
                       dict(mode=mode, per=per), 400, 2000, work=1, unit="iteration",
                       cpu_n=(4, 6),
                       note="per iteration: a 128x128x64 f16 wgmma and/or "
                            f"{per} TMA loads of one 16 KiB tile, 132 blocks"))
  # (e') again with a K=32 wgmma (A's rows 64 bytes, the 64-byte swizzle: the
  # quickstart's tile_k=32), half the work, so one load an iteration balances.
  for mode in ("wgmma", "loads", "both"):
    out.append(Micro(f"smem_k32_{mode}" + ("_alone" if mode != "both" else "")
                     + ("" if mode == "wgmma" else "_1_loads"),
                     "SMEM shared by wgmma reads and TMA writes, K=32?", _build_smem,
                     dict(mode=mode, per=1, k=32), 400, 2000, work=1, unit="iteration",
                     cpu_n=(4, 6),
                     note="per iteration: a 128x128x32 f16 wgmma and/or one TMA "
                          "load of one 16 KiB tile, 132 blocks"))
  # (e') with a K=32 wgmma beside loads whose rows are 64- or 128-byte TMA
  # boxes (the quickstart's tile_k=32 B tile: 64), one and two blocks to an SM.
  for swz in (64, 128):
    for mode, bps in (("loads", 1), ("both", 1), ("loads", 2), ("both", 2)):
      out.append(Micro(f"smem_k32_{mode}_swz{swz}_{bps}_per_sm",
                       "SMEM shared by wgmma reads and swizzled TMA writes, K=32?",
                       _build_smem, dict(mode=mode, per=1, k=32, x_swizzle=swz, bps=bps),
                       400, 2000, work=1, unit="iteration", cpu_n=(4, 6),
                       note=f"per iteration: {'a 128x128x32 f16 wgmma and ' if mode == 'both' else ''}"
                            f"one TMA load of one 16 KiB f16 tile in {swz}-byte boxes, "
                            f"{bps} block(s) per SM"))
  # (e'') a wgmma's A from registers (a mixed-type matmul's steps).
  for mode in REGA_MODES:
    for wgs in (1, 2):
      out.append(Micro(f"rega_{mode}_{wgs}_wg", "register-A wgmma, SMEM loads, converts",
                       _build_rega, dict(mode=mode, wgs=wgs), 200, 1000, work=1,
                       unit="iteration", cpu_n=(2, 4),
                       note=f"per iteration, in each of {wgs} warpgroup(s) of 132 "
                            f"blocks: {REGA_MODES[mode]}; 128x128x64"))
  # (e''') the row kernels' body: 128x64 and 64x128 bf16 tiles (16 KiB), one
  # block to an SM, and two for the load, negate and store.
  # RMSnorm's second body alone at the three tiles the rows trace timed in
  # the pipeline (8, 16 and 32 KiB: 328, 586 and 1113 cycles on the H200)
  shapes = {mode: ((128, 64), (64, 128)) for mode in SMEM_RW_MODES}
  shapes["scale"] = ((64, 64), (128, 64), (128, 128))
  for mode, bps in itertools.product(SMEM_RW_MODES, (1, 2)):
    if bps == 2 and mode != "rw":
      continue
    for rows_, cols_ in shapes[mode]:
      out.append(Micro(f"smem_rw_{mode}_{rows_}x{cols_}_{bps}_per_sm",
                       "SMEM loads and stores of a warpgroup's registers",
                       _build_smem_rw, dict(mode=mode, rows=rows_, cols=cols_, bps=bps),
                       200, 1000, work=1, unit="iteration", cpu_n=(2, 4),
                       note=f"per iteration, one warpgroup in each of {bps * NUM_SMS} "
                            f"blocks: {SMEM_RW_MODES[mode]}; {rows_}x{cols_} bf16"))
  for work in BESIDE_WORK:
    for wgmma in ("none", "smem", "bf16"):
      out.append(Micro(f"beside_{wgmma}_{work}", "ALU work beside a wgmma",
                       _build_beside, dict(wgmma=wgmma, work=work), 200, 1000, work=1,
                       unit="iteration", cpu_n=(2, 4),
                       note=f"per iteration: WG0 a 128x128x64 bf16 wgmma ({wgmma}: A "
                            f"from SMEM, or registers, or none), WG1 "
                            f"{BESIDE_REPS[work]} x {BESIDE_WORK[work]}; 132 blocks"))
  out.append(Micro("sem_pingpong", "a global semaphore's hand-off between SMs",
                   _build_sem_pingpong, {}, 200, 1000, work=1, unit="round trip",
                   note="two blocks, signal/wait over two global semaphores: one round "
                        "trip = two hand-offs through the L2"))
  out.append(Micro("sem_signals", "what a semaphore signal holds its thread",
                   _build_sem_signals, {}, 200, 1000, work=1, unit="signal",
                   note="one block, n signals of a global semaphore in a row, then one "
                        "wait for all of them"))
  out.append(Micro("barrier_pingpong", "barrier_latency", _build_pingpong, {},
                   2000, 10000, work=1, unit="round trip",
                   note="two warpgroups, arrive/wait over two Barriers: one round trip "
                        "= two hand-offs"))
  # (g) launches.
  for blocks in (1, NUM_SMS):
    out.append(Micro(f"launch_{blocks}_blocks", "launch_overhead_s", _build_launch,
                     dict(blocks=blocks), 40, 200, work=1, unit="launch",
                     note="x = tiny(x) chained in one jit; per launch"))
  return out


# f16 with B stored (N, K) and passed transposed: N need only be a multiple
# of 8 then (a (K, N) B with the 128-byte swizzle needs N % 64 == 0).
WGMMA_TYPES["f16t"] = ("float16", 64, True)
# f16 with K = 32 a wgmma: A's rows 64 bytes (the 64-byte swizzle), as in
# the quickstart's tile_k=32 configurations.
WGMMA_TYPES["f16k32"] = ("float16", 32, False)

MICROS = _micros()


def by_name(name):
  for m in MICROS:
    if m.name == name:
      return m
  raise KeyError(name)


# ---------------------------------------------------------------------------
# CPU check in the simulator.
# ---------------------------------------------------------------------------

def sim_check(pattern="", races=True):
  import time
  import jax
  import pallas_sim as ps
  ok = True
  for m in MICROS:
    if pattern not in m.name:
      continue
    t0 = time.time()
    times = []
    try:
      for n in m.cpu_n:
        b = m.build(n, cpu=True)
        args = b.check_args or b.args
        sim = ps.simulate(b.fn, *args, check_races=races)
        out = np.asarray(sim.outputs[0] if isinstance(sim.outputs, tuple) else sim.outputs,
                         np.float32)
        # (jitted, as the GPU's harness computes it: measure_gpu)
        ref = np.asarray(jax.jit(b.reference)(*args), np.float32)
        err = float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-30))
        if not err <= max(b.tol, 1e-6):
          raise AssertionError(f"n={n}: max relative error {err:.3e}")
        times.append(sum(k.time_s for k in sim.report.kernels))
      per = (times[1] - times[0]) / (m.cpu_n[1] - m.cpu_n[0])
      print(f"{m.name:34s} ok   sim per iteration {per * 1e9:9.1f} ns  "
            f"({time.time() - t0:.1f} s)", flush=True)
    except Exception as e:  # report and go on
      ok = False
      print(f"{m.name:34s} FAIL {type(e).__name__}: {str(e)[:300]}", flush=True)
  return ok


def main(argv=None):
  import argparse
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--sim-check", action="store_true")
  ap.add_argument("pattern", nargs="?", default="")
  ns = ap.parse_args(argv)
  return 0 if sim_check(ns.pattern) else 1


if __name__ == "__main__":
  sys.exit(main())
