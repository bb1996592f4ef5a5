"""Probe: float division in registers on an H100/H200 (`x / y` in a kernel,
which Mosaic GPU lowers to arith.divf, and the same in plgpu.inline_mgpu),
against candidate models: correctly rounded division (what the simulator
computes), x times the correctly rounded reciprocal, and the PTX division
instructions themselves (div.rn / div.full / div.approx, run on the GPU
through inline PTX), to find which instruction the compiler emits and how
far from correctly rounded it is.

    python3 -m lab.division_probe [OUT] [--table]   # on a Hopper GPU

--table measures rcp.approx.f32 for every f32 mantissa and writes the table
the simulator uses (OUT/rcp_delta.npz: backends/sim/machine/numerics/rcp_approx_sm90.npz).
"""
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import vector as vector_dialect
import jax.experimental.mosaic.gpu as mgpu
from jax.experimental.mosaic.gpu import utils as mgpu_utils
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

SHAPE = (128, 128)
LAY = plgpu.Layout.WGMMA


def plain_div(x, y):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype))
  def k(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] / y_ref[...]
  return k(x, y)


def ptx_div(instr):
  """x / y by one PTX instruction per f32 element."""
  def run(x, y):
    ret = plgpu.ShapeDtypeStruct(SHAPE, jnp.float32, layout=LAY)

    @plgpu.kernel(out_type=jax.ShapeDtypeStruct(SHAPE, jnp.float32))
    def k(x_ref, y_ref, o_ref):
      xv = plgpu.load(x_ref, layout=LAY, optimized=False)
      yv = plgpu.load(y_ref, layout=LAY, optimized=False)

      @plgpu.inline_mgpu(arg_types=(LAY, LAY), return_type=ret)
      def div(ctx, a, b):
        f32 = ir.F32Type.get()
        regs = np.empty_like(a.registers)
        for i, (ra, rb) in enumerate(zip(a.registers.flat, b.registers.flat)):
          n = ir.VectorType(ra.type).shape[0]
          out = ra
          for j in range(n):
            ea = vector_dialect.extract(ra, [], [j])
            eb = vector_dialect.extract(rb, [], [j])
            q = mgpu_utils.inline_ptx(f"{instr} $0, $1, $2;", ea, eb, result_types=f32)
            out = vector_dialect.insert(q, out, [], [j])
          regs.flat[i] = out
        return mgpu.FragmentedArray(_registers=regs, _layout=a.layout, _is_signed=None)
      o_ref[...] = div(xv, yv)
    return k(x, y)
  return run


def ptx_unary_tiles(instr, x):
  """instr applied to every f32 of x (n, 128, 128), a block per tile."""
  n = x.shape[0]
  ret = plgpu.ShapeDtypeStruct(SHAPE, jnp.float32, layout=LAY)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(x.shape, jnp.float32), grid=(n,),
                grid_names=("b",))
  def k(x_ref, o_ref):
    b = jax.lax.axis_index("b")
    xv = plgpu.load(x_ref.at[b], layout=LAY, optimized=False)

    @plgpu.inline_mgpu(arg_types=(LAY,), return_type=ret)
    def op(ctx, a):
      f32 = ir.F32Type.get()
      regs = np.empty_like(a.registers)
      for i, ra in enumerate(a.registers.flat):
        out = ra
        for j in range(ir.VectorType(ra.type).shape[0]):
          e = vector_dialect.extract(ra, [], [j])
          q = mgpu_utils.inline_ptx(f"{instr} $0, $1;", e, result_types=f32)
          out = vector_dialect.insert(q, out, [], [j])
        regs.flat[i] = out
      return mgpu.FragmentedArray(_registers=regs, _layout=a.layout, _is_signed=None)
    o_ref[b] = op(xv)
  return k(x)


def rcp_table(out_dir):
  """rcp.approx.f32 of every float32 in [1, 2): its difference in ulps from
  the correctly rounded reciprocal, and whether div.full.f32 is x times it."""
  m = np.arange(2 ** 23, dtype=np.uint32) | np.uint32(127 << 23)
  y = m.view(np.float32).reshape(-1, 128, 128)
  r = np.asarray(jax.jit(lambda y: ptx_unary_tiles("rcp.approx.f32", y))(y)).reshape(-1)
  rn = (1.0 / y.reshape(-1).astype(np.float64)).astype(np.float32)
  delta = r.view(np.int32).astype(np.int64) - rn.view(np.int32)
  vals, counts = np.unique(delta, return_counts=True)
  print("rcp.approx.f32 - RN(1/y) in ulps over [1, 2):", dict(zip(vals.tolist(), counts.tolist())))
  np.savez_compressed(os.path.join(out_dir, "rcp_delta.npz"), delta=delta.astype(np.int8))
  # Is div.full.f32 the product with that reciprocal, rounded once?
  rng = np.random.default_rng(1)
  x32 = (rng.uniform(-1, 1, SHAPE) * 2.0 ** rng.integers(-20, 20, SHAPE)).astype(np.float32)
  y32 = (rng.uniform(-1, 1, SHAPE) * 2.0 ** rng.integers(-20, 20, SHAPE)).astype(np.float32)
  real = np.asarray(ps.run(plain_div, x32, y32, backend="mosaic"))
  yb = y32.view(np.uint32)
  mant = (yb & np.uint32(0x7FFFFF)).astype(np.int64)
  r1 = (rn.view(np.int32)[mant] + delta[mant]).astype(np.int32).view(np.float32)  # rcp of [1,2)
  scale = np.ldexp(1.0, -(((yb >> 23) & 0xFF).astype(np.int64) - 127))
  ry = (r1.astype(np.float64) * scale * np.sign(y32)).astype(np.float32)
  model = (x32.astype(np.float64) * ry.astype(np.float64)).astype(np.float32)
  print(f"div.full.f32 == RN(x * rcp.approx(y)): {share(real, model):.6f}")


def bits(a):
  a = np.asarray(a)
  return a.view(f"u{a.dtype.itemsize}")


def share(a, b):
  return float(np.mean(bits(a) == bits(b)))


def max_ulps(a, b):
  a, b = np.asarray(a), np.asarray(b)
  i = np.dtype(f"i{a.dtype.itemsize}")
  return int(np.max(np.abs(a.view(i).astype(np.int64) - b.view(i).astype(np.int64))))


def main():
  rng = np.random.default_rng(0)
  x32 = (rng.uniform(-1, 1, SHAPE) * 2.0 ** rng.integers(-20, 20, SHAPE)).astype(np.float32)
  y32 = (rng.uniform(-1, 1, SHAPE) * 2.0 ** rng.integers(-20, 20, SHAPE)).astype(np.float32)
  f = lambda a: np.asarray(a, np.float64)
  ieee = (f(x32) / f(y32)).astype(np.float32)
  rcp = (f(x32) * f((1.0 / f(y32)).astype(np.float32))).astype(np.float32)
  real = np.asarray(ps.run(plain_div, x32, y32, backend="mosaic"))
  sim = np.asarray(ps.run(plain_div, x32, y32, backend="sim"))
  print("f32 x / y on the GPU: equal to correctly rounded %.4f (max %d ulp), to "
        "x*rcp_rn(y) %.4f, simulator %.4f" % (share(real, ieee), max_ulps(real, ieee),
                                               share(real, rcp), share(real, sim)))
  for instr in ("div.rn.f32", "div.full.f32", "div.approx.f32", "div.approx.ftz.f32"):
    got = np.asarray(ps.run(ptx_div(instr), x32, y32, backend="mosaic"))
    print(f"  {instr}: equal to arith.divf's {share(real, got):.4f}, to correctly "
          f"rounded {share(got, ieee):.4f} (max {max_ulps(got, ieee)} ulp)")
  for dt in (np.float16, ml_dtypes.bfloat16):
    xs = rng.uniform(-8, 8, SHAPE).astype(dt)
    ys = rng.uniform(-8, 8, SHAPE).astype(dt)
    ieee_h = (f(xs) / f(ys)).astype(np.float32).astype(dt)
    via32 = (f(xs) / f(ys)).astype(np.float32)
    real = np.asarray(ps.run(plain_div, xs, ys, backend="mosaic"))
    sim = np.asarray(ps.run(plain_div, xs, ys, backend="sim"))
    print(f"{np.dtype(dt).name} x / y: equal to correctly rounded {share(real, ieee_h):.4f}, "
          f"simulator {share(real, sim):.4f}; f32 quotients {via32.dtype}")


def full_range(out_dir):
  """The simulator's model (machine/numerics/division.py) against the GPU on operands
  of every exponent (random bit patterns, NaN excluded), f32 and halves;
  saves pinned samples for tests/test_numerics.py."""
  rng = np.random.default_rng(2)
  def operands(dt, n):
    w = np.dtype(dt).itemsize * 8
    b = rng.integers(0, 2 ** w, n, dtype=np.uint64).astype(f"u{w // 8}")
    v = b.view(dt)
    return np.where(np.isnan(v.astype(np.float32)), v.dtype.type(1), v).reshape(SHAPE)
  pinned = {}
  for dt in (np.float32, np.float16, ml_dtypes.bfloat16):
    x, y = operands(dt, 16384), operands(dt, 16384)
    real = np.asarray(ps.run(plain_div, x, y, backend="mosaic"))
    sim = np.asarray(ps.run(plain_div, x, y, backend="sim"))
    ieee = (x.astype(np.float64) / y.astype(np.float64)).astype(np.float32).astype(dt)
    off = bits(real) != bits(sim)
    print(f"{np.dtype(dt).name} x / y over all exponents: simulator equal "
          f"{share(real, sim):.6f}, correctly rounded equal {share(real, ieee):.6f}")
    if off.any():
      i = np.argwhere(off)[:5]
      print("  e.g.", [(x[tuple(j)], y[tuple(j)], real[tuple(j)], sim[tuple(j)]) for j in i])
    k = np.nonzero((bits(real) != bits(ieee)).reshape(-1))[0][:64]
    pinned[np.dtype(dt).name] = np.stack([bits(x).reshape(-1)[k], bits(y).reshape(-1)[k],
                                          bits(real).reshape(-1)[k]])
  np.savez_compressed(os.path.join(out_dir, "division_h200.npz"), **pinned)


def subnormal_divisors(out_dir):
  """Divisors below 2^-126 (subnormal), of every magnitude: the GPU's
  quotients, saved for fitting the scaling div.full.f32 applies there."""
  rng = np.random.default_rng(3)
  lead = rng.integers(0, 23, SHAPE)
  mant = (rng.integers(0, 2 ** 23, SHAPE) >> lead) | 1
  y = (mant.astype(np.uint32) | (rng.integers(0, 2, SHAPE).astype(np.uint32) << 31)).view(np.float32)
  x = (rng.uniform(1, 2, SHAPE) * 2.0 ** rng.integers(-149, 0, SHAPE)).astype(np.float32)
  real = np.asarray(ps.run(plain_div, x, y, backend="mosaic"))
  sim = np.asarray(ps.run(plain_div, x, y, backend="sim"))
  print(f"subnormal divisors: simulator equal {share(real, sim):.6f}")
  np.savez_compressed(os.path.join(out_dir, "subnormal_div.npz"), x=x, y=y, real=real)


if __name__ == "__main__":
  main()
  out = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "--table" else "."
  if "--table" in sys.argv:
    rcp_table(out)
  full_range(out)
  subnormal_divisors(out)
