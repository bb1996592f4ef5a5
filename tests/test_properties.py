"""Property tests: generated kernels in the simulator against NumPy."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hypothesis import assume, given, strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from conftest import rel_err
from test_quickstart import matmul_mcs

UNARY = {
    "exp": (jnp.exp, np.exp), "tanh": (jnp.tanh, np.tanh),
    "log1p_abs": (lambda x: jnp.log1p(jnp.abs(x)), lambda x: np.log1p(np.abs(x))),
    "square": (lambda x: x * x, lambda x: x * x),
    "relu": (lambda x: jnp.where(x > 0, x, 0), lambda x: np.where(x > 0, x, 0)),
}
BINARY = {
    "add": (jnp.add, np.add), "mul": (jnp.multiply, np.multiply),
    "max": (jnp.maximum, np.maximum), "sub": (jnp.subtract, np.subtract),
}
DTYPES = {"f32": (jnp.float32, 1e-6), "f16": (jnp.float16, 2e-3),
          "bf16": (jnp.bfloat16, 1.6e-2)}


@st.composite
def elementwise_case(draw):
  rows = draw(st.sampled_from([1, 2, 4, 8]))
  cols = draw(st.sampled_from([128, 256, 512]))
  grid = draw(st.sampled_from([1, 2, 4]))
  dt = draw(st.sampled_from(sorted(DTYPES)))
  u = draw(st.sampled_from(sorted(UNARY)))
  b = draw(st.sampled_from(sorted(BINARY)))
  via_smem = draw(st.booleans())
  seed = draw(st.integers(0, 2 ** 16))
  return rows * grid, cols, grid, dt, u, b, via_smem, seed


@given(elementwise_case())
def test_elementwise_matches_numpy(case):
  n_rows, cols, grid, dt, u, b, via_smem, seed = case
  dtype, tol = DTYPES[dt]
  rows = n_rows // grid
  uf, un = UNARY[u]
  bf, bn = BINARY[b]

  scratch = [plgpu.SMEM((rows, cols), dtype), plgpu.Barrier()] if via_smem else []

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((n_rows, cols), dtype), grid=(grid,),
                grid_names=("g",), scratch_types=scratch)
  def k(x_ref, y_ref, o_ref, *scr):
    g = jax.lax.axis_index("g")
    rs = pl.ds(g * rows, rows)
    if via_smem:
      smem, bar = scr
      plgpu.copy_gmem_to_smem(x_ref.at[rs], smem, bar)
      plgpu.barrier_wait(bar)
      x = smem[...]
    else:
      x = x_ref[rs]
    o_ref[rs] = bf(uf(x), y_ref[rs]).astype(dtype)

  r = np.random.default_rng(seed)
  x = jnp.asarray(r.uniform(-2, 2, (n_rows, cols)), dtype)
  y = jnp.asarray(r.uniform(-2, 2, (n_rows, cols)), dtype)
  got = np.asarray(ps.run(k, x, y, backend="sim"), np.float64)
  xf, yf = np.asarray(x, np.float64), np.asarray(y, np.float64)
  want = bn(un(xf), yf)
  assert np.abs(got - want).max() <= tol * 8 * max(1.0, np.abs(want).max())


@st.composite
def pipeline_case(draw):
  tm = draw(st.sampled_from([8, 16, 32, 64]))
  tn = draw(st.sampled_from([128, 256]))
  gm = draw(st.integers(1, 4))
  gn = draw(st.integers(1, 3))
  mcs = draw(st.integers(1, 3))
  return tm, tn, gm, gn, mcs, draw(st.integers(0, 2 ** 16))


@given(pipeline_case())
def test_emit_pipeline_in_out_specs(case):
  tm, tn, gm, gn, mcs, seed = case
  shape = (tm * gm, tn * gn)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, jnp.float32))
  def k(x_ref, y_ref, o_ref):
    def body(_, x, y, o):
      o[...] = x[...] * 2 + y[...]

    spec = plgpu.BlockSpec((tm, tn), lambda i, j: (i, j))
    plgpu.emit_pipeline(body, grid=(gm, gn), in_specs=[spec, spec],
                        out_specs=[spec], max_concurrent_steps=mcs)(x_ref, y_ref, o_ref)

  r = np.random.default_rng(seed)
  x = jnp.asarray(r.standard_normal(shape), jnp.float32)
  y = jnp.asarray(r.standard_normal(shape), jnp.float32)
  np.testing.assert_allclose(ps.run(k, x, y, backend="sim"),
                             2 * np.asarray(x) + np.asarray(y), rtol=1e-6)


@given(st.sampled_from([1, 2, 4]), st.sampled_from([64, 128, 256]),
       st.sampled_from([32, 64, 128]), st.integers(2, 3),
       st.sampled_from(["f16", "bf16"]), st.integers(0, 2 ** 16))
def test_matmul_tiles(gm, tile_n, tile_k, mcs, dt, seed):
  dtype = DTYPES[dt][0]
  align = lambda x: -(-x // 1024) * 1024
  smem = (align(128 * tile_n * 4) + align(mcs * 128 * tile_k * 2)
          + align(mcs * tile_k * tile_n * 2) + 8 * mcs)
  assume(smem <= 232448)  # over the limit is test_lowering_agreement's business
  m, n, k = 128 * gm, tile_n * 2, tile_k * 4
  r = np.random.default_rng(seed)
  a = jnp.asarray(r.standard_normal((m, k)), dtype)
  b = jnp.asarray(r.standard_normal((k, n)), dtype)
  got = ps.run(lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k,
                                       max_concurrent_steps=mcs,
                                       out_dtype=jnp.float32), a, b, backend="sim")
  want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
  assert rel_err(got, want) < 1e-6
