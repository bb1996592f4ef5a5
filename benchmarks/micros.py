"""The model against the H200's micro-benchmarks (lab/calibrate.py): each
micro's cycles an iteration (the difference of its two loop lengths, so
the launch cancels) measured and predicted side by side at 1980 MHz (the
clock the light loops hold), and the mean error; for streams, a load's round
trip (slots x an iteration) beside it.

    ./dev python benchmarks/micros.py --filter l2_        # l2_half_*, l2_lag*
    ./dev python benchmarks/micros.py --filter row_ --predictions FILE
    ./dev python benchmarks/micros.py --from-predictions FILE   # blind, scored

The measured rows are the newest run's of each micro in any micros_* key of
lab/data/h200_measured.json; a micro not measured yet gets its prediction
alone (--predictions writes them all, with the commit: committed before the
micros are measured, they are blind; --from-predictions scores such a
file's micros against the measurements instead of estimating them again).
Streams whose blocks share tiles run
`grouped` in the model (calibrate.tma_stream: the model sees who shares a
tile through the grid's axes, not through b // readers)."""
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


def measured():
  """name -> cycles an iteration, from the last run that has it."""
  with open(os.path.join(DATA, "h200_measured.json")) as f:
    data = json.load(f)
  out = {}
  for run in data.values():  # (runs in the order they were added: the newest last)
    lists = [v for k, v in run.items() if k.startswith("micros")] if isinstance(
        run, dict) else []
    for r in (r for rows in lists if isinstance(rows, list) for r in rows):
      if isinstance(r, dict) and r.get("per_iter_cycles"):
        out[r["name"]] = r["per_iter_cycles"]
  return out


def predicted(micro):
  """The model's cycles an iteration: two estimates, n1 and n2 loads a block,
  a stream whose blocks share tiles `grouped`."""
  times = []
  for n in (micro.n1, micro.n2):
    b = micro.build(n)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in b.args]
    grouped = micro.make is calibrate._build_stream and micro.params.get("readers", 1) > 1
    fn = functools.partial(b.fn, grouped=True) if grouped else b.fn
    times.append(ps.estimate(fn, *args, gpu="h200", clock_mhz=MHZ).time_s)
  return (times[1] - times[0]) / (micro.n2 - micro.n1) * MHZ * 1e6


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--filter", default="", help="micros whose name holds this")
  ap.add_argument("--predictions", default=None, metavar="FILE",
                  help="write the model's cycles an iteration of each micro here")
  ap.add_argument("--from-predictions", default=None, metavar="FILE",
                  help="take the model's cycles from FILE (written by --predictions at "
                  "an earlier commit) for the micros it holds, instead of estimating them")
  ns = ap.parse_args(argv)
  meas = measured()
  given = None
  if ns.from_predictions:
    with open(ns.from_predictions) as fh:
      blind = json.load(fh)
    given = blind["predictions"]
    print(f"predictions of {ns.from_predictions} (commit {blind['commit'][:12]})\n")
  preds, errs = {}, []
  print("| micro | H200 (cycles an iteration) | model's | error | round trip: H200 / model |")
  print("|---|---:|---:|---:|---:|")
  for m in calibrate.MICROS:
    if ns.filter not in m.name or (given is not None and m.name not in given):
      continue
    it = preds[m.name] = given[m.name] if given is not None else predicted(m)
    h = meas.get(m.name)
    if h:
      errs.append(it / h - 1)
    slots = m.params.get("slots") if m.make is calibrate._build_stream else None
    trip = (f"{slots * h:.0f} / {slots * it:.0f}" if h else f"- / {slots * it:.0f}") \
        if slots else ""
    print(f"| {m.name} | {f'{h:.1f}' if h else '(not measured)'} | {it:.1f} | "
          f"{f'{100 * (it / h - 1):+.0f}%' if h else ''} | {trip} |", flush=True)
  if errs:
    print(f"\n{len(errs)} measured: mean abs error {100 * sum(map(abs, errs)) / len(errs):.1f}%, "
          f"largest {100 * max(map(abs, errs)):.1f}%")
  if ns.predictions:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    with open(ns.predictions, "w") as fh:
      json.dump({"command": " ".join(sys.argv), "gpu": "h200", "clock_mhz": MHZ,
                 "commit": commit, "unit": "cycles an iteration",
                 "predictions": preds}, fh, indent=1)


if __name__ == "__main__":
  main()
