"""SMEM the simulator counts for a kernel (backends/sim/analysis/resources.py) against
the real lowering's own estimate (jax/_src/pallas/mosaic_gpu/lowering.py
`_estimate_resources`), for kernels that fit: allocations in pl.when / cond
branches, loop bodies and nested scopes, with drawn sizes. The report's
bytes and blocks per SM follow from that figure."""
import jax
import jax.numpy as jnp
from hypothesis import example, given, settings, strategies as st
import jax.experimental.mosaic.gpu as mgpu
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.base import jax_internals as jx

F32 = jnp.float32
X = jnp.ones((8, 128), F32)


def lowering_smem_bytes(fn, *args):
  """The SMEM scratch bytes and barrier count the lowering estimates for
  the one kernel `fn` launches."""
  def kernels(j):
    for e in j.eqns:
      if e.primitive.name in ("pallas_call", "mpmd_map"):
        yield e
      for v in e.params.values():
        for sub in (v if isinstance(v, (tuple, list)) else (v,)):
          sub = getattr(sub, "jaxpr", sub)
          if hasattr(sub, "eqns"):
            yield from kernels(sub)
  (eqn,) = kernels(jax.make_jaxpr(fn)(*args).jaxpr)
  body = eqn.params["jaxpr"] if "jaxpr" in eqn.params else eqn.params["jaxprs"][0]
  body = getattr(body, "jaxpr", body)
  low = jx.gpu_lowering
  ctx = low.ResourceEstimatorContext(
      reduction_scratch_bytes=2048, axis_names=low._AxisNames(grid=()),
      lowering_semantics=mgpu.LoweringSemantics.Lane)
  rs = low._estimate_resources(ctx, body)
  return rs.smem_scratch_bytes


def kernel(rows_a, rows_b, loop_rows, while_rows):
  """A pl.when branch allocating rows_a x 128 f32, a cond whose other branch
  allocates rows_b, a fori_loop (a scan) whose body allocates loop_rows, a
  while loop whose body allocates while_rows, each scope inside an outer
  one of 8 x 128."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((8, 128), F32),
                scratch_types=[plgpu.SMEM((8, 128), F32)])
  def k(x_ref, o_ref, outer):
    outer[...] = x_ref[...]

    @pl.when(x_ref[0, 0] > 0)
    def _():
      def body(s):
        s[pl.ds(0, 8)] = outer[...]
        outer[...] = s[pl.ds(0, 8)] + 1
      pl.run_scoped(body, plgpu.SMEM((rows_a, 128), F32))

    def other(s):
      s[pl.ds(0, 8)] = outer[...] * 2
      outer[...] = s[pl.ds(0, 8)]
    lax.cond(x_ref[0, 1] > 0, lambda: None,
             lambda: pl.run_scoped(other, plgpu.SMEM((rows_b, 128), F32)))

    def step(i, carry):
      def inner(s):
        s[pl.ds(0, 8)] = outer[...]
        outer[...] = s[pl.ds(0, 8)] - 1
      pl.run_scoped(inner, plgpu.SMEM((loop_rows, 128), F32))
      return carry
    lax.fori_loop(0, 2, step, 0)

    def again(i):
      def inner(s):
        s[pl.ds(0, 8)] = outer[...]
        outer[...] = s[pl.ds(0, 8)] * 0.5
      pl.run_scoped(inner, plgpu.SMEM((while_rows, 128), F32))
      return i + 1
    lax.while_loop(lambda i: i < 2, again, 0)
    o_ref[...] = outer[...]
  return k


ROWS = st.sampled_from([8, 64, 128, 200, 256])


@settings(max_examples=10, deadline=None)
@given(ROWS, ROWS, ROWS, ROWS)
@example(256, 8, 8, 8)  # (each scope the biggest once, whatever is drawn)
@example(8, 256, 8, 8)
@example(8, 8, 256, 8)
@example(8, 8, 8, 256)
def test_smem_in_branches_and_loops_is_counted_as_the_lowering_counts_it(a, b, c, d):
  k = kernel(a, b, c, d)
  want = lowering_smem_bytes(k, X)
  sim = ps.estimate(k, X)
  (rep,) = sim.kernels
  assert rep.smem_bytes == want, (rep.smem_bytes, want)
  # The branches, not their sum: the biggest of them, beside the outer scope.
  assert want == 4096 + 1024 * -(-max(a, b, c, d) * 512 // 1024)
