"""The three kernels of the Mosaic GPU quickstart, verbatim, run on a chosen
backend with pallas-sim.

    python examples/quickstart.py                 # simulator, prints a report
    python examples/quickstart.py --backend mosaic  # the real lowering (H100/H200)
    python examples/quickstart.py --trace trace.json
"""
import argparse
import sys

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

# --- from the quickstart, unchanged ------------------------------------------


@plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
def fill_42(o_ref):
  o_ref[...] = jnp.full_like(o_ref, 42.0)


@plgpu.kernel(
    out_type=jax.ShapeDtypeStruct((1024,), jnp.float32),
    grid=(8,),
    grid_names=('i',),
)
def iota(o_ref):
  i = jax.lax.axis_index('i')
  o_ref[pl.ds(i * 128, 128)] = jnp.arange(128, dtype=jnp.float32) + i * 128


def matmul(a, b, tile_m=128, tile_n=128, tile_k=64, out_dtype=jnp.float16):
  m, k = a.shape
  _, n = b.shape

  @plgpu.kernel(
      out_type=jax.ShapeDtypeStruct((m, n), out_dtype),
      scratch_types=dict(
          o_smem=plgpu.SMEM((tile_m, tile_n), out_dtype),
          acc=plgpu.ACC((tile_m, tile_n), jnp.float32),
      ),
      grid=(m // tile_m, n // tile_n),
      grid_names=('m', 'n'),
  )
  def kernel(a_gmem, b_gmem, o_gmem, o_smem, acc):
    pid_m = jax.lax.axis_index('m')
    pid_n = jax.lax.axis_index('n')

    def body(_, a_smem, b_smem):
      plgpu.wgmma(acc, a_smem, b_smem)
      plgpu.wgmma_wait(1)  # Keep one wgmma in flight.

    plgpu.emit_pipeline(
        body,
        grid=(k // tile_k,),
        in_specs=[
            plgpu.BlockSpec(
                (tile_m, tile_k), lambda ki: (pid_m, ki), delay_release=1
            ),
            plgpu.BlockSpec(
                (tile_k, tile_n), lambda ki: (ki, pid_n), delay_release=1
            ),
        ],
        max_concurrent_steps=2,
    )(a_gmem, b_gmem)

    # Drain: move the accumulated result to GMEM via SMEM.
    o_smem[...] = acc[...].astype(out_dtype)
    plgpu.commit_smem()  # Make the SMEM write visible to the TMA engine.
    plgpu.copy_smem_to_gmem(
        o_smem,
        o_gmem.at[pl.ds(pid_m * tile_m, tile_m),
                  pl.ds(pid_n * tile_n, tile_n)],
    )
    plgpu.wait_smem_to_gmem(0)  # Wait for all copies to finish.

  return kernel(a, b)

# --- end of the quickstart ---------------------------------------------------


def check(name, got, want, rtol):
  got = np.asarray(got, np.float32)
  err = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
  ok = np.all(np.isfinite(got)) and err <= rtol
  print(f"  {name:<22} {'ok' if ok else 'WRONG'}   relative error {err:.2e}")
  return ok


def run_all(backend, gpu="h100", trace=None, size=512):
  import pallas_sim as ps
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
  want_mm = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  print(f"pallas-sim quickstart on backend={backend!r}")
  ok = True
  with ps.backend(backend, gpu=gpu) as report:
    ok &= check("fill_42", fill_42(), np.full(128, 42.0, np.float32), 0)
    ok &= check("iota", iota(), np.arange(1024, dtype=np.float32), 0)
    ok &= check(f"matmul {size}^3 f16", matmul(a, b), want_mm, 1e-3)
  if report is not None:
    print()
    print(report.summary())
    if trace:
      report.save_trace(trace)
      print(f"Chrome trace written to {trace}")
  return ok


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--backend", default="sim", choices=["sim", "mosaic", "auto"])
  ap.add_argument("--gpu", default="h100", choices=["h100", "h200"])
  ap.add_argument("--size", type=int, default=512, help="matmul size (multiple of 128)")
  ap.add_argument("--trace", help="write a Chrome trace of the simulated kernels")
  ns = ap.parse_args(argv)
  return 0 if run_all(ns.backend, ns.gpu, ns.trace, ns.size) else 1


if __name__ == "__main__":
  sys.exit(main())
