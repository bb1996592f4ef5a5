"""Simulator speed against JAX's own GPU interpret mode, side by side in one run.

Kernels both can run: the quickstart grid iota scaled to 1M elements (8192
blocks), and the quickstart matmul at 512^3 and 1024^3 with the accumulator
allocated by its own pl.run_scoped (the only way JAX's interpreter runs it).
Each cell is the median wall time of `--repeat` calls after one warm-up call
(warm: JAX's interpreter reuses its compiled program; ours re-simulates);
JAX with race detection runs `--repeat // 3` times (it is slow). Ratios:
JAX's time over pallas-sim's, with race checks off in both and on in both.

Then: the quickstart matmul over 1, 2 and every core's worker processes
(`workers=`, outputs and reports compared with one process's), against
numpy's own f32 matmul (BLAS, every core) of the same shape; and the cost
of one simulated wgmma, TMA copy and barrier wait, from kernels that loop
over one of them (the time of 1010 iterations less that of 10, per 1000).

    ./dev bench                 # prints the tables (also benchmarks/RESULTS.md)
    ./dev bench --only scaling  # one table: speed, scaling, per-op
    ./dev bench --only speed --kernels matmul --repeat 6  # (JAX's iota row takes minutes)
"""
import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.base import jax_internals
from pallas_sim.backends.sim.execute import parallel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from quickstart import matmul  # noqa: E402


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
  # (races counted, not raised: jax 0.12's interpreter raises by default)
  params = jax_internals.interpret_params(detect_races=detect_races)

  def call():
    with plgpu.force_gpu_interpret_mode(params):
      return np.asarray(jax.block_until_ready(fn(*args)))
  return call


def ours(fn, args, check_races):
  return lambda: np.asarray(ps.run(fn, *args, backend="sim",
                                   check_races=check_races))


def speed_table(ns, rng):
  cases = []
  nb = 1024 if ns.quick else 8192
  if "iota" in ns.kernels:
    cases.append((f"iota {nb * 128 // 1024}K elems ({nb} blocks)", make_iota(nb), (), nb))
  for size in ((256, 512) if ns.quick else (512, 1024)) if "matmul" in ns.kernels else ():
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

  print(f"Simulator vs JAX's GPU interpret mode (workers: every core, "
        f"{parallel.default_workers()})\n")
  print("| kernel | blocks | pallas-sim, races off (s) | per block (us) | "
        "JAX interpret, races off (s) | ratio | pallas-sim, races on (s) | "
        "race-check overhead | JAX interpret, races on (s) | ratio | outputs agree |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
  for name, blocks, t, t_on, tj, tjr, same in rows:
    print(f"| {name} | {blocks} | {t:.3f} | {t / blocks * 1e6:.0f} | {tj:.3f} | "
          f"{tj / t:.1f}x | {t_on:.3f} | {t_on / t:.2f}x | {tjr:.3f} | "
          f"{tjr / t_on:.1f}x | {same} |")
  print()


def _simulate(fn, args, workers):
  sim = ps.simulate(fn, *args, workers=workers)
  return [np.asarray(x) for x in jax.tree.leaves(sim.outputs)], sim.report


def scaling_table(ns, rng):
  """The quickstart matmul (tile 128x128x64, races on) over worker counts."""
  cores = parallel.default_workers()
  counts = sorted({1, 2, cores})
  print("Quickstart matmul f16, races on, over worker processes; numpy: f32 "
        "matmul (BLAS, every core) of the same shape\n")
  print("| size | blocks | " + " | ".join(f"{w} worker(s) (s)" for w in counts)
        + " | speed-up at " + str(counts[-1]) + " | numpy matmul (s) | ratio to numpy "
        "| same outputs and reports |")
  print("|---|---:|" + "---:|" * (len(counts) + 3) + "---|")
  for size in ns.sizes:
    a = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
    b = jnp.asarray(rng.standard_normal((size, size)), jnp.float16)
    fn = jax.jit(matmul)  # (traced once: the calls time the simulation)
    times, results = [], []
    for w in counts:
      reps = ns.repeat if size <= 1024 else 1
      t, res = time_calls(lambda: _simulate(fn, (a, b), w), reps)
      times.append(t)
      results.append(res)
    af, bf = np.asarray(a, np.float32), np.asarray(b, np.float32)
    t_np, _ = time_calls(lambda: af @ bf, 5)
    (o1, r1), same = results[0], True
    for o, r in results[1:]:
      same &= all(np.array_equal(x, y) for x, y in zip(o1, o))
      same &= [str(x) for x in r1.races] == [str(x) for x in r.races]
      same &= r1.kernels[0].time_s == r.kernels[0].time_s
    print(f"| {size}^3 | {(size // 128) ** 2} | " + " | ".join(f"{t:.3f}" for t in times)
          + f" | {times[0] / times[-1]:.2f}x | {t_np:.4f} | {times[-1] / t_np:.0f}x | "
          f"{same} |")
  print()


T = 64


def _smem(shape):
  return plgpu.SMEM(shape, jnp.float16, transforms=(
      plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))


def wgmma_loop(n):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((T, T), jnp.float32),
                scratch_types=[_smem((T, T)), _smem((T, T)), plgpu.ACC((T, T), jnp.float32),
                               plgpu.Barrier(num_arrivals=2)])
  def k(a_ref, b_ref, o_ref, a_s, b_s, acc, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    plgpu.barrier_wait(bar)

    @pl.loop(0, n)
    def _(i):
      plgpu.wgmma(acc, a_s, b_s)
      plgpu.wgmma_wait(0)
    o_ref[...] = acc[...]
  return k


def tma_loop(n):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((T, T), jnp.float16),
                scratch_types=[_smem((T, T)), plgpu.Barrier()])
  def k(a_ref, o_ref, a_s, bar):
    @pl.loop(0, n)
    def _(i):
      plgpu.copy_gmem_to_smem(a_ref.at[pl.ds((i % 4) * T, T)], a_s, bar)
      plgpu.barrier_wait(bar)
    o_ref[...] = a_s[...]
  return k


def barrier_loop(n):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.Barrier()])
  def k(o_ref, bar):
    @pl.loop(0, n)
    def _(i):
      plgpu.barrier_arrive(bar)
      plgpu.barrier_wait(bar)
    o_ref[...] = jnp.zeros((128,), jnp.float32)
  return k


def per_op_table(ns, rng):
  a = jnp.asarray(rng.standard_normal((4 * T, T)), jnp.float16)
  cases = [("wgmma 64x64x64 f16 (+ wgmma_wait)", wgmma_loop, (a[:T], a[:T])),
           ("TMA copy 64x64 f16 (+ barrier_wait)", tma_loop, (a,)),
           ("barrier arrive + wait", barrier_loop, ())]
  print("Cost of one simulated operation (one block, races on)\n")
  print("| operation | us per op |")
  print("|---|---:|")
  for name, make, args in cases:
    t = {}
    for n in (10, 1010):
      fn = jax.jit(make(n))
      t[n], _ = time_calls(lambda: np.asarray(ps.run(fn, *args, backend="sim")),
                           max(ns.repeat, 5))
    print(f"| {name} | {(t[1010] - t[10]) / 1000 * 1e6:.1f} |")
  print()


TABLES = {"speed": speed_table, "scaling": scaling_table, "per-op": per_op_table}


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--quick", action="store_true", help="smaller sizes")
  ap.add_argument("--only", nargs="+", choices=sorted(TABLES), default=list(TABLES))
  ap.add_argument("--kernels", nargs="+", choices=["iota", "matmul"],
                  default=["iota", "matmul"], help="rows of the speed table")
  ap.add_argument("--sizes", type=int, nargs="+", default=None,
                  help="matmul sizes of the scaling table (default 1024 2048)")
  ns = ap.parse_args(argv)
  ns.sizes = ns.sizes or ([512] if ns.quick else [1024, 2048])
  rng = np.random.default_rng(0)
  for name in ns.only:
    TABLES[name](ns, rng)


if __name__ == "__main__":
  main()
