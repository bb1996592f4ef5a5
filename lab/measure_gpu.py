"""H200 ground truth for the timing model: measures every kernel of
lab/timing_suite.py and every micro-benchmark of lab/calibrate.py
on the GPU, and writes $OUT/h200_measured.json plus a printed table.

Run on the GPU machine (jax with CUDA):

    python3 -m lab.measure_gpu [--deadline 400] [--ncu 2] [--filter S]
                                      [--resume earlier/h200_measured.json]

How a time is taken (device time, not Python dispatch):
* each kernel first runs once and its output is checked against a jnp
  reference computed on the GPU in float32 (||out - ref|| / ||ref|| under the
  case's tolerance; NaN fails): a wrong kernel is reported, never timed. XLA's
  autotuning is switched off (--xla_gpu_autotune_level=0) so that the
  references compile in well under a second; the Pallas kernels are not
  affected by it;
* `jax.jit(fn)` is called back to back `calls` times (dispatch is
  asynchronous: launches queue on the GPU) and synchronized once; a batch lasts
  >= 25 ms; the median over 7 batches after warm-up is the time per call,
  `spread` is (max - min) / median over the batches;
* GPU-bound check, every row: `enqueue_frac`, the share of a batch the host
  spent issuing the calls (well under 1: the GPU set the pace; near 1: host
  dispatch may have). Rows marked small also run the kernel twice in one
  jitted program, chained through an optimization barrier so XLA can neither
  merge nor drop a call: `k2_per_kernel_s` (half that program's time) and
  `k2_ratio` = k2_per_kernel_s / median_s (near 1: GPU-bound); and
  CHAIN_CALLS times in one program: `chain_per_kernel_s` (that program's
  time over CHAIN_CALLS), the time a kernel takes among others on the GPU
  (two in a program still carry half a host dispatch each: the 2048^3
  matmuls' blocks ran in ~24 us where k2 gave 31-36: h200_measured.json's
  chain_study_eighteenth);
* the SM clock is sampled by `nvidia-smi -lms 100` throughout (clocks are
  never changed); each row gets the median SM clock over its timed window;
* `--ncu N`: the first N of NCU_CASES are run again under Nsight Compute
  (`ncu --clock-control none --cache-control none --metrics
  gpu__time_duration.sum`), one process each, as a cross-check column.

Kernels are compiled and checked in chunks (threads), each chunk then timed
one kernel at a time with nothing else on the GPU; the JSON is rewritten
after every chunk, so a run cut short keeps what it measured, and `--resume`
runs only what an earlier JSON lacks (its rows are kept, marked `from_run`).

Micro-benchmarks are measured at n1 and n2 iterations and reduced by
calibrate.Micro.derive (differences). `--sim-check` instead runs every suite
kernel at a small size in the simulator on the CPU against its reference.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import csv
import io
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import traceback

import numpy as np

# The jnp references (f32 matmuls, attention) are XLA programs: without this
# XLA:GPU autotunes every dot it compiles, seconds each, under a lock (the
# first H200 run spent most of its time there). Kernels are not affected.
if "xla_gpu_autotune_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_gpu_autotune_level=0").strip()

from lab import ROOT, calibrate, timing_suite  # noqa: E402  (after XLA_FLAGS)

LAST = ("barrier_pingpong",)
# What to run first (by key prefix), the rest after in list order.
PRIORITY = ("wgmma_latency", "spill_", "wgmma_tf32", "wgmma_fp8", "launch_",
            "quickstart 4096", "hopper_matmul 4096", "attention", "add ", "rowsum",
            "warp_specialized", "quickstart 8192", "hopper_matmul 8192", "quickstart 2048")
NCU_CASES = ["quickstart 4096 128x128x64 mcs=2", "add pipeline 64M f32 1024 blocks 32x256 mcs=2",
             "hopper_matmul 8192 f16 128x128x64 mcs=4 wgN minorN w4"]


# ---------------------------------------------------------------------------
# Clock sampling.
# ---------------------------------------------------------------------------

class ClockSampler:
  """nvidia-smi every 100 ms: (host time, SM MHz, memory MHz, watts, C,
  throttle reasons). Read-only queries; the clocks are left alone."""

  FIELDS = "clocks.sm,clocks.mem,power.draw,temperature.gpu"

  def __init__(self, every_ms=100, fields=None):
    self.fields = fields or self.FIELDS
    self.samples = []
    self.proc = None
    try:
      self.proc = subprocess.Popen(
          ["nvidia-smi", f"--query-gpu={self.fields}", "--format=csv,noheader,nounits",
           "-lms", str(every_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
          text=True)
    except OSError:
      return
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    n = len(self.fields.split(","))
    for line in self.proc.stdout:
      vals = []
      for p in line.split(","):
        try:
          vals.append(float(p))
        except ValueError:
          vals.append(float("nan"))
      if len(vals) == n and vals[0] == vals[0]:
        self.samples.append((time.time(), *vals))

  def window(self, t0, t1):
    s = [x for x in self.samples if t0 - 0.05 <= x[0] <= t1 + 0.15]
    if not s:
      return None
    return dict(sm_mhz=statistics.median(x[1] for x in s),
                sm_mhz_min=min(x[1] for x in s), sm_mhz_max=max(x[1] for x in s),
                mem_mhz=statistics.median(x[2] for x in s),
                power_w=statistics.median(x[3] for x in s),
                temp_c=max(x[4] for x in s), samples=len(s))

  def stop(self):
    if self.proc:
      self.proc.terminate()


# ---------------------------------------------------------------------------
# Timing.
# ---------------------------------------------------------------------------

def chained(fn, k):
  """fn k times in one program, each call's inputs passed through an
  optimization barrier together with the previous call's output: the calls
  run one after the other and none is merged (CSE) or dropped; all outputs
  are returned."""
  import jax

  def g(*args):
    outs = [fn(*args)]
    for _ in range(k - 1):
      args, _ = jax.lax.optimization_barrier((args, outs[-1]))
      outs.append(fn(*args))
    return outs
  return g


def _per_call(f, args, calls, enq=None):
  import jax
  t0 = time.perf_counter()
  out = None
  for _ in range(calls):
    out = f(*args)
  t1 = time.perf_counter()
  jax.block_until_ready(out)
  t2 = time.perf_counter()
  if enq is not None:
    enq.append((t1 - t0) / (t2 - t0))
  return (t2 - t0) / calls


BATCH_S = [0.025]  # (--batch-s: longer batches give the clock sampler more to see)
SUSTAIN_S = [0.0]  # (--sustain-s: back-to-back calls before the timed batches)


def time_fn(f, args, *, batch_s=0.025, batches=7, max_calls=400):
  """Median seconds per call of the (jitted, warmed-up) f. `enqueue_frac`:
  the share of a batch's time the host spent issuing the calls; well under
  1 means the GPU, not Python dispatch, set the pace."""
  _per_call(f, args, 2)                               # warm-up
  one = _per_call(f, args, 1)
  calls = int(min(max_calls, max(3, math.ceil(batch_s / max(one, 1e-7)))))
  t_end = time.perf_counter() + SUSTAIN_S[0]
  while time.perf_counter() < t_end:  # (the clock settles under the power limit)
    _per_call(f, args, calls)
  enq = []
  ts = [_per_call(f, args, calls, enq) for _ in range(batches)]
  med = statistics.median(ts)
  return dict(median_s=med, spread=(max(ts) - min(ts)) / med, calls=calls,
              batches=batches, repeats=calls * batches, batch_s=ts,
              enqueue_frac=statistics.median(enq))


# ---------------------------------------------------------------------------
# Jobs: one kernel configuration each (a suite case, or a micro at n1 or n2).
# ---------------------------------------------------------------------------

CHAIN_CALLS = 32  # (small rows: dispatch is 1/32 of a call's time or less)


class Job:
  def __init__(self, key, build, meta, k2=False):
    self.key = key
    self.build = build         # () -> timing_suite.Built
    self.meta = meta
    self.k2 = k2               # also time the kernel twice, and CHAIN_CALLS times, in one program
    self.built = None
    self.f1 = self.f2 = self.fn = None
    self.res = dict(meta)
    self.ok = False
    self.done = False          # measured in an earlier run (--resume)

  def prepare(self):
    """Build, compile, run once, check against the reference (on the GPU)."""
    import jax
    import jax.numpy as jnp
    t0 = time.perf_counter()
    try:
      b = self.built = self.build()
      self.f1 = jax.jit(b.fn)
      cargs = b.check_args or b.args
      out = self.f1(*cargs)
      jax.block_until_ready(out)
      self.res["first_call_s"] = time.perf_counter() - t0
      o = out[0] if isinstance(out, (tuple, list)) else out
      if b.check_args is not None:
        self.res["checked_on"] = "check_args (exact-sum inputs)"
      if b.reference is not None:
        ref = jax.jit(b.reference)(*cargs)
        o32, r32 = jnp.asarray(o, jnp.float32), jnp.asarray(ref, jnp.float32)
        if o32.shape != r32.shape:
          raise AssertionError(f"shape {o32.shape} != reference {r32.shape}")
        err = float(jnp.linalg.norm(o32 - r32) / jnp.maximum(jnp.linalg.norm(r32), 1e-30))
        self.res["rel_err"] = err
        self.res["tol"] = b.tol
        if not err <= max(b.tol, 1e-6):   # NaN fails too
          raise AssertionError(f"relative error {err:.3e} > tolerance {b.tol:g}")
      del out, o
      if b.check_args is not None:   # the timed inputs run once too
        jax.block_until_ready(self.f1(*b.args))
      if self.k2:
        self.f2 = jax.jit(chained(b.fn, 2))
        jax.block_until_ready(self.f2(*b.args))
        self.fn = jax.jit(chained(b.fn, CHAIN_CALLS))
        jax.block_until_ready(self.fn(*b.args))
      self.ok = True
    except Exception as e:  # reported in the results, the run goes on
      self.res["error"] = f"{type(e).__name__}: {e}"[:2000]
      self.res["traceback"] = traceback.format_exc()[-3000:]
    self.res["prepare_s"] = time.perf_counter() - t0
    return self

  def measure(self, clocks):
    if not self.ok:
      return
    args = self.built.args
    try:
      t0 = time.time()
      r1 = time_fn(self.f1, args, batch_s=BATCH_S[0])
      if self.f2 is not None:
        r2 = time_fn(self.f2, args, batches=5)
        self.res["k2_per_kernel_s"] = r2["median_s"] / 2
        self.res["k2_ratio"] = r2["median_s"] / 2 / r1["median_s"]
      if self.fn is not None:
        tc = time.time()
        rn = time_fn(self.fn, args, batches=5)
        self.res["chain_calls"] = CHAIN_CALLS
        self.res["chain_per_kernel_s"] = rn["median_s"] / CHAIN_CALLS
        self.res["chain_spread"] = rn["spread"]
        self.res["chain_clock"] = clocks.window(tc, time.time())
      t1 = time.time()
      self.res.update({k: v for k, v in r1.items()})
      self.res["clock"] = clocks.window(t0, t1)
    except Exception as e:
      self.ok = False
      self.res["error"] = f"timing: {type(e).__name__}: {e}"[:2000]

  def release(self):
    self.built = self.f1 = self.f2 = self.fn = None


def suite_jobs(pattern="", kind="suite"):
  jobs = []
  for c in timing_suite.cases(kind):
    if pattern and pattern not in c.name:
      continue
    meta = dict(kind="suite", name=c.name, family=c.family, params=c.params,
                flops=c.flops, bytes=c.bytes, small=c.small, note=c.note)
    jobs.append(Job(c.name, c.build, meta, k2=c.small))
  return jobs


def micro_jobs(pattern=""):
  jobs = []
  for m in calibrate.MICROS:
    if pattern and pattern not in m.name:
      continue
    for which, n in (("n1", m.n1), ("n2", m.n2)):
      meta = dict(kind="micro", name=m.name, which=which, n=n)
      jobs.append(Job(f"{m.name} {which}", (lambda m=m, n=n: m.build(n)), meta))
  return jobs


# ---------------------------------------------------------------------------
# Nsight Compute cross-check.
# ---------------------------------------------------------------------------

def ncu_child(names):
  """Run under ncu: each named suite case 3 times, nothing else timed."""
  import jax
  for name in names:
    b = timing_suite.by_name(name).build()
    f = jax.jit(b.fn)
    for _ in range(3):
      jax.block_until_ready(f(*b.args))


def _ncu_path():
  import glob
  import shutil
  found = shutil.which("ncu")
  if found:
    return found
  for pat in ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda*/bin/ncu",
              "/usr/local/cuda*/nsight-compute*/ncu"):
    hits = sorted(glob.glob(pat))
    if hits:
      return hits[-1]
  return "ncu"


def run_ncu(name, timeout):
  cmd = [_ncu_path(), "--clock-control", "none", "--cache-control", "none",
         "--metrics", "gpu__time_duration.sum", "--csv",
         sys.executable, "-m", "lab.measure_gpu", "--ncu-child", name]
  t0 = time.time()
  # The child must not preallocate GPU memory: this process holds most of it.
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
  rows = []
  text = p.stdout
  start = text.find('"ID"')
  if start >= 0:
    for r in csv.DictReader(io.StringIO(text[start:])):
      if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
      v = float(r["Metric Value"].replace(",", ""))
      unit = r.get("Metric Unit", "nsecond")
      scale = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}.get(unit, 1e-9)
      rows.append((r.get("Kernel Name", "?"), v * scale))
  by = {}
  for k, v in rows:
    by.setdefault(k, []).append(v)
  if not by:
    return dict(ok=False, wall_s=time.time() - t0, rc=p.returncode,
                tail=(p.stdout[-1500:] + p.stderr[-1500:]))
  kname, vals = max(by.items(), key=lambda kv: sum(kv[1]))
  return dict(ok=True, kernel=kname[:200], durations_s=vals,
              median_s=statistics.median(vals), wall_s=time.time() - t0,
              other_kernels={k[:120]: statistics.median(v) for k, v in by.items()
                             if k != kname})


# ---------------------------------------------------------------------------
# Results.
# ---------------------------------------------------------------------------

def _env():
  import jax
  env = dict(jax=jax.__version__, devices=[str(d) for d in jax.devices()],
             time=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
  try:
    env["nvidia_smi"] = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
         "clocks.sm,power.limit", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=20).stdout.strip()
  except Exception as e:
    env["nvidia_smi"] = str(e)
  try:
    d = jax.devices()[0]
    env["num_sms"] = getattr(d, "core_count", None)
  except Exception:
    pass
  return env


def summarize_micros(jobs):
  """Per micro-benchmark: the two times and the derived figures."""
  by = {}
  for j in jobs:
    if j.res.get("kind") == "micro":
      by.setdefault(j.res["name"], {})[j.res["which"]] = j.res
  out = []
  for m in calibrate.MICROS:
    if m.name not in by:
      continue
    r1, r2 = by[m.name].get("n1", {}), by[m.name].get("n2", {})
    row = dict(name=m.name, figure=m.figure, unit=m.unit, work_per_iter=m.work,
               params=m.params, n1=m.n1, n2=m.n2, note=m.note)
    errs = [r.get("error") for r in (r1, r2) if r.get("error")]
    if errs or "median_s" not in r1 or "median_s" not in r2:
      row["error"] = "; ".join(errs) or "not measured"
      out.append(row)
      continue
    clk = [r["clock"]["sm_mhz"] for r in (r1, r2) if r.get("clock")]
    clock_hz = statistics.mean(clk) * 1e6 if clk else None
    row.update(t1_s=r1["median_s"], t2_s=r2["median_s"], spread1=r1["spread"],
               spread2=r2["spread"], k2_ratio1=r1.get("k2_ratio"),
               k2_ratio2=r2.get("k2_ratio"), enqueue_frac1=r1.get("enqueue_frac"),
               enqueue_frac2=r2.get("enqueue_frac"), clock_hz=clock_hz,
               rel_err=max(r1.get("rel_err", 0), r2.get("rel_err", 0)),
               **m.derive(r1["median_s"], r2["median_s"], clock_hz))
    out.append(row)
  return out


# (figure, micro-benchmark, its field): the figures the JSON summarises
FIGURES = [
    ("tma_latency_l2_4k_cycles", "tma_latency_l2_4k", "per_iter_cycles"),
    ("tma_latency_l2_32k_cycles", "tma_latency_l2_32k", "per_iter_cycles"),
    ("tma_latency_hbm_4k_cycles", "tma_latency_hbm_4k", "per_iter_cycles"),
    ("hbm_read_bytes_per_s", "stream_hbm_all_sms", "rate_per_s"),
    ("hbm_read_bytes_per_s_2_per_sm", "stream_hbm_2_per_sm", "rate_per_s"),
    ("hbm_copy_bytes_per_s", "copy_gmem_smem_gmem_all_sms", "rate_per_s"),
    ("one_sm_tma_bytes_per_s", "stream_hbm_one_sm", "rate_per_s"),
    ("one_sm_tma_bytes_per_s_6slots", "stream_hbm_one_sm_6slots", "rate_per_s"),
    ("l2_reuse_bytes_per_s", "l2_reuse_all_sms", "rate_per_s"),
    ("barrier_round_trip_cycles", "barrier_pingpong", "per_iter_cycles"),
    ("launch_overhead_s_1_block", "launch_1_blocks", "per_iter_s"),
    ("launch_overhead_s_132_blocks", "launch_132_blocks", "per_iter_s"),
]

def headline(micros):
  """The figures gpus.py reads, from the micro rows."""
  g = {r["name"]: r for r in micros if "per_iter_s" in r}
  f = {}

  def put(key, name, field, scale=1.0):
    if name in g and g[name].get(field) is not None:
      f[key] = g[name][field] * scale

  for key, name, field in FIGURES:
    put(key, name, field)
  for r in g.values():
    if r["name"].startswith(("wgmma_", "spill_")) and r.get("per_sm_per_clk"):
      f[f"{r['name']}_flop_per_clk_per_sm"] = r["per_sm_per_clk"]
    if r["name"].startswith("wgmma_latency") and r.get("per_iter_cycles"):
      f[f"{r['name']}_cycles"] = r["per_iter_cycles"]
  return f


def write(path, env, jobs, micros, ncu, clocks, done):
  suite = [j.res for j in jobs if j.res.get("kind") == "suite"]
  for r in suite:
    if "median_s" in r:
      r["tflops"] = r["flops"] / r["median_s"] / 1e12
      r["hbm_gbps_min_bytes"] = r["bytes"] / r["median_s"] / 1e9
    if r["name"] in ncu:
      r["ncu"] = ncu[r["name"]]
  doc = dict(env=env, complete=done, cases=suite, micros=micros,
             figures=headline(micros),
             micro_raw=[j.res for j in jobs if j.res.get("kind") == "micro"],
             clock_samples=[(round(t, 2), s) for t, s, *_ in clocks.samples[::5]])
  tmp = path + ".tmp"
  with open(tmp, "w") as fh:
    json.dump(doc, fh, indent=1, default=str)
  os.replace(tmp, path)


def print_tables(jobs, micros):
  print("\n| case | family | median (us) | spread | calls x batches | enqueue frac | k2 ratio | TFLOP/s | GB/s (min bytes) | SM MHz | rel err |")
  print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for j in jobs:
    r = j.res
    if r.get("kind") != "suite":
      continue
    if "median_s" not in r:
      print(f"| {r['name']} | {r['family']} | FAILED: {r.get('error', '?')[:150]} |")
      continue
    clk = r.get("clock") or {}
    print(f"| {r['name']}{' (small)' if r.get('small') else ''} | {r['family']} | "
          f"{r['median_s'] * 1e6:.1f} | {r['spread']:.3f} | {r['calls']}x{r['batches']} | "
          f"{r.get('enqueue_frac', float('nan')):.2f} | {r.get('k2_ratio', float('nan')):.3f} | {r['flops'] / r['median_s'] / 1e12:.1f} | "
          f"{r['bytes'] / r['median_s'] / 1e9:.0f} | {clk.get('sm_mhz', float('nan')):.0f} | "
          f"{r.get('rel_err', float('nan')):.1e} |")
  print("\n| micro | n1 / n2 | t1 / t2 (us) | per iteration | cycles | rate | per SM per clk | SM MHz |")
  print("|---|---|---|---:|---:|---:|---:|---:|")
  for r in micros:
    if "per_iter_s" not in r:
      print(f"| {r['name']} | {r['n1']} / {r['n2']} | FAILED: {r.get('error', '?')[:150]} |")
      continue
    rate = r.get("rate_per_s")
    rate_s = ""
    if rate is not None:
      rate_s = f"{rate / 1e9:.1f} GB/s" if r["unit"] == "bytes" else f"{rate / 1e12:.1f} TFLOP/s"
    cyc = r.get("per_iter_cycles")
    print(f"| {r['name']} | {r['n1']} / {r['n2']} | {r['t1_s'] * 1e6:.1f} / {r['t2_s'] * 1e6:.1f} | "
          f"{r['per_iter_s'] * 1e9:.1f} ns | {cyc if cyc is None else round(cyc, 1)} | {rate_s} | "
          f"{r.get('per_sm_per_clk', '') if r.get('per_sm_per_clk') is None else round(r['per_sm_per_clk'], 1)} | "
          f"{(r['clock_hz'] or 0) / 1e6:.0f} |")


# ---------------------------------------------------------------------------
# The simulator check (CPU).
# ---------------------------------------------------------------------------

def sim_check(pattern="", kind="suite"):
  import pallas_sim as ps
  ok = True
  for c in timing_suite.cases(kind):
    if pattern not in c.name:
      continue
    t0 = time.time()
    try:
      b = c.make(**timing_suite.sim_params(c))
      sim = ps.simulate(b.fn, *b.args)  # races and uninitialized reads raise
      out = np.asarray(sim.outputs, np.float64)
      ref = np.asarray(b.reference(*b.args), np.float64)
      err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
      if not err <= max(b.tol, 1e-6):
        raise AssertionError(f"relative error {err:.3e}")
      print(f"{c.name:60s} ok  err {err:.1e}  sim {sim.report.kernels[0].time_s * 1e6:8.1f} us"
            f"  ({time.time() - t0:.1f} s)", flush=True)
    except Exception as e:
      ok = False
      print(f"{c.name:60s} FAIL {type(e).__name__}: {str(e)[:300]}", flush=True)
  return ok


# ---------------------------------------------------------------------------

# Seconds a chunk keeps for its timing: none starts with less left.
CHUNK_RESERVE_S = 40


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--deadline", type=float, default=420.0,
                  help="seconds: start no new work after this (results so far are written)")
  ap.add_argument("--filter", default="")
  ap.add_argument("--only-micros", action="store_true")
  ap.add_argument("--only-suite", action="store_true")
  timing_suite.add_kind_args(ap)
  ap.add_argument("--threads", type=int, default=8, help="parallel compile + check")
  ap.add_argument("--chunk", type=int, default=16, help="jobs prepared, then timed, at a time")
  ap.add_argument("--resume", default=None, help="an earlier h200_measured.json")
  ap.add_argument("--ncu", type=int, default=0, help="cross-check this many NCU_CASES")
  ap.add_argument("--ncu-timeout", type=float, default=90.0)
  ap.add_argument("--ncu-child", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--sim-check", action="store_true")
  ap.add_argument("--batch-s", type=float, default=0.025,
                  help="seconds of back-to-back calls per batch")
  ap.add_argument("--clock-ms", type=int, default=100, help="clock sampling period")
  ap.add_argument("--sustain-s", type=float, default=0.0,
                  help="seconds of back-to-back calls before a kernel's timed batches, "
                       "so that they see the clock the power limit settles at")
  ns = ap.parse_args(argv)

  if ns.ncu_child:
    ncu_child(ns.ncu_child.split("|"))
    return 0
  if ns.sim_check:
    return 0 if sim_check(ns.filter, timing_suite.kind_of(ns)) else 1
  if ns.deadline < CHUNK_RESERVE_S + 20:  # (no chunk would start: it measures nothing)
    ap.error(f"--deadline {ns.deadline:g}: a chunk starts only with {CHUNK_RESERVE_S} s "
             f"left, so give it at least {CHUNK_RESERVE_S + 20} s")

  start = time.time()
  left = lambda: ns.deadline - (time.time() - start)
  os.makedirs(ns.out, exist_ok=True)
  path = os.path.join(ns.out, "h200_measured.json")
  env = _env()
  print("env:", json.dumps(env), flush=True)
  BATCH_S[0] = ns.batch_s
  SUSTAIN_S[0] = ns.sustain_s
  clocks = ClockSampler(ns.clock_ms)

  jobs = []
  if not ns.only_suite:
    jobs += micro_jobs(ns.filter)
  if not ns.only_micros:
    jobs += suite_jobs(ns.filter, timing_suite.kind_of(ns))
  ncu = {}

  # Earlier results (--resume FILE: that run's h200_measured.json): rows
  # measured there are kept as they are and not run again.
  if ns.resume and os.path.exists(ns.resume):
    old = json.load(open(ns.resume))
    prev = {r["name"]: r for r in old.get("cases", []) if "median_s" in r}
    prev.update({f"{r['name']} {r['which']}": r for r in old.get("micro_raw", [])
                 if "median_s" in r})
    for j in jobs:
      if j.key in prev:
        j.res, j.ok, j.done = prev[j.key], True, True
        j.res["from_run"] = old.get("env", {}).get("time")
    print(f"resumed {sum(j.done for j in jobs)} rows from {ns.resume}", flush=True)

  # Order: what the earlier run missed in PRIORITY order, then the rest. Kernels
  # that could hang the GPU if the hardware disagreed with the simulator
  # about barriers go last (a hang stalls everything after it; the JSON is
  # rewritten after every chunk).
  def rank(j):
    for i, p in enumerate(PRIORITY):
      if j.key.startswith(p):
        return (j.key.startswith(LAST), i)
    return (j.key.startswith(LAST), len(PRIORITY))
  todo = sorted([j for j in jobs if not j.done], key=rank)

  def report(j):
    r = j.res
    status = "ok" if j.ok else ("SKIPPED (deadline)" if "prepare_s" not in r
                                 else "FAIL " + r.get("error", "")[:300])
    print(f"[prep {time.time() - start:6.1f}s] {j.key}: {status}"
          f" err={r.get('rel_err', float('nan')):.1e} ({r.get('prepare_s', 0):.1f}s)",
          flush=True)

  # Chunks: build, compile and check a chunk in threads (tracing is Python;
  # compiling and running release the GIL), then time its kernels one at a
  # time with nothing else on the GPU.
  t0 = time.time()
  chunk = max(1, ns.chunk)
  regular = [j for j in todo if not j.key.startswith(LAST)]
  chunks = [regular[i:i + chunk] for i in range(0, len(regular), chunk)]
  chunks.append([j for j in todo if j.key.startswith(LAST)])
  with cf.ThreadPoolExecutor(ns.threads) as ex:
    for part in chunks:
      if not part:
        continue
      if left() < CHUNK_RESERVE_S:
        print("deadline: no more chunks", flush=True)
        break
      if part[0].key.startswith(LAST):
        for j in part:
          report(j.prepare())
      else:
        futs = {ex.submit(lambda j=j: j.prepare() if left() > 30 else j): j for j in part}
        for fut in cf.as_completed(futs):
          report(futs[fut])
      for j in part:
        if left() < 10:
          break
        j.measure(clocks)
        r = j.res
        if "median_s" in r:
          print(f"[time {time.time() - start:6.1f}s] {j.key}: {r['median_s'] * 1e6:.1f} us "
                f"spread {r['spread']:.3f} enq {r['enqueue_frac']:.2f} "
                f"k2 {r.get('k2_ratio', float('nan')):.3f} "
                f"chained {r.get('chain_per_kernel_s', float('nan')) * 1e6:.1f} us "
                f"clk {(r.get('clock') or {}).get('sm_mhz')}", flush=True)
        j.release()
      write(path, env, jobs, summarize_micros(jobs), ncu, clocks, False)
  measured = sum('median_s' in j.res for j in jobs)
  print(f"measured {measured}/{len(jobs)} ({time.time() - t0:.0f}s)", flush=True)
  calibrate.clear_cache()
  timing_suite.clear_cache()

  # 3. Nsight Compute cross-check, one process per case.
  for name in NCU_CASES[:ns.ncu]:
    if left() < ns.ncu_timeout + 5:
      print(f"ncu {name}: skipped (deadline)", flush=True)
      continue
    try:
      ncu[name] = run_ncu(name, ns.ncu_timeout)
    except Exception as e:
      ncu[name] = dict(ok=False, error=f"{type(e).__name__}: {e}"[:500])
    print(f"ncu {name}: {json.dumps(ncu[name], default=str)[:600]}", flush=True)

  clocks.stop()
  micros = summarize_micros(jobs)
  write(path, env, jobs, micros, ncu, clocks, True)
  print_tables(jobs, micros)
  print("\nfigures:", json.dumps(headline(micros), indent=1))
  print(f"\nwrote {path} ({time.time() - start:.0f}s)")
  if jobs and not measured:  # (a step that measures nothing fails, loudly)
    print(f"measure_gpu: measured none of the {len(jobs)} jobs", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
