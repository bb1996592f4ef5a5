"""Probe: GMEM stores of a cluster's blocks read by its leader after a
leader-tracked cluster barrier, on an H100/H200.

Each block of a cluster of 4 stores its row of GMEM and arrives on a
leader-tracked cluster barrier; the leader waits and sums the rows
(tests/test_clusters.py::leader_tracked_gather). The simulator orders the
stores before the leader's reads through the barrier. On an H200 one run of
tests/test_gpu.py once read 32 of those values stale (uninitialized output
memory): this counts how often that happens. Open question (see
benchmarks/HISTORY.md): the arrival is made by a few lanes with
mbarrier.arrive's default (CTA-scope) release semantics.

    python3 -m lab.cluster_arrival_probe [runs]     # on a Hopper GPU
"""
import os
import sys

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import pallas_sim as ps  # noqa: E402
from test_clusters import leader_tracked_gather  # noqa: E402


def main():
  runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
  bad, worst = 0, 0
  with ps.backend("mosaic"):
    f = jax.jit(leader_tracked_gather())  # (compiled once: a run is a launch)
    for _ in range(runs):
      out = np.asarray(f())
      n = int(np.count_nonzero(out[4] != 10.0))
      bad += n > 0
      worst = max(worst, n)
  print(f"{runs} runs: {bad} with stale values (at most {worst} in a run)")


if __name__ == "__main__":
  main()
