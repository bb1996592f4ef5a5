"""How `plgpu.atomic_max`/`atomic_min` order int32 values on this GPU: for
SMEM and GMEM destinations, values from a plain load, from plgpu.load and
computed. Prints, per case, whether the result is the signed or the unsigned
max/min. Needs a Hopper GPU.

    python3 -m lab.atomic_probe
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

M, N = 128, 64


def kernel(op, dest, source):
  fn = getattr(plgpu, f"atomic_{op}")
  scratch = [plgpu.SMEM((M, N), jnp.int32)] if dest == "smem" else []

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((M, N), jnp.int32), scratch_types=scratch)
  def k(x_ref, init_ref, o_ref, *smem):
    dst = smem[0] if dest == "smem" else o_ref
    dst[...] = init_ref[...]
    if source == "plain":
      val = x_ref[...]
    elif source == "plgpu.load":
      val = plgpu.load(x_ref, layout=plgpu.Layout.WGMMA, optimized=False)
    else:
      val = x_ref[...] * 1 + 0
    fn(dst, val)
    if dest == "smem":
      o_ref[...] = dst[...]
  return k


def main():
  rng = np.random.default_rng(0)
  x = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
  init = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
  for op in ("max", "min"):
    for dest in ("smem", "gmem"):
      for source in ("plain", "plgpu.load", "computed"):
        try:
          real = np.asarray(ps.run(kernel(op, dest, source), x, init, backend="mosaic"))
        except Exception as e:  # noqa: BLE001
          print(f"{op} {dest} {source}: {type(e).__name__}: {str(e)[:100]}")
          continue
        f = np.maximum if op == "max" else np.minimum
        signed = f(x, init)
        unsigned = f(x.view(np.uint32), init.view(np.uint32)).view(np.int32)
        kind = ("signed" if np.array_equal(real, signed) else
                "unsigned" if np.array_equal(real, unsigned) else "neither")
        print(f"{op} {dest} {source}: {kind}", flush=True)


if __name__ == "__main__":
  main()
