"""Where a quickstart matmul's pipeline step goes on the GPU.

The quickstart's kernel (examples/quickstart.py) with its wgmma issue and its
wgmma_wait(1) in named scopes, compiled with Mosaic GPU's profiler
(CompilerParams profile_space / profile_dir), which stamps each scope's start
and end with the SM's cycle counter, per warpgroup. Per pipeline step:

* `issue`: the wgmma's issue;
* `wait`: wgmma_wait(1), until the group before is done (the tensor cores);
* `rest`: from the wait's end to the next step's issue: the pipeline's TMA
  issue for a later step and its wait on this step's barrier (the loads);
* `step`: one issue to the next.

Run on the GPU machine (each case is warmed up unprofiled first, so that the
clock is the one its sustained run holds):

    python3 -m lab.pipeline_trace --out $OUT [--filter S]

Prints, per case, the median and the 10th/90th percentiles over every block's
steady steps (past the first mcs + 1 and before the last) of each part in SM
cycles, and writes OUT/pipeline_trace.json.

`--fp8`: our fp8 matmul (lab/families.py: the same pipeline, K-major B, one
wgmma of 128 bytes of K a step) in place of the quickstart's, FP8_CASES, each
row with the clock its warm-up held ("mhz"), which --compare estimates it at.

`--stream-spans`: the same spans for calibrate.tma_stream, every SM loading
shared tiles from the L2 with 1-8 in flight (STREAM_CASES).

`--spans` instead records only each block's epilogue (so its occupancy stays as
unprofiled): every block's start, cycles, SM and launch order, and what they
say of the launch's waves (span_summary; `--cold` empties the L2 first).

On a CPU, the model beside a GPU run (the simulator writes the same trace,
in the same cycles: backends/sim/report/profiler.py), each case estimated at the
clock its suite row held sustained (h200_measured.json):

    ./dev python -m lab.pipeline_trace --compare lab/data/pipeline_trace_h200.json
"""
from __future__ import annotations

import argparse
import functools
import glob
import json
import math
import os
import sys
import tempfile
import time

import numpy as np


# (size, tile_n, tile_k, max_concurrent_steps): rows of the suite, the held-out
# and blind sets where the model errs most, and rows it gets right beside them.
CASES = [(4096, 128, 128, 2), (4096, 128, 64, 2), (8192, 128, 64, 2), (4096, 128, 64, 3),
         (4096, 128, 64, 4), (4096, 128, 32, 4), (4096, 128, 32, 3),
         (8192, 128, 128, 2), (8192, 128, 64, 4), (8192, 128, 32, 4),
         (4096, 64, 64, 3), (4096, 64, 128, 4), (4096, 64, 128, 2)]


# Our fp8 matmul, 4096^3, at two slots (two blocks an SM) and four (one):
# 128x128 tiles, which the model times within 2% at every depth, beside
# 64x256 ones, which the H200 runs 5-19% slower at four slots than at two and
# the model faster (the families' 64x256 rows). (size, tile_n, tile_k, mcs[,
# tile_m]); six slots of 128x128 leave no SMEM for the profiler's buffer
# (PROFILE_SMEM_MARGIN).
FP8_CASES = [(4096, 128, 128, 2), (4096, 128, 128, 4), (4096, 256, 128, 2, 64),
             (4096, 256, 128, 4, 64)]


def name_of(size, tile_n, tile_k, mcs, fp8=False, tile_m=128):
  return f"{'own fp8' if fp8 else 'quickstart'} {size} {tile_m}x{tile_n}x{tile_k} mcs={mcs}"


def traced_matmul(a, b, *, tile_n, tile_k, mcs, profile_dir=None, space=0,
                  truncate=False, step_scopes=True):
  """The quickstart's matmul (tests/test_quickstart.matmul_mcs, the suite's
  code: its body's two parts in named scopes), profiled into profile_dir.
  `truncate`: events past `space` are dropped (a small buffer leaves the
  kernel's occupancy as it is unprofiled)."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from lab import timing_suite  # (it finds matmul_mcs as the suite does)
  matmul_mcs = timing_suite._matmul_mcs()
  params = (plgpu.CompilerParams(profile_space=space, profile_dir=profile_dir,
                                 profile_bounds_check=truncate)
            if profile_dir else None)
  return matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k, max_concurrent_steps=mcs,
                    compiler_params=params, step_scopes=step_scopes)


def traced_fp8(a, bt, *, tile_n, tile_k, mcs, profile_dir=None, space=0, truncate=False,
               step_scopes=True, tile_m=128):
  """Our fp8 (e4m3) matmul (lab/families.fp8_matmul: B given as B^T, the same
  pipeline as the quickstart's) with the same scopes, profiled likewise."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from lab import families
  params = (plgpu.CompilerParams(profile_space=space, profile_dir=profile_dir,
                                 profile_bounds_check=truncate)
            if profile_dir else None)
  return families.fp8_matmul(a, bt, tile_m=tile_m, tile_n=tile_n, tile_k=tile_k, mcs=mcs,
                             compiler_params=params, step_scopes=step_scopes)


def tracer(fp8):
  """The traced kernel and its operands' dtype: the quickstart's (f16) or
  our fp8 matmul's (its B as B^T, so both operands are size x k)."""
  import jax.numpy as jnp
  return (traced_fp8, jnp.float8_e4m3fn) if fp8 else (traced_matmul, jnp.float16)


def tma_issue_kernel(x, *, copies, rows=128, cols=64, blocks=132, profile_dir=None):
  """Each block issues `copies` TMA loads of a rows x cols f16 tile back to
  back (each to its own SMEM slot and barrier) in a named scope "issue",
  then waits for them ("land"), then stores them all back to back ("store")
  and waits for the stores ("drain"): the issue's (and the store's) cycles
  over `copies` are what a TMA copy costs its warpgroup to issue."""
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas import mosaic_gpu as plgpu
  params = (plgpu.CompilerParams(profile_space=64, profile_dir=profile_dir)
            if profile_dir else None)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((blocks, copies, rows, cols), jnp.float16),
                scratch_types=dict(buf=plgpu.SMEM((copies, rows, cols), jnp.float16),
                                   bar=plgpu.Barrier(num_barriers=copies)),
                grid=(blocks,), grid_names=("b",), compiler_params=params)
  def kernel(x_gmem, o_gmem, buf, bar):
    b = jax.lax.axis_index("b")
    with jax.named_scope("issue"):
      for i in range(copies):
        plgpu.copy_gmem_to_smem(x_gmem.at[b, i], buf.at[i], bar.at[i])
    with jax.named_scope("land"):
      for i in range(copies):
        plgpu.barrier_wait(bar.at[i])
    plgpu.commit_smem()
    with jax.named_scope("store"):
      for i in range(copies):
        plgpu.copy_smem_to_gmem(buf.at[i], o_gmem.at[b, i])
    with jax.named_scope("drain"):
      plgpu.wait_smem_to_gmem(0)

  return kernel(x)


class Seen:
  """A module as the code that imported it sees it while a run is traced:
  `real`'s attributes, but for those given (attention_trace puts JAX's
  attention kernel's phases in named scopes so, rows_trace emit_pipeline's
  waits)."""

  def __init__(self, real, **overrides):
    self._real = real
    self.__dict__.update(overrides)

  def __getattr__(self, name):
    return getattr(self._real, name)


def spread(values):
  """A part's cycles over the steps traced: median, 10th and 90th
  percentiles, and mean (a long tail moves the mean, which sets the
  kernel's time, and not the median) (None: no step)."""
  v = np.asarray(values, float)
  if not v.size:
    return None
  return {"median": float(np.median(v)), "p10": float(np.percentile(v, 10)),
          "p90": float(np.percentile(v, 90)), "mean": float(v.mean())}


def newest_trace(directory):
  """The last trace file a profiled run wrote into `directory` (None: none)."""
  files = sorted(glob.glob(os.path.join(directory, "*-trace.json")))
  if not files:
    return None
  with open(files[-1]) as fh:
    return json.load(fh)


def ranges(trace):
  """Per track (tid): its ranges (name, begin, end) in time order, times
  in cycles (the profiler's timestamps: a block's start in ns plus cycles
  since), and its SM (pid)."""
  by_tid, sm = {}, {}
  for ev in sorted(trace["traceEvents"], key=lambda e: e["ts"]):
    tid = ev["tid"]
    sm.setdefault(tid, ev["pid"])
    track = by_tid.setdefault(tid, ([], {}))
    if ev["ph"] == "B":
      track[1][ev["name"]] = ev["ts"] * 1e3
    elif ev["name"] in track[1]:
      track[0].append((ev["name"], track[1].pop(ev["name"]), ev["ts"] * 1e3))
  return {tid: done for tid, (done, _) in by_tid.items()}, sm


def block_clock(tracks, sm, max_mhz=1980.0):
  """Each block's cycles, its tracks' first event to their last, against
  the time on the global timer from its start to the next block's start on
  the same SM (a track's first event stands at its block's start in ns: the
  profiler counts cycles from there). Their ratio is the SM's clock, or less
  by what a block does outside its events (its start before the first, its
  end after the last, the next one's launch): `mhz_at_least`. `block_us`:
  those intervals. It reads the clock where an SM holds one block at a time
  (blocks_at_launch_per_sm 1). Where it holds several, a block that starts
  before its predecessor could have ended at `max_mhz` ran beside it and that
  pair is left out, but pairs of blocks that overlapped in part still count:
  the figure is then too high. None where no SM ran two blocks one after the
  other (the simulator counts each block from 0). `tracks`, `sm`: ranges(trace)."""
  by_sm = {}
  for tid, rs in tracks.items():
    if rs:
      b = min(r[1] for r in rs)
      by_sm.setdefault(sm[tid], []).append((b, max(r[2] for r in rs) - b))
  intervals, mhz = [], []
  for runs in by_sm.values():
    runs.sort()
    # (a block's warpgroups read the timer each at its start: one block)
    blocks = []
    for b, cycles in runs:
      if blocks and b - blocks[-1][0] < 500.0:
        blocks[-1][1] = max(blocks[-1][1], cycles)
      else:
        blocks.append([b, cycles])
    for (b0, cycles), (b1, _) in zip(blocks, blocks[1:]):
      if cycles / (b1 - b0) * 1e3 > max_mhz:  # (beside it, not after it)
        continue
      intervals.append((b1 - b0) / 1e3)
      mhz.append(cycles / (b1 - b0) * 1e3)
  return {"block_us": spread(intervals), "mhz_at_least": spread(mhz)}


def issue_cycles(trace):
  """Median over blocks of each range's cycles (issue, land, store, drain)."""
  tracks, _ = ranges(trace)
  out = {}
  for name in ("issue", "land", "store", "drain"):
    lengths = [e - b for rs in tracks.values() for n, b, e in rs if n == name]
    out[name] = float(np.median(lengths)) if lengths else None
  return out


def tma_issue(out_dir=None):
  """TMA issue cost to the warpgroup: 1, 2, 4 and 8 copies, on this backend (the GPU,
  or the simulator under pallas_sim.backend("sim"))."""
  import jax
  import jax.numpy as jnp
  rows = []
  for copies in (1, 2, 4, 8):
    x = jax.random.normal(jax.random.key(1), (132, copies, 128, 64), jnp.float16)
    d = tempfile.mkdtemp(prefix="tma_issue_")
    f = jax.jit(lambda x: tma_issue_kernel(x, copies=copies, profile_dir=d))
    for _ in range(3):
      jax.block_until_ready(f(x))
    jax.effects_barrier()
    r = {"copies": copies, **issue_cycles(newest_trace(d))}
    r["per_copy"] = r["issue"] / copies
    r["per_store"] = r["store"] / copies
    rows.append(r)
    print(f"{copies} TMA loads of a 128x64 f16 tile: issued in {r['issue']:.0f} cycles "
          f"({r['per_copy']:.1f} a copy), landed {r['land']:.0f} later; stored in "
          f"{r['store']:.0f} ({r['per_store']:.1f} a copy), drained {r['drain']:.0f} later",
          flush=True)
  if out_dir:
    with open(os.path.join(out_dir, "tma_issue.json"), "w") as fh:
      json.dump({"command": " ".join(sys.argv), "rows": rows}, fh, indent=1)
  return rows


def profile_space(size, tile_k):
  """Ranges a warpgroup records: two a step, and room for the rest."""
  return 2 * (size // tile_k) * 2 + 64


# SMEM a profiled kernel leaves unused below the per-block limit: a launch
# whose dynamic SMEM the lowering accepted at 232,448 bytes less one range
# (our fp8 matmul at six slots, 189 ranges) failed on the H200 with
# "INTERNAL: invalid argument", where every profiled kernel with 1 KiB or more
# to spare ran.
PROFILE_SMEM_MARGIN = 2048


def fitting_space(fn, shapes, space, *, tile_n, tile_k, mcs, gpu="h200"):
  """The most profiler ranges (at most `space`, a multiple of 4: 16 bytes a
  warpgroup's buffer) with which the profiled kernel leaves
  PROFILE_SMEM_MARGIN of SMEM unused, as the simulator counts it (the
  profiler's buffer is SMEM too: what the lowering counts): (space,
  truncate). A kernel that cannot keep even 8 ranges raises."""
  import pallas_sim as ps
  from pallas_sim import gpus
  limit = gpus.GPUS[gpu].max_smem_per_block - PROFILE_SMEM_MARGIN

  def need(n):
    try:
      r = ps.estimate(lambda x, y: fn(x, y, tile_n=tile_n, tile_k=tile_k, mcs=mcs,
                                      profile_dir=tempfile.gettempdir(), space=n,
                                      truncate=n < space), *shapes, gpu=gpu)
      return max(k.smem_bytes for k in r.kernels)
    except ps.SmemOverflowError as e:
      return e.smem_bytes

  full = need(space)
  if full <= limit:
    return space, False
  per_range = (full - need(space - 4)) / 4 or 4  # (bytes a range takes, all threads')
  fit = (space - math.ceil((full - limit) / per_range)) // 4 * 4
  while fit >= 8 and need(fit) > limit:
    fit -= 4
  if fit < 8:
    raise ValueError(f"the profiled kernel does not keep {PROFILE_SMEM_MARGIN} bytes of "
                     f"SMEM free with even 8 ranges ({full} bytes with {space})")
  return fit, True


def steps_of(trace, mcs):
  """Per block (the trace's tid): the steady steps' parts, in cycles."""
  tracks, sm_of = ranges(trace)
  parts = {"issue": [], "wait": [], "rest": [], "step": []}
  spans, sms, n_steps, prologues, epilogues, tails = [], {}, 0, [], [], []
  for tid, rs in tracks.items():
    init = [e for name, _, e in rs if name == "Init"]  # (the profiler's own)
    issue = [(b, e) for name, b, e in rs if name == "issue"]
    wait = [(b, e) for name, b, e in rs if name == "wait"]
    n = min(len(issue), len(wait))
    if n < mcs + 4:
      continue
    sms[tid] = sm_of[tid]
    if init:  # (from the profiler's Init range to the first wgmma's issue)
      prologues.append(issue[0][0] - init[0])
    n_steps = n
    spans.append(wait[n - 1][1] - issue[0][0])
    # (the block's end: its epilogue, and from its last step to the
    # epilogue's end, where the kernel has one in a scope)
    epi = [(b, e) for name, b, e in rs if name == "epilogue"]
    if epi:
      epilogues.append(epi[-1][1] - epi[-1][0])
      tails.append(epi[-1][1] - wait[n - 1][1])
    for j in range(mcs + 1, n - 1):
      parts["issue"].append(issue[j][1] - issue[j][0])
      parts["wait"].append(wait[j][1] - wait[j][0])
      parts["rest"].append(issue[j + 1][0] - wait[j][1])
      parts["step"].append(issue[j + 1][0] - issue[j][0])
  out = {k: spread(v) for k, v in parts.items()}
  # Blocks an SM took at once: those starting on it within 2 us of the
  # kernel's first block (a block's first event: its start, in ns).
  first = {tid: rs[0][1] for tid, rs in tracks.items() if rs}
  t0 = min(first.values()) if first else 0.0
  per_sm = {}
  for tid, t in first.items():
    if t - t0 < 2000.0:
      per_sm[sm_of[tid]] = per_sm.get(sm_of[tid], 0) + 1
  out["blocks_at_launch_per_sm"] = (float(np.mean(list(per_sm.values())))
                                    if per_sm else None)
  # Per SM, how long after its first block its second started (us): ~0 where
  # it holds two at once, a block's time where it holds one.
  starts = {}
  for tid, t in first.items():
    starts.setdefault(sm_of[tid], []).append(t)
  gaps = [sorted(v)[1] - sorted(v)[0] for v in starts.values() if len(v) > 1]
  out["second_block_after_us"] = float(np.median(gaps)) / 1e3 if gaps else None
  out.update(block_clock(tracks, sm_of))
  out["blocks"] = len(spans)
  out["block_cycles_median"] = float(np.median(spans)) if spans else None
  out["block_cycles_max"] = float(np.max(spans)) if spans else None
  out["steps"] = n_steps
  out["prologue_cycles_median"] = float(np.median(prologues)) if prologues else None
  out["epilogue"] = spread(epilogues)
  out["tail"] = spread(tails)
  out["sms"] = len(set(sms.values()))
  return out


def reader_gaps(trace, grid_m, clock_ghz):
  """How far apart in time (us) the blocks that read one tile read it, from
  a quickstart trace of grid (M, N), M = grid_m. Mosaic GPU gives the
  grid's last axis (n) to CUDA's x, which the GPU launches fastest; the
  profiler numbers a block (its tid - 1) n * M + m. Per step k, the readers
  of one A tile (one m: launched side by side) and of one B tile (one n: N
  launches apart), each group's in time order, and the gaps between them.
  Returns {"A (side by side)": gaps, "B (N launches apart)": gaps}."""
  tracks, _ = ranges(trace)
  # (a block's first event is its start in ns, the rest cycles since: in ns)
  at = {tid - 1: np.array([rs[0][1] + (b - rs[0][1]) / clock_ghz
                           for name, b, _ in rs if name == "issue"])
        for tid, rs in tracks.items() if rs}
  steps = min(len(v) for v in at.values())
  blocks = len(at)
  out = {"A (side by side)": [], "B (N launches apart)": []}
  for k in range(0, steps, 7):
    for key, group in (("A (side by side)", lambda b: b % grid_m),
                       ("B (N launches apart)", lambda b: b // grid_m)):
      by = {}
      for b in range(blocks):
        by.setdefault(group(b), []).append(at[b][k])
      for ts in by.values():
        out[key].extend(np.diff(np.sort(ts)) / 1e3)
  return {k: np.asarray(v) for k, v in out.items()}


def block_spans(trace, grid_m, grid_n):
  """Each block's (launch index, SM, start ns, cycles) from a trace whose
  blocks record their epilogue (a --spans run): the start is the block's
  first event (the SMs' common clock, ns), its cycles run to its
  epilogue's end (its SM's cycle counter: exact whatever the clock). The
  profiler numbers a block n * M + m; the GPU launches it m * N + n-th
  (the grid's last axis fastest)."""
  tracks, sm_of = ranges(trace)
  out = []
  for tid, rs in tracks.items():
    ends = [e for name, _, e in rs if name == "epilogue"]
    if not rs or not ends:
      continue
    m, n = (tid - 1) % grid_m, (tid - 1) // grid_m
    out.append((m * grid_n + n, sm_of[tid], rs[0][1], ends[-1] - rs[0][1]))
  out.sort()
  return np.asarray(out, dtype=np.float64)


def span_summary(spans, grid_n, slots):
  """What a launch's block spans say of its waves: each block's cycles
  (median, and spread p90 / p10), how far apart in start the readers of
  one B tile (grid_n launches apart) are (us), each wave's spread of
  starts (us, p90 - p10 of the wave's slots), each SM's mean cycles a
  block, the SMs that ran their blocks in under 0.95 of the median SM's
  (the fast SMs), and in each wave their blocks' cycles over the rest's."""
  launch, sm, start, cyc = spans[:, 0].astype(int), spans[:, 1].astype(int), spans[:, 2], spans[:, 3]
  by = dict(zip(launch, start))
  gaps = [abs(by[i + grid_n] - by[i]) / 1e3 for i in launch if i + grid_n in by]
  per_sm = {int(s): float(cyc[sm == s].mean()) for s in np.unique(sm)}
  mid = float(np.median(list(per_sm.values())))
  fast = sorted(s for s, c in per_sm.items() if c < 0.95 * mid)
  is_fast = np.isin(sm, fast)
  wave = launch // slots
  spread, fast_ratio = [], []
  for w in range(int(wave.max()) + 1):
    s = start[wave == w]
    if s.size > 4:
      spread.append(float(np.percentile(s, 90) - np.percentile(s, 10)) / 1e3)
    f, o = cyc[(wave == w) & is_fast], cyc[(wave == w) & ~is_fast]
    if f.size and o.size:
      fast_ratio.append(round(float(f.mean() / o.mean()), 3))
  return {"blocks": int(len(spans)), "block_cycles_median": float(np.median(cyc)),
          "block_p90_over_p10": float(np.percentile(cyc, 90) / np.percentile(cyc, 10)),
          "b_gap_us": ({f"p{q}": float(np.percentile(gaps, q)) for q in (10, 50, 75, 90)}
                       if gaps else None),
          "wave_start_spread_us": spread, "sm_cycles": per_sm, "fast_sms": fast,
          "fast_over_rest_by_wave": fast_ratio}


def _operands(size, k=None, m=None, fp8=False):
  """The quickstart's two random f16 operands, m x k and k x size (k and m:
  size unless given), on the device; with fp8, e4m3 ones, m x k and
  size x k (B given as B^T)."""
  import jax
  import jax.numpy as jnp
  k, m = k or size, m or size
  ka, kb = jax.random.split(jax.random.key(0))
  dtype = tracer(fp8)[1]
  return (jax.random.normal(ka, (m, k), jnp.float32).astype(dtype),
          jax.random.normal(kb, (size, k) if fp8 else (k, size), jnp.float32).astype(dtype))


def _warm(f, x, y, seconds):
  """f(x, y) called back to back for `seconds` (the clock a sustained run
  holds); its time a call, dispatch included."""
  import jax
  jax.block_until_ready(f(x, y))
  t0, calls = time.time(), 0
  while time.time() - t0 < seconds:
    out = f(x, y)
    calls += 1
  jax.block_until_ready(out)
  return (time.time() - t0) / calls


def profiled_after_warm(traced, plain, args, d, warm_s):
  """`plain` warmed up for warm_s, then `traced` (writing its trace into d)
  called at once: (plain's time a call, nvidia-smi's clock, the trace).
  `traced` is compiled before the warm-up, so that its call runs at the
  clock the sustained run holds, not after the idle of its compile (where
  the SM clock falls). Where that compiled call wrote no trace, it is
  called again the plain way."""
  import jax
  compiled = traced.lower(*args).compile()
  clock = _clock_sampler()
  per_call = _warm(lambda *_: plain(*args), None, None, warm_s)
  jax.block_until_ready(compiled(*args))
  mhz = _clock_of(clock)
  jax.effects_barrier()
  trace = newest_trace(d)
  if trace is None:
    jax.block_until_ready(traced(*args))
    jax.effects_barrier()
    trace = newest_trace(d)
  return per_call, mhz, trace


def _clock_sampler():
  """nvidia-smi reading the SM clock every 20 ms (a process; _clock_of ends it)."""
  import subprocess
  return subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits",
                           "-lms", "20"], stdout=subprocess.PIPE, text=True)


def _clock_of(proc):
  """The median of the last 0.2 s of a _clock_sampler's readings (MHz)."""
  proc.terminate()
  vals = [float(v) for v in proc.communicate()[0].split() if v.replace(".", "").isdigit()]
  return float(np.median(vals[-10:])) if vals else None


def spans(cases, out_dir, warm_s, cold=False):
  """Block spans (block_spans) of each quickstart case, profiled with only
  its epilogue in a scope (a few ranges a block: its occupancy stays as
  unprofiled), after warm_s of unprofiled calls; writes OUT/spans.json.
  `cold`: the L2 emptied of the operands before the profiled call (256 MiB
  written in between), as a launch whose inputs were not just read finds it."""
  import jax
  import jax.numpy as jnp
  flush = jax.jit(lambda x: jnp.full((64, 2 ** 20), x[0, 0], jnp.float32))  # (256 MiB)
  rows = []
  for size, tn, tk, mcs in cases:
    name = name_of(size, tn, tk, mcs)
    x, y = _operands(size)
    plain = jax.jit(lambda x, y: traced_matmul(x, y, tile_n=tn, tile_k=tk, mcs=mcs))
    d = tempfile.mkdtemp(prefix="spans_")
    traced = jax.jit(lambda x, y: traced_matmul(
        x, y, tile_n=tn, tile_k=tk, mcs=mcs, profile_dir=d, space=16, truncate=True,
        step_scopes=False))
    jax.block_until_ready(traced(x, y))  # (compiled before the clock is sampled)
    smi = _clock_sampler()
    per_call = _warm(plain, x, y, warm_s)
    if cold:
      jax.block_until_ready(flush(x))
    jax.block_until_ready(traced(x, y))
    mhz = _clock_of(smi)
    jax.effects_barrier()
    sp = block_spans(newest_trace(d), size // 128, size // tn)
    per_sm = np.bincount(sp[sp[:, 2] < sp[:, 2].min() + 2000, 1].astype(int))
    slots = 132 * int(np.median(per_sm[per_sm > 0]))
    r = {"name": name, "size": size, "tile": [128, tn, tk], "mcs": mcs, "mhz": mhz, "cold": cold,
         "unprofiled_call_s": per_call, "slots": slots,
         **span_summary(sp, size // tn, slots),
         "spans": [[int(a), int(b), round(c - sp[0, 2], 1), int(e)] for a, b, c, e in sp]}
    rows.append(r)
    gap = r["b_gap_us"] or {"p50": float("nan"), "p90": float("nan")}
    print(f"{name}: {slots} slots, a block {r['block_cycles_median'] / 1e3:.0f}k cycles "
          f"(p90/p10 {r['block_p90_over_p10']:.2f}), B readers' start gap p50 "
          f"{gap['p50']:.1f} us, p90 {gap['p90']:.1f}; waves' start "
          f"spread (us): " + " ".join(f"{v:.0f}" for v in r["wave_start_spread_us"])
          + f"; the {len(r['fast_sms'])} fast SMs' blocks over the rest's: "
          + " ".join(f"{v:.2f}" for v in r["fast_over_rest_by_wave"])
          + f"; unprofiled {per_call * 1e6:.0f} us a call at {mhz} MHz", flush=True)
  with open(os.path.join(out_dir, "spans.json"), "w") as fh:
    json.dump({"command": " ".join(sys.argv), "rows": rows}, fh)
  return rows


# (region MiB, blocks an SM, loads in flight, tile rows x f32 columns, SMEM
# swizzle): every SM streaming tiles that groups of 12 blocks share, as a
# matmul's operands, over a region that fits in half the L2 (8 MiB) or does
# not (48 MiB); 128-byte rows (32 x 128, swizzled 128) and 64-byte rows
# (64 x 64, swizzled 64).
STREAM_CASES = [(48, 1, 1, 32, 128, 128), (48, 1, 2, 32, 128, 128), (48, 1, 4, 32, 128, 128),
                (48, 1, 8, 32, 128, 128), (48, 2, 4, 32, 128, 128), (48, 2, 6, 32, 128, 128),
                (8, 1, 4, 32, 128, 128), (8, 1, 8, 32, 128, 128), (8, 2, 6, 32, 128, 128),
                (48, 1, 8, 64, 64, 64), (48, 2, 6, 64, 64, 64)]


def stream_spans(out_dir, cases=None, n=2000, readers=12):
  """Block spans of calibrate.tma_stream on every SM (one wave: blocks an SM
  x 132 blocks), each block n loads through its ring, profiled at its
  epilogue: which SMs stream faster than the rest, and by how much, as the
  loads in flight grow (STREAM_CASES). Writes OUT/stream_spans.json."""
  import jax
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from lab import calibrate
  rows = []
  for mib, per_sm, slots, tr, cols, swz in cases or STREAM_CASES:
    blocks = calibrate.NUM_SMS * per_sm
    b = calibrate.stream_case(mib, per_sm, slots, tr, cols, swz, n=n, readers=readers)
    [x] = b.args
    d = tempfile.mkdtemp(prefix="stream_")
    plain = jax.jit(b.fn)
    traced = jax.jit(lambda x: b.fn(x, compiler_params=plgpu.CompilerParams(
        profile_space=16, profile_dir=d, profile_bounds_check=True)))
    jax.block_until_ready(traced(x))
    jax.block_until_ready(plain(x))  # (compiled before it is timed)
    t0 = time.time()
    for _ in range(20):
      out = plain(x)
    jax.block_until_ready(out)
    per_call = (time.time() - t0) / 20
    jax.block_until_ready(traced(x))
    jax.effects_barrier()
    sp = block_spans(newest_trace(d), blocks, 1)
    s = span_summary(sp, 1, blocks)
    name = (f"stream {mib} MiB, {per_sm} an SM, {slots} in flight, {tr}x{cols} f32 "
            f"swizzled {swz}")
    r = {"name": name, "region_mib": mib, "per_sm": per_sm, "slots": slots,
         "tile": [tr, cols], "swizzle": swz, "n": n, "readers": readers,
         "unprofiled_call_s": per_call, **{k: v for k, v in s.items() if k != "b_gap_us"},
         "spans": [[int(a), int(b), round(c - sp[0, 2], 1), int(e)] for a, b, c, e in sp]}
    rows.append(r)
    print(f"{name}: a block {s['block_cycles_median'] / n:.0f} cycles a load (p90/p10 "
          f"{s['block_p90_over_p10']:.2f}); {len(s['fast_sms'])} fast SMs, their blocks "
          f"over the rest's {s['fast_over_rest_by_wave']}; unprofiled {per_call * 1e6:.0f} us "
          f"a call", flush=True)
  with open(os.path.join(out_dir, "stream_spans.json"), "w") as fh:
    json.dump({"command": " ".join(sys.argv), "rows": rows}, fh)
  return rows


def _sustained_clocks():
  """Quickstart case name -> the SM clock (MHz) its sustained run held on the
  H200 (the suite's, held-out and blind studies of h200_measured.json)."""
  from lab import DATA, timing_suite
  data = json.load(open(os.path.join(DATA, "h200_measured.json")))
  out = {}
  for study in ("power_study_suite", "blind_study", "holdout_study"):
    d = data.get(study, {})
    for name, mhz in timing_suite.sustained_clocks(d.get("rows", []) + d.get("cases", [])).items():
      out.setdefault(name.replace(" (blind)", "").replace("quickstart f16 ", "quickstart "), mhz)
  return out


def compare(path):
  """The model's steps beside the GPU's (a pipeline_trace.json), in cycles."""
  import jax
  import pallas_sim as ps
  clocks = _sustained_clocks()
  gpu = json.load(open(path))
  print("| case | clock (MHz) | a step: GPU / model | issue | wait | rest | prologue | "
        "epilogue |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  for r in gpu["rows"]:
    if "error" in r:
      continue
    size, (tm, tn, tk), mcs = r["size"], r["tile"], r["mcs"]
    mhz = r.get("mhz") or clocks.get(r["name"])
    d = tempfile.mkdtemp(prefix="trace_sim_")
    fp8 = r.get("fp8", False)
    fn, dtype = tracer(fp8)
    fn = fn if tm == 128 else functools.partial(fn, tile_m=tm)
    k, m = r.get("k") or size, r.get("m") or size  # (as _operands shapes them)
    x = jax.ShapeDtypeStruct((m, k), dtype)
    y = jax.ShapeDtypeStruct((size, k) if fp8 else (k, size), dtype)
    full = profile_space(k, tk)  # (a smaller space: a --space run's, truncated)
    space = r.get("space") or full
    ps.estimate(lambda a, b: fn(a, b, tile_n=tn, tile_k=tk, mcs=mcs, profile_dir=d,
                                space=space, truncate=space < full),
                x, y, gpu="h200", clock_mhz=mhz)
    m = steps_of(newest_trace(d), mcs)
    # (the GPU: the median block; the model: its slowest class's block, as
    # an estimate simulates one block a class, the last wave's too)
    gpu_step = r["block_cycles_median"] / max(1, r["steps"] - 1)
    sim_step = m["block_cycles_max"] / max(1, m["steps"] - 1)
    part = lambda k: (f"{r[k]['median']:.0f} / {m[k]['median']:.0f}"
                      if r.get(k) and m.get(k) else "-")
    pro = lambda x: f"{x:.0f}" if x is not None else "-"
    print(f"| {r['name']} | {mhz or 'model'} | {gpu_step:.0f} / {sim_step:.0f} "
          f"({sim_step / gpu_step - 1:+.0%}) | {part('issue')} | {part('wait')} | "
          f"{part('rest')} | {pro(r.get('prologue_cycles_median'))} / "
          f"{pro(m['prologue_cycles_median'])} | {part('epilogue')} |", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--filter", default="")
  ap.add_argument("--warm-s", type=float, default=1.0)
  ap.add_argument("--tma-issue", action="store_true",
                  help="what a TMA copy's issue costs its warpgroup (1, 2, 4 and 8 loads, "
                  "then as many stores, back to back)")
  ap.add_argument("--compare", default=None,
                  help="a GPU run's pipeline_trace.json: the model's steps beside it (CPU)")
  ap.add_argument("--case", nargs=4, type=int, action="append", default=[],
                  metavar=("SIZE", "TILE_N", "TILE_K", "MCS"),
                  help="trace this configuration (repeatable) in place of CASES")
  ap.add_argument("--fp8", action="store_true",
                  help="trace our fp8 matmul (lab/families.py) in place of the quickstart's "
                  "(FP8_CASES, or --case SIZE TILE_N TILE_K MCS)")
  ap.add_argument("--space", type=int, default=0,
                  help="ranges a warpgroup records (the rest dropped), where the "
                  "whole kernel's would take SMEM that its blocks share unprofiled")
  ap.add_argument("--gaps", nargs=3, metavar=("TRACE", "GRID_M", "MHZ"), default=None,
                  help="a kept trace (--keep): how far apart its tiles' readers read them")
  ap.add_argument("--spans", action="store_true",
                  help="each block's start and end, SM and launch order (the --case "
                  "configurations): how its waves keep together")
  ap.add_argument("--k", type=int, default=0,
                  help="the traced cases' K in place of their size (A: size x K, B: K x size)")
  ap.add_argument("--m", type=int, default=0,
                  help="the traced cases' M in place of their size (A: M x K)")
  ap.add_argument("--cold", action="store_true",
                  help="--spans with the L2 emptied of the operands before the profiled call")
  ap.add_argument("--stream-spans", action="store_true",
                  help="each SM's time for streaming shared tiles from the L2 "
                  "(STREAM_CASES): which SMs are fast, and when")
  ap.add_argument("--stream-case", nargs=6, type=int, action="append", default=[],
                  metavar=("MIB", "PER_SM", "SLOTS", "ROWS", "COLS", "SWIZZLE"),
                  help="--stream-spans of this case (repeatable) in place of STREAM_CASES")
  ap.add_argument("--keep", action="store_true",
                  help="keep each case's trace (gzipped JSON) in OUT")
  a = ap.parse_args(argv)
  if a.compare:
    compare(a.compare)
    return 0
  if a.gaps:
    import gzip
    path, grid_m, mhz = a.gaps
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
      gaps = reader_gaps(json.load(fh), int(grid_m), float(mhz) / 1e3)
    for key, g in gaps.items():
      print(f"{key}: " + ", ".join(f"p{q} {np.percentile(g, q):.2f}" for q in (10, 25, 50, 75, 90))
            + " us", flush=True)
    return 0
  if a.tma_issue:
    tma_issue(a.out)
    return 0
  if a.stream_spans:
    stream_spans(a.out, [tuple(c) for c in a.stream_case])
    return 0
  if a.spans:
    if a.k or a.m:
      ap.error("--k and --m shape the step traces, not --spans")
    spans([tuple(c) for c in a.case] or CASES, a.out, a.warm_s, a.cold)
    return 0
  import jax
  rows = []
  fn = tracer(a.fp8)[0]

  def write():  # (after every case: a call stopped later keeps what it measured)
    with open(os.path.join(a.out, "pipeline_trace.json"), "w") as fh:
      json.dump({"command": " ".join(sys.argv), "rows": rows}, fh, indent=1)

  for size, tn, tk, mcs, *tm in ([tuple(c) for c in a.case] or (FP8_CASES if a.fp8 else CASES)):
    tm = tm[0] if tm else 128
    name = (name_of(size, tn, tk, mcs, a.fp8, tm) + (f" k={a.k}" if a.k else "")
            + (f" m={a.m}" if a.m else ""))
    if a.filter not in name:
      continue
    try:
      r = trace_case(a, fn, name, size, tn, tk, mcs, tm)
    except Exception as e:  # (a failed launch leaves the device unusable: stop, loudly)
      rows.append({"name": name, "error": f"{type(e).__name__}: {e}"[:500]})
      write()
      print(f"{name}: {type(e).__name__}: {e}", flush=True)
      return 1
    rows.append(r)
    write()
    if "error" in r:
      print(name, r["error"], flush=True)
      continue
    print(f"{name}: step {r['step']['median']:.0f} (p10 {r['step']['p10']:.0f}, p90 "
          f"{r['step']['p90']:.0f}) = issue {r['issue']['median']:.0f} + wait "
          f"{r['wait']['median']:.0f} (p90 {r['wait']['p90']:.0f}) + rest "
          f"{r['rest']['median']:.0f} (p90 {r['rest']['p90']:.0f}) cycles; "
          f"{r['blocks']} blocks on {r['sms']} SMs, a block {r['block_cycles_median']:.0f} "
          f"({r['block_cycles_median'] / max(1, r['steps'] - 1):.0f} a step), "
          f"{r['blocks_at_launch_per_sm']:.2f} an SM at launch, its second "
          + (f"{r['second_block_after_us']:.1f} us after its first; "
             if r["second_block_after_us"] is not None else "none; ")
          + (f"epilogue {r['epilogue']['median']:.0f}, prologue "
             f"{r['prologue_cycles_median']:.0f} cycles; " if r.get("epilogue") else "")
          + (f"the clock by the blocks' starts >= {r['mhz_at_least']['median']:.0f} MHz; "
             if r.get("mhz_at_least") else "")
          + f"unprofiled {r['unprofiled_call_s'] * 1e6:.0f} us a call (dispatch included)",
          flush=True)
  write()
  if not any("error" not in r for r in rows):
    print("no case measured", flush=True)
    return 1
  return 0


def trace_case(a, fn, name, size, tn, tk, mcs, tm=128):
  """One configuration warmed up unprofiled, then profiled once: its row."""
  import jax
  fn = fn if tm == 128 else functools.partial(fn, tile_m=tm)
  x, y = _operands(size, a.k, a.m, a.fp8)
  plain = jax.jit(lambda x, y: fn(x, y, tile_n=tn, tile_k=tk, mcs=mcs))
  d = tempfile.mkdtemp(prefix="trace_")
  # (a buffer past the SMEM the blocks leave fails the launch: fewer ranges,
  # the steps' tail dropped, rather than no trace)
  space, truncate = fitting_space(
      fn, [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in (x, y)],
      a.space or profile_space(a.k or size, tk), tile_n=tn, tile_k=tk, mcs=mcs)
  truncate = truncate or bool(a.space)
  traced = jax.jit(lambda x, y: fn(
      x, y, tile_n=tn, tile_k=tk, mcs=mcs, profile_dir=d, space=space,
      truncate=truncate))
  per_call, mhz, trace = profiled_after_warm(traced, plain, (x, y), d, a.warm_s)
  if trace is None:
    return {"name": name, "error": "no trace written"}
  if a.keep:
    import gzip
    with gzip.open(os.path.join(a.out, f"trace_{size}_{tn}_{tk}_{mcs}.json.gz"), "wt") as fh:
      json.dump(trace, fh)
  return {"name": name, "size": size, "k": a.k or size, "m": a.m or size,
          "tile": [tm, tn, tk], "mcs": mcs, "space": space, "fp8": a.fp8, "mhz": mhz,
          "unprofiled_call_s": per_call, **steps_of(trace, mcs)}


if __name__ == "__main__":
  sys.exit(main())
