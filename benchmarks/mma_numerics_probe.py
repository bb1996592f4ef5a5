"""Which tensor-core summation model `plgpu.mma` (mma.sync) follows on this
GPU, per operand dtype: runs the real kernel and compares its f32 results
bit for bit with machine/tensor_core.py's model for several (K slice, align
bits, result bits). Needs a Hopper GPU.

    python3 benchmarks/mma_numerics_probe.py
"""
import itertools
import os
import sys

import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import pallas_sim as ps  # noqa: E402
from pallas_sim.backends.sim.machine import tensor_core as tc  # noqa: E402
from test_wgmma import mma_sync_kernel, mma_sync_operands  # noqa: E402


def model(a, bt, kslice, align, result):
  acc = np.zeros((a.shape[0], bt.shape[0]), np.float32)
  a64, b64 = a.astype(np.float64), bt.T.astype(np.float64)
  out = acc.copy()
  tc._mma(out, np.ascontiguousarray(a64), np.ascontiguousarray(b64), tc.exponents(a64),
          tc.exponents(b64), kslice, align, result)
  return out


def main():
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
