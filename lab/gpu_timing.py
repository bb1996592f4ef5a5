"""Measured kernel times on a Hopper GPU beside the simulator's predictions,
in one run (run on the GPU machine: lab/gpu_suite.sh).

Each measured time is the median over 5 batches of `--repeat` back-to-back
jitted calls (dispatch is asynchronous, so launches queue up and host
overhead hides behind GPU time), after warm-up, on random non-zero inputs.
"""
import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tests"))

import pallas_sim as ps  # noqa: E402
from test_quickstart import matmul_mcs  # noqa: E402
from benchmarks.sim_speed import make_iota  # noqa: E402


def measure(fn, args, repeat):
  f = jax.jit(fn)
  jax.block_until_ready(f(*args))
  ts = []
  for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(repeat):
      out = f(*args)
    jax.block_until_ready(out)
    ts.append((time.perf_counter() - t0) / repeat)
  return statistics.median(ts)


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeat", type=int, default=50)
  ap.add_argument("--gpu", default="h200")
  ns = ap.parse_args(argv)
  rng = np.random.default_rng(0)
  cases = [("iota 1M f32 (8192 blocks)", make_iota(8192), ())]
  for size, tn, tk, mcs in [(1024, 128, 64, 2), (2048, 128, 64, 2),
                            (4096, 128, 64, 2), (4096, 256, 64, 3),
                            (4096, 128, 64, 4)]:
    a = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
    b = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
    fn = (lambda tn, tk, mcs: lambda a, b: matmul_mcs(
        a, b, tile_n=tn, tile_k=tk, max_concurrent_steps=mcs))(tn, tk, mcs)
    cases.append((f"matmul {size}^3 f16 tile 128x{tn}x{tk} mcs={mcs}", fn, (a, b)))

  print(f"| kernel | measured (us) | predicted (us) | predicted/measured | "
        f"measured TFLOP/s | sim wall (s) |")
  print("|---|---:|---:|---:|---:|---:|")
  for name, fn, args in cases:
    t_real = measure(fn, args, ns.repeat)
    t0 = time.perf_counter()
    sim = ps.simulate(fn, *args, gpu=ns.gpu)
    wall = time.perf_counter() - t0
    k = sim.report.kernels[0]
    flops = k.wgmma_flops
    print(f"| {name} | {t_real * 1e6:.1f} | {k.time_s * 1e6:.1f} | "
          f"{k.time_s / t_real:.2f} | "
          f"{flops / t_real / 1e12 if flops else 0:.0f} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
  main()
