"""Probe: what a cluster barrier's arrival releases, on an H100/H200.

The lowering makes a cluster barrier's arrival with a few lanes (one per
block it signals) and puts no warpgroup barrier before it. Each block of a
cluster of 4 stores its row of GMEM, arrives on a leader-tracked cluster
barrier, and the leader sums the rows after its wait: without a warpgroup
barrier before the arrival (commit_smem), the stores of lanes that did not
arrive need not be visible to the leader. The simulator reports that race
(machine/observer.py, arrive); this counts how often the H200 shows it
(rarely: tests/test_gpu.py saw it once, 32 stale values).

    python3 benchmarks/cluster_arrival_probe.py [runs]     # on a Hopper GPU
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
import pallas_sim as ps  # noqa: E402
from test_clusters import leader_tracked_gather  # noqa: E402


def main():
  runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
  print(f"| commit_smem before the arrival | runs | runs with stale rows | stale values (most) |")
  print("|---|---:|---:|---:|")
  for sync in (False, True):
    k = leader_tracked_gather(sync=sync)
    bad, worst = 0, 0
    for _ in range(runs):
      out = np.asarray(ps.run(k, backend="mosaic"))
      n = int(np.count_nonzero(out[4] != 10.0))
      bad += n > 0
      worst = max(worst, n)
    print(f"| {'yes' if sync else 'no'} | {runs} | {bad} | {worst} |")


if __name__ == "__main__":
  main()
