"""Where a matmul block's time goes (lab/families.py block_study_cases): for
each configuration measured at three K, a line through its time a block
against its K steps, on the H200 and in the model: the intercept is a
block's fixed cost (start, pipeline fill, epilogue, hand-over to the next
block), the slope its cost a step. And for the rows run with their loads
alone (no wgmma), the rate the L2 gave the tiles they share.

    ./dev python -m lab.block_study [--measured lab/data/h200_measured.json]
        [--predictions lab/data/blind_predictions_own_families_blocks.json]

A block's time is the launch's over its waves (every block of these
launches does the same work; one block an SM): ceil(blocks / 132).
Times are microseconds; the cycles beside them are at the clock each row
held (the H200's sustained run's nvidia-smi reading; the model's own
predicted clock)."""
import argparse
import json
import math
import os
import re

import numpy as np

from lab import DATA, families, timing_suite

NUM_SMS = 132


def _blocks_and_steps(case):
  p = case.params
  if case.family.startswith("own ws_matmul"):
    bm, bn = families.ws_block(p["tile_m"], p["tile_n"], p["consumers"], p["split"])
    return (p["m"] // bm) * (p["n"] // bn), p["k"] // p["tile_k"], 2 * (bm + bn) * p["tile_k"]
  return ((p["m"] // p["tile_m"]) * (p["n"] // p["tile_n"]), p["k"] // p["tile_k"],
          (p["tile_m"] + p["tile_n"]) * p["tile_k"])


def _config(case):
  """The row's configuration without its K (the line's key)."""
  return re.sub(r"(\d+)x\d+x(\d+)", r"\1xKx\2", case.name, count=1)


def rows(measured, predictions):
  """(case, blocks, steps, bytes a step, H200 s, H200 MHz, model s, model MHz)
  for every block-study case, None where not measured."""
  got = {r["name"]: r for r in timing_suite.study_rows(measured, "families")}
  out = []
  for c in families.block_study_cases():
    blocks, steps, step_bytes = _blocks_and_steps(c)
    m = got.get(c.name) or {}
    p = predictions.get(c.name) or {}
    out.append((c, blocks, steps, step_bytes, m.get("median_s"),
                (m.get("clock") or {}).get("sm_mhz"), p.get("predicted_s"), p.get("sm_mhz")))
  return out


def line(points):
  """Least squares (intercept, slope) of y on x over (x, y) points."""
  x, y = np.asarray([p[0] for p in points], float), np.asarray([p[1] for p in points], float)
  slope, intercept = np.polyfit(x, y, 1)
  return float(intercept), float(slope)


def _per_block(t, waves):
  """A launch's time (s) as a block's (us), or None where not measured."""
  return t / waves * 1e6 if t else None


def _blocks(v):
  """(steps, a block's us, MHz) points as 'us (cycles)' cells."""
  return " / ".join(f"{b:.1f}" + (f" ({b * m:.0f})" if m else "") if b else "-"
                    for _, b, m in v)


def _fit(v):
  """The line through (steps, a block's us, MHz) points: fixed + a step, in
  us and, where the clocks are known, cycles."""
  pts = [(s, b) for s, b, _ in v if b]
  if len(pts) < 2:
    return "-"
  i, s = line(pts)
  cyc = [(st, b * m) for st, b, m in v if b and m]
  extra = ""
  if len(cyc) >= 2:
    ci, cs = line(cyc)
    extra = f" ({ci:.0f} + {cs:.0f} cycles)"
  return f"{i:.2f} + {s:.3f}{extra}"


def report(measured, predictions):
  rs = rows(measured, predictions)
  lines = {}
  for c, blocks, steps, _, t, mhz, pt, pmhz in rs:
    if "loads only" in c.name:
      continue
    waves = math.ceil(blocks / NUM_SMS)
    lines.setdefault(_config(c), []).append((steps, t, mhz, pt, pmhz, waves))
  print("| configuration | K steps | H200: a block (us), cycles | model: a block (us), cycles |")
  print("|---|---|---:|---:|")
  fits = []
  for cfg, pts in lines.items():
    pts.sort()
    h = [(s, _per_block(t, w), mhz) for s, t, mhz, _, _, w in pts]
    mo = [(s, _per_block(pt, w), pm) for s, _, _, pt, pm, w in pts]
    print(f"| {cfg} | {', '.join(str(s) for s, *_ in pts)} | {_blocks(h)} | {_blocks(mo)} |")
    fits.append((cfg, h, mo))
  print("\nA line through each configuration's blocks (fixed us + us a step; cycles at "
        "the clock each row held):\n")
  print("| configuration | H200: fixed, a step | model: fixed, a step |")
  print("|---|---:|---:|")
  for cfg, h, mo in fits:
    print(f"| {cfg} | {_fit(h)} | {_fit(mo)} |")
  print("\nLoads alone (no wgmma): the TMA bytes over the launch's time, TB/s:\n")
  print("| row | H200 | model |")
  print("|---|---:|---:|")
  for c, blocks, steps, step_bytes, t, _, pt, _ in rs:
    if "loads only" not in c.name:
      continue
    total = blocks * steps * step_bytes
    print(f"| {c.name} | {total / t / 1e12:.2f} |" if t else f"| {c.name} | - |",
          f"{total / pt / 1e12:.2f} |" if pt else "- |")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--measured", default=os.path.join(DATA, "h200_measured.json"))
  ap.add_argument("--predictions",
                  default=os.path.join(DATA, "blind_predictions_own_families_blocks.json"))
  ns = ap.parse_args(argv)
  report(json.load(open(ns.measured)), json.load(open(ns.predictions))["predictions"])


if __name__ == "__main__":
  main()
