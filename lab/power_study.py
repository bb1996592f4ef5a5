"""Clock and power under sustained load, for the timing model's clock:
each kernel runs back to back for --seconds, and the SM clock and
the board's power are read (nvidia-smi, every 20 ms, read-only: the clocks
and power limit are left as found) over the last --window seconds, when
they have settled. Micro-benchmarks (lab/calibrate.py, at their n2
size) load one unit at a time: tensor cores, L2, HBM, ALUs; suite kernels
(lab/timing_suite.py) load several together.

    python3 -m lab.power_study --out $OUT [--seconds 3] [--window 1.5]
        [--whole-suite]   # every kernel of the suite, no micro-benchmarks
        [--diagnostic]    # the quickstart's pipeline taken apart, no micros
        [--holdout]       # the kernels held out of calibration, no micros

Writes $OUT/power_study.json: per kernel the time per call over the window,
the median SM clock and power there (and their range), and the idle board.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from lab import measure_gpu

MICROS = ("alu_fma_1_per_sm", "alu_exp_2_per_sm", "wgmma_f16_m128n128_1per_sm",
          "wgmma_f16_m128n128_2per_sm", "wgmma_f16_m128n64_1per_sm",
          "wgmma_bf16_m128n128_1per_sm", "wgmma_fp8_m128n128_1per_sm",
          "wgmma_tf32_m128n128_1per_sm", "wgmma_f16_m128n256_1per_sm",
          "wgmma_f16_m128n128_1per_sm_normal", "wgmma_f16_m128n128_2per_sm_normal",
          "wgmma_bf16_m128n128_1per_sm_normal", "wgmma_fp8_m128n128_1per_sm_normal",
          "l2_stream_32mib", "l2_reuse_all_sms", "l2_same_tile_2_per_sm",
          "stream_hbm_all_sms", "copy_gmem_smem_gmem_all_sms")
SUITE = ("quickstart 8192 128x128x64 mcs=2", "quickstart 8192 128x128x64 mcs=4",
         "quickstart 8192 128x128x32 mcs=4", "quickstart 8192 128x64x64 mcs=3",
         "quickstart 8192 128x256x64 mcs=2", "quickstart 4096 128x128x64 mcs=4",
         "quickstart 4096 128x64x64 mcs=3", "warp_specialized_matmul 8192",
         "hopper_matmul 8192 f16 128x128x64 mcs=4 wgN minorN w4",
         "attention fwd b1 s4096 h32 d128 bq64 bkv128",
         "attention fwd b1 s4096 h32 d64 bq64 bkv128",
         "add pipeline 64M f32 1024 blocks 32x256 mcs=2")


class Sampler(measure_gpu.ClockSampler):
  """nvidia-smi every `ms`: (host time, SM MHz, instantaneous W, average W),
  where the driver has the instantaneous reading (else power.draw twice)."""

  def __init__(self, ms):
    fields = "clocks.sm,power.draw.instant,power.draw.average"
    probe = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or "Field" in probe.stdout + probe.stderr:
      fields = "clocks.sm,power.draw,power.draw"
    super().__init__(ms, fields)

  def window(self, t0, t1):
    s = [x for x in self.samples if t0 <= x[0] <= t1 and all(v == v for v in x)]  # (whole readings)
    if not s:
      return None
    col = lambda i: [x[i] for x in s]
    return dict(sm_mhz=statistics.median(col(1)), sm_mhz_mean=statistics.fmean(col(1)),
                sm_mhz_min=min(col(1)), sm_mhz_max=max(col(1)),
                power_w=statistics.median(col(2)),
                power_w_min=min(col(2)), power_w_max=max(col(2)),
                power_avg_w=statistics.median(col(3)), samples=len(s))


def sustain(f, args, seconds, window):
  """Calls f back to back for `seconds`; the time per call over the last
  `window` seconds, and that window's (start, end) host times."""
  import jax
  t_start = time.time()
  marks = []
  per_sync = 1
  while True:
    t0 = time.time()
    for _ in range(per_sync):
      out = f(*args)
    jax.block_until_ready(out)
    t1 = time.time()
    marks.append((t1, per_sync))
    if t1 - t0 < 0.02:
      per_sync *= 2
    if t1 - t_start >= seconds:
      break
  w0 = t1 - window
  inside = [(t, n) for t, n in marks if t >= w0]
  first = max((t for t, _ in marks if t < inside[0][0]), default=t_start)
  calls = sum(n for _, n in inside)
  return (t1 - first) / calls, first, t1


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--seconds", type=float, default=3.0)
  ap.add_argument("--window", type=float, default=1.5)
  ap.add_argument("--filter", default="")
  ap.add_argument("--whole-suite", action="store_true",
                  help="every kernel of lab/timing_suite.py, and no micros")
  measure_gpu.timing_suite.add_kind_args(ap)  # (and no micros)
  ns = ap.parse_args(argv)
  sampler = Sampler(20)
  time.sleep(2.5)
  t = time.time()
  rows = [dict(name="idle", kind="idle", clock=sampler.window(t - 1.5, t))]
  kind = measure_gpu.timing_suite.kind_of(ns)
  whole = ns.whole_suite or kind != "suite"
  jobs = [] if whole else [j for j in measure_gpu.micro_jobs()
                           if j.key.endswith(" n2") and j.meta["name"] in MICROS]
  jobs += [j for j in measure_gpu.suite_jobs(kind=kind)
           if whole or j.meta["name"] in SUITE]
  jobs = [j for j in jobs if ns.filter in j.meta["name"]]
  path = os.path.join(ns.out, "power_study.json")
  for j in jobs:
    j.prepare()
    row = dict(name=j.meta["name"], kind=j.meta["kind"], ok=j.ok,
               error=j.res.get("error"))
    if j.ok:
      per, w0, w1 = sustain(j.f1, j.built.args, ns.seconds, ns.window)
      row.update(per_call_s=per, clock=sampler.window(w0, w1))
    rows.append(row)
    c = row.get("clock") or {}
    print(f"{row['name'][:58]:58s} {row.get('per_call_s', float('nan')) * 1e6:10.1f} us "
          f"{c.get('sm_mhz', float('nan')):6.0f} MHz ({c.get('sm_mhz_min', 0):.0f}-"
          f"{c.get('sm_mhz_max', 0):.0f}) {c.get('power_w', float('nan')):6.1f} W "
          f"(avg {c.get('power_avg_w', float('nan')):.1f}) n={c.get('samples', 0)}", flush=True)
    json.dump(dict(command="python3 -m lab.power_study " + " ".join(argv or sys.argv[1:]),
                   fields=sampler.fields, seconds=ns.seconds, window=ns.window, env=measure_gpu._env(),
                   rows=rows), open(path, "w"), indent=1)
    time.sleep(0.5)
  sampler.stop()
  return 0


if __name__ == "__main__":
  sys.exit(main())
