"""Compares wgmma results measured on a GPU (lab/wgmma_numerics_probe.py)
with two models of the tensor core's f32 accumulation: an exact product sum
rounded to f32 (what the simulator did before) and the simulator's model
(backends/sim/machine/numerics/tensor_core.py). Prints, per operand type, the share of
output elements that are bit-identical and the largest relative difference.

    python3 -m lab.wgmma_numerics_fit wgmma_probe.npz
"""
import collections
import sys

import numpy as np

from pallas_sim.backends.sim.machine.numerics import tensor_core
from pallas_sim.backends.sim.interpret.rules.wgmma import to_tf32

ITEMSIZE = {"f8e4m3": 1, "f8e5m2": 1, "f16": 2, "bf16": 2, "f32": 4}


def main(path):
  d = np.load(path)
  keys = sorted({k.rsplit("_", 1)[0] for k in d.files if k != "provenance"})
  rows = collections.defaultdict(lambda: [[], [], [], []])
  for key in keys:
    dt = key.split("_")[0]
    a, b, hw = d[key + "_a"], d[key + "_b"], d[key + "_out"]
    if dt == "f32":
      a, b = to_tf32(a).astype(np.float64), to_tf32(b).astype(np.float64)
    exact = np.asarray(a @ b.T, np.float32).astype(np.float64)
    model = np.zeros(hw.shape, np.float32)
    tensor_core.mma_f32(model, a, b.T, ITEMSIZE[dt])
    model = model.astype(np.float64)
    scale = np.abs(hw).max()
    r = rows[dt]
    r[0].append(np.mean(exact == hw))
    r[1].append(np.abs(exact - hw).max() / scale)
    r[2].append(np.mean(model == hw))
    r[3].append(np.abs(model - hw).max() / scale)
  print(f"{path}: {len(keys)} matmuls (64x64, K = 32/64/128, random and "
        "structured inputs)\n")
  print("| operands | f32 sum: bit-equal | max rel diff | model: bit-equal | max rel diff |")
  print("|---|---:|---:|---:|---:|")
  for dt, (e_eq, e_d, m_eq, m_d) in rows.items():
    print(f"| {dt} | {np.mean(e_eq):.4f} | {max(e_d):.1e} | {np.mean(m_eq):.4f} | "
          f"{max(m_d):.1e} |")


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "wgmma_probe.npz")
