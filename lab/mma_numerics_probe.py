"""Which tensor-core summation model `plgpu.mma` (mma.sync) follows on this
GPU, per operand dtype: runs the real kernel and compares its f32 results
bit for bit with machine/numerics/tensor_core.py's model for several (K slice, align
bits, result bits). Needs a Hopper GPU.

    python3 -m lab.mma_numerics_probe
    python3 -m lab.mma_numerics_probe --golden tests/data/mma_sync_h200.npz

--golden writes the H200's outputs for tests/test_wgmma.py to check the
simulator against bit for bit (random and structured operands: one large
product among small ones of many scales, where the summation's order and
rounding show), with how it was made.
"""
import itertools
import json
import os
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import pallas_sim as ps  # noqa: E402
from pallas_sim.backends.sim.machine.numerics import tensor_core as tc  # noqa: E402
from test_wgmma import mma_sync_kernel, mma_sync_operands  # noqa: E402


def model(a, bt, kslice, align, result):
  acc = np.zeros((a.shape[0], bt.shape[0]), np.float32)
  a64, b64 = a.astype(np.float64), bt.T.astype(np.float64)
  out = acc.copy()
  tc.mma_general(out, np.ascontiguousarray(a64), np.ascontiguousarray(b64),
                 tc.exponents(a64), tc.exponents(b64), kslice, align, result)
  return out


GOLDEN_DTYPES = (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float16, jnp.bfloat16)
GOLDEN_ROWS = 16  # (an output row depends on its row of A alone: the test pads)


def structured_operands(dtype, seed, m=128, k=128, n=8):
  """One product of 2^e (e in 0..5) per row beside small ones of scales down
  to 2^-11, and B of +-1, +-0.5, +-1.5."""
  rng = np.random.default_rng(seed)
  a = rng.uniform(-1, 1, (m, k)) * 2.0 ** -(np.arange(m)[:, None] % 12)
  a[:, 0] = 2.0 ** rng.integers(0, 6, m)
  bt = np.where(rng.random((n, k)) < 0.5, 1.0, -1.0) * rng.choice([1, 0.5, 1.5], (n, k))
  return np.asarray(a, dtype), np.asarray(bt, dtype)


def golden(path):
  from lab.wgmma_numerics_probe import provenance
  keep = {}
  for dtype in GOLDEN_DTYPES:
    name = jnp.dtype(dtype).name
    for kind, seed in (("random", 0), ("random", 1), ("structured", 2)):
      a, bt = (mma_sync_operands(dtype, seed=seed) if kind == "random" else
               structured_operands(dtype, seed))
      real = np.asarray(ps.run(mma_sync_kernel(dtype), a, bt, backend="mosaic"))
      key = f"{name}_{kind}_{seed}"
      keep[key + "_a"] = np.asarray(a[:GOLDEN_ROWS], np.float32)
      keep[key + "_b"] = np.asarray(bt, np.float32)
      keep[key + "_out"] = real[:GOLDEN_ROWS].astype(np.float32)
  meta = json.dumps(provenance(
      "mosaic", "mma_numerics_probe",
      "plgpu.mma (mma.sync) of A (128, 128) and B given (8, 128), f32 accumulator "
      "from zeros (tests/test_wgmma.py mma_sync_kernel); kept: rows 0..15 of A, all "
      "of B, rows 0..15 of the output"))
  np.savez_compressed(path, provenance=meta, **keep)
  print("saved", path, meta)


def main():
  if "--golden" in sys.argv:
    golden(sys.argv[sys.argv.index("--golden") + 1])
    return
  for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float16, jnp.bfloat16):
    rows = []
    for seed in range(3):
      a, bt = mma_sync_operands(dtype, seed=seed)
      real = np.asarray(ps.run(mma_sync_kernel(dtype), a, bt, backend="mosaic"))
      for kslice, align, result in itertools.product((8, 16, 32), (13, 24, 25, 26),
                                                     (13, 22, 23)):
        got = model(a, bt, kslice, align, result)
        rows.append(((kslice, align, result), int((got.view(np.int32)
                                                   != real.view(np.int32)).sum())))
    tot = {}
    for key, bad in rows:
      tot[key] = tot.get(key, 0) + bad
    best = sorted(tot.items(), key=lambda kv: kv[1])[:5]
    print(f"{jnp.dtype(dtype).name}: (K slice, align, result) -> mismatches of "
          f"3x1024: {best}", flush=True)


if __name__ == "__main__":
  main()
