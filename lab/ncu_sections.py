"""Nsight Compute's view of suite kernels (to see why a kernel is slower
than the timing model says). On the GPU machine:

    python3 -m lab.ncu_sections --out $OUT "quickstart one tile 4096 128x128x32 mcs=4" ...
        [--sections SpeedOfLight WarpStateStats SchedulerStats MemoryWorkloadAnalysis_Tables]

Each named case (lab/timing_suite.py, any kind) runs in its own
process under `ncu --clock-control none`: its kernel's second launch is
profiled (the first compiles and warms), and the sections' text report is
written to $OUT/ncu_<n>.txt (n: the case's position on the command line).
A name "stream MIB PER_SM SLOTS ROWS COLS SWIZZLE" is calibrate.tma_stream as
pipeline_trace.py --stream-case runs it (every SM streaming shared tiles).
Metrics such as breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed
say which of the L2's units binds.
"""
import argparse
import json
import os
import re
import subprocess
import sys

from lab import ROOT

SECTIONS = ("SpeedOfLight", "WarpStateStats", "SchedulerStats",
            "MemoryWorkloadAnalysis_Tables", "InstructionStats")


def child(name):
  import jax
  if name.startswith("stream "):
    from lab import calibrate
    b = calibrate.stream_case(*map(int, name.split()[1:]))
  else:
    from lab import timing_suite
    b = timing_suite.by_name(name).build()
  f = jax.jit(b.fn)
  for _ in range(2):
    jax.block_until_ready(f(*b.args))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("names", nargs="*")
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--sections", nargs="+", default=list(SECTIONS))
  ap.add_argument("--metrics", nargs="*", default=[],
                  help="metrics to collect besides the sections (e.g. dram__bytes_read.sum); "
                  "each case's values go to OUT/ncu_metrics.json")
  ap.add_argument("--timeout", type=float, default=120.0)
  ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
  ns = ap.parse_args(argv)
  if ns.child:
    child(ns.child)
    return 0
  from lab import measure_gpu
  os.makedirs(ns.out, exist_ok=True)
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  table = {}
  for i, name in enumerate(ns.names):
    cmd = [measure_gpu._ncu_path(), "--clock-control", "none", "--cache-control", "none",
           "--launch-skip", "1", "--launch-count", "1"]
    for s in ns.sections:
      cmd += ["--section", s]
    if ns.metrics:
      cmd += ["--metrics", ",".join(ns.metrics)]
    cmd += [sys.executable, "-m", "lab.ncu_sections", "--child", name]
    try:
      p = subprocess.run(cmd, capture_output=True, text=True, timeout=ns.timeout, env=env,
                         cwd=ROOT)
      text = p.stdout + ("\n[stderr]\n" + p.stderr[-4000:] if p.returncode else "")
    except subprocess.TimeoutExpired:
      text = f"timed out after {ns.timeout} s"
    with open(os.path.join(ns.out, f"ncu_{i}.txt"), "w") as f:
      f.write(f"# {name}\n# {' '.join(cmd)}\n{text}")
    values = read_metrics(text, ns.metrics + ["Duration", "SM Frequency", "L2 Hit Rate",
                                              "DRAM Throughput"])
    table[name] = values
    print(f"{name}: {len(text)} characters; {values}", flush=True)
    if ns.metrics:  # (after each case: a run cut short keeps what it measured)
      with open(os.path.join(ns.out, "ncu_metrics.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "cases": table}, f, indent=1)
  return 0


def read_metrics(text, names):
  """name -> (unit, value) of each metric line of ncu's report (the first)."""
  out = {}
  for n in names:
    m = re.search(rf"^\s*{re.escape(n)}\s+(\S+)\s+([\d,.]+)\s*$", text, re.M)
    if m:
      out[n] = [m.group(1), float(m.group(2).replace(",", ""))]
  return out


if __name__ == "__main__":
  sys.exit(main())
