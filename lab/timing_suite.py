"""The suite of real Pallas Mosaic GPU kernels whose run time the simulator
predicts (to calibrate the timing model against an H200).

A library: importing it builds nothing and touches no device. `CASES` is a list
of `Case`s; `case.build()` makes `Built(fn, args, reference)`, where `args` are
jax arrays drawn from a seeded numpy RNG (random, never zeros) and
`reference(*args)` is the expected output in float32 (jnp code: on the GPU it
runs through XLA there). `flops` counts the tensor-core (or ALU) work;
`bytes` the fewest HBM bytes the kernel must move (every input read once,
every output written once).

Families: kernels of one family are configurations of one kernel at one size,
so their times compare directly (e.g. "quickstart matmul 4096").
`small=True` marks a row expected under ~150 us of GPU time (launch and L2
effects weigh more there; the 2048^3 matmuls' operands fit in L2).

    from lab.timing_suite import CASES, by_name
    b = by_name("quickstart 4096 128x128x64 mcs=2").build()
    out = jax.jit(b.fn)(*b.args)

`scaled(case, factor)` gives the same kernel at a CPU-simulable size (used by
lab/measure_gpu.py --sim-check and the CPU checks of calibrate.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import operator
import os
import sys
import threading
from typing import Any, Callable

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _paths():
  """tests/ and examples/ on sys.path (for matmul_mcs and the examples); done
  when a case is built, not at import."""
  for sub in ("tests", "examples"):
    p = os.path.join(_ROOT, sub)
    if p not in sys.path:
      sys.path.insert(0, p)


SMEM_LIMIT = 232448  # Mosaic's max_smem_bytes on sm_90 (227 KiB)


@dataclasses.dataclass
class Built:
  fn: Callable
  args: tuple
  reference: Callable  # (*args) -> float32 array (jnp), or None
  tol: float = 1e-2    # max relative error ||out - ref|| / ||ref||
  # Inputs for the correctness check, where they differ from the timed
  # `args` (same shapes and dtypes: the same compiled kernel runs on both).
  check_args: tuple | None = None


@dataclasses.dataclass
class Case:
  name: str
  family: str
  params: dict
  flops: float
  bytes: float
  make: Callable[..., Built]   # make(**params) -> Built
  small: bool = False
  note: str = ""

  def build(self, **override) -> Built:
    return self.make(**{**self.params, **override})


# ---------------------------------------------------------------------------
# Inputs.
# ---------------------------------------------------------------------------

_CACHE = {}
_LOCK = threading.Lock()


def _rand(seed, shape, dtype, scale=1.0, shift=0.0):
  """Standard normal values (times scale) in dtype from numpy's RNG seeded
  with `seed`, as a jax array (cached by recipe: the configurations of one
  family share their inputs). Never all zeros; for f16/bf16 matmuls the
  K-sums of such values stay far from overflow at the sizes here."""
  import jax.numpy as jnp
  key = (seed, tuple(shape), str(jnp.dtype(dtype)), scale, shift)
  with _LOCK:
    if key not in _CACHE:
      rng = np.random.default_rng(seed)
      x = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
      if shift:
        x += np.float32(shift)
      if np.dtype(jnp.dtype(dtype)).kind in "iu":  # (integers: rounded, in range)
        info = np.iinfo(jnp.dtype(dtype))
        x = np.clip(np.round(x), info.min, info.max)
      _CACHE[key] = jnp.asarray(x, dtype)
    return _CACHE[key]


def clear_cache():
  _CACHE.clear()


def _rel_tol_for(dtype_out):
  import jax.numpy as jnp
  return {jnp.dtype(jnp.float16): 5e-3, jnp.dtype(jnp.bfloat16): 2e-2}.get(
      jnp.dtype(dtype_out), 1e-4)


def _matmul_ref(a, b):
  import jax
  import jax.numpy as jnp
  return jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32),
                 precision=jax.lax.Precision.HIGHEST)


# ---------------------------------------------------------------------------
# 1. The quickstart matmul (tests/test_quickstart.py matmul_mcs), f16.
# ---------------------------------------------------------------------------

def _matmul_mcs():
  """tests/test_quickstart.py's matmul_mcs. Imported as a module; should that
  import fail (it also imports pallas_sim and the test helpers, which may be
  mid-edit in a working tree), the function alone is compiled from the
  file's source."""
  _paths()
  try:
    from test_quickstart import matmul_mcs
    return matmul_mcs
  except Exception:
    import ast
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    path = os.path.join(_ROOT, "tests", "test_quickstart.py")
    tree = ast.parse(open(path).read(), path)
    fdef = [n for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name == "matmul_mcs"]
    import contextlib
    ns = dict(jax=jax, jnp=jnp, pl=pl, plgpu=plgpu, contextlib=contextlib)
    exec(compile(ast.Module(body=fdef, type_ignores=[]), path, "exec"), ns)
    return ns["matmul_mcs"]


def _make_quickstart(size, tile_n, tile_k, mcs, seed=0, dtype="float16", mkn=None):
  import jax.numpy as jnp
  matmul_mcs = _matmul_mcs()
  m, k, n = mkn or (size, size, size)
  a = _rand(seed, (m, k), jnp.dtype(dtype))
  b = _rand(seed + 100, (k, n), jnp.dtype(dtype))
  fn = functools.partial(matmul_mcs, tile_n=tile_n, tile_k=tile_k,
                         max_concurrent_steps=mcs, out_dtype=jnp.dtype(dtype))
  return Built(fn, (a, b), _matmul_ref, tol=_rel_tol_for(dtype))


def _smem_need(tile_m, tile_n, tile_k, mcs, itemsize=2):
  # The same formula as tests/test_quickstart.py _smem_need (not imported at
  # module import, to keep this module free of side effects).
  align = lambda x: -(-x // 1024) * 1024
  return (align(tile_m * tile_n * itemsize) + align(mcs * tile_m * tile_k * itemsize)
          + align(mcs * tile_k * tile_n * itemsize) + 8 * mcs)


# (tile_n, tile_k, max_concurrent_steps): each parameter varied around the
# 128x128x64 mcs=2 baseline; the 128x256 tiles spill registers on the GPU
# (a 128x256 f32 accumulator is 256 registers a lane), with 208, 160 and
# 160 KiB of SMEM, which leave the spills 28-92 KiB of L1.
QUICKSTART_CONFIGS = [
    (128, 64, 2), (128, 64, 3), (128, 64, 4),
    (128, 32, 4), (128, 128, 2),
    (64, 64, 3), (64, 128, 4),
    (256, 64, 3), (256, 32, 4), (256, 64, 2),
]
QUICKSTART_SIZES = (2048, 4096, 8192)


def _quickstart_cases():
  out = []
  for size in QUICKSTART_SIZES:
    for tn, tk, mcs in QUICKSTART_CONFIGS:
      if _smem_need(128, tn, tk, mcs) > SMEM_LIMIT:
        continue
      out.append(Case(
          name=f"quickstart {size} 128x{tn}x{tk} mcs={mcs}",
          family=f"quickstart matmul {size}",
          params=dict(size=size, tile_n=tn, tile_k=tk, mcs=mcs),
          flops=2.0 * size ** 3, bytes=3.0 * size * size * 2,
          make=_make_quickstart, small=size <= 2048,
          note="operands fit in L2" if size <= 2048 else ""))
  return out


# ---------------------------------------------------------------------------
# 2. Memory-bound elementwise: out = x + y over 64M f32.
# ---------------------------------------------------------------------------

EW_ROWS, EW_COLS = 65536, 1024      # 64M f32 = 256 MiB per array


def elementwise_regs(x, y, *, rows_per_block=8, row_tile=None, op=None):
  """out = x + y (or op(x, y)) with plain GMEM loads into registers and plain
  stores back (no TMA, no SMEM): a grid of blocks, each adds `rows_per_block`
  full rows (`row_tile` rows at a time, in a loop)."""
  import jax
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  row_tile = row_tile or rows_per_block
  assert rows % rows_per_block == 0 and rows_per_block % row_tile == 0
  steps = rows_per_block // row_tile

  def body(x_ref, y_ref, o_ref):
    base = lax.axis_index("b") * rows_per_block

    def step(s, carry):
      sl = pl.ds(base + s * row_tile, row_tile)
      o_ref[sl, :] = (op or operator.add)(x_ref[sl, :], y_ref[sl, :])
      return carry

    if steps == 1:
      step(0, None)
    else:
      lax.fori_loop(0, steps, step, None)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(rows // rows_per_block,), grid_names=("b",))(x, y)


def elementwise_pipeline(x, y, *, blocks=1024, tile_m=32, tile_n=256, mcs=2):
  """out = x + y through plgpu.emit_pipeline: examples/kernels.py
  pipeline_elementwise at these sizes (each of `blocks` CUDA blocks
  pipelines its rows over (tile_m, tile_n) tiles, TMA in and out)."""
  _paths()
  from kernels import pipeline_elementwise
  return pipeline_elementwise(x, y, blocks=blocks, tile_m=tile_m, tile_n=tile_n, mcs=mcs)


def _add_ref(x, y):
  return x + y


def _make_ew(kind, rows=EW_ROWS, cols=EW_COLS, seed=1, **kw):
  import jax.numpy as jnp
  x = _rand(seed, (rows, cols), jnp.float32)
  y = _rand(seed + 100, (rows, cols), jnp.float32)
  f = elementwise_regs if kind == "regs" else elementwise_pipeline
  return Built(functools.partial(f, **kw), (x, y), _add_ref, tol=1e-6)


def _ew_case(name, family, **params):
  """out = x + y over EW_ROWS x EW_COLS f32 (regs or pipeline: params' kind)."""
  n = EW_ROWS * EW_COLS
  return Case(name=name, family=family, params=params, flops=float(n),
              bytes=3.0 * n * 4, make=_make_ew)


def _ew_cases():
  return [
      _ew_case("add regs 64M f32 8 rows/block", "elementwise regs 64M f32",
         kind="regs", rows_per_block=8),
      _ew_case("add regs 64M f32 32 rows/block (4 at a time)", "elementwise regs 64M f32",
         kind="regs", rows_per_block=32, row_tile=4),
      _ew_case("add pipeline 64M f32 1024 blocks 32x256 mcs=2", "elementwise pipeline 64M f32",
         kind="pipeline", blocks=1024, tile_m=32, tile_n=256, mcs=2),
      _ew_case("add pipeline 64M f32 128 blocks 16x256 mcs=3", "elementwise pipeline 64M f32",
         kind="pipeline", blocks=128, tile_m=16, tile_n=256, mcs=3),
      _ew_case("add pipeline 64M f32 2048 blocks 16x128 mcs=4", "elementwise pipeline 64M f32",
         kind="pipeline", blocks=2048, tile_m=16, tile_n=128, mcs=4),
  ]


# ---------------------------------------------------------------------------
# 3. Reduction: row sums of a large f32 matrix.
# ---------------------------------------------------------------------------

RS_ROWS, RS_COLS = 32768, 8192      # 256M f32 = 1 GiB


def row_sums(x, *, block_m=128, tile_k=128, mcs=2):
  """out[i] = sum_j x[i, j]: each block owns `block_m` rows and pipelines
  them over (block_m, tile_k) tiles (TMA into SMEM), loading each tile into
  registers in the WGMMA layout (one warpgroup holds 64-row strips) and
  adding its row sums to a carried (block_m,) vector; the sums go out
  through SMEM and a TMA store."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  rows, cols = x.shape
  assert rows % block_m == 0 and cols % tile_k == 0 and block_m % 64 == 0

  def body(x_gmem, o_gmem, o_smem):
    bm = lax.axis_index("m")

    def step(indices, x_smem, carry):
      del indices
      v = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA)
      return carry + jnp.sum(v, axis=1)

    init = plgpu.layout_cast(jnp.zeros((block_m,), jnp.float32),
                             plgpu.Layout.WGMMA.reduce(1))
    acc = plgpu.emit_pipeline(
        step, grid=(cols // tile_k,),
        in_specs=[pl.BlockSpec((block_m, tile_k), lambda k: (bm, k))],
        max_concurrent_steps=mcs, init_carry=init)(x_gmem)
    o_smem[...] = acc
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_gmem.at[pl.ds(bm * block_m, block_m)])
    plgpu.wait_smem_to_gmem(0)

  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct((rows,), jnp.float32),
      scratch_types=[plgpu.SMEM((block_m,), jnp.float32)],
      grid=(rows // block_m,), grid_names=("m",))(x)


def _rowsum_ref(x):
  import jax
  import jax.numpy as jnp
  return jnp.sum(x.astype(jnp.float32), axis=1)


def _make_rowsum(rows=RS_ROWS, cols=RS_COLS, seed=2, **kw):
  import jax.numpy as jnp
  # Positive-mean values (normal, mean 1): the relative error of the sums
  # means something.
  x = _rand(seed, (rows, cols), jnp.float32, shift=1.0)
  return Built(functools.partial(row_sums, **kw), (x,), _rowsum_ref, tol=1e-5)


def _rowsum_cases():
  n = RS_ROWS * RS_COLS
  mk = lambda name, **p: Case(
      name=name, family="row sums 32768x8192 f32", params=p, flops=float(n),
      bytes=4.0 * (n + RS_ROWS), make=_make_rowsum)
  return [
      mk("rowsum 128 rows/block 128x128 mcs=2", block_m=128, tile_k=128, mcs=2),
      mk("rowsum 64 rows/block 64x256 mcs=3", block_m=64, tile_k=256, mcs=3),
  ]


# ---------------------------------------------------------------------------
# 4. examples/kernels.py warp_specialized_matmul (any size; 128x256 block
#    tiles, 2 compute warpgroups + 1 memory warpgroup), f16.
# ---------------------------------------------------------------------------

def _make_ws(size, seed=0):
  import jax.numpy as jnp
  _paths()
  from kernels import warp_specialized_matmul
  a = _rand(seed, (size, size), jnp.float16)
  b = _rand(seed + 100, (size, size), jnp.float16)
  return Built(warp_specialized_matmul, (a, b), _matmul_ref, tol=5e-3)


def _ws_cases():
  return [Case(name=f"warp_specialized_matmul {s}", family="warp-specialized matmul",
               params=dict(size=s), flops=2.0 * s ** 3, bytes=3.0 * s * s * 2,
               make=_make_ws) for s in (4096, 8192)]


# ---------------------------------------------------------------------------
# 5. JAX's hopper_matmul_mgpu and attention_mgpu (the installed jax's).
# ---------------------------------------------------------------------------

def _hopper_fields(mcs, wg, minor, width, tile_n=128, cluster=None):
  """TuningConfig fields of hopper_matmul_mgpu (MatmulDimension by name),
  128xtile_nx64 tiles."""
  return dict(tile_m=128, tile_n=tile_n, tile_k=64, max_concurrent_steps=mcs,
              grid_minor_dim=minor, grid_tile_width=width, wg_dimension=wg,
              **({"cluster_dimension": cluster} if cluster else {}))


HOPPER_CONFIGS = {
    "128x128x64 mcs=4 wgN minorN w4": _hopper_fields(4, "N", "N", 4),
    "128x128x64 mcs=4 wgM minorM w8": _hopper_fields(4, "M", "M", 8),
    "128x128x64 mcs=4 wgN minorN w4 clusterM": _hopper_fields(4, "N", "N", 4, cluster="M"),
}


def _hopper_config(module, config):
  """A TuningConfig of `module` (hopper_matmul_mgpu or its mixed-type
  sibling) from a HOPPER_CONFIGS-style dict, dimensions by name."""
  fields = dict(config)
  for k in ("grid_minor_dim", "wg_dimension", "cluster_dimension"):
    if fields.get(k) is not None:
      fields[k] = module.MatmulDimension[fields[k]]
  return module.TuningConfig(epi_tile_n=64, epi_tile_m=64, **fields)


def _make_hopper(size, config, dtype="float16", seed=0, mkn=None):
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
  cfg = _hopper_config(hm, {**HOPPER_CONFIGS, **HOLDOUT_HOPPER_CONFIGS}[config])
  m, k, n = mkn or (size, size, size)
  a = _rand(seed, (m, k), jnp.dtype(dtype))
  b = _rand(seed + 100, (k, n), jnp.dtype(dtype))
  return Built(lambda a, b: hm.matmul(a, b, None, cfg), (a, b), _matmul_ref,
               tol=_rel_tol_for(dtype))


def _hopper_cases():
  return [Case(name=f"hopper_matmul {s} f16 {c}", family=f"hopper_matmul_mgpu {s}",
               params=dict(size=s, config=c), flops=2.0 * s ** 3,
               bytes=3.0 * s * s * 2, make=_make_hopper)
          for s in (4096, 8192) for c in HOPPER_CONFIGS]


def _make_attention(batch, seq, heads, head_dim, block_q, block_kv, causal,
                    mcs=2, seed=5):
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.gpu import attention_mgpu as am
  shape = (batch, seq, heads, head_dim)
  q, k, v = (_rand(seed + 100 * i, shape, jnp.float16) for i in range(3))
  cfg = am.TuningConfig(block_q=block_q, block_kv=block_kv,
                        max_concurrent_steps=mcs, causal=causal)

  def ref(q, k, v):
    return am.attention_reference(q, k, v, causal=causal).astype(jnp.float32)

  return Built(lambda q, k, v: am.attention(q, k, v, cfg), (q, k, v), ref, tol=1e-2)


def _attention_cases():
  out = []
  for batch, seq, heads, d, bq, bkv, causal in [
      (1, 4096, 32, 128, 64, 128, False),
      (1, 4096, 32, 128, 64, 64, False),
      (1, 8192, 16, 128, 64, 128, True),
      (1, 4096, 32, 64, 64, 128, False),
  ]:
    flops = 4.0 * batch * seq * seq * heads * d / (2 if causal else 1)
    out.append(Case(
        name=f"attention fwd b{batch} s{seq} h{heads} d{d} bq{bq} bkv{bkv}"
             + (" causal" if causal else ""),
        family=f"attention_mgpu fwd s{seq} h{heads} d{d}" + (" causal" if causal else ""),
        params=dict(batch=batch, seq=seq, heads=heads, head_dim=d, block_q=bq,
                    block_kv=bkv, causal=causal),
        flops=flops, bytes=4.0 * batch * seq * heads * d * 2,
        make=_make_attention))
  return out


def all_cases():
  return (_quickstart_cases() + _ew_cases() + _rowsum_cases() + _ws_cases()
          + _hopper_cases() + _attention_cases())


# ---------------------------------------------------------------------------
# Diagnostics (not in CASES, not in accuracy's figures): the quickstart's
# pipeline taken apart, to see which half of a matmul the model gets wrong.
# "loads only": the same TMA loads, barriers and output, no wgmma (the
# L2/HBM side alone, at the clock a kernel without tensor work holds);
# "one tile": every load of every block reads A's first tile and B's first
# (the L2 serves what all SMs read at once far faster than it streams:
# lab/calibrate.py l2_same_tile), so the tensor cores and the
# pipeline's own steps set the time; "and delay": each with scalar work in
# place of the wgmma, as long as it, at the clock such work holds.
# Measured: "pipeline_study" and "power_study_diagnostic" in
# h200_measured.json (benchmarks/HISTORY.md).
# ---------------------------------------------------------------------------

# A "delay" step: this many cycles of dependent scalar work (the rounds of
# lab/calibrate.py scalar_loop, 4.29 cycles an equation on the H200)
# per tile FLOP / DELAY_FLOP_PER_CYCLE: as long as its wgmma would take.
DELAY_FLOP_PER_CYCLE = 3400


def delay_rounds(tile_n, tile_k, tile_m=128):
  return max(1, round(2 * tile_m * tile_n * tile_k / DELAY_FLOP_PER_CYCLE / (4 * 4.29)))


def matmul_pipeline(a, b, *, tile_n, tile_k, mcs, mode, tile_m=128):
  """The quickstart matmul (tests/test_quickstart.py matmul_mcs) with
  mode="loads" (no wgmma: the output is zeros), "one_tile" (every step
  of every block loads A[:tile_m, :tile_k] and B[:tile_k, :tile_n]) or
  "delay" (the loads, and in place of each wgmma as many cycles of scalar
  work, delay_rounds: the pipeline's overlap of loads and work, at the
  clock a kernel without tensor work holds; the output is zeros unless the
  scalar ends at one value, so that it must be computed), or
  "delay_one_tile" (that work on one tile's loads: the delay's own time)."""
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl
  from jax.experimental.pallas import mosaic_gpu as plgpu
  m, k = a.shape
  n = b.shape[1]
  one = mode in ("one_tile", "delay_one_tile")
  delay = mode in ("delay", "delay_one_tile")

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((m, n), jnp.float16),
                scratch_types=dict(o_smem=plgpu.SMEM((tile_m, tile_n), jnp.float16),
                                   acc=plgpu.ACC((tile_m, tile_n), jnp.float32)),
                grid=(m // tile_m, n // tile_n), grid_names=("m", "n"))
  def kernel(a_gmem, b_gmem, o_gmem, o_smem, acc):
    pid_m = jax.lax.axis_index("m")
    pid_n = jax.lax.axis_index("n")

    def body(_, a_smem, b_smem, *carry):
      if delay:
        def spin(i, c):
          c = c * 1664525 + i
          return c ^ jax.lax.shift_right_logical(c, 13)
        return jax.lax.fori_loop(0, delay_rounds(tile_n, tile_k, tile_m), spin,
                                 carry[0])
      if mode != "loads":
        plgpu.wgmma(acc, a_smem, b_smem)
        plgpu.wgmma_wait(1)

    spun = plgpu.emit_pipeline(
        body, grid=(k // tile_k,),
        in_specs=[plgpu.BlockSpec((tile_m, tile_k),
                                  lambda ki: (0, 0) if one else (pid_m, ki),
                                  delay_release=1),
                  plgpu.BlockSpec((tile_k, tile_n),
                                  lambda ki: (0, 0) if one else (ki, pid_n),
                                  delay_release=1)],
        max_concurrent_steps=mcs,
        init_carry=pid_m + pid_n if delay else None)(a_gmem, b_gmem)
    out = acc[...]
    if delay:  # (0 unless the scalar hits one value: it must be computed)
      out = out + (spun == 0x7FFF1234).astype(jnp.float32)
    o_smem[...] = out.astype(jnp.float16)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(
        o_smem, o_gmem.at[pl.ds(pid_m * tile_m, tile_m), pl.ds(pid_n * tile_n, tile_n)])
    plgpu.wait_smem_to_gmem(0)

  return kernel(a, b)


def _pipeline_ref(a, b, *, tile_n, tile_k, mode, tile_m=128):
  import jax.numpy as jnp
  m, k = a.shape
  n = b.shape[1]
  if mode in ("loads", "delay", "delay_one_tile"):
    return jnp.zeros((m, n), jnp.float16)
  t = _matmul_ref(a[:tile_m, :tile_k], b[:tile_k, :tile_n]).astype(jnp.float32)
  return jnp.tile(t * (k // tile_k), (m // tile_m, n // tile_n)).astype(jnp.float16)


def _make_pipeline(size, tile_n, tile_k, mcs, mode, seed=0):
  import jax.numpy as jnp
  a = _rand(seed, (size, size), jnp.float16)
  b = _rand(seed + 100, (size, size), jnp.float16)
  fn = functools.partial(matmul_pipeline, tile_n=tile_n, tile_k=tile_k, mcs=mcs,
                         mode=mode)
  ref = functools.partial(_pipeline_ref, tile_n=tile_n, tile_k=tile_k, mode=mode)
  return Built(fn, (a, b), ref, tol=5e-3)


def _diagnostic_cases():
  out = []
  for mode, label in (("loads", "loads only"), ("one_tile", "one tile"),
                      ("delay", "loads and delay"),
                      ("delay_one_tile", "one tile and delay")):
    for size in (4096, 8192):
      for tn, tk, mcs in QUICKSTART_CONFIGS:
        if tn == 256:  # (the spilling tiles: their own study, spill_study)
          continue
        out.append(Case(
            name=f"quickstart {label} {size} 128x{tn}x{tk} mcs={mcs}",
            family=f"quickstart {label} {size}",
            params=dict(size=size, tile_n=tn, tile_k=tk, mcs=mcs, mode=mode),
            flops=2.0 * size ** 3 if mode == "one_tile" else 0.0,
            bytes=2.0 * size ** 3 * (128 + tn) / (128 * tn),  # (what the loads move)
            make=_make_pipeline))
  return out


# ---------------------------------------------------------------------------
# Held out (not in CASES, never used to set a figure of pallas_sim/gpus.py):
# kernels, sizes and dtypes the model was not calibrated on, predicted
# before they were first measured (lab/data/holdout_predictions.json,
# committed before the GPU run; benchmarks/HISTORY.md). They say how
# the model does on kernels it has not seen, which is what a user has.
# ---------------------------------------------------------------------------

HOLDOUT_HOPPER_CONFIGS = {
    "128x128x64 mcs=2 wgM minorM w1": _hopper_fields(2, "M", "M", 1),
    "128x64x64 mcs=4 wgN minorM w8": _hopper_fields(4, "N", "M", 8, tile_n=64),
    "128x128x64 mcs=3 wgN minorM w16": _hopper_fields(3, "N", "M", 16),
}


def gelu_times(x, y):
  """gelu(x) * y, the tanh form: a transcendental and a few FMAs an element
  (in a kernel, on registers; and as the jnp reference)."""
  import jax.numpy as jnp
  return 0.5 * x * (1.0 + jnp.tanh(0.7978846 * (x + 0.044715 * x * x * x))) * y


def _make_gelu(rows=EW_ROWS, cols=EW_COLS, seed=3, **kw):
  import jax.numpy as jnp
  x = _rand(seed, (rows, cols), jnp.float32)
  y = _rand(seed + 100, (rows, cols), jnp.float32)
  return Built(functools.partial(elementwise_regs, op=gelu_times, **kw), (x, y), gelu_times,
               tol=1e-5)


def _ragged_sizes(m, groups, block_m, seed):
  """Group sizes summing to m, uneven and not multiples of block_m (seeded)."""
  rng = np.random.default_rng(seed)
  cuts = np.sort(rng.choice(np.arange(1, m), groups - 1, replace=False))
  return np.diff(np.concatenate([[0], cuts, [m]])).astype(np.int32)


def _make_ragged(m, k, n, groups, block_m, block_n, block_k, mcs, grid_block_n, seed=7):
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd
  sizes = _ragged_sizes(m, groups, block_m, seed)
  lhs = _rand(seed, (m, k), jnp.float16)
  rhs = _rand(seed + 100, (groups, k, n), jnp.float16)
  gs = jnp.asarray(sizes)  # (data, never a shape: what the kernel's control flow reads)

  def fn(lhs, rhs):
    return rd.ragged_dot(lhs, rhs, group_sizes=gs, block_m=block_m, block_n=block_n,
                         block_k=block_k, max_concurrent_steps=mcs,
                         grid_block_n=grid_block_n)

  def ref(lhs, rhs):
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    outs = [_matmul_ref(lhs[s:s + z], rhs[g]) for g, (s, z) in enumerate(zip(starts, sizes))]
    return jnp.concatenate(outs, axis=0)

  return Built(fn, (lhs, rhs), ref, tol=5e-3)


def _make_mixed(m, k, n, config, seed=11):
  import jax.numpy as jnp
  from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as mm
  cfg = _hopper_config(mm, HOLDOUT_HOPPER_CONFIGS.get(config) or HOPPER_CONFIGS[config])
  # int8 weights (a normal times 40, rounded), bf16 activations.
  a = _rand(seed, (m, k), jnp.int8, scale=40.0)
  b = _rand(seed + 100, (k, n), jnp.bfloat16)
  return Built(lambda a, b: mm.mixed_matmul_kernel(a, b, out_dtype=jnp.bfloat16, config=cfg),
               (a, b), lambda a, b: _matmul_ref(a.astype(jnp.float32), b), tol=2e-2)


def _holdout_cases():
  out = []
  # The quickstart in bf16 at 6144 (48 x 48 blocks of 128x128: 17.5 waves).
  for tn, tk, mcs in ((128, 64, 2), (128, 64, 4), (128, 32, 3), (64, 128, 3),
                      (128, 128, 3), (256, 64, 2)):
    out.append(Case(
        name=f"quickstart bf16 6144 128x{tn}x{tk} mcs={mcs}",
        family="quickstart matmul bf16 6144 (held out)",
        params=dict(size=6144, tile_n=tn, tile_k=tk, mcs=mcs, dtype="bfloat16"),
        flops=2.0 * 6144 ** 3, bytes=3.0 * 6144 ** 2 * 2, make=_make_quickstart))
  # JAX's matmul, bf16, 8192 x 2048 @ 2048 x 8192.
  for c in ("128x128x64 mcs=4 wgN minorN w4", *HOLDOUT_HOPPER_CONFIGS):
    out.append(Case(
        name=f"hopper_matmul 8192x2048x8192 bf16 {c}",
        family="hopper_matmul_mgpu bf16 8192x2048x8192 (held out)",
        params=dict(size=0, config=c, dtype="bfloat16", mkn=(8192, 2048, 8192)),
        flops=2.0 * 8192 * 2048 * 8192, bytes=2.0 * (2 * 8192 * 2048 + 8192 * 8192),
        make=_make_hopper))
  # JAX's attention at shapes and blocks the suite lacks.
  for batch, seq, heads, d, bq, bkv, causal, mcs in (
      (2, 2048, 32, 128, 64, 128, False, 2), (2, 2048, 32, 128, 64, 64, False, 3),
      (2, 2048, 32, 128, 64, 64, False, 4), (1, 4096, 32, 64, 64, 128, True, 2)):
    flops = 4.0 * batch * seq * seq * heads * d / (2 if causal else 1)
    out.append(Case(
        name=f"attention fwd b{batch} s{seq} h{heads} d{d} bq{bq} bkv{bkv} mcs={mcs}"
             + (" causal" if causal else ""),
        family=f"attention_mgpu fwd s{seq} h{heads} d{d}" + (" causal" if causal else "")
               + " (held out)",
        params=dict(batch=batch, seq=seq, heads=heads, head_dim=d, block_q=bq,
                    block_kv=bkv, causal=causal, mcs=mcs),
        flops=flops, bytes=4.0 * batch * seq * heads * d * 2, make=_make_attention))
  # JAX's ragged (grouped) matmul: 8 groups of uneven sizes over 8192 rows.
  for bm, bn, bk, mcs, gbn in ((128, 128, 64, 4, 4), (64, 128, 64, 4, 8)):
    out.append(Case(
        name=f"ragged_dot 8192x2048 8x2048x4096 f16 {bm}x{bn}x{bk} mcs={mcs} gbn={gbn}",
        family="ragged_dot_mgpu f16 (held out)",
        params=dict(m=8192, k=2048, n=4096, groups=8, block_m=bm, block_n=bn,
                    block_k=bk, mcs=mcs, grid_block_n=gbn),
        flops=2.0 * 8192 * 2048 * 4096, bytes=2.0 * (8192 * 2048 + 8 * 2048 * 4096
                                                     + 8192 * 4096),
        make=_make_ragged))
  # JAX's mixed-type matmul: int8 @ bf16.
  for c in ("128x128x64 mcs=4 wgN minorN w4", "128x128x64 mcs=2 wgM minorM w1"):
    out.append(Case(
        name=f"mixed_matmul 4096x4096x8192 int8xbf16 {c}",
        family="hopper_mixed_type_matmul_mgpu 4096x4096x8192 (held out)",
        params=dict(m=4096, k=4096, n=8192, config=c),
        flops=2.0 * 4096 * 4096 * 8192, bytes=4096 * 4096 + 2.0 * (4096 * 8192 * 2),
        make=_make_mixed))
  # An activation: gelu(x) * y over 64M f32, through registers.
  n = EW_ROWS * EW_COLS
  for rpb, rt in ((8, None), (32, 4)):
    out.append(Case(
        name=f"gelu regs 64M f32 {rpb} rows/block" + (f" ({rt} at a time)" if rt else ""),
        family="elementwise gelu 64M f32 (held out)",
        params=dict(rows_per_block=rpb, row_tile=rt), flops=float(n), bytes=3.0 * n * 4,
        make=_make_gelu))
  return out


# The quickstart at pipeline depths and tiles the suite lacks, f16, at 4096
# and 6144: an earlier L2 model (loads shared by a wave's blocks, a loaded
# L2's latency) predicted them, and the predictions were committed
# (lab/data/blind_predictions_quickstart_attention.json), before they were measured.
# At 8192, tile_k=32 tiles that a smeared-wave rule (since dropped) said
# miss in the L2, and a 128-byte-row tile it said does not:
# predicted (lab/data/blind_predictions_quickstart_8192.json) and committed before
# they were measured. The measurements refuted the rule (benchmarks/HISTORY.md).
BLIND_CONFIGS = {4096: ((128, 64, 5), (128, 32, 2), (128, 32, 3), (64, 64, 2),
                        (64, 64, 4), (64, 128, 2), (128, 128, 3)),
                 6144: ((128, 64, 3), (128, 32, 4), (64, 64, 3), (64, 128, 4),
                        (128, 128, 2)),
                 8192: ((128, 32, 2), (128, 32, 3), (64, 32, 4), (64, 64, 4))}


# JAX's attention at shapes, blocks and depths the suite and the held-out set
# lack (predicted and committed before they were measured, as above).
BLIND_ATTENTION = ((1, 8192, 16, 128, 64, 128, False, 2), (1, 8192, 16, 128, 64, 128, False, 3),
                   (1, 8192, 16, 128, 64, 64, False, 2), (1, 8192, 16, 128, 64, 64, False, 4),
                   (2, 4096, 16, 64, 64, 128, True, 2), (2, 4096, 16, 64, 64, 64, True, 3))


# The quickstart where its inputs and output fit in half the L2, or just do
# not: M x K x N and tiles that the footprint study (pipeline_trace.py --m
# --k: pipeline_trace_h200.json's eighteenth_session.footprint_study) did not
# run. The near/far L2 rule (timing.far_share) predicted them 12-23% faster
# than the model without it (every L2 read far) where they fit, 5-7% where
# they half fit, the same where they do not; predicted
# (lab/data/blind_predictions_near_l2_half.json) and committed before they
# were measured. Small rows: timed in a chain.
BLIND_NEAR = (((2048, 2048, 2048), ((128, 32, 2), (128, 32, 3), (64, 64, 2), (64, 32, 4))),
              ((4096, 1024, 2048), ((128, 64, 2), (64, 64, 3))),
              ((1024, 4096, 2048), ((128, 64, 2), (128, 32, 4))),
              ((3072, 1024, 3072), ((128, 32, 4), (64, 64, 3))),
              ((2048, 3072, 2048), ((128, 32, 4), (64, 64, 3))),
              ((2048, 2048, 4096), ((128, 64, 2), (64, 64, 3))))
BLIND_NEAR_ATTENTION = ((1, 2048, 8, 128, 64, 128, False, 2),)


def _attention_case(batch, seq, heads, d, bq, bkv, causal, mcs, tag, small=False):
  return Case(
      name=f"attention fwd b{batch} s{seq} h{heads} d{d} bq{bq} bkv{bkv} mcs={mcs}"
           + (" causal" if causal else "") + f" ({tag})",
      family=f"attention_mgpu fwd s{seq} h{heads} d{d}" + (" causal" if causal else "")
             + f" ({tag})",
      params=dict(batch=batch, seq=seq, heads=heads, head_dim=d, block_q=bq,
                  block_kv=bkv, causal=causal, mcs=mcs),
      flops=4.0 * batch * seq * seq * heads * d / (2 if causal else 1),
      bytes=4.0 * batch * seq * heads * d * 2, make=_make_attention, small=small)


def _blind_near_cases():
  out = [_attention_case(*a, tag="blind near", small=True) for a in BLIND_NEAR_ATTENTION]
  for mkn, configs in BLIND_NEAR:
    out += _quickstart_mkn(mkn, configs, "blind near",
                           "quickstart matmul f16 near the L2's half (blind near)", small=True)
  return out


def _quickstart_mkn(mkn, configs, tag, family=None, small=False, dtype=None):
  """The quickstart at M x K x N (f16, or `dtype`) for each (tile_n, tile_k,
  mcs), tagged; of `family`, or one of its shape and dtype."""
  m, k, n = mkn
  short = {None: "f16", "float16": "f16", "bfloat16": "bf16"}[dtype]
  out = []
  for tn, tk, mcs in configs:
    assert _smem_need(128, tn, tk, mcs) <= SMEM_LIMIT
    params = dict(size=0, tile_n=tn, tile_k=tk, mcs=mcs, mkn=(m, k, n))
    if dtype is not None:
      params["dtype"] = dtype
    out.append(Case(
        name=f"quickstart {short} {m}x{k}x{n} 128x{tn}x{tk} mcs={mcs} ({tag})",
        family=family or f"quickstart matmul {short} {m}x{k}x{n} ({tag})",
        params=params, flops=2.0 * m * k * n,
        bytes=2.0 * (m * k + k * n + m * n), make=_make_quickstart, small=small))
  return out


# Boxes of narrow rows: A tiles 16 elements wide (32-byte rows), and an
# elementwise add through emit_pipeline in tiles 4 f32 wide (16-byte rows:
# narrower than the rows gpus.GPU.tma_narrow_rows_per_clk was measured on).
# The row rate predicted them 23-51% slower than the model without it, a
# 64-byte-row control the same; predicted
# (lab/data/blind_predictions_narrow_rows.json) and committed before
# they were measured.
BLIND_NARROW = {4096: ((128, 16, 4), (128, 16, 6), (64, 16, 6)), 8192: ((128, 16, 4),),
                6144: ((64, 32, 3),)}
BLIND_NARROW_EW = ((256, 256, 4, 4),)  # (blocks, tile_m, tile_n, mcs)


# The quickstart's A and B tiles share the swizzle the lowering infers
# (backends/sim/analysis/smem_swizzle.py): its B loads in A's 32- or 64-byte rows
# at tile_k 16 and 32, and its A in B's at tile_n 16 and 32; narrow rows
# go at the L2's request rate (gpus.GPU.l2_requests_per_s). Predicted
# (lab/data/blind_predictions_swizzle.json) and committed before they
# were measured.
BLIND_SWIZZLE = {4096: ((64, 16, 4), (128, 32, 5), (16, 64, 4), (32, 64, 4)),
                 6144: ((128, 16, 4), (128, 32, 5)), 8192: ((64, 16, 6), (128, 32, 5))}


def _quickstart_blind(configs_by_size, tag):
  """The square f16 quickstart at each size's (tile_n, tile_k, mcs), tagged."""
  out = []
  for size, configs in configs_by_size.items():
    for tn, tk, mcs in configs:
      assert _smem_need(128, tn, tk, mcs) <= SMEM_LIMIT
      out.append(Case(
          name=f"quickstart f16 {size} 128x{tn}x{tk} mcs={mcs} ({tag})",
          family=f"quickstart matmul f16 {size} ({tag})",
          params=dict(size=size, tile_n=tn, tile_k=tk, mcs=mcs),
          flops=2.0 * size ** 3, bytes=3.0 * size * size * 2, make=_make_quickstart))
  return out


def _blind_narrow_cases():
  return (_quickstart_blind(BLIND_NARROW, "blind narrow")
          + _ew_pipeline_blind(BLIND_NARROW_EW, "blind narrow"))


def _ew_pipeline_blind(configs, tag):
  """The elementwise add through emit_pipeline at each (blocks, tile_m,
  tile_n, mcs), tagged."""
  out = []
  for blocks, tm, tn, mcs in configs:
    assert 3 * mcs * tm * tn * 4 <= SMEM_LIMIT
    out.append(_ew_case(
        f"add pipeline 64M f32 {blocks} blocks {tm}x{tn} mcs={mcs} ({tag})",
        f"elementwise pipeline 64M f32 ({tag})",
        kind="pipeline", blocks=blocks, tile_m=tm, tile_n=tn, mcs=mcs))
  return out


# Broad blind rows: shapes and tiles a user might sweep that no earlier set
# measured (non-square matmuls, 5120^3, bf16, other elementwise tiles,
# attention at other sizes), predicted (lab/data/blind_predictions_broad.json)
# and committed before they were measured: how the model does on kernels it was
# not fitted to.
BLIND_BROAD_MM = (((8192, 4096, 4096), "float16", ((128, 64, 3), (128, 128, 2), (128, 32, 3))),
                  ((4096, 8192, 4096), "float16", ((128, 64, 4), (64, 128, 3), (128, 128, 3))),
                  ((5120, 5120, 5120), "float16",
                   ((128, 64, 2), (256, 64, 2), (128, 32, 4), (64, 64, 4))),
                  ((12288, 2048, 6144), "bfloat16", ((128, 128, 3), (128, 64, 4))))
BLIND_BROAD_EW = ((512, 32, 128, 3), (1024, 16, 256, 4))  # (blocks, tile_m, tile_n, mcs)
BLIND_BROAD_ATTENTION = ((1, 4096, 32, 128, 64, 128, True, 2),
                         (2, 8192, 8, 64, 64, 128, False, 3))


def _blind_broad_cases():
  tag = "blind broad"
  out = [_attention_case(*a, tag=tag) for a in BLIND_BROAD_ATTENTION]
  for mkn, dtype, configs in BLIND_BROAD_MM:
    out += _quickstart_mkn(mkn, configs, tag, dtype=dtype)
  return out + _ew_pipeline_blind(BLIND_BROAD_EW, tag)


def _blind_cases():
  out = []
  for a in BLIND_ATTENTION:
    out.append(_attention_case(*a, tag="blind"))
  return (out + _quickstart_blind(BLIND_CONFIGS, "blind") + _blind_near_cases()
          + _blind_narrow_cases() + _quickstart_blind(BLIND_SWIZZLE, "blind swizzle")
          + _blind_broad_cases())


CASES = all_cases()   # plain data: nothing is built or traced here
DIAGNOSTIC_CASES = _diagnostic_cases()
HOLDOUT_CASES = _holdout_cases()
BLIND_CASES = _blind_cases()
# Kernels of our own, written as users write them (lab/families.py).
from lab import families  # noqa: E402  (it imports this module only when called)
FAMILY_CASES = families.family_cases()
KINDS = {"suite": CASES, "diagnostic": DIAGNOSTIC_CASES, "holdout": HOLDOUT_CASES,
         "blind": BLIND_CASES, "families": FAMILY_CASES}


def cases(kind="suite"):
  """The suite's kernels ("suite"), its quickstart's pipeline taken apart
  ("diagnostic"), the kernels held out of calibration ("holdout"), those
  predicted before they were measured ("blind"), or our own kernel families
  ("families": lab/families.py)."""
  return KINDS[kind]


def add_kind_args(ap):
  """--diagnostic / --holdout / --blind / --families on a benchmark script's
  parser (kind_of reads them)."""
  g = ap.add_mutually_exclusive_group()
  g.add_argument("--diagnostic", action="store_true",
                 help="timing_suite.DIAGNOSTIC_CASES (the quickstart's pipeline taken "
                      "apart) in place of the suite")
  g.add_argument("--holdout", action="store_true",
                 help="timing_suite.HOLDOUT_CASES (kernels held out of calibration) in "
                      "place of the suite")
  g.add_argument("--blind", action="store_true",
                 help="timing_suite.BLIND_CASES (predicted before they were measured) "
                      "in place of the suite")
  g.add_argument("--families", action="store_true",
                 help="timing_suite.FAMILY_CASES (our own kernel families, "
                      "lab/families.py) in place of the suite")


def kind_of(ns):
  return ("diagnostic" if ns.diagnostic else "holdout" if ns.holdout else
          "blind" if getattr(ns, "blind", False) else
          "families" if getattr(ns, "families", False) else "suite")


def measured_seconds(row):
  """A measured row's time (h200_measured.json): a small row's per-kernel
  time in a chain of calls in one program (measure_gpu.CHAIN_CALLS, else
  two), which hides host dispatch; any other's median time per call."""
  return row.get("chain_per_kernel_s") or row.get("k2_per_kernel_s") or row["median_s"]


# Where each kind's sustained measurements are in h200_measured.json.
STUDIES = {"diagnostic": "pipeline_study", "holdout": "holdout_study",
           "blind": "blind_study", "families": "families_study"}


def study_rows(data, kind):
  """A kind's measured rows (h200_measured.json, not the suite's): its study
  and the later studies of the same kind ("blind_study_twentieth"...)."""
  key = STUDIES[kind]
  return [r for k in sorted(data) if k == key or k.startswith(key + "_")
          for r in data[k].get("cases", [])]


def sustained_clocks(rows):
  """Measured row name -> the SM clock (MHz) its sustained run held (rows of
  a study in h200_measured.json; those without a clock are left out): for a
  row timed in a chain, the chain's."""
  out = {}
  for r in rows:
    clock = r.get("chain_clock") if r.get("chain_per_kernel_s") else r.get("clock")
    if clock:
      out[r["name"]] = clock["sm_mhz"]
  return out


def by_name(name):
  for c in CASES + DIAGNOSTIC_CASES + HOLDOUT_CASES + BLIND_CASES + FAMILY_CASES:
    if c.name == name:
      return c
  raise KeyError(name)


# Sizes small enough for the simulator on a CPU (a few seconds a kernel): the
# same kernel code, the same configuration, smaller operands.
def sim_params(case):
  p = dict(case.params)
  fam = case.family
  if fam.startswith("own "):
    return families.sim_params(case)
  if fam.startswith("quickstart"):  # (and its diagnostics)
    p["size"] = 256 if p["tile_n"] < 256 else 512
    p.pop("mkn", None)
  elif fam.startswith("elementwise regs") or fam.startswith("elementwise gelu"):
    p.update(rows=4 * p["rows_per_block"], cols=256)
  elif fam.startswith("elementwise pipeline"):
    p.update(blocks=2, rows=2 * p["tile_m"] * 2, cols=2 * p["tile_n"])
  elif fam.startswith("row sums"):
    p.update(rows=2 * p["block_m"], cols=2 * p["tile_k"])
  elif fam.startswith("warp-specialized"):
    p["size"] = 256
  elif fam.startswith("hopper_matmul_mgpu bf16"):
    p["mkn"] = (512, 256, 512)
  elif fam.startswith("hopper_matmul"):
    p["size"] = 512
  elif fam.startswith("ragged_dot"):
    p.update(m=1024, k=256, n=1024)
  elif fam.startswith("hopper_mixed_type"):
    p.update(m=512, k=256, n=512)
  elif fam.startswith("attention"):
    p.update(seq=256, heads=2)
  return p


@contextlib.contextmanager
def shapes_only():
  """The suite's inputs as shapes: estimate needs no values (and an 8192^2
  random matrix costs seconds to draw on a CPU)."""
  global _rand
  import jax
  import jax.numpy as jnp
  real = _rand
  _rand = lambda seed, shape, dtype, *a, **k: jax.ShapeDtypeStruct(
      tuple(shape), jnp.dtype(dtype))
  try:
    yield
  finally:
    _rand = real


def predict(case, gpu, clock_mhz=None):
  """ps.estimate of the case at its GPU size (inputs as shapes), at
  clock_mhz if given: (report, estimate's wall seconds)."""
  import time
  import pallas_sim as ps
  with shapes_only():
    built = case.build()
  t0 = time.perf_counter()
  report = ps.estimate(built.fn, *built.args, gpu=gpu, clock_mhz=clock_mhz)
  return report, time.perf_counter() - t0
