"""Cost of race checking: the same kernels simulated with check_races off and
on, alternating, `--repeat` times each; medians and their ratio.

    ./dev python benchmarks/race_overhead.py
"""
import argparse
import os
import statistics
import sys
import time

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
import pallas_sim as ps  # noqa: E402
from quickstart import matmul  # noqa: E402
from sim_speed import make_iota, matmul_scoped_acc  # noqa: E402


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeat", type=int, default=7)
  ns = ap.parse_args(argv)
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((1024, 1024)), jnp.float16)
  cases = [("iota 1M elems (8192 blocks)", make_iota(8192), ()),
           ("quickstart matmul 1024^3", matmul, (a, a)),
           ("matmul 1024^3, ACC from run_scoped", matmul_scoped_acc, (a, a))]
  print("| kernel | races off (s) | races on (s) | overhead |")
  print("|---|---:|---:|---:|")
  for name, fn, args in cases:
    times = {False: [], True: []}
    for check in (False, True):  # warm-up
      ps.run(fn, *args, backend="sim", check_races=check)
    for _ in range(ns.repeat):
      for check in (False, True):
        t0 = time.perf_counter()
        ps.run(fn, *args, backend="sim", check_races=check)
        times[check].append(time.perf_counter() - t0)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"| {name} | {off:.3f} | {on:.3f} | {on / off:.2f}x |", flush=True)


if __name__ == "__main__":
  main()
