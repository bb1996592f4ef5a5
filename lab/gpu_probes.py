"""Questions about Hopper behaviour the simulator's model depends on, asked
of the real GPU (run on the GPU machine: lab/gpu_suite.sh).

1. Does a kernel that ends with TMA stores it never awaited still write them?
2. How wrong is the quickstart matmul with delay_release=0 on hardware?
"""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples"))
from test_quickstart import matmul_mcs  # noqa: E402


def unawaited_store(x):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0],),
                grid_names=("i",), scratch_types=[plgpu.SMEM(x.shape[1:], x.dtype)])
  def k(x_ref, o_ref, smem):
    i = jax.lax.axis_index("i")
    smem[...] = x_ref[i] * 2
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[i])
    # no wait_smem_to_gmem: the kernel ends with the store in flight
  return k(x)


def main():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((1024, 64, 128)), jnp.float32)
  bad = 0
  for _ in range(20):
    out = np.asarray(jax.jit(unawaited_store)(x))
    bad += int(not np.array_equal(out, 2 * np.asarray(x)))
  print(f"probe 1: unawaited TMA stores at kernel end: {bad}/20 runs wrong")

  for tn in (128, 256):
    errs = []
    for seed in range(5):
      r = np.random.default_rng(seed)
      a = jnp.asarray(r.standard_normal((1024, 1024)), jnp.float16)
      b = jnp.asarray(r.standard_normal((1024, 1024)), jnp.float16)
      want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
      got = np.asarray(jax.jit(lambda a, b: matmul_mcs(
          a, b, tile_n=tn, delay_release=0))(a, b), np.float32)
      errs.append(np.linalg.norm(got - want) / np.linalg.norm(want))
    print(f"probe 2: delay_release=0 tile_n={tn}: relative errors "
          + " ".join(f"{e:.2e}" for e in errs))


if __name__ == "__main__":
  main()
