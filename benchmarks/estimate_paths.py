"""ps.estimate against the full simulation on kernels whose blocks take
different paths: JAX's persistent ragged dots (control flow on group
sizes, data) and its persistent matmul (on the grid), over group sizes
drawn from several seeds. Each row: the estimate's predicted time and how
long it took, the same launch with every block simulated (ps.simulate
with block_classes off and no tensor-core sums: what ps.estimate did
before it followed these paths), their ratio, and what the estimate
simulated.

    ./dev python benchmarks/estimate_paths.py [--quick] [--seeds 3]"""
import argparse
import functools
import re
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import pallas_sim as ps


def _sizes(m, groups, seed, empty=0):
  """Group sizes summing to m, uneven (seeded); `empty` of them zero."""
  rng = np.random.default_rng(seed)
  cuts = np.sort(rng.choice(np.arange(1, m), groups - 1 - empty, replace=False))
  sizes = np.diff(np.concatenate([[0], cuts, [m]]))
  sizes = np.concatenate([sizes, np.zeros(empty, sizes.dtype)])
  return rng.permutation(sizes).astype(np.int32)


def ragged(m, k, n, groups, seed, bm=128, bn=128, bk=64, mcs=4, gbn=4, empty=0):
  from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu as rd
  gs = jnp.asarray(_sizes(m, groups, seed, empty))
  fn = lambda lhs, rhs: rd.ragged_dot(lhs, rhs, group_sizes=gs, block_m=bm, block_n=bn,
                                      block_k=bk, max_concurrent_steps=mcs,
                                      grid_block_n=gbn)
  return fn, (jax.ShapeDtypeStruct((m, k), jnp.float16),
              jax.ShapeDtypeStruct((groups, k, n), jnp.float16))


def transposed(k, m, n, groups, seed, bm=128, bn=128, bk=64, mcs=4, gbn=4):
  from jax.experimental.pallas.ops.gpu import transposed_ragged_dot_mgpu as trd
  gs = jnp.asarray(_sizes(k, groups, seed))
  fn = lambda lhs, rhs: trd.transposed_ragged_dot(
      lhs, rhs, group_sizes=gs, block_m=bm, block_n=bn, block_k=bk,
      max_concurrent_steps=mcs, grid_block_n=gbn)
  return fn, (jax.ShapeDtypeStruct((k, m), jnp.float16),
              jax.ShapeDtypeStruct((k, n), jnp.float16))


def hopper(m, k, n, seed=0):
  from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm
  del seed
  cfg = hm.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                        epi_tile_n=64, epi_tile_m=64, grid_minor_dim=hm.MatmulDimension.N,
                        grid_tile_width=4, wg_dimension=hm.MatmulDimension.N)
  fn = lambda a, b: hm.matmul(a, b, None, cfg)
  return fn, (jax.ShapeDtypeStruct((m, k), jnp.float16),
              jax.ShapeDtypeStruct((k, n), jnp.float16))


def cases(quick, seeds):
  big = [] if quick else [
      ("ragged_dot 8192x2048 8x2048x4096", functools.partial(ragged, 8192, 2048, 4096, 8)),
      ("ragged_dot 16384x2048 16x2048x8192 bm64",
       functools.partial(ragged, 16384, 2048, 8192, 16, bm=64, gbn=8)),
  ]
  small = [
      ("ragged_dot 4096x1024 8x1024x2048", functools.partial(ragged, 4096, 1024, 2048, 8)),
      ("ragged_dot 4096x1024 8x1024x2048 2 empty",
       functools.partial(ragged, 4096, 1024, 2048, 8, empty=2)),
      ("ragged_dot 2048x512 4x512x1024 bm64 mcs2",
       functools.partial(ragged, 2048, 512, 1024, 4, bm=64, mcs=2, gbn=1)),
      ("transposed_ragged_dot 4096x1024x1024 8", functools.partial(transposed, 4096, 1024,
                                                                   1024, 8)),
  ]
  out = [(f"{name} seed {s}", functools.partial(make, seed=s))
         for name, make in small + big for s in range(seeds)]
  return out + [("hopper_matmul 4096x2048x4096 (grid paths)",
                 functools.partial(hopper, 4096, 2048, 4096))]


def _timed(fn, args, every_block=False):
  """(the kernel's report, wall seconds): ps.estimate, or with
  `every_block` the launch simulated block by block as ps.estimate does
  but for its classes (no tensor-core sums, no checks)."""
  t0 = time.perf_counter()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", ps.EstimateWarning)
    if every_block:
      zeros = [jnp.zeros(a.shape, a.dtype) for a in args]
      rep = ps.simulate(fn, *zeros, gpu="h200", numerics=False, block_classes=False,
                        check_races=False, check_uninitialized=False,
                        check_lowering=False).report
    else:
      rep = ps.estimate(fn, *args, gpu="h200")
  return rep.kernels[-1], time.perf_counter() - t0


def _how(k):
  """What the estimate simulated, in short (its report's `estimate:` line)."""
  loop = re.search(r"persistent loop's (\d+) iterations over \d+ blocks take (\d+) "
                   r"path\(s\): (\d+) iterations in (\d+) blocks", k.classes)
  if loop:
    return (f"loop: {loop[1]} iterations, {loop[2]} paths; {loop[3]} iterations of "
            f"{loop[4]} blocks run")
  classes = re.search(r"(\d+) class\(es\).*?(\d+) of (\d+) blocks", k.classes)
  if classes:
    return f"{classes[1]} classes; {classes[2]} of {classes[3]} blocks run"
  return "every block"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--quick", action="store_true", help="the smaller kernels only")
  ap.add_argument("--seeds", type=int, default=3, help="group sizes drawn per kernel")
  ns = ap.parse_args(argv)
  print("| kernel | estimate (us) | every block (us) | ratio | estimate (s) | "
        "every block (s) | speed-up | simulated |")
  print("|---|---:|---:|---:|---:|---:|---:|---|")
  worst = 0.0
  for name, make in cases(ns.quick, ns.seeds):
    fn, args = make()
    est, t_est = _timed(fn, args)
    full, t_full = _timed(fn, args, every_block=True)
    ratio = est.time_s / full.time_s
    worst = max(worst, abs(ratio - 1))
    what = _how(est)
    print(f"| {name} | {est.time_s * 1e6:.2f} | {full.time_s * 1e6:.2f} | {ratio:.6f} | "
          f"{t_est:.1f} | {t_full:.1f} | {t_full / t_est:.1f}x | {what} |")
  print(f"\nlargest difference from the full simulation: {worst:.1e} (relative)")


if __name__ == "__main__":
  main()
