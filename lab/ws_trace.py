"""Where a warp-specialized matmul's pipeline step goes (lab/families.py
ws_matmul, JAX's emit_pipeline_warp_specialized): each consumer's step in
named scopes, "acc" (the step's run_state: its wgmma's issue and the wait for
it) and "issue" (the wgmma's issue), stamped by Mosaic GPU's profiler with
the SM's cycle counter. Per consumer and steady step (past the first mcs + 1,
before the last):

* `acc`: the run_state, issue to the accumulator back (the tensor cores,
  this consumer's wgmma and the other's before it);
* `gap`: from its end to the next step's start: the consumed barrier's
  arrive, the loop, and the wait on the produced barrier (the loads);
* `step`: one start to the next;
* `block`, `prologue`, `epilogue`: a consumer's whole work, from its start
  to its first step, and its tile's store;
* `block_us`, `mhz_at_least`: on the GPU, the time from one block's start
  to the next one's on its SM, and `block`'s cycles over it (the clock the
  SM held, less by its launches: lab.pipeline_trace.block_clock), beside
  the call's time and nvidia-smi's clock.

On the GPU machine (each case warmed up unprofiled first, so the clock is the
one a sustained run holds):

    python3 -m lab.ws_trace --out $OUT

On a CPU, the simulator's trace of the same kernel, in the same cycles
(report/profiler.py), at the clock the GPU run held:

    ./dev python -m lab.ws_trace --sim [--mhz 1500]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile

from lab import families
from lab.pipeline_trace import block_clock, newest_trace, ranges, spread

# (tile_m, tile_n, split, mcs): the families' split-N block 128x256x64 at its
# two depths, and the split-M one.
CASES = [(128, 128, "N", 2), (128, 128, "N", 3), (64, 256, "M", 2), (64, 256, "M", 3)]
SIZE = 4096
TILE_K = 64
# Ranges a warpgroup records: two a step, every step of the K loop (the
# profiler's Init and the epilogue's beside them), so that a step's mean is
# the whole block's and its tail is seen.
SPACE = 2 * (SIZE // TILE_K) + 16


def name_of(tile_m, tile_n, split, mcs):
  return f"ws {SIZE} {tile_m}x{tile_n} split {split} mcs={mcs}"


def kernel_of(tile_m, tile_n, split, mcs, profile_dir=None):
  from jax.experimental.pallas import mosaic_gpu as plgpu
  params = (plgpu.CompilerParams(profile_space=SPACE, profile_dir=profile_dir,
                                 profile_bounds_check=True) if profile_dir else None)
  return functools.partial(families.ws_matmul, tile_m=tile_m, tile_n=tile_n, tile_k=TILE_K,
                           mcs=mcs, split=split, scopes=bool(profile_dir),
                           compiler_params=params)


def parts(trace, mcs):
  """Medians (10th/90th percentiles, means) of acc, gap and step over every
  consumer track's steady steps, in cycles; `span`: each consumer's first
  step's start to its last's end, and `steps`: the most steps a track holds."""
  tracks, sm = ranges(trace)
  out = {"acc": [], "gap": [], "step": [], "issue": [], "span": [], "block": [],
         "prologue": [], "epilogue": []}
  steps = 0
  for rs in tracks.values():
    acc = [(b, e) for name, b, e in rs if name == "acc"]
    issue = [(b, e) for name, b, e in rs if name == "issue"]
    if acc:
      out["span"].append(acc[-1][1] - acc[0][0])
      steps = max(steps, len(acc))
    for name, b, e in rs:
      if name == "block":
        out["block"].append(e - b)
        if acc:
          out["prologue"].append(acc[0][0] - b)
      elif name == "epilogue":
        out["epilogue"].append(e - b)
    for j in range(mcs + 1, len(acc) - 1):
      out["acc"].append(acc[j][1] - acc[j][0])
      out["gap"].append(acc[j + 1][0] - acc[j][1])
      out["step"].append(acc[j + 1][0] - acc[j][0])
      if j < len(issue):
        out["issue"].append(issue[j][1] - issue[j][0])
  return {"steps": steps, **{k: spread(v) for k, v in out.items()}, **block_clock(tracks, sm)}


def _operands(sim):
  import jax
  import jax.numpy as jnp
  if sim:
    return (jax.ShapeDtypeStruct((SIZE, SIZE), jnp.float16),) * 2
  k1, k2 = jax.random.split(jax.random.key(0))
  return (jax.random.normal(k1, (SIZE, SIZE), jnp.float16),
          jax.random.normal(k2, (SIZE, SIZE), jnp.float16))


def gpu(out_dir, warm_s):
  """Each case warmed up, then profiled once; OUT/ws_trace.json written after
  every case. Exits 1 where a case traced nothing."""
  import jax
  from lab.pipeline_trace import profiled_after_warm
  a, b = _operands(False)
  rows = []
  for case in CASES:
    f = jax.jit(kernel_of(*case))
    jax.block_until_ready(f(a, b))
    with tempfile.TemporaryDirectory() as d:
      per_call, mhz, trace = profiled_after_warm(
          jax.jit(kernel_of(*case, profile_dir=d)), f, (a, b), d, warm_s)
    row = dict(name=name_of(*case), case=case, per_call_us=per_call * 1e6, mhz=mhz)
    if trace is None:
      row["error"] = "no trace written"
    else:
      row.update(parts(trace, case[3]))
    rows.append(row)
    with open(os.path.join(out_dir, "ws_trace.json"), "w") as fh:
      json.dump({"command": " ".join(sys.argv), "space": SPACE, "rows": rows}, fh, indent=1)
    if trace is None:
      sys.exit(f"{row['name']}: no trace written")
    _print(row)


def sim(mhz):
  import pallas_sim as ps
  a, b = _operands(True)
  for case in CASES:
    with tempfile.TemporaryDirectory() as d:
      ps.estimate(kernel_of(*case, profile_dir=d), a, b, gpu="h200", clock_mhz=mhz)
      trace = newest_trace(d)
    _print(dict(name=name_of(*case), mhz=mhz, **parts(trace, case[3])))


def _print(row):
  def f(p):
    return (f"{p['median']:6.0f} ({p['p10']:.0f}-{p['p90']:.0f}, mean {p['mean']:.0f})"
            if p else "     -")
  print(f"{row['name']:32s} {row.get('mhz') or 0:5.0f} MHz  acc {f(row['acc'])}  "
        f"gap {f(row['gap'])}  step {f(row['step'])}  issue {f(row['issue'])}  "
        f"{row['steps']} steps in {f(row['span'])}  block {f(row.get('block'))}  "
        f"prologue {f(row.get('prologue'))}  epilogue {f(row.get('epilogue'))}"
        + (f"  block {row['block_us']['median']:.1f} us apart, clock >= "
           f"{row['mhz_at_least']['median']:.0f} MHz" if row.get("block_us") else "")
        + (f"  {row['per_call_us']:.1f} us a call" if "per_call_us" in row else ""),
        flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--warm-s", type=float, default=1.0)
  ap.add_argument("--sim", action="store_true", help="the simulator's trace, on a CPU")
  ap.add_argument("--mhz", type=float, default=1500.0)
  ns = ap.parse_args(argv)
  if ns.sim:
    sim(ns.mhz)
  else:
    gpu(ns.out, ns.warm_s)


if __name__ == "__main__":
  main()
