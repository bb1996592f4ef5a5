"""Where a KV step of JAX's attention goes on the GPU, beside the model.

lab/step_costs.py finds that a KV step of JAX's attention (pallas/ops/gpu/
attention_mgpu.py) costs the H200 700-880 cycles whatever its size, twice the
model's 380-410. This traces the step's phases with Mosaic GPU's profiler, so
the missing cost can be put where it is paid. The kernel is JAX's own, run
as users run it: while it is traced, the `plgpu` and `pl` its module sees
put its phases in named scopes, and its CompilerParams gain the profiler's
buffer (scoped_attention). Per compute warpgroup and KV step:

* `qk`: the QK^T wgmma's issue, the schedule barrier the two compute
  warpgroups hand back and forth, and the wait for the wgmma's result;
  within it `qk wait schedule_barrier`, the barrier's wait alone;
* `softmax`: from qk's end to the wait for the V tile: the row max and sum
  (each ends in an exchange across the 4 lanes of a row), the exponentials,
  the accumulator's rescale;
* `wait v_barriers`, `wait schedule_barrier`: the V tile's arrival, and the
  other warpgroup's end of its softmax (the tensor cores' turn);
* `pv`: the PV wgmma's issue, the wait for the next K tile (`pv wait
  k_barriers`), the wait for the wgmma's result;
* `rest`: from pv's end to the next qk (the slot's release, the loop);
* `step`: one qk's start to the next.

On the GPU machine (each case warmed up unprofiled first, so its clock is
the one its sustained run holds; writes OUT/attention_trace.json):

    python3 -m lab.attention_trace --out $OUT [--filter S]

On a CPU, the model's phases beside a GPU run's (the simulator's profiler
writes the same trace in the same cycles: report/profiler.py), each case
estimated at the clock the GPU held, and what a step costs whatever its size
(step_costs.fixed_cost), phase by phase, for cases that differ only in
block_kv:

    ./dev python -m lab.attention_trace --compare OUT/attention_trace.json

`--predict FILE` writes the model's phases of CASES at its own clock, before
the GPU has traced them. (A profiled estimate keeps every block's trace: about
100 s a case on a 2-core machine.)
"""
from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import linecache
import os
import re
import sys
import tempfile

import numpy as np

from lab import pipeline_trace as pt

# (batch, seq, heads, head_dim, block_q, block_kv, max_concurrent_steps):
# step_costs pairs (the same work in 128- and 64-key steps) at one block an
# SM, the suite's at head_dim 128 and at 64, where the softmax outweighs the
# wgmmas (its row reductions at the row micros' cost put the suite's d64 row
# 17% long, the d128 ones within 9%).
CASES = [(1, 4096, 32, 128, 64, 128, 2), (1, 4096, 32, 128, 64, 64, 2),
         (1, 4096, 32, 64, 64, 128, 2), (1, 4096, 32, 64, 64, 64, 2)]

# The phases a compute warpgroup's step is cut into, in the order it runs them.
PARTS = ("qk", "qk wait schedule_barrier", "softmax", "wait v_barriers",
         "wait schedule_barrier", "pv", "pv wait k_barriers", "rest", "step")

# Scoped phases by the function a run_scoped / run_state call runs.
_PHASES = {"compute_qk": "qk", "compute_pv": "pv"}


def name_of(case):
  b, s, h, d, bq, bkv, mcs = case
  return f"attention fwd b{b} s{s} h{h} d{d} bq{bq} bkv{bkv} mcs={mcs}"


def _barrier_of(frame):
  """The barrier array a barrier_wait call names at its line ("v_barriers"
  in plgpu.barrier_wait(v_barriers.at[slot]))."""
  line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
  m = re.search(r"barrier_wait\(\s*(\w+)", line)
  return m.group(1) if m else f"line {frame.f_lineno}"


@contextlib.contextmanager
def scoped_attention(profile_dir, space):
  """While inside, JAX's attention kernel (attention_mgpu, traced inside)
  runs profiled into `profile_dir` (`space` ranges a warpgroup, the rest
  dropped) with its phases in named scopes: qk and pv (its run_scoped and
  run_state calls), and each barrier wait, named by its barrier and, inside
  a phase, by the phase ("pv wait k_barriers")."""
  import jax
  from jax.experimental.pallas.ops.gpu import attention_mgpu as am
  plgpu, pl = am.plgpu, am.pl
  open_phase = []  # (the phase being traced: a wait inside it says so)

  def phased(name, f):
    def run(*args, **kw):
      open_phase.append(name)
      try:
        with jax.named_scope(name):
          return f(*args, **kw)
      finally:
        open_phase.pop()
    return run

  def barrier_wait(*args, **kw):
    name = "wait " + _barrier_of(sys._getframe(1))
    if open_phase:
      name = f"{open_phase[-1]} {name}"
    with jax.named_scope(name):
      return plgpu.barrier_wait(*args, **kw)

  def run_scoped(f, *args, **kw):
    phase = _PHASES.get(getattr(f, "__name__", ""))
    return (phased(phase, pl.run_scoped) if phase else pl.run_scoped)(f, *args, **kw)

  def run_state(f, *args, **kw):
    phase = _PHASES.get(getattr(f, "__name__", ""))
    out = pl.run_state(f, *args, **kw)
    return phased(phase, out) if phase else out

  def compiler_params(**kw):
    return plgpu.CompilerParams(**kw, profile_space=space, profile_dir=profile_dir,
                                profile_bounds_check=True)

  am.plgpu = pt.Seen(plgpu, barrier_wait=barrier_wait, CompilerParams=compiler_params)
  am.pl = pt.Seen(pl, run_scoped=run_scoped, run_state=run_state)
  try:
    yield am
  finally:
    am.plgpu, am.pl = plgpu, pl


def profile_space(case):
  """Ranges a warpgroup records: seven a step, and room for the rest."""
  seq, bkv = case[1], case[5]
  return 7 * (seq // bkv) + 32


def attention(q, k, v, case, profile_dir=None):
  """JAX's attention forward at the case's tiles; profiled with its phases
  scoped where profile_dir is given."""
  from jax.experimental.pallas.ops.gpu import attention_mgpu as am
  _, _, _, _, bq, bkv, mcs = case
  cfg = am.TuningConfig(block_q=bq, block_kv=bkv, max_concurrent_steps=mcs)
  if profile_dir is None:
    return am.attention(q, k, v, cfg)
  with scoped_attention(profile_dir, profile_space(case)) as scoped:
    return scoped.attention(q, k, v, cfg)


def steps_of(trace, case):
  """The compute warpgroups' steady steps (past the first mcs + 1 and before
  the last), phase by phase (PARTS): median, p10, p90 in cycles; and a
  block's cycles, its steps and its blocks."""
  tracks, _ = pt.ranges(trace)
  mcs = case[6]
  parts = {p: [] for p in PARTS}
  spans, n_steps = [], 0
  for rs in tracks.values():
    qk = [(b, e) for n, b, e in rs if n == "qk"]
    if len(qk) < mcs + 4:
      continue  # (the memory warpgroup, or a block the buffer cut short)
    n_steps = len(qk)
    # Each range to the step it starts in (one qk's start to the next), the
    # first of each name a step: one pass, not a scan of the track a step.
    starts = [b for b, _ in qk]
    steps = [{} for _ in qk]
    for n, b, e in rs:
      j = bisect.bisect_right(starts, b) - 1
      if n in PARTS and j >= 0:
        steps[j].setdefault(n, (b, e))
    pv_ends = [st["pv"][1] for st in steps if "pv" in st]
    spans.append(pv_ends[-1] - qk[0][0] if pv_ends else 0.0)
    for j in range(mcs + 1, len(qk) - 1):
      st, hi = steps[j], qk[j + 1][0]
      if "wait v_barriers" not in st or "pv" not in st:
        continue
      for p, (b, e) in st.items():
        parts[p].append(e - b)
      parts["softmax"].append(st["wait v_barriers"][0] - qk[j][1])
      parts["rest"].append(hi - st["pv"][1])
      parts["step"].append(hi - qk[j][0])
  out = {p: pt.spread(v) for p, v in parts.items()}
  out["warpgroups"] = len(spans)
  out["block_cycles_median"] = float(np.median(spans)) if spans else None
  out["steps"] = n_steps
  return out


def _operands(case, key=0):
  import jax
  import jax.numpy as jnp
  b, s, h, d = case[:4]
  keys = jax.random.split(jax.random.key(key), 3)
  return tuple(jax.random.normal(kk, (b, s, h, d), jnp.float32).astype(jnp.float16)
               for kk in keys)


def measure(cases, out_dir, warm_s):
  """Each case on the GPU: warmed up unprofiled for warm_s, then one
  profiled call; its steps' phases (steps_of) and the clock it held."""
  import jax
  rows = []
  for case in cases:
    name = name_of(case)
    q, k, v = _operands(case)
    plain = jax.jit(lambda q, k, v: attention(q, k, v, case))
    d = tempfile.mkdtemp(prefix="attention_trace_")
    traced = jax.jit(lambda q, k, v: attention(q, k, v, case, profile_dir=d))
    per_call, mhz, trace = pt.profiled_after_warm(traced, plain, (q, k, v), d, warm_s)
    if trace is None:
      rows.append({"name": name, "case": list(case), "error": "no trace written"})
      print(name, "no trace written", flush=True)
      continue
    r = {"name": name, "case": list(case), "mhz": mhz, "unprofiled_call_s": per_call,
         **steps_of(trace, case)}
    rows.append(r)
    print(f"{name} at {mhz} MHz: " + ", ".join(
        f"{p} {r[p]['median']:.0f}" for p in PARTS if r.get(p)) + " cycles (medians)",
        flush=True)
    # (after each case: a step stopped at its time limit keeps what it measured)
    with open(os.path.join(out_dir, "attention_trace.json"), "w") as fh:
      json.dump({"command": " ".join(sys.argv), "rows": rows}, fh, indent=1)
  return rows


def simulated(case, mhz):
  """The model's steps_of for a case, estimated at `mhz` (None: its own clock)."""
  import jax
  import jax.numpy as jnp
  import pallas_sim as ps
  d = tempfile.mkdtemp(prefix="attention_trace_sim_")
  x = jax.ShapeDtypeStruct(case[:4], jnp.float16)
  ps.estimate(lambda q, k, v: attention(q, k, v, case, profile_dir=d), x, x, x,
              gpu="h200", clock_mhz=mhz)
  return steps_of(pt.newest_trace(d), case)


def fixed_by_part(a, b):
  """Phase by phase, what a step costs whatever its size (step_costs.
  fixed_cost) from two cases' steps_of rows that differ only in block_kv:
  a phase's cycles a block are its median a step times the steps."""
  from lab.step_costs import fixed_cost
  out = {}
  for p in PARTS:
    if a.get(p) and b.get(p):
      out[p] = fixed_cost(a["steps"], a[p]["median"] * a["steps"],
                          b["steps"], b[p]["median"] * b["steps"])
  return out


def compare(path):
  """The model's phases beside a GPU run's (attention_trace.json)."""
  gpu = [r for r in json.load(open(path))["rows"] if "error" not in r]
  sims = {}
  print("| case | clock (MHz) | " + " | ".join(PARTS) + " |")
  print("|---|---:|" + "---:|" * len(PARTS))
  for r in gpu:
    case = tuple(r["case"])
    m = sims[case] = simulated(case, r.get("mhz"))
    cell = lambda p: (f"{r[p]['median']:.0f} / {m[p]['median']:.0f}"
                      if r.get(p) and m.get(p) else "-")
    print(f"| {r['name']} (GPU / model) | {r.get('mhz')} | "
          + " | ".join(cell(p) for p in PARTS) + " |", flush=True)
  print("\nWhat a step costs whatever its size, phase by phase (GPU / model):\n")
  print("| pair | " + " | ".join(PARTS) + " |")
  print("|---|" + "---:|" * len(PARTS))
  by_case = {tuple(r["case"]): r for r in gpu}
  for case, r in by_case.items():
    for other, r2 in by_case.items():
      if case[:5] == other[:5] and case[5] > other[5]:
        g, s = fixed_by_part(r, r2), fixed_by_part(sims[case], sims[other])
        print(f"| {r['name']} / bkv{other[5]} mcs={other[6]} | " + " | ".join(
            f"{g[p]:.0f} / {s[p]:.0f}" if p in g and p in s else "-" for p in PARTS)
            + " |", flush=True)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--filter", default="")
  ap.add_argument("--warm-s", type=float, default=1.0)
  ap.add_argument("--compare", default=None,
                  help="a GPU run's attention_trace.json: the model's phases beside it (CPU)")
  ap.add_argument("--predict", default=None, metavar="FILE",
                  help="the model's phases of CASES, at its own clock, into FILE (CPU: "
                  "written before the GPU traces them, they are blind)")
  a = ap.parse_args(argv)
  if a.compare:
    compare(a.compare)
    return 0
  if a.predict:
    import subprocess
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    rows = [{"name": name_of(c), "case": list(c), **simulated(c, None)}
            for c in CASES if a.filter in name_of(c)]
    with open(a.predict, "w") as fh:
      json.dump({"command": " ".join(sys.argv), "commit": commit, "rows": rows}, fh, indent=1)
    return 0
  measure([c for c in CASES if a.filter in name_of(c)], a.out, a.warm_s)
  return 0


if __name__ == "__main__":
  sys.exit(main())
