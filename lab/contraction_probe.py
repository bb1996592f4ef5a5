"""Probe: when does the GPU compiler fuse a multiply and an add into one fma?

Runs small kernels on a Hopper GPU and says, per dtype and pattern, whether
the hardware's result equals the fused (one rounding) or the unfused (two
roundings) computation. The simulator's rule is interpret.contractions.

    python3 -m lab.contraction_probe            # on a Hopper GPU
"""
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

PATTERNS = {
    "x*x-y": lambda x, y, z: x * x - y,
    "y-x*x": lambda x, y, z: y - x * x,
    "x*z+y": lambda x, y, z: x * z + y,
    "p=x*x twice: p-y": None,   # p also stored: two uses
    "(x*x+z)-y": lambda x, y, z: (x * x + z) - y,
    "x*x+y*z": lambda x, y, z: x * x + y * z,
}


def kernel(name, dtype):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), dtype))
  def k(x_ref, y_ref, z_ref, o_ref):
    x, y, z = x_ref[...], y_ref[...], z_ref[...]
    if PATTERNS[name] is None:
      p = x * x
      o_ref[0] = p - y
      o_ref[1] = p
    else:
      o_ref[0] = PATTERNS[name](x, y, z)
      o_ref[1] = x
  return k


def r(v, dtype):
  dt = ml_dtypes.bfloat16 if dtype == jnp.bfloat16 else np.dtype(dtype)
  return np.asarray(np.asarray(v, np.float64).astype(dt), np.float64)


def models(name, x, y, z, dtype):
  """(fused, unfused) results, float64."""
  if name in ("x*x-y", "p=x*x twice: p-y"):
    return r(x * x - y, dtype), r(r(x * x, dtype) - y, dtype)
  if name == "y-x*x":
    return r(y - x * x, dtype), r(y - r(x * x, dtype), dtype)
  if name == "x*z+y":
    return r(x * z + y, dtype), r(r(x * z, dtype) + y, dtype)
  if name == "(x*x+z)-y":
    return r(r(x * x + z, dtype) - y, dtype), r(r(r(x * x, dtype) + z, dtype) - y, dtype)
  if name == "x*x+y*z":  # one of the products fused (which?), or none
    return r(x * x + r(y * z, dtype), dtype), r(r(x * x, dtype) + r(y * z, dtype), dtype)


def main():
  rng = np.random.default_rng(0)
  backend = "sim" if "--sim" in sys.argv else "mosaic"
  for dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
    for name in PATTERNS:
      x, y, z = (jnp.asarray(rng.uniform(-2, 2, 128), dtype) for _ in range(3))
      out = np.asarray(ps.run(kernel(name, dtype), x, y, z, backend=backend),
                       np.float64)[0]
      xf, yf, zf = (np.asarray(v, np.float64) for v in (x, y, z))
      fused, unfused = models(name, xf, yf, zf, dtype)
      if name == "x*x+y*z":
        other = r(r(xf * xf, dtype) + yf * zf, dtype)
        print(f"{np.dtype(dtype).name:9s} {name:18s} fuses x*x: "
              f"{np.mean(out == fused):.2f}  fuses y*z: {np.mean(out == other):.2f}  "
              f"none: {np.mean(out == unfused):.2f}")
        continue
      print(f"{np.dtype(dtype).name:9s} {name:18s} equals fused: "
            f"{np.mean(out == fused):.2f}  unfused: {np.mean(out == unfused):.2f}")


if __name__ == "__main__":
  main()
