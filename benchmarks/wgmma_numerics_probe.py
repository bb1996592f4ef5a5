"""Probe: how an H100/H200 tensor core sums wgmma products into an f32
accumulator, per operand type (fp8 e4m3/e5m2, f16, bf16, f32 as tf32).

The agreement suite found the hardware's fp8 matmuls differ from an exact f32
accumulation by ~2^-14 relative. This runs wgmma matmuls (K = 32, 64, 128) on
random and structured inputs on the GPU (or, with --sim, in the simulator)
and saves inputs and outputs to $OUT/wgmma_probe[_sim].npz; benchmarks/
wgmma_numerics_fit.py compares them with the simulator's model
(backends/sim/rules/wgmma.py).

    python3 benchmarks/wgmma_numerics_probe.py          # on a Hopper GPU
"""
import os
import sys

import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "agreement"), os.path.join(ROOT, "tests")]
import pallas_sim as ps  # noqa: E402
from families import hand_matmul  # noqa: E402

DTYPES = {"f8e4m3": jnp.float8_e4m3fn, "f8e5m2": jnp.float8_e5m2,
          "f16": jnp.float16, "bf16": jnp.bfloat16, "f32": jnp.float32}


def structured(k, rng):
  """Rows mixing one large product with many small ones of varied scales."""
  a = np.zeros((64, k), np.float32)
  for i in range(64):
    a[i, 0] = 2.0 ** rng.integers(-2, 6)
    a[i, 1:] = rng.uniform(-1, 1, k - 1) * 2.0 ** -(i % 12)
  return a


def run(a, bt, dtype, backend):
  return np.asarray(ps.run(hand_matmul, jnp.asarray(a, dtype), jnp.asarray(bt, dtype),
                           backend=backend, tm=64, tn=64, swizzle=32, slots=1,
                           transpose_a=False, transpose_b=True, transforms=True,
                           out_dtype=jnp.float32), np.float64)


def main():
  rng = np.random.default_rng(0)
  out = {}
  backend = "sim" if "--sim" in sys.argv else "mosaic"
  for name, dtype in DTYPES.items():
    for k in (32, 64, 128):
      for kind in ("random", "structured"):
        for rep in range(3):
          a = (rng.uniform(-2, 2, (64, k)) if kind == "random" else structured(k, rng))
          bt = rng.uniform(-2, 2, (64, k)) if kind == "random" else np.where(
              rng.random((64, k)) < 0.5, 1.0, -1.0) * rng.choice([1, 0.5, 1.5], (64, k))
          a = np.asarray(jnp.asarray(a, dtype), np.float64)
          bt = np.asarray(jnp.asarray(bt, dtype), np.float64)
          key = f"{name}_{kind}_k{k}_{rep}"
          out[key + "_a"], out[key + "_b"] = a, bt
          out[key + "_out"] = run(a, bt, dtype, backend)
          exact = a @ bt.T
          rel = np.abs(out[key + "_out"] - exact).max() / np.abs(exact).max()
          print(f"{key}: max |out - exact| / max|exact| = {rel:.2e}", flush=True)
  path = os.path.join(os.environ.get("OUT", "."),
                      "wgmma_probe" + ("_sim" if backend == "sim" else "") + ".npz")
  np.savez_compressed(path, **out)
  print("saved", path)


if __name__ == "__main__":
  main()
