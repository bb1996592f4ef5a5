"""The model against the H200's HBM streams (lab/calibrate.py hbm_rows_*,
measured into micros_2026_12_05 of lab/data/h200_measured.json): each
stream's call over its whole array, measured (the mean of the runs that have
it) and predicted side by side, and the mean error.

    ./dev python benchmarks/hbm_streams.py [--queue-cycles 0 100 150 ...]

With --queue-cycles, the mean and largest error for each value of
gpus.GPU.hbm_queue_cycles in place of the table."""
import argparse
import collections
import dataclasses
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pallas_sim as ps  # noqa: E402
from pallas_sim import gpus  # noqa: E402
from lab import DATA  # noqa: E402
from lab import calibrate  # noqa: E402


def measured():
  with open(os.path.join(DATA, "h200_measured.json")) as f:
    runs = json.load(f)["micros_2026_12_05"]
  t = collections.defaultdict(list)
  for key in ("micros_first", "micros"):
    for r in runs[key]:
      t[r["name"]].append(r["t2_s"] * 1e6)
  return {k: sum(v) / len(v) for k, v in t.items()}


def predicted(micro, gpu):
  p = micro.params
  fn = calibrate.tma_panel_copy if "copy" in micro.name else calibrate.tma_panel
  x = jax.ShapeDtypeStruct((p["blocks"] * p["tile_rows"], p["cols"]), jnp.dtype(p["dtype"]))
  f = functools.partial(fn, n=micro.n2, blocks=p["blocks"], tile_rows=p["tile_rows"],
                        box_cols=p["box_cols"], slots=p["slots"])
  return ps.estimate(f, x, gpu=gpu, clock_mhz=1980).time_s * 1e6


def errors(gpu, meas, table=False):
  errs = []
  if table:
    print("| stream | H200 (us) | model (us) | error |\n|---|---:|---:|---:|")
  for m in calibrate.MICROS:
    if m.name in meas and m.name.startswith("hbm_rows"):
      t = predicted(m, gpu)
      errs.append(t / meas[m.name] - 1)
      if table:
        print(f"| {m.name} | {meas[m.name]:.1f} | {t:.1f} | {100 * errs[-1]:+.1f}% |",
              flush=True)
  return errs


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--queue-cycles", type=float, nargs="*", default=None)
  ns = ap.parse_args(argv)
  meas = measured()
  h200 = gpus.get("h200")
  for q in ns.queue_cycles if ns.queue_cycles is not None else [None]:
    g = h200 if q is None else dataclasses.replace(h200, hbm_queue_cycles=q)
    e = errors(g, meas, table=q is None)
    print(f"hbm_queue_cycles {g.hbm_queue_cycles:g}: {len(e)} streams, mean abs error "
          f"{100 * sum(map(abs, e)) / len(e):.1f}%, largest {100 * max(map(abs, e)):.1f}%",
          flush=True)


if __name__ == "__main__":
  main()
