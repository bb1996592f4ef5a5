"""The L2 model's HBM traffic against Nsight Compute's.

Each kernel that lab/data/ncu_dram_h200.json measured on the H200
(`ncu_sections.py NAMES --sections SpeedOfLight --metrics dram__bytes_read.sum
dram__bytes_write.sum ...`) is estimated here, and the
bytes the model moves to and from HBM are set beside ncu's:

    ./dev python -m lab.hbm_bytes [--filter S]

`--predict FILE` adds the model's HBM bytes to each case of a predictions file
(benchmarks/accuracy.py --predictions), before the kernels are measured.
"""
import argparse
import json
import os
import sys

from lab import DATA

UNIT = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def measured_bytes(values):
  """ncu's DRAM bytes read + written, from ncu_metrics.json's values."""
  return sum(UNIT[u] * v for k, (u, v) in values.items()
             if k in ("dram__bytes_read.sum", "dram__bytes_write.sum"))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--filter", default="")
  ap.add_argument("--data", default=os.path.join(DATA, "ncu_dram_h200.json"))
  ap.add_argument("--predict", default=None, metavar="FILE")
  a = ap.parse_args(argv)
  import numpy as np
  from lab import timing_suite
  if a.predict:
    saved = json.load(open(a.predict))
    for name, pred in saved["predictions"].items():
      report, _ = timing_suite.predict(timing_suite.by_name(name), saved.get("gpu", "h200"))
      pred["hbm_bytes"] = sum(k.hbm_bytes for k in report.kernels)
      print(f"{name}: {pred['hbm_bytes'] / 1e9:.3f} GB", flush=True)
    saved["command"] += f"; ./dev python -m lab.hbm_bytes --predict {a.predict}"
    with open(a.predict, "w") as fh:
      json.dump(saved, fh, indent=1)
    return 0
  cases = json.load(open(a.data))["cases"]
  print("| kernel | HBM, ncu (GB) | HBM, model (GB) | model / ncu | ncu's L2 hit rate |")
  print("|---|---:|---:|---:|---:|")
  ratios = []
  for name, values in cases.items():
    if a.filter not in name:
      continue
    report, _ = timing_suite.predict(timing_suite.by_name(name), "h200")
    model = sum(k.hbm_bytes for k in report.kernels)
    gpu = measured_bytes(values)
    ratios.append(model / gpu)
    hit = values.get("lts__t_sector_hit_rate.pct", ["%", float("nan")])[1]
    print(f"| {name} | {gpu / 1e9:.3f} | {model / 1e9:.3f} | {model / gpu:.2f} | {hit:.0f}% |",
          flush=True)
  r = np.asarray(ratios)
  print(f"\n{len(r)} kernels: model / ncu median {np.median(r):.2f}, "
        f"within 15% for {int(np.sum(np.abs(r - 1) <= 0.15))}, "
        f"range {r.min():.2f}..{r.max():.2f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
