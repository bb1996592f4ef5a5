"""A tile sweep with ps.estimate, as a kernel author would run it on a laptop:
ten configurations of the quickstart matmul at 8192^3 f16 on the H200 model,
the predicted time, the bound, and how long each estimate took here.

    ./dev python benchmarks/estimate_sweep.py [--size 8192] [--gpu h200]
        [--clock-mhz F]   # the SMs at F MHz (the power limit's clock, if known)"""
import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
import pallas_sim as ps  # noqa: E402
from test_quickstart import matmul_mcs  # noqa: E402

CONFIGS = [(128, 64, 2), (128, 64, 3), (128, 64, 4), (128, 128, 2), (128, 32, 4),
           (256, 64, 2), (256, 64, 3), (64, 64, 2), (64, 128, 3), (128, 128, 3)]


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--size", type=int, default=8192)
  ap.add_argument("--gpu", default="h200")
  ap.add_argument("--clock-mhz", type=float, default=None)
  ns = ap.parse_args(argv)
  n = ns.size
  shape = jax.ShapeDtypeStruct((n, n), jnp.float16)
  print(f"| tile (m x n x k), max_concurrent_steps | predicted (us) | TFLOP/s | bound | "
        f"estimate (s) |")
  print("|---|---:|---:|---|---:|")
  t_all = time.perf_counter()
  for tn, tk, mcs in CONFIGS:
    t0 = time.perf_counter()
    rep = ps.estimate(lambda a, b: matmul_mcs(a, b, tile_n=tn, tile_k=tk,
                                              max_concurrent_steps=mcs),
                      shape, shape, gpu=ns.gpu, clock_mhz=ns.clock_mhz)
    k = rep.kernels[0]
    print(f"| 128x{tn}x{tk}, {mcs} | {k.time_s * 1e6:.0f} | {k.tflops:.0f} | {k.bound} | "
          f"{time.perf_counter() - t0:.2f} |")
  print(f"\n{len(CONFIGS)} configurations of a {n}^3 matmul estimated in "
        f"{time.perf_counter() - t_all:.1f} s")


if __name__ == "__main__":
  main()
