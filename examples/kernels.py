"""Small, self-contained Pallas Mosaic GPU (Hopper) kernels for the simulator.

Every kernel here is ordinary ``plgpu`` code, written the way one would write
it for an H100/H200 with JAX 0.11.2:

* TMA copies move whole tiles between GMEM and SMEM and are tracked with
  ``plgpu.Barrier``s (GMEM->SMEM) or bulk-async groups (SMEM->GMEM).
* ``plgpu.wgmma`` operands are f16 tiles in SMEM whose minor dimension is
  64 elements (= 128 bytes), carrying the
  ``TilingTransform((8, 64)) + SwizzleTransform(128)`` transforms the Hopper
  lowering requires; accumulators are f32.
* Every barrier completion is awaited exactly once by every thread that waits
  on it (the rule from the Mosaic GPU reference), and every SMEM buffer is
  re-used only after the asynchronous operation that reads it has finished.

Each kernel is a plain Python function taking jnp arrays and returning jnp
arrays.  ``reference(...)`` companions compute the expected output with numpy.
``EXAMPLES`` lists ``(name, fn, make_args, reference)`` tuples, where
``make_args(seed)`` returns a tuple of non-zero random inputs.  ``TOLERANCES``
gives ``(rtol, atol)`` for comparing a kernel's output with its reference.

Running this file traces every kernel with ``jax.make_jaxpr`` (which works on
a CPU-only install) and prints the primitives used inside each kernel body.
Optional flags:

* ``--lower``     also lowers each kernel through the real Mosaic GPU
                  (Hopper) lowering with ``jax.export(platforms=["cuda"])``;
                  this needs no GPU.
* ``--interpret`` also runs each kernel on the CPU in JAX's GPU interpret mode
                  (with race detection) where that interpreter supports it,
                  and compares the result with the reference.
* ``--run``       runs each kernel natively (needs a Hopper GPU) and compares
                  it with its reference.

Status with JAX 0.11.2 (CPU venv for trace/lower/interpret, an H200 for run):
every kernel traces; all but ``pallas_call_kernel`` lower and run natively,
matching their references; ``pallas_call_kernel`` cannot be lowered for a
GPU by 0.11.2 (see its docstring) and is checked with ``interpret=True``.
"""

from __future__ import annotations

import functools
import warnings

import jax
from jax import lax
import jax.extend.core
import jax.numpy as jnp
import numpy as np

from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu


# ---------------------------------------------------------------------------
# Helpers shared by the kernels.
# ---------------------------------------------------------------------------

def _nonzero_uniform(rng: np.random.Generator, shape, dtype, lo=0.25, hi=1.0):
  """Random values with |x| in [lo, hi) and a random sign: never zero."""
  mag = rng.uniform(lo, hi, size=shape)
  sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
  return jnp.asarray((mag * sign).astype(dtype))


def _mma_transforms(dtype, swizzle: int = 128):
  """SMEM transforms that make a 2D ref a valid Hopper wgmma operand.

  The TensorCore wants row-major (8, swizzle_elems) tiles, swizzled with the
  same byte width, where swizzle_elems * itemsize == swizzle bytes (the same
  recipe as ops/gpu/hopper_matmul_mgpu.py and the Mosaic GPU reference).
  """
  swizzle_elems = swizzle // jnp.dtype(dtype).itemsize
  return (
      plgpu.TilingTransform((8, swizzle_elems)),
      plgpu.SwizzleTransform(swizzle),
  )


def _np(x):
  return np.asarray(x, dtype=np.float32)


# ---------------------------------------------------------------------------
# 1. two_thread_copy: a hand-written producer/consumer double buffer.
# ---------------------------------------------------------------------------

TTC_ROWS, TTC_COLS = 512, 128      # f32 input
TTC_TILE = 64                      # rows per tile -> 8 tiles of 64x128 f32
TTC_SLOTS = 2                      # double buffering


def two_thread_copy(x):
  """y = x * 2 + 1 with a TMA producer warpgroup and a compute consumer.

  Thread ("wg") 0 is the producer: it streams 64-row tiles GMEM->SMEM with
  ``copy_gmem_to_smem`` into a 2-slot ring, the TMA completing
  ``produced[slot]``.  Before refilling a slot it waits on ``consumed[slot]``,
  which the consumer arrives on once it has read the tile into registers.
  Thread 1 is the consumer: it waits on ``produced[slot]``, computes, releases
  the input slot, stages the result in a 2-slot SMEM output ring and TMA-stores
  it to GMEM.
  """
  rows, cols = x.shape
  assert rows % TTC_TILE == 0
  num_tiles = rows // TTC_TILE
  assert num_tiles >= TTC_SLOTS

  def body(x_gmem, o_gmem, in_smem, out_smem, produced, consumed):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _producer():
      def step(i, carry):
        slot = lax.rem(i, TTC_SLOTS)

        # The slot still holds tile i - TTC_SLOTS until the consumer says so.
        @pl.when(i >= TTC_SLOTS)
        def _wait_for_free_slot():
          plgpu.barrier_wait(consumed.at[slot])

        plgpu.copy_gmem_to_smem(
            x_gmem.at[pl.ds(i * TTC_TILE, TTC_TILE)],
            in_smem.at[slot],
            produced.at[slot],
        )
        return carry

      lax.fori_loop(0, num_tiles, step, None)
      # The consumer arrives once per tile, but the loop above only awaited
      # num_tiles - TTC_SLOTS of those completions.  Await the last completion
      # of every slot so that no barrier outlives its scope with an unawaited
      # completion.
      for s in range(TTC_SLOTS):
        plgpu.barrier_wait(consumed.at[s])

    @pl.when(wg == 1)
    def _consumer():
      def step(i, carry):
        slot = lax.rem(i, TTC_SLOTS)
        plgpu.barrier_wait(produced.at[slot])
        y = in_smem[slot] * 2.0 + 1.0
        # The store issued TTC_SLOTS tiles ago read out_smem[slot]; make sure
        # it is done reading before overwriting the slot.
        plgpu.wait_smem_to_gmem(TTC_SLOTS - 1, wait_read_only=True)
        out_smem[slot] = y
        # One proxy fence orders both our generic-proxy SMEM accesses with
        # later async-proxy (TMA) ones: the write of out_smem[slot] before the
        # TMA store below, and the read of in_smem[slot] before the producer's
        # next TMA load into that slot (which it issues after `consumed`).
        plgpu.commit_smem()
        # The tile has been read: hand the input slot back to the producer.
        plgpu.barrier_arrive(consumed.at[slot])
        plgpu.copy_smem_to_gmem(
            out_smem.at[slot], o_gmem.at[pl.ds(i * TTC_TILE, TTC_TILE)]
        )
        return carry

      lax.fori_loop(0, num_tiles, step, None)
      plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((rows, cols), x.dtype),
      scratch_types=[
          plgpu.SMEM((TTC_SLOTS, TTC_TILE, cols), x.dtype),   # in_smem
          plgpu.SMEM((TTC_SLOTS, TTC_TILE, cols), x.dtype),   # out_smem
          plgpu.Barrier(num_barriers=TTC_SLOTS),              # produced
          plgpu.Barrier(num_barriers=TTC_SLOTS),              # consumed
      ],
      num_threads=2,
      thread_name="wg",
  )(x)


def two_thread_copy_args(seed):
  rng = np.random.default_rng(seed)
  return (_nonzero_uniform(rng, (TTC_ROWS, TTC_COLS), np.float32),)


def two_thread_copy_reference(x):
  return _np(x) * 2.0 + 1.0


# ---------------------------------------------------------------------------
# 2. hand_pipelined_matmul: manual double-buffered TMA + async wgmma.
# ---------------------------------------------------------------------------

HPM_M = HPM_N = HPM_K = 256
HPM_TILE_M, HPM_TILE_N = 128, 128
HPM_TILE_K = 64                    # 64 f16 = 128 bytes = the 128B swizzle
HPM_SLOTS = 2


def hand_pipelined_matmul(a, b):
  """f32 (M, N) = a (M, K) f16 @ b (K, N) f16, one warpgroup per output tile.

  The K loop is software-pipelined by hand: the A and B tiles of step k
  arrive in slot k % 2 and complete ``loaded[slot]`` (2 arrivals, one per
  copy).  At step k the kernel issues ``wgmma`` on slot k % 2 and
  ``wgmma_wait(1)`` leaves that wgmma in flight while guaranteeing that step
  k - 1's wgmma is done, so slot (k + 1) % 2 can be refilled with the tiles of
  step k + 1 while the TensorCore works.  The f32 accumulator lives in a
  ``plgpu.ACC`` allocated with ``pl.run_scoped``; the epilogue goes registers
  -> swizzled SMEM -> ``commit_smem`` -> TMA store -> ``wait_smem_to_gmem``.
  """
  m, k = a.shape
  k2, n = b.shape
  assert k == k2 and a.dtype == b.dtype == jnp.float16
  assert m % HPM_TILE_M == 0 and n % HPM_TILE_N == 0 and k % HPM_TILE_K == 0
  k_steps = k // HPM_TILE_K
  out_dtype = jnp.float32
  in_transforms = _mma_transforms(jnp.float16)
  out_transforms = _mma_transforms(out_dtype)   # (8, 32) tiles, 128B swizzle

  def body(a_gmem, b_gmem, o_gmem, a_smem, b_smem, o_smem, loaded):
    m_slice = pl.ds(lax.axis_index("m") * HPM_TILE_M, HPM_TILE_M)
    n_slice = pl.ds(lax.axis_index("n") * HPM_TILE_N, HPM_TILE_N)

    def fetch(step, slot):
      k_slice = pl.ds(step * HPM_TILE_K, HPM_TILE_K)
      plgpu.copy_gmem_to_smem(
          a_gmem.at[m_slice, k_slice], a_smem.at[slot], loaded.at[slot]
      )
      plgpu.copy_gmem_to_smem(
          b_gmem.at[k_slice, n_slice], b_smem.at[slot], loaded.at[slot]
      )

    def compute(acc_ref):
      fetch(0, 0)  # Prologue.

      def k_step(step, carry):
        slot = lax.rem(step, HPM_SLOTS)
        plgpu.barrier_wait(loaded.at[slot])
        plgpu.wgmma(acc_ref, a_smem.at[slot], b_smem.at[slot])
        # Only this step's wgmma may still be running: the other slot (read
        # by step - 1) is free to be refilled.
        plgpu.wgmma_wait(1)

        @pl.when(step + 1 < k_steps)
        def _prefetch():
          fetch(step + 1, lax.rem(step + 1, HPM_SLOTS))

        return carry

      lax.fori_loop(0, k_steps, k_step, None)
      plgpu.wgmma_wait(0)
      return acc_ref[...]  # Reading the accumulator awaits all wgmmas too.

    acc = pl.run_scoped(
        compute, plgpu.ACC((HPM_TILE_M, HPM_TILE_N), jnp.float32)
    )
    o_smem[...] = acc.astype(out_dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[m_slice, n_slice])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
      scratch_types=[
          plgpu.SMEM((HPM_SLOTS, HPM_TILE_M, HPM_TILE_K), jnp.float16,
                     transforms=in_transforms),
          plgpu.SMEM((HPM_SLOTS, HPM_TILE_K, HPM_TILE_N), jnp.float16,
                     transforms=in_transforms),
          plgpu.SMEM((HPM_TILE_M, HPM_TILE_N), out_dtype,
                     transforms=out_transforms),
          plgpu.Barrier(num_arrivals=2, num_barriers=HPM_SLOTS),
      ],
      grid=(m // HPM_TILE_M, n // HPM_TILE_N),
      grid_names=("m", "n"),
  )(a, b)


def hand_pipelined_matmul_args(seed):
  rng = np.random.default_rng(seed)
  return (
      _nonzero_uniform(rng, (HPM_M, HPM_K), np.float16),
      _nonzero_uniform(rng, (HPM_K, HPM_N), np.float16),
  )


def hand_pipelined_matmul_reference(a, b):
  return _np(a) @ _np(b)


# ---------------------------------------------------------------------------
# 3. core_map_kernel: pl.run_state + pl.core_map over a plgpu.Mesh.
# ---------------------------------------------------------------------------

CM_ROWS, CM_COLS = 256, 128        # f32
CM_BLOCKS, CM_THREADS = 2, 2       # 2 CUDA blocks x 2 warpgroups
CM_ROWS_PER_THREAD = CM_ROWS // (CM_BLOCKS * CM_THREADS)   # 64


def core_map_kernel(x):
  """Low-level form of plgpu.kernel: ``pl.run_state`` turns the input and a
  preallocated output into GMEM refs, and ``pl.core_map`` runs the body on a
  ``plgpu.Mesh`` of 2 blocks x 2 warpgroups.

  Each (block, warpgroup) pair owns 64 rows: it TMA-loads them into its half
  of an SMEM buffer that ``pl.run_scoped(..., collective_axes="wg")``
  allocates once per block (on its own barrier), computes ``x * 3 - 1`` in
  SMEM, and TMA-stores the rows back.  It also writes its flat id
  ``block * num_threads + wg`` into a second output directly through the
  GMEM ref (a plain store, no TMA).

  JAX 0.11.2 note: ``pl.core_map`` still works (it now builds an ``mpmd_map``)
  but emits a DeprecationWarning pointing at ``pl.kernel(body, out_type,
  mesh=...)``, which is what ``plgpu.kernel`` wraps.
  """
  rows, cols = x.shape
  assert rows == CM_BLOCKS * CM_THREADS * CM_ROWS_PER_THREAD
  mesh = plgpu.Mesh(
      grid=(CM_BLOCKS,), grid_names=("blk",),
      num_threads=CM_THREADS, thread_name="wg",
  )

  @pl.run_state
  def stateful(refs):
    x_ref, y_ref, ids_ref = refs   # GMEM refs; we are not in the kernel yet.

    # (pl.core_map is deprecated for pl.kernel, which plgpu.kernel wraps; this
    # example keeps it to show that code written with it runs, so the
    # warning JAX gives for it is expected here.)
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", "jax.experimental.pallas.core_map is deprecated",
                              DeprecationWarning)
      core_map = pl.core_map(mesh)

    @core_map
    def _kernel_body():
      @functools.partial(
          pl.run_scoped,
          smem=plgpu.SMEM((CM_THREADS, CM_ROWS_PER_THREAD, cols), x.dtype),
          barriers=plgpu.Barrier(num_barriers=CM_THREADS),
          collective_axes="wg",   # One allocation shared by both warpgroups.
      )
      def _scope(smem, barriers):
        blk = lax.axis_index("blk")
        wg = lax.axis_index("wg")
        num_wgs = lax.axis_size("wg")
        rows_slice = pl.ds(
            (blk * num_wgs + wg) * CM_ROWS_PER_THREAD, CM_ROWS_PER_THREAD
        )
        my_smem = smem.at[wg]
        plgpu.copy_gmem_to_smem(x_ref.at[rows_slice], my_smem, barriers.at[wg])
        plgpu.barrier_wait(barriers.at[wg])
        my_smem[...] = my_smem[...] * 3.0 - 1.0
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(my_smem, y_ref.at[rows_slice])
        # Direct GMEM store of a splat.
        ids_ref[blk, wg] = jnp.broadcast_to(blk * num_wgs + wg, (cols,))
        plgpu.wait_smem_to_gmem(0)

  y_init = jnp.zeros_like(x)
  ids_init = jnp.zeros((CM_BLOCKS, CM_THREADS, cols), jnp.int32)
  _, y, ids = stateful((x, y_init, ids_init))
  return y, ids


def core_map_kernel_args(seed):
  rng = np.random.default_rng(seed)
  return (_nonzero_uniform(rng, (CM_ROWS, CM_COLS), np.float32),)


def core_map_kernel_reference(x):
  ids = np.arange(CM_BLOCKS * CM_THREADS, dtype=np.int32).reshape(
      CM_BLOCKS, CM_THREADS, 1)
  return _np(x) * 3.0 - 1.0, np.broadcast_to(ids, (CM_BLOCKS, CM_THREADS, CM_COLS))


# ---------------------------------------------------------------------------
# 4. control_flow_kernel: fori_loop / scan / while_loop / cond in a kernel.
# ---------------------------------------------------------------------------

CF_ROWS, CF_COLS = 256, 64         # f32, 64 KiB in SMEM
CF_CHUNK = 64                      # rows per chunk -> 4 chunks
CF_NCHUNKS = CF_ROWS // CF_CHUNK


def control_flow_kernel(x):
  """Rewrites four 64-row chunks of x in SMEM with structured control flow.

  1. ``lax.fori_loop`` over chunks i, with ``lax.cond`` on i's parity and on a
     cond that returns a value: even chunks are scaled by s, odd ones shifted
     by -s, where s = 2(i+1) for i < 2 and s = i+1 otherwise.
  2. ``lax.scan`` (loop-carried index, no xs/ys): prefix sum over chunks,
     chunk[j+1] += chunk[j].
  3. ``lax.while_loop`` with a stride-2 index and a doubling f32 scale:
     chunk[k] = chunk[k] * scale + chunk[k+1] for k = 0, 2.
  Chunks are addressed as ``smem.at[pl.ds(...)]`` sub-refs and
  ``smem[pl.ds(...), :]`` loads.
  """
  rows, cols = x.shape
  assert (rows, cols) == (CF_ROWS, CF_COLS)

  def body(x_gmem, o_gmem, smem, barrier):
    plgpu.copy_gmem_to_smem(x_gmem, smem, barrier)
    plgpu.barrier_wait(barrier)

    def chunk(i):
      return smem.at[pl.ds(i * CF_CHUNK, CF_CHUNK)]

    # 1. fori_loop + cond.
    def fori_body(i, carry):
      c = chunk(i)
      base = (i + 1).astype(jnp.float32)
      s = lax.cond(i < 2, lambda: base * 2.0, lambda: base)

      def even():
        c[...] = c[...] * s

      def odd():
        c[...] = c[...] - s

      lax.cond(lax.rem(i, 2) == 0, even, odd)
      return carry

    lax.fori_loop(0, CF_NCHUNKS, fori_body, None)

    # 2. scan with a loop-carried index and no xs / ys.
    def scan_body(j, _):
      prev = smem[pl.ds(j * CF_CHUNK, CF_CHUNK), :]
      cur = chunk(j + 1)
      cur[...] = cur[...] + prev
      return j + 1, None

    lax.scan(scan_body, jnp.int32(0), None, length=CF_NCHUNKS - 1)

    # 3. while_loop with a non-unit stride and a float carry.
    def while_cond(carry):
      k, _ = carry
      return k < CF_NCHUNKS

    def while_body(carry):
      k, scale = carry
      a = chunk(k)
      nxt = smem[pl.ds((k + 1) * CF_CHUNK, CF_CHUNK), :]
      a[...] = a[...] * scale + nxt
      return k + 2, scale * 2.0

    lax.while_loop(while_cond, while_body, (jnp.int32(0), jnp.float32(0.5)))

    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_gmem)
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
      scratch_types=[plgpu.SMEM(x.shape, x.dtype), plgpu.Barrier()],
  )(x)


def control_flow_kernel_args(seed):
  rng = np.random.default_rng(seed)
  return (_nonzero_uniform(rng, (CF_ROWS, CF_COLS), np.float32),)


def control_flow_kernel_reference(x):
  c = _np(x).reshape(CF_NCHUNKS, CF_CHUNK, CF_COLS).copy()
  for i in range(CF_NCHUNKS):
    s = np.float32(2 * (i + 1) if i < 2 else i + 1)
    c[i] = c[i] * s if i % 2 == 0 else c[i] - s
  for j in range(CF_NCHUNKS - 1):
    c[j + 1] = c[j + 1] + c[j]
  scale = np.float32(0.5)
  for k in range(0, CF_NCHUNKS, 2):
    c[k] = c[k] * scale + c[k + 1]
    scale = scale * np.float32(2.0)
  return c.reshape(CF_ROWS, CF_COLS)


# ---------------------------------------------------------------------------
# 5. pipeline_elementwise: plgpu.emit_pipeline with in_specs and out_specs.
# ---------------------------------------------------------------------------

PE_ROWS, PE_COLS = 256, 256        # f32
PE_BLOCKS = 2                      # CUDA blocks, each owns 128 rows
PE_TILE_M, PE_TILE_N = 32, 128     # 16 KiB tiles


def pipeline_elementwise(x, y, *, blocks=PE_BLOCKS, tile_m=PE_TILE_M, tile_n=PE_TILE_N,
                         mcs=2):
  """out = x + y; each of 2 CUDA blocks pipelines its 128 x 256 half over a
  (4, 2) grid of 32 x 128 tiles with ``plgpu.emit_pipeline`` (2 concurrent
  steps: the inputs of step s+2 are fetched while step s computes, and
  outputs are TMA-stored from the pipeline's SMEM ring). The keywords give
  other sizes (lab/timing_suite.py)."""
  rows, cols = x.shape
  assert x.shape == y.shape and rows % (blocks * tile_m) == 0 and cols % tile_n == 0
  tiles_per_block = rows // blocks // tile_m
  grid = (tiles_per_block, cols // tile_n)

  def body(x_gmem, y_gmem, o_gmem):
    blk = lax.axis_index("blk")

    def index_map(i, j):
      return blk * tiles_per_block + i, j

    def step(indices, x_smem, y_smem, o_smem):
      del indices
      o_smem[...] = x_smem[...] + y_smem[...]

    spec = pl.BlockSpec((tile_m, tile_n), index_map)
    plgpu.emit_pipeline(
        step,
        grid=grid,
        in_specs=[spec, spec],
        out_specs=[spec],
        max_concurrent_steps=mcs,
    )(x_gmem, y_gmem, o_gmem)

  return plgpu.kernel(
      body,
      out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(blocks,),
      grid_names=("blk",),
  )(x, y)


def pipeline_elementwise_args(seed):
  rng = np.random.default_rng(seed)
  return (
      _nonzero_uniform(rng, (PE_ROWS, PE_COLS), np.float32),
      _nonzero_uniform(rng, (PE_ROWS, PE_COLS), np.float32),
  )


def pipeline_elementwise_reference(x, y):
  return _np(x) + _np(y)


# ---------------------------------------------------------------------------
# 6. warp_specialized_matmul: plgpu.emit_pipeline_warp_specialized.
# ---------------------------------------------------------------------------

WS_M = WS_N = WS_K = 256
WS_TILE_M, WS_TILE_N = 128, 128
WS_TILE_K = 64                     # 128 bytes of f16 (128B swizzle)
WS_COMPUTE_WGS = 2                 # + 1 memory warpgroup


def warp_specialized_matmul(a, b):
  """The pipelining guide's warp-specialized matmul (f16 in, f32 acc, f16 out).

  3 warpgroups per block: 2 compute warpgroups each own a 128 x 128 output
  tile (adjacent columns, shared LHS tile), and the last warpgroup is the
  memory thread that ``emit_pipeline_warp_specialized`` drives (TMA loads,
  produced/consumed barriers).  The accumulator is created in
  ``compute_context`` (so only compute threads hold it) and carried through
  the pipeline; each step runs ``plgpu.wgmma`` on an ``ACC.init``-ed
  accumulator inside ``pl.run_state``.
  """
  m, k = a.shape
  k2, n = b.shape
  assert k == k2 and a.dtype == b.dtype == jnp.float16
  dtype = jnp.float16
  cta_tile_n = WS_TILE_N * WS_COMPUTE_WGS
  assert m % WS_TILE_M == 0 and n % cta_tile_n == 0 and k % WS_TILE_K == 0
  grid_m, grid_n, grid_k = m // WS_TILE_M, n // cta_tile_n, k // WS_TILE_K
  transforms = _mma_transforms(dtype)

  def kernel(a_gmem, b_gmem, o_gmem, o_smem):
    wg_idx = lax.axis_index("wg")
    wg_slice = pl.ds(wg_idx * WS_TILE_N, WS_TILE_N)
    # The guide uses pl.program_id(0/1); lax.axis_index on the grid names is
    # equivalent here (and JAX's GPU interpreter always returns 0 for
    # program_id).
    pid_m = lax.axis_index("m")
    pid_n = lax.axis_index("n")

    def compute_thread(pipeline):
      acc = plgpu.layout_cast(
          jnp.full((WS_TILE_M, WS_TILE_N), 0, dtype=jnp.float32),
          plgpu.Layout.WGMMA,
      )
      final_acc = pipeline(acc)
      # Epilogue, per compute warpgroup: its own SMEM slot and GMEM tile.
      o_smem[wg_idx] = final_acc.astype(dtype)
      plgpu.commit_smem()
      m_slice = pl.ds(pid_m * WS_TILE_M, WS_TILE_M)
      n_slice = pl.ds(pid_n * cta_tile_n + wg_idx * WS_TILE_N, WS_TILE_N)
      plgpu.copy_smem_to_gmem(o_smem.at[wg_idx], o_gmem.at[m_slice, n_slice])
      plgpu.wait_smem_to_gmem(0)

    def kernel_body(_, a_smem, b_smem, carry):
      b_smem_wg = b_smem.at[:, wg_slice]

      def do_wgmma(acc_ref):
        plgpu.wgmma(acc_ref, a_smem, b_smem_wg)

      return pl.run_state(do_wgmma)(plgpu.ACC.init(carry))

    pipeline = plgpu.emit_pipeline_warp_specialized(
        kernel_body,
        in_specs=[
            plgpu.BlockSpec((WS_TILE_M, WS_TILE_K), lambda kk: (pid_m, kk),
                            transforms=transforms),
            plgpu.BlockSpec((WS_TILE_K, cta_tile_n), lambda kk: (kk, pid_n),
                            transforms=transforms),
        ],
        grid=(grid_k,),
        compute_context=compute_thread,
        max_concurrent_steps=2,
        num_compute_wgs=WS_COMPUTE_WGS,
        memory_registers=40,
        memory_thread_idx=WS_COMPUTE_WGS,   # must be the last thread
        wg_axis="wg",
    )
    pipeline(a_gmem, b_gmem)

  return plgpu.kernel(
      kernel,
      out_type=jax.ShapeDtypeStruct((m, n), dtype),
      scratch_types=[
          plgpu.SMEM((WS_COMPUTE_WGS, WS_TILE_M, WS_TILE_N), dtype,
                     transforms=transforms),
      ],
      grid=(grid_m, grid_n),
      grid_names=("m", "n"),
      num_threads=WS_COMPUTE_WGS + 1,   # 2 compute + 1 memory
      thread_name="wg",
  )(a, b)


def warp_specialized_matmul_args(seed):
  rng = np.random.default_rng(seed)
  return (
      _nonzero_uniform(rng, (WS_M, WS_K), np.float16),
      _nonzero_uniform(rng, (WS_K, WS_N), np.float16),
  )


def warp_specialized_matmul_reference(a, b):
  return (_np(a) @ _np(b)).astype(np.float16).astype(np.float32)


# ---------------------------------------------------------------------------
# 7. pallas_call_kernel: pl.pallas_call + plgpu.CompilerParams + BlockSpecs.
# ---------------------------------------------------------------------------

PC_ROWS, PC_COLS = 256, 256        # f32
PC_BLOCK_M, PC_BLOCK_N = 64, 128
PC_GRID = (PC_ROWS // PC_BLOCK_M, PC_COLS // PC_BLOCK_N)   # (4, 2)


def _gated_block_kernel(x_ref, g_ref, o_ref):
  """Per-block body: o = x * sigmoid(g) + (linear id of the block)."""
  block_id = pl.program_id(0) * pl.num_programs(1) + pl.program_id(1)
  o_ref[...] = (
      x_ref[...] * jax.nn.sigmoid(g_ref[...]) + block_id.astype(jnp.float32)
  )


def _pallas_call_config(x):
  spec = pl.BlockSpec((PC_BLOCK_M, PC_BLOCK_N), lambda i, j: (i, j))
  return dict(
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=PC_GRID,
      in_specs=[spec, spec],
      out_specs=spec,
      # Axis 0 is a parallel CUDA grid axis; axis 1 is pipelined sequentially
      # with 2 steps in flight.
      compiler_params=plgpu.CompilerParams(
          dimension_semantics=("parallel", "sequential"),
          max_concurrent_steps=2,
      ),
  )


def pallas_call_kernel(x, g, *, interpret=False):
  """out = x * sigmoid(g) + block_id over a (4, 2) grid of 64 x 128 blocks,
  written with the compatibility ``pl.pallas_call`` API,
  ``plgpu.CompilerParams(dimension_semantics=..., max_concurrent_steps=...)``
  and BlockSpecs; the body uses ``pl.program_id`` / ``pl.num_programs``.

  JAX 0.11.2 note: this traces to a ``pallas_call`` primitive, but 0.11.2
  registers no Mosaic GPU lowering for ``pallas_call`` any more (lowering it
  for CUDA fails with an assertion in pallas_call.py's ``gpu_lowering``), and
  the GPU interpreter only accepts whole-array BlockSpecs.  It runs with the
  generic Pallas interpreter (``interpret=True``).  ``pallas_call_compat_kernel``
  is the same program through 0.11.2's Mosaic GPU pallas_call shim, which does
  lower and run on a GPU.
  """
  assert x.shape == g.shape == (PC_ROWS, PC_COLS)
  return pl.pallas_call(
      _gated_block_kernel, **_pallas_call_config(x), interpret=interpret
  )(x, g)


def pallas_call_compat_kernel(x, g):
  """``pallas_call_kernel`` through ``jax._src.pallas.mosaic_gpu.pallas_call``,
  the shim 0.11.2 uses to give ``pallas_call`` semantics on Mosaic GPU: the
  parallel grid axes become a ``plgpu.kernel`` CUDA grid (axis names "d0",
  ...), the sequential axes a ``plgpu.emit_pipeline`` over SMEM blocks, and
  ``pl.program_id`` is resolved through a grid environment.  It is private
  API (a testing shim), so this example may need updating with JAX.
  """
  from jax._src.pallas.mosaic_gpu import pallas_call as mgpu_pallas_call

  assert x.shape == g.shape == (PC_ROWS, PC_COLS)
  cfg = _pallas_call_config(x)
  out_shape = cfg.pop("out_shape")
  return mgpu_pallas_call.pallas_call(_gated_block_kernel, out_shape, **cfg)(
      x, g
  )


def pallas_call_kernel_args(seed):
  rng = np.random.default_rng(seed)
  return (
      _nonzero_uniform(rng, (PC_ROWS, PC_COLS), np.float32),
      _nonzero_uniform(rng, (PC_ROWS, PC_COLS), np.float32),
  )


def pallas_call_kernel_reference(x, g):
  x, g = _np(x), _np(g)
  block_id = np.arange(PC_GRID[0] * PC_GRID[1], dtype=np.float32).reshape(
      PC_GRID)
  block_id = np.repeat(np.repeat(block_id, PC_BLOCK_M, 0), PC_BLOCK_N, 1)
  return x / (1.0 + np.exp(-g)) + block_id


# ---------------------------------------------------------------------------
# Registry.
# ---------------------------------------------------------------------------

EXAMPLES = [
    ("two_thread_copy", two_thread_copy, two_thread_copy_args,
     two_thread_copy_reference),
    ("hand_pipelined_matmul", hand_pipelined_matmul,
     hand_pipelined_matmul_args, hand_pipelined_matmul_reference),
    ("core_map_kernel", core_map_kernel, core_map_kernel_args,
     core_map_kernel_reference),
    ("control_flow_kernel", control_flow_kernel, control_flow_kernel_args,
     control_flow_kernel_reference),
    ("pipeline_elementwise", pipeline_elementwise, pipeline_elementwise_args,
     pipeline_elementwise_reference),
    ("warp_specialized_matmul", warp_specialized_matmul,
     warp_specialized_matmul_args, warp_specialized_matmul_reference),
    ("pallas_call_kernel", pallas_call_kernel, pallas_call_kernel_args,
     pallas_call_kernel_reference),
    ("pallas_call_compat_kernel", pallas_call_compat_kernel,
     pallas_call_kernel_args, pallas_call_kernel_reference),
]

# (rtol, atol) for comparing a kernel's output(s) with its reference.
TOLERANCES = {
    "two_thread_copy": (1e-6, 1e-6),
    "hand_pipelined_matmul": (1e-3, 1e-3),     # f32 accumulation order
    "core_map_kernel": (1e-6, 1e-6),
    "control_flow_kernel": (1e-5, 1e-5),
    "pipeline_elementwise": (1e-6, 1e-6),
    "warp_specialized_matmul": (2e-3, 2e-2),   # f16 output rounding
    "pallas_call_kernel": (1e-5, 1e-5),
    "pallas_call_compat_kernel": (1e-5, 1e-5),
}

# Kernels whose outputs use f32 exp (libdevice on the GPU, within 2 ulp; numpy
# here): the one documented place where simulator and hardware may differ in
# the last bits. All others are bit-identical (tests/test_gpu.py asserts it).
INEXACT = ("pallas_call_kernel", "pallas_call_compat_kernel")

# Kernels that JAX 0.11.2 cannot lower for a GPU (see their docstrings).  They
# run with the generic Pallas interpreter: ``fn(*args, interpret=True)``.
NOT_LOWERABLE = ("pallas_call_kernel",)

# Primitives that start a kernel body.
KERNEL_PRIMITIVES = ("mpmd_map", "pallas_call", "core_map")


# ---------------------------------------------------------------------------
# Jaxpr walking (used by __main__, handy for the simulator's tests too).
# ---------------------------------------------------------------------------

def _sub_jaxprs(value):
  """Yields the jaxprs found in an equation parameter value."""
  if isinstance(value, jax.extend.core.ClosedJaxpr):
    yield value.jaxpr
  elif isinstance(value, jax.extend.core.Jaxpr):
    yield value
  elif isinstance(value, (tuple, list)):
    for v in value:
      yield from _sub_jaxprs(v)
  elif isinstance(value, dict):
    for v in value.values():
      yield from _sub_jaxprs(v)


def collect_primitives(jaxpr, names=None):
  """All primitive names in ``jaxpr`` and, recursively, its sub-jaxprs."""
  if names is None:
    names = set()
  for eqn in jaxpr.eqns:
    names.add(eqn.primitive.name)
    for param in eqn.params.values():
      for sub in _sub_jaxprs(param):
        collect_primitives(sub, names)
  return names


def kernel_body_primitives(jaxpr, names=None):
  """Primitive names used inside kernel bodies (mpmd_map / pallas_call)."""
  if names is None:
    names = set()
  for eqn in jaxpr.eqns:
    inside = eqn.primitive.name in KERNEL_PRIMITIVES
    for param in eqn.params.values():
      for sub in _sub_jaxprs(param):
        if inside:
          collect_primitives(sub, names)
        else:
          kernel_body_primitives(sub, names)
  return names


def _outputs_match(name, out, expected):
  rtol, atol = TOLERANCES[name]
  outs = out if isinstance(out, (tuple, list)) else (out,)
  exps = expected if isinstance(expected, (tuple, list)) else (expected,)
  assert len(outs) == len(exps), (len(outs), len(exps))
  for o, e in zip(outs, exps):
    np.testing.assert_allclose(
        np.asarray(o, dtype=np.float64), np.asarray(e, dtype=np.float64),
        rtol=rtol, atol=atol, err_msg=name)


def _check_interpret(name, fn, args, reference):
  """Runs ``fn`` in JAX's GPU interpret mode (CPU) with race detection."""
  from pallas_sim.backends.sim.base import jax_internals as jx
  interpret_pallas_call = jx.interpret_pallas_call

  if name in NOT_LOWERABLE:
    out = jax.block_until_ready(fn(*args, interpret=True))
    _outputs_match(name, out, reference(*args))
    return "generic Pallas interpreter (interpret=True): matches reference"
  # (races counted, not raised: jax 0.12's interpreter raises by default)
  params = jx.interpret_params(detect_races=True)
  try:
    with plgpu.force_gpu_interpret_mode(params):
      out = jax.block_until_ready(fn(*args))
  except Exception as e:  # pylint: disable=broad-except
    # JAX 0.11.2's GPU interpreter does not cover everything the hardware
    # does, e.g. predicated SMEM->GMEM copies (used by emit_pipeline for its
    # outputs) or wgmma inside pl.run_state.
    interpret_pallas_call.reset_gpu_interpret_mode_state()
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    msg = lines[-1] if lines else type(e).__name__
    return f"not supported by JAX's GPU interpreter: {msg[:160]}"
  races = interpret_pallas_call.get_races().races_found
  _outputs_match(name, out, reference(*args))
  return f"GPU interpreter: matches reference, races_found={races}"


def main(argv):
  do_lower = "--lower" in argv
  do_interpret = "--interpret" in argv
  do_run = "--run" in argv
  union = set()
  for name, fn, make_args, reference in EXAMPLES:
    args = make_args(0)
    jaxpr = jax.make_jaxpr(fn)(*args)
    prims = kernel_body_primitives(jaxpr.jaxpr)
    union |= prims
    print(f"{name}: {sorted(prims)}", flush=True)
    lowerable = name not in NOT_LOWERABLE
    if do_lower:
      if lowerable:
        exported = jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)
        assert "mosaic_gpu" in exported.mlir_module(), name
        print("  lower: Mosaic GPU lowering for cuda succeeded", flush=True)
      else:
        print("  lower: skipped (no Mosaic GPU pallas_call lowering in 0.11.2)")
    if do_interpret:
      print(f"  interpret: {_check_interpret(name, fn, args, reference)}",
            flush=True)
    if do_run:
      if lowerable:
        out = jax.block_until_ready(jax.jit(fn)(*args))
        _outputs_match(name, out, reference(*args))
        print("  run: matches reference", flush=True)
      else:
        print("  run: skipped (no Mosaic GPU pallas_call lowering in 0.11.2)")
  print(f"union: {sorted(union)}")


if __name__ == "__main__":
  import sys
  main(sys.argv[1:])
