"""Where a step of our row kernels' pipelines goes on the GPU, beside the model.

The model is right within 4% on RMSnorm and softmax (lab/families.py) where
the launch holds two blocks an SM or more, and 17-28% short at 8192x16384,
where it holds one block an SM or leaves half the SMs idle (64 blocks) and
the two-slot pipelines wait on their loads: is the loads' latency longer
there than the model's, or the body's work? This times each pipeline step of
both passes (lab/families.rms_norm: the squares, then the scaled rows;
softmax_rows: the statistics, then the exponentials) with Mosaic GPU's
profiler, per block, in SM cycles:

* `wait load`: emit_pipeline's wait on the step's TMA barrier;
* `wait store`: its wait for the store two steps back to have read its SMEM
  (the second pass only);
* `body`: the step's own work (the kernel's "body" scope);
* `rest`: from the body's end to the next step's first wait (the SMEM
  fence, the TMA store's and the next load's issue);
* `step`: one body's start to the next.

On the GPU machine (each case warmed up unprofiled first, so its clock is the
one its sustained run holds; writes OUT/rows_trace.json, after every case):

    python3 -m lab.rows_trace --out $OUT [--filter S]

On a CPU, the model's steps beside a GPU run's (the simulator's profiler
writes the same trace in the same cycles), each case estimated at the clock
the GPU held:

    ./dev python -m lab.rows_trace --compare OUT/rows_trace.json

`--check` estimates each case profiled on this CPU, as the GPU will run it:
it must fit in SMEM with the profiler's buffer, keep its unprofiled blocks
an SM, and record every step (what lab/tests/test_lab_plans.py runs).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile

import numpy as np

from lab import pipeline_trace as pt

# (kernel, rows, cols, block_m, tile_n, mcs): the 8192x16384 rows the model
# gets short (one block an SM, or 64 blocks), one it gets right beside them
# (64x256), and the same kernel at 16384x8192 (two blocks an SM: right). The
# profiler's trace costs the GPU about 65 us a range to write out (the
# attention trace's): these six record about 800,000.
CASES = [("rmsnorm", 8192, 16384, 128, 64, 2), ("rmsnorm", 8192, 16384, 64, 64, 2),
         ("rmsnorm", 8192, 16384, 128, 128, 2), ("rmsnorm", 8192, 16384, 64, 256, 2),
         ("rmsnorm", 16384, 8192, 64, 64, 2), ("softmax", 8192, 16384, 64, 64, 2)]

PARTS = ("wait load", "wait store", "body", "rest", "step")
PASSES = ("first", "second")


def name_of(case):
  what, rows, cols, bm, tn, mcs = case
  return f"own {what} bf16 {rows}x{cols} {bm}x{tn} mcs={mcs}"


@contextlib.contextmanager
def scoped_waits():
  """While inside, emit_pipeline's waits run in named scopes: its TMA
  barrier's ("wait load") and the stores' SMEM reads' ("wait store")."""
  import jax
  from pallas_sim.backends.sim.base.jax_internals import gpu_pipeline
  real = gpu_pipeline.gpu_primitives

  def scope(name, f):
    def run(*args, **kw):
      with jax.named_scope(name):
        return f(*args, **kw)
    return run

  gpu_pipeline.gpu_primitives = pt.Seen(
      real, barrier_wait=scope("wait load", real.barrier_wait),
      wait_smem_to_gmem=scope("wait store", real.wait_smem_to_gmem))
  try:
    yield
  finally:
    gpu_pipeline.gpu_primitives = real


def steps(case):
  """The steps a block runs: both passes'."""
  return 2 * (case[2] // case[4])


def profile_space(case):
  """Ranges a warpgroup records: a body and two waits a step, and room for
  the rest."""
  return 3 * steps(case) + 32


def built(case, profile_dir=None):
  """The case's lab.timing_suite.Built (its kernel and inputs), profiled into
  profile_dir when given."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  from lab import families
  what, rows, cols, bm, tn, mcs = case
  make = families._make_rms if what == "rmsnorm" else families._make_softmax
  cp = (plgpu.CompilerParams(profile_space=profile_space(case), profile_dir=profile_dir,
                             profile_bounds_check=True) if profile_dir else None)
  return make(rows, cols, block_m=bm, tile_n=tn, mcs=mcs, compiler_params=cp)


def call(case, profile_dir=None):
  """A function of the case's inputs running its kernel (waits scoped when
  profiled), and the inputs."""
  b = built(case, profile_dir)

  def run(*args):
    if profile_dir is None:
      return b.fn(*args)
    with scoped_waits():
      return b.fn(*args)
  return run, b.args


def steps_of(trace, case):
  """Per pass, the steady steps' parts (past the first mcs + 1 and before
  the last; PARTS): median, p10, p90 in cycles; and the blocks, their
  cycles (median) and their steps."""
  tracks, _ = pt.ranges(trace)
  mcs, per_pass = case[5], steps(case) // 2
  parts = {(p, q): [] for p in PASSES for q in PARTS}
  spans, counted = [], 0
  for rs in tracks.values():
    bodies = [(b, e) for n, b, e in rs if n == "body"]
    if len(bodies) < 2 * per_pass:
      continue  # (a block the buffer cut short)
    counted += 1
    spans.append(bodies[-1][1] - bodies[0][0])
    waits = sorted((b, e, n) for n, b, e in rs if n in ("wait load", "wait store"))
    starts = [b for b, _ in bodies]
    # each wait to the step whose body it precedes
    before = [dict() for _ in bodies]
    j = 0
    for b, e, n in waits:
      while j < len(starts) and starts[j] < b:
        j += 1
      if j < len(bodies):
        before[j][n] = before[j].get(n, 0.0) + (e - b)
    for k, pas in enumerate(PASSES):
      lo = k * per_pass
      for i in range(lo + mcs + 1, lo + per_pass - 1):
        nxt = bodies[i + 1][0]
        parts[(pas, "body")].append(bodies[i][1] - bodies[i][0])
        parts[(pas, "step")].append(nxt - bodies[i][0])
        for w in ("wait load", "wait store"):
          parts[(pas, w)].append(before[i + 1].get(w, 0.0))
        waited = sum(before[i + 1].values())
        parts[(pas, "rest")].append(nxt - bodies[i][1] - waited)
  out = {f"{pas} {q}": pt.spread(v) for (pas, q), v in parts.items()}
  out["blocks"] = counted
  out["block_cycles_median"] = float(np.median(spans)) if spans else None
  out["steps"] = 2 * per_pass
  return out


def _summary(r):
  return ", ".join(f"{k} {r[k]['median']:.0f}" for p in PASSES for q in PARTS
                   if r.get(k := f"{p} {q}")) + " cycles (medians)"


def measure(cases, out_dir, warm_s):
  """Each case on the GPU: warmed up unprofiled for warm_s, then one
  profiled call; its steps (steps_of) and the clock it held. A case that
  records no step is an error row, and the step fails (main)."""
  import jax
  rows = []
  for case in cases:
    name = name_of(case)
    d = tempfile.mkdtemp(prefix="rows_trace_")
    plain, args = call(case)
    traced, _ = call(case, d)
    per_call, mhz, trace = pt.profiled_after_warm(jax.jit(traced), jax.jit(plain), args, d,
                                                  warm_s)
    r = {"name": name, "case": list(case), "mhz": mhz, "unprofiled_call_s": per_call}
    if trace is None:
      r["error"] = "no trace written"
    else:
      r.update(steps_of(trace, case))
      if not r["blocks"]:
        r["error"] = "no block recorded every step"
    rows.append(r)
    print(f"{name} at {mhz} MHz, {per_call * 1e6:.1f} us a call: "
          + (r.get("error") or _summary(r)), flush=True)
    with open(os.path.join(out_dir, "rows_trace.json"), "w") as fh:
      json.dump({"command": " ".join(sys.argv), "rows": rows}, fh, indent=1)
  return rows


def simulated(case, mhz=None):
  """The model's steps_of for a case, estimated at `mhz` (None: its own
  clock), and its report."""
  import pallas_sim as ps
  d = tempfile.mkdtemp(prefix="rows_trace_sim_")
  run, args = call(case, d)
  rep = ps.estimate(run, *args, gpu="h200", clock_mhz=mhz)
  return steps_of(pt.newest_trace(d), case), rep


def check(cases):
  """Each case profiled in the simulator as the GPU will run it: it fits in
  SMEM with the profiler's buffer (estimate raises if not), holds as many
  blocks an SM as unprofiled, and every block simulated records every step.
  Returns the rows; raises on the first that fails."""
  import pallas_sim as ps
  sms = ps.gpus.get("h200").num_sms
  held = lambda k: min(k.blocks_per_sm, -(-k.num_blocks // sms))  # (an SM, at once)
  rows = []
  for case in cases:
    plain, args = call(case)
    base = ps.estimate(plain, *args, gpu="h200").kernels[0]
    r, rep = simulated(case)
    k = rep.kernels[0]
    if held(k) != held(base):
      raise ValueError(f"{name_of(case)}: with the profiler's buffer an SM holds "
                       f"{held(k)} blocks at once, {held(base)} unprofiled")
    if not r["blocks"] or not r.get("first body") or not r.get("second body"):
      raise ValueError(f"{name_of(case)}: the simulated trace records no full block")
    rows.append(r)
    print(f"{name_of(case)}: fits, {held(k)} blocks an SM at once; model: {_summary(r)}",
          flush=True)
  return rows


def compare(path):
  """The model's steps beside a GPU run's (rows_trace.json)."""
  gpu = [r for r in json.load(open(path))["rows"] if "error" not in r]
  cols = [f"{p} {q}" for p in PASSES for q in PARTS]
  print("| case | clock (MHz) | " + " | ".join(cols) + " |")
  print("|---|---:|" + "---:|" * len(cols))
  for r in gpu:
    m, _ = simulated(tuple(r["case"]), r.get("mhz"))
    cell = lambda c: (f"{r[c]['median']:.0f} / {m[c]['median']:.0f}"
                      if r.get(c) and m.get(c) else "-")
    print(f"| {r['name']} (GPU / model) | {r.get('mhz')} | "
          + " | ".join(cell(c) for c in cols) + " |", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--filter", default="")
  ap.add_argument("--warm-s", type=float, default=1.0)
  g = ap.add_mutually_exclusive_group()
  g.add_argument("--compare", metavar="FILE")
  g.add_argument("--check", action="store_true")
  ns = ap.parse_args(argv)
  cases = [c for c in CASES if ns.filter in name_of(c)]
  if not cases:
    raise SystemExit(f"no case matches --filter {ns.filter!r}")
  if ns.compare:
    return compare(ns.compare)
  if ns.check:
    return check(cases)
  os.makedirs(ns.out, exist_ok=True)
  rows = measure(cases, ns.out, ns.warm_s)
  bad = [r["name"] for r in rows if "error" in r]
  if bad:
    raise SystemExit(f"rows_trace: {len(bad)} of {len(rows)} cases measured nothing: {bad}")


if __name__ == "__main__":
  main()
