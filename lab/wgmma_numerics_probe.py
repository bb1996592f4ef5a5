"""Probe: how an H100/H200 tensor core sums wgmma products into an f32
accumulator, per operand type (fp8 e4m3/e5m2, f16, bf16, f32 as tf32).

The agreement suite found the hardware's fp8 matmuls differ from an exact f32
accumulation by ~2^-14 relative. This runs wgmma matmuls (K = 32, 64, 128) on
random and structured inputs on the GPU (or, with --sim, in the simulator)
and saves inputs and outputs to $OUT/wgmma_probe[_sim].npz;
lab/wgmma_numerics_fit.py compares them with the simulator's model
(backends/sim/interpret/rules/wgmma.py).

    python3 -m lab.wgmma_numerics_probe          # on a Hopper GPU
    python3 -m lab.wgmma_numerics_probe --golden tests/data/wgmma_h200.npz

--golden also writes the slice of the outputs that tests/test_wgmma.py checks
the tensor-core models against, with how it was made (GPU, driver, jax,
command, commit: $PALLAS_SIM_COMMIT where the checkout has no .git).
"""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests", "agreement"), os.path.join(ROOT, "tests")]
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


# The matmuls (and the rows of A and B) the golden file keeps for the tests.
GOLDEN = [("random", 64, 0), ("random", 128, 1), ("structured", 128, 0)]
GOLDEN_ROWS_A, GOLDEN_ROWS_B = 8, 16


def provenance(backend, script="wgmma_numerics_probe", what=None):
  """How a golden file was made (GPU, driver, jax, command, commit, date)."""
  def cmd(*c):
    try:
      return subprocess.run(c, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
      return ""
  import jax
  import jaxlib
  commit = os.environ.get("PALLAS_SIM_COMMIT") or cmd("git", "-C", ROOT, "rev-parse", "HEAD")
  return dict(
      backend=backend,
      gpu=cmd("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"),
      jax=jax.__version__, jaxlib=jaxlib.__version__,
      devices=[str(d) for d in jax.devices()],
      command=f"python3 -m lab.{script} " + " ".join(sys.argv[1:]),
      commit=commit, date=cmd("date", "-u", "+%Y-%m-%dT%H:%M:%SZ"),
      what=what or ("wgmma (tm=64, tn=64, swizzle=32, B stored (N, K), f32 accumulator) "
                    "of a (64, K) and a (64, K) operand; kept: rows 0..7 of A, rows "
                    "0..15 of B and the (8, 16) corner of the output"))


def main():
  rng = np.random.default_rng(0)
  out = {}
  backend = "sim" if "--sim" in sys.argv else "mosaic"
  golden = sys.argv[sys.argv.index("--golden") + 1] if "--golden" in sys.argv else None
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
  meta = json.dumps(provenance(backend))
  np.savez_compressed(path, provenance=meta, **out)
  print("saved", path)
  if golden:
    keep = {}
    for name in DTYPES:
      for kind, k, rep in GOLDEN:
        key = f"{name}_{kind}_k{k}_{rep}"
        keep[key + "_a"] = out[key + "_a"][:GOLDEN_ROWS_A].astype(np.float32)
        keep[key + "_b"] = out[key + "_b"][:GOLDEN_ROWS_B].astype(np.float32)
        keep[key + "_out"] = out[key + "_out"][:GOLDEN_ROWS_A, :GOLDEN_ROWS_B].astype(np.float32)
    np.savez_compressed(golden, provenance=meta, **keep)
    print("saved", golden, meta)


if __name__ == "__main__":
  main()
