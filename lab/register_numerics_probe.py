"""Probe: register arithmetic on an H100/H200 where the simulator's model is
not yet pinned by the agreement suite, each case run on the GPU and in the
simulator, with candidate models of what the hardware does:

1. lax.reduce_sum called directly on f16/bf16 arrays (jnp.sum upcasts to f32
   first, which the agreement suite covers): is the sum accumulated in f32 and
   rounded once (the simulator), or in the half type?
2. f16 (x*x + iota) - y, the two agreement examples that were not
   bit-identical: which of the fused / unfused orders matches?
3. signed zeros through max/min/neg/add.

    python3 -m lab.register_numerics_probe     # on a Hopper GPU
"""
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.experimental import pallas as pl  # noqa: F401
from jax.experimental.pallas import mosaic_gpu as plgpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "agreement"))
import pallas_sim as ps  # noqa: E402
import tolerance as tol  # noqa: E402


def both(fn, *args):
  sim = np.asarray(ps.run(fn, *args, backend="sim", on_race="report"))
  real = np.asarray(ps.run(fn, *args, backend="mosaic"))
  return sim, real


def share_equal(a, b):
  return float(np.mean(tol.bits(a) == tol.bits(b)))


def direct_half_sums():
  rows = []
  for dt in (jnp.float16, jnp.bfloat16):
    for axis in (0, 1):
      @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,) if axis == 0 else (64,), dt),
                    scratch_types=[plgpu.SMEM((64, 256), dt), plgpu.Barrier()])
      def k(x_ref, o_ref, x_s, bar):
        plgpu.copy_gmem_to_smem(x_ref, x_s, bar)
        plgpu.barrier_wait(bar)
        x = plgpu.load(x_s, layout=plgpu.Layout.WGMMA)
        o_ref[...] = lax.reduce_sum(x, axes=(axis,))
      x = np.random.default_rng(axis).uniform(-2, 2, (64, 256)).astype(dt)
      sim, real = both(k, jnp.asarray(x))
      f32_once = np.sum(x.astype(np.float32), axis=axis).astype(dt)
      seq = x.take(0, axis=axis).copy()
      for i in range(1, x.shape[axis]):  # in order, rounding each step
        seq = (seq.astype(np.float32) + x.take(i, axis=axis).astype(np.float32)).astype(dt)
      rows.append((f"lax.reduce_sum {np.dtype(dt).name} axis={axis}",
                   share_equal(sim, real), share_equal(f32_once, real),
                   share_equal(seq, real),
                   float(np.max(np.abs(real.astype(np.float64) - f32_once.astype(np.float64))))))
  print("| case | sim = GPU | f32 then round once = GPU | in order, in the half type = GPU "
        "| max |GPU - f32 once| |")
  print("|---|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.3f} | {r[4]:.3g} |")


def fma_with_iota():
  for dt in (jnp.float16, jnp.bfloat16, jnp.float32):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 256), dt))
    def k(x_ref, y_ref, o_ref):
      x = x_ref[...]
      u = x * x + lax.broadcasted_iota(jnp.int32, x.shape, 0).astype(dt)
      o_ref[...] = u - y_ref[...]
    r = np.random.default_rng(1)
    x = r.uniform(-2, 2, (64, 256)).astype(dt)
    y = r.uniform(-2, 2, (64, 256)).astype(dt)
    sim, real = both(k, jnp.asarray(x), jnp.asarray(y))
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    io = np.indices(x.shape)[0].astype(np.float64)
    cands = {
        "fma(x,x,i) - y": tol.round_to(tol.round_to(tol.fma_round(xf, xf, io, dt) - yf, dt), dt),
        "(rnd(x*x) + i) - y": tol.round_to(tol.round_to(tol.round_to(xf * xf, dt) + io, dt) - yf, dt),
        "fma(x,x, rnd(i - y))": tol.fma_round(xf, xf, tol.round_to(io - yf, dt), dt),
        "rnd(x*x + i - y) (once)": tol.round_to(xf * xf + io - yf, dt),
        "f32 throughout, rounded once": tol.round_to(
            tol.round_to(tol.fma_round(xf, xf, io, np.float32) - yf, np.float32), dt),
    }
    print(f"\n(x*x + iota) - y, {np.dtype(dt).name}: sim = GPU {share_equal(sim, real):.3f}")
    for name, c in cands.items():
      print(f"  {name:32s} = GPU {share_equal(np.asarray(c, dt), real):.3f}")


def fma_with_iota_f32_where():
  """Where the f32 case differs from fma(x,x,i) - y: rows, and candidates
  evaluated on the differing elements only."""
  dt = jnp.float32

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 256), dt))
  def k(x_ref, y_ref, o_ref):
    x = x_ref[...]
    u = x * x + lax.broadcasted_iota(jnp.int32, x.shape, 0).astype(dt)
    o_ref[...] = u - y_ref[...]
  for seed in (1, 2):
    r = np.random.default_rng(seed)
    x = r.uniform(-2, 2, (64, 256)).astype(dt)
    y = r.uniform(-2, 2, (64, 256)).astype(dt)
    sim, real = both(k, jnp.asarray(x), jnp.asarray(y))
    bad = tol.bits(sim) != tol.bits(real)
    rows, cols = np.nonzero(bad)
    print(f"\nf32 (x*x + iota) - y, seed {seed}: {int(bad.sum())} differ; rows "
          f"{sorted(set(rows.tolist()))[:20]}, cols (first) {sorted(set(cols.tolist()))[:12]}")
    xf, yf = x.astype(np.float64), y.astype(np.float64)
    io = np.indices(x.shape)[0].astype(np.float64)
    F = np.float32
    cands = {
        "fma(x,x,-y) + i": tol.round_to(tol.fma_round(xf, xf, -yf, F) + io, F),
        "rnd(x*x) + (i - y) ": tol.round_to(tol.round_to(xf * xf, F) + tol.round_to(io - yf, F), F),
        "fma(x,x, i - y) (i - y rounded)": tol.fma_round(xf, xf, tol.round_to(io - yf, F), F),
        "(rnd(x*x) + i) - y": tol.round_to(tol.round_to(tol.round_to(xf * xf, F) + io, F) - yf, F),
        "x*x + i - y once": tol.round_to(xf * xf + io - yf, F),
    }
    for name, c in cands.items():
      c = np.asarray(c, F)
      print(f"  {name:34s} = GPU on those: {share_equal(c[bad], real[bad]) if bad.any() else 1:.3f}; "
            f"everywhere {share_equal(c, real):.3f}")
    if bad.any():
      i = tuple(int(v) for v in np.argwhere(bad)[0])
      print(f"  e.g. {i}: x={x[i]!r} y={y[i]!r} gpu={real[i]!r} sim={sim[i]!r}")


def half_sum_of_a_large_and_ones():
  """2048 then ones: in f16 every +1 to 2048 rounds away; in f32 they add."""
  for dt in (jnp.float16, jnp.bfloat16):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64,), dt),
                  scratch_types=[plgpu.SMEM((64, 256), dt), plgpu.Barrier()])
    def k(x_ref, o_ref, x_s, bar):
      plgpu.copy_gmem_to_smem(x_ref, x_s, bar)
      plgpu.barrier_wait(bar)
      o_ref[...] = lax.reduce_sum(plgpu.load(x_s, layout=plgpu.Layout.WGMMA), axes=(1,))
    big = 2048.0 if dt == jnp.float16 else 256.0
    x = np.ones((64, 256), dt)
    x[:, 0] = big
    sim, real = both(k, jnp.asarray(x))
    print(f"\nlax.reduce_sum of [{big}, 1 x 255] in {np.dtype(dt).name}: GPU {sorted(set(real.astype(float).tolist()))}, "
          f"sim {sorted(set(sim.astype(float).tolist()))}, f32 then round "
          f"{float(np.asarray(big + 255.0, dt))}")


def known_zero_adds():
  """x*x + z + y where z is zero in a way the compiler may know: does the
  add fold away, so that x*x + y fuses into one fma?"""
  for dt in (jnp.float32, jnp.float16, jnp.bfloat16):
    zeros = {
        "iota along an axis of size 1": lambda x: lax.broadcasted_iota(
            jnp.int32, x.shape, 0).astype(dt),
        "jnp.zeros_like": jnp.zeros_like,
        "literal 0.0": lambda x: 0.0,
        "x * 0 (not known)": lambda x: x * jnp.asarray(0, dt),
    }
    for name, zero in zeros.items():
      @plgpu.kernel(out_type=jax.ShapeDtypeStruct((1, 256), dt))
      def k(x_ref, y_ref, o_ref):
        x = x_ref[...]
        o_ref[...] = (x * x + zero(x)) + y_ref[...]
      r = np.random.default_rng(3)
      x = r.uniform(-2, 2, (1, 256)).astype(dt)
      y = r.uniform(-2, 2, (1, 256)).astype(dt)
      sim, real = both(k, jnp.asarray(x), jnp.asarray(y))
      xf, yf = x.astype(np.float64), y.astype(np.float64)
      fused = np.asarray(tol.fma_round(xf, xf, yf, dt), dt)
      unfused = np.asarray(tol.round_to(tol.round_to(xf * xf, dt) + yf, dt), dt)
      print(f"{np.dtype(dt).name:9s} {name:30s} GPU = fused {share_equal(fused, real):.3f}, "
            f"= unfused {share_equal(unfused, real):.3f}; sim = GPU {share_equal(sim, real):.3f}")


def signed_zeros():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((6, 128), jnp.float32))
  def k(x_ref, y_ref, o_ref):
    x, y = x_ref[...], y_ref[...]
    o_ref[0] = jnp.maximum(x, y)
    o_ref[1] = jnp.minimum(x, y)
    o_ref[2] = jnp.maximum(y, x)
    o_ref[3] = jnp.minimum(y, x)
    o_ref[4] = x + y
    o_ref[5] = -y
  x = np.full(128, -0.0, np.float32)
  y = np.zeros(128, np.float32)
  sim, real = both(k, jnp.asarray(x), jnp.asarray(y))
  names = ["max(-0, +0)", "min(-0, +0)", "max(+0, -0)", "min(+0, -0)", "-0 + +0", "-(+0)"]
  print("\n| op | GPU | sim |\n|---|---|---|")
  for i, n in enumerate(names):
    print(f"| {n} | {real[i, 0]!r} | {sim[i, 0]!r} |")


if __name__ == "__main__":
  direct_half_sums()
  half_sum_of_a_large_and_ones()
  fma_with_iota()
  fma_with_iota_f32_where()
  known_zero_adds()
  signed_zeros()
