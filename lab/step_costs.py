"""What one pipeline step costs beyond its work: the H200 beside the model.

Two configurations of one kernel that do the same work in a different
number of steps a block (attention's block_kv: 64 against 128 keys a step),
at the same blocks an SM, take block cycles

    B = W * c + steps * f + O

(W the block's work, c its cost, f what a step costs whatever its size, O
the block's prologue and epilogue), so f = (B2 - B1) / (steps2 - steps1),
whatever c and O are. The H200's block cycles come from a measured row's
time at its measured clock over the launch's waves; the model's from its
estimate at that clock (the same waves). A step's fixed cost that the model
lacks shows as an f short of the H200's: the mechanism to look for is one
a step pays once (a reduction's exchange across lanes, a barrier's round
trip, a wgmma's wait), not one its work scales.

    ./dev python -m lab.step_costs
"""
from __future__ import annotations

import argparse
import json
import math
import os

HERE = os.path.dirname(os.path.abspath(__file__))

# Pairs (kind, fewer steps, more steps): the same kernel and shape, the KV
# loop in 128- and 64-key steps, each at one block an SM.
PAIRS = [
    ("suite", "attention fwd b1 s4096 h32 d128 bq64 bkv128",
     "attention fwd b1 s4096 h32 d128 bq64 bkv64"),
    ("holdout", "attention fwd b2 s2048 h32 d128 bq64 bkv128 mcs=2",
     "attention fwd b2 s2048 h32 d128 bq64 bkv64 mcs=3"),
    ("blind", "attention fwd b1 s8192 h16 d128 bq64 bkv128 mcs=2 (blind)",
     "attention fwd b1 s8192 h16 d128 bq64 bkv64 mcs=2 (blind)"),
    ("blind", "attention fwd b1 s8192 h16 d128 bq64 bkv128 mcs=3 (blind)",
     "attention fwd b1 s8192 h16 d128 bq64 bkv64 mcs=4 (blind)"),
    ("families", "own attention_mgpu fwd b2 s4096 h16 d128 bq64 bkv128 mcs=2",
     "own attention_mgpu fwd b2 s4096 h16 d128 bq64 bkv64 mcs=3"),
]


def kv_steps(case):
  """KV steps a block runs (non-causal attention: the whole sequence)."""
  p = case.params
  bkv = p.get("block_kv") or int(case.name.split(" bkv")[1].split()[0])
  seq = p.get("seq") or int(case.name.split(" s")[1].split()[0])
  return seq // bkv


def measured_rows(data, kind):
  """name -> (seconds, sustained clock MHz) for a kind's measured rows."""
  from lab import timing_suite as ts
  if kind == "suite":
    rows = data["sustained"]["cases"]
    clocks = ts.sustained_clocks(data.get("power_study_suite", {}).get("rows", []))
  else:
    rows = ts.study_rows(data, kind)
    clocks = ts.sustained_clocks(rows)
  return {r["name"]: (ts.measured_seconds(r), clocks.get(r["name"]))
          for r in rows if r.get("median_s")}


def fixed_cost(steps1, cycles1, steps2, cycles2):
  """What a step costs whatever its size: two runs of the same work in
  steps1 and steps2 steps took cycles1 and cycles2 a block."""
  if steps1 == steps2:
    raise ValueError(f"step_costs: both runs take {steps1} steps; no step cost to solve")
  return (cycles2 - cycles1) / (steps2 - steps1)


def block_cycles(seconds, mhz, report):
  """A launch's cycles per block on each slot: its time at the clock over
  its waves (the same for both rows of a pair)."""
  k = report.kernels[0]
  waves = math.ceil(k.num_blocks / (k.num_sms * k.blocks_per_sm))
  return seconds * mhz * 1e6 / waves


def main(argv=None):
  from benchmarks.accuracy import predict
  from lab import timing_suite as ts
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--measured", default=os.path.join(HERE, "data", "h200_measured.json"))
  ns = ap.parse_args(argv)
  data = json.load(open(ns.measured))
  print("| pair (fewer steps / more steps) | steps | blocks an SM | H200 block cycles "
        "| model block cycles | fixed cost a step, H200 | the model's |")
  print("|---|---|---|---|---|---:|---:|")
  for kind, a, b in PAIRS:
    rows = measured_rows(data, kind)
    cases = {c.name: c for c in ts.cases(kind)}
    if a not in rows or b not in rows:
      print(f"| {a} / {b} | (not measured) | | | | | |")
      continue
    out = []
    for name in (a, b):
      seconds, mhz = rows[name]
      rep = predict(cases[name], "h200", mhz)[0]
      out.append((kv_steps(cases[name]), rep.kernels[0].blocks_per_sm,
                  block_cycles(seconds, mhz, rep), block_cycles(rep.time_s, mhz, rep)))
    (s1, p1, h1, m1), (s2, p2, h2, m2) = out
    same = "" if p1 == p2 else " (occupancy differs: not comparable)"
    print(f"| {a} / {b.split(' bq')[1]} | {s1} / {s2} | {p1} / {p2}{same} | "
          f"{h1:.0f} / {h2:.0f} | {m1:.0f} / {m2:.0f} | {fixed_cost(s1, h1, s2, h2):.0f} | "
          f"{fixed_cost(s1, m1, s2, m2):.0f} |")


if __name__ == "__main__":
  main()
