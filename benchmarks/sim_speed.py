"""Simulator speed against JAX's own GPU interpret mode, side by side in one run.

Kernels both can run: the quickstart grid iota scaled to 1M elements (8192
blocks), and the quickstart matmul at 512^3 and 1024^3 with the accumulator
allocated by its own pl.run_scoped (the only way JAX's interpreter runs it).
Each cell is the median wall time of `--repeat` calls after one warm-up call
(warm: JAX's interpreter reuses its compiled program; ours re-simulates);
JAX with race detection runs `--repeat // 3` times (it is slow). Ratios:
JAX's time over pallas-sim's, with race checks off in both and on in both.

    ./dev bench                 # prints the table (also benchmarks/RESULTS.md)
"""
import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps


def make_iota(nblocks):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((nblocks * 128,), jnp.float32),
                grid=(nblocks,), grid_names=("i",))
  def iota(o_ref):
    i = jax.lax.axis_index("i")
    o_ref[pl.ds(i * 128, 128)] = jnp.arange(128, dtype=jnp.float32) + i * 128
  return iota


def matmul_scoped_acc(a, b, tile_m=128, tile_n=128, tile_k=64):
  """The quickstart matmul, ACC from pl.run_scoped instead of scratch_types."""
  m, k = a.shape
  _, n = b.shape

  @plgpu.kernel(
      out_type=jax.ShapeDtypeStruct((m, n), jnp.float16),
      scratch_types=dict(o_smem=plgpu.SMEM((tile_m, tile_n), jnp.float16)),
      grid=(m // tile_m, n // tile_n), grid_names=("m", "n"))
  def kernel(a_gmem, b_gmem, o_gmem, o_smem):
    pid_m = jax.lax.axis_index("m")
    pid_n = jax.lax.axis_index("n")

    def scoped(acc):
      def body(_, a_smem, b_smem):
        plgpu.wgmma(acc, a_smem, b_smem)
        plgpu.wgmma_wait(1)

      plgpu.emit_pipeline(
          body, grid=(k // tile_k,),
          in_specs=[
              plgpu.BlockSpec((tile_m, tile_k), lambda ki: (pid_m, ki), delay_release=1),
              plgpu.BlockSpec((tile_k, tile_n), lambda ki: (ki, pid_n), delay_release=1),
          ],
          max_concurrent_steps=2)(a_gmem, b_gmem)
      o_smem[...] = acc[...].astype(jnp.float16)

    pl.run_scoped(scoped, plgpu.ACC((tile_m, tile_n), jnp.float32))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(
        o_smem, o_gmem.at[pl.ds(pid_m * tile_m, tile_m), pl.ds(pid_n * tile_n, tile_n)])
    plgpu.wait_smem_to_gmem(0)

  return kernel(a, b)


def time_calls(call, repeat):
  out = call()  # warm-up (tracing, compilation)
  ts = []
  for _ in range(repeat):
    t0 = time.perf_counter()
    out = call()
    ts.append(time.perf_counter() - t0)
  return statistics.median(ts), out


def jax_interpret(fn, args, detect_races):
  params = plgpu.InterpretGPUParams(detect_races=detect_races)

  def call():
    with plgpu.force_gpu_interpret_mode(params):
      return np.asarray(jax.block_until_ready(fn(*args)))
  return call


def ours(fn, args, check_races):
  return lambda: np.asarray(ps.run(fn, *args, backend="sim",
                                   check_races=check_races))


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--quick", action="store_true", help="smaller sizes")
  ns = ap.parse_args(argv)
  rng = np.random.default_rng(0)
  cases = []
  nb = 1024 if ns.quick else 8192
  cases.append((f"iota {nb * 128 // 1024}K elems ({nb} blocks)", make_iota(nb), (), nb))
  for size in ((256, 512) if ns.quick else (512, 1024)):
    a = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
    b = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
    cases.append((f"matmul {size}^3 f16", matmul_scoped_acc, (a, b),
                  (size // 128) ** 2))

  rows = []
  for name, fn, args, blocks in cases:
    t_off, out_ours = time_calls(ours(fn, args, False), ns.repeat)
    t_on, _ = time_calls(ours(fn, args, True), ns.repeat)
    t_jax, out_jax = time_calls(jax_interpret(fn, args, False), ns.repeat)
    t_jax_r, _ = time_calls(jax_interpret(fn, args, True), max(1, ns.repeat // 3))
    same = np.allclose(out_ours.astype(np.float32), out_jax.astype(np.float32),
                       rtol=1e-3, atol=1e-2)
    rows.append((name, blocks, t_off, t_on, t_jax, t_jax_r, same))

  print("| kernel | blocks | pallas-sim, races off (s) | per block (us) | "
        "JAX interpret, races off (s) | ratio | pallas-sim, races on (s) | "
        "race-check overhead | JAX interpret, races on (s) | ratio | outputs agree |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
  for name, blocks, t, t_on, tj, tjr, same in rows:
    print(f"| {name} | {blocks} | {t:.3f} | {t / blocks * 1e6:.0f} | {tj:.3f} | "
          f"{tj / t:.1f}x | {t_on:.3f} | {t_on / t:.2f}x | {tjr:.3f} | "
          f"{tjr / t_on:.1f}x | {same} |")


if __name__ == "__main__":
  main()
