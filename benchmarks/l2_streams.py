"""The model against the H200's L2 streams (lab/calibrate.py l2_half_*: groups
of 12 blocks on every SM loading one 16 KiB tile at once, 1 to 8 in flight,
over 8 MiB (within half the L2) or 48 MiB (past it); l2_lag*_: the same with a
group's readers out of step): a load's round trip, slots x the cycles an
iteration, measured and predicted side by side at 1980 MHz (the clock these
light loops hold), and the mean error.

    ./dev python benchmarks/l2_streams.py [--filter S]
    ./dev python benchmarks/l2_streams.py --predictions FILE   # before measuring

The measured rows are the newest run's of each micro in any micros_* key of
lab/data/h200_measured.json; a micro not measured yet gets its prediction
alone (--predictions writes them all, with the commit, to compare later)."""
import argparse
import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pallas_sim as ps  # noqa: E402
from lab import DATA  # noqa: E402
from lab import calibrate  # noqa: E402

MHZ = 1980.0
PREFIXES = ("l2_half_", "l2_lag")


def streams(pattern=""):
  return [m for m in calibrate.MICROS if m.name.startswith(PREFIXES)
          and "chain" not in m.name and pattern in m.name]


def measured():
  """name -> cycles an iteration, from the last run that has it."""
  with open(os.path.join(DATA, "h200_measured.json")) as f:
    data = json.load(f)
  out = {}
  for key, run in data.items():
    if not (isinstance(run, dict) and isinstance(run.get("micros"), list)):
      continue
    for r in run["micros"]:
      if str(r.get("name", "")).startswith(PREFIXES) and r.get("per_iter_cycles"):
        out[r["name"]] = r["per_iter_cycles"]
  return out


def predicted(micro):
  """The model's cycles an iteration: two estimates, n1 and n2 loads a block,
  of the stream `grouped` (calibrate.tma_stream: the model sees which
  blocks share a tile through the grid's axes, not through b // readers)."""
  times = []
  for n in (micro.n1, micro.n2):
    b = micro.build(n)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in b.args]
    fn = functools.partial(b.fn, grouped=True)
    times.append(ps.estimate(fn, *args, gpu="h200", clock_mhz=MHZ).time_s)
  return (times[1] - times[0]) / (micro.n2 - micro.n1) * MHZ * 1e6


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--filter", default="")
  ap.add_argument("--predictions", default=None, metavar="FILE",
                  help="write the model's cycles an iteration of every stream here")
  ns = ap.parse_args(argv)
  meas = measured()
  preds, errs = {}, []
  print("| stream | in flight | lag | H200 round trip (cycles) | model's | error |")
  print("|---|---:|---:|---:|---:|---:|")
  for m in streams(ns.filter):
    p = m.params
    it = preds[m.name] = predicted(m)
    h = meas.get(m.name)
    slots = p["slots"]
    cell = f"{slots * h:.0f}" if h else "(not measured)"
    err = f"{100 * (it / h - 1):+.0f}%" if h else ""
    if h:
      errs.append(it / h - 1)
    print(f"| {m.name} | {slots} x 16 KiB | {p.get('lag', 0)} | {cell} | {slots * it:.0f} "
          f"| {err} |", flush=True)
  if errs:
    print(f"\n{len(errs)} measured streams: mean abs error "
          f"{100 * sum(map(abs, errs)) / len(errs):.1f}%, largest "
          f"{100 * max(map(abs, errs)):.1f}%")
  if ns.predictions:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    with open(ns.predictions, "w") as fh:
      json.dump({"command": " ".join(sys.argv), "gpu": "h200", "clock_mhz": MHZ,
                 "commit": commit, "unit": "cycles an iteration",
                 "predictions": preds}, fh, indent=1)


if __name__ == "__main__":
  main()
