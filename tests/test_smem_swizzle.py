"""The swizzle the lowering infers for a wgmma's untransformed SMEM operands
(backends/sim/analysis/smem_swizzle.py), as the timing model sees it: the rows of
the TMA boxes that fill them."""
import collections
import re

import jax
import jax.numpy as jnp
import pytest
from hypothesis import example, given, settings, strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.frontend import capture
from pallas_sim.backends.sim.analysis import smem_swizzle
from pallas_sim.backends.sim.timing import model as timing
from test_quickstart import matmul_mcs

F16 = jax.ShapeDtypeStruct((256, 256), jnp.float16)


def _estimated_rows(fn, *args):
  """Estimates fn(*args); returns {TMA load site: its boxes' row bytes}."""
  seen = collections.defaultdict(set)
  tma = timing.Timing.tma

  def spy(self, engines, t, nbytes, site=None, row_bytes=None, **kw):
    if site is not None:
      seen[site].add(row_bytes)
    return tma(self, engines, t, nbytes, site, row_bytes, **kw)
  timing.Timing.tma = spy
  try:
    ps.estimate(fn, *args, gpu="h200")
  finally:
    timing.Timing.tma = tma
  return seen


@pytest.fixture
def rows_seen():
  """Each TMA load site's row bytes, sorted (_estimated_rows)."""
  return lambda fn, *args: sorted(tuple(sorted(r)) for r in _estimated_rows(fn, *args).values())


@pytest.mark.parametrize("tile_k, tile_n, rows", [
    (16, 128, 32),   # A (128, 16) allows 32 bytes: B's 256-byte rows go in 32
    (32, 128, 64),
    (64, 128, 128),
    (64, 16, 32),    # B (64, 16) allows 32: A's 128-byte rows go in 32
])
def test_a_wgmmas_operands_load_in_rows_of_their_common_swizzle(rows_seen, tile_k, tile_n,
                                                               rows):
  got = rows_seen(lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k), F16, F16)
  assert got == [(rows,)] * 4  # (A's and B's sites: the pipeline's prologue and loop)


def test_transforms_the_kernel_gives_are_kept_and_set_the_pairs(rows_seen):
  """An operand the kernel tiles and swizzles itself loads in its rows (here
  64 bytes, where the lowering would infer 128), and its untransformed
  partner gets the same (B, which alone would take 128)."""
  t = (plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(64))

  def mm(a, b):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256, 256), jnp.float32),
                  scratch_types=dict(acc=plgpu.ACC((128, 128), jnp.float32)),
                  grid=(2, 2), grid_names=("m", "n"))
    def kernel(a_gmem, b_gmem, o_gmem, acc):
      m, n = jax.lax.axis_index("m"), jax.lax.axis_index("n")

      def body(_, a_smem, b_smem):
        plgpu.wgmma(acc, a_smem, b_smem)
        plgpu.wgmma_wait(1)
      plgpu.emit_pipeline(
          body, grid=(4,),
          in_specs=[plgpu.BlockSpec((128, 64), lambda k: (m, k), transforms=t),
                    plgpu.BlockSpec((64, 128), lambda k: (k, n))],
          max_concurrent_steps=2)(a_gmem, b_gmem)
      o_gmem[pl.ds(m * 128, 128), pl.ds(n * 128, 128)] = acc[...]
    return kernel(a, b)

  assert rows_seen(mm, F16, F16) == [(64,)] * 4


def test_lane_semantics_infer_nothing(monkeypatch):
  """Only the default (Warpgroup) lowering infers transforms."""
  inferred = []
  infer = smem_swizzle.infer
  monkeypatch.setattr(smem_swizzle, "infer",
                      lambda j, lane=False: inferred.append(infer(j, lane)) or inferred[-1])
  ps.estimate(lambda a, b: matmul_mcs(a, b, tile_k=16), F16, F16, gpu="h200")
  assert sorted(inferred[-1][0].values()) == [32, 32]
  lane = plgpu.CompilerParams(lowering_semantics=plgpu.LoweringSemantics.Lane)
  assert capture.lane_semantics({"compiler_params": lane})
  assert capture.lane_semantics({"compiler_params": {"mosaic_gpu": lane}})
  assert not capture.lane_semantics({"compiler_params": plgpu.CompilerParams()})
  assert not capture.lane_semantics({})


def _wgmma_under(control):
  """A kernel whose TMA loads fill A (128, 16) and B (16, 128) at its top,
  and whose wgmma reads them inside `control`: a loop with a trip count
  known only at run time (a while), or a branch (a cond)."""
  def mm(a, b):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256, 128), jnp.float32), grid=(2,),
                  grid_names=("i",),
                  scratch_types=[plgpu.SMEM((128, 16), jnp.float16),
                                 plgpu.SMEM((16, 128), jnp.float16),
                                 plgpu.Barrier(num_barriers=2),
                                 plgpu.ACC((128, 128), jnp.float32)])
    def kernel(a_gmem, b_gmem, o_gmem, a_smem, b_smem, bars, acc):
      i = jax.lax.axis_index("i")
      plgpu.copy_gmem_to_smem(a_gmem.at[pl.ds(i * 128, 128)], a_smem, bars.at[0])
      plgpu.copy_gmem_to_smem(b_gmem, b_smem, bars.at[1])
      plgpu.barrier_wait(bars.at[0])
      plgpu.barrier_wait(bars.at[1])

      def step(*_):
        plgpu.wgmma(acc, a_smem, b_smem)
        plgpu.wgmma_wait(0)
      if control == "while":
        jax.lax.fori_loop(0, i + 1, lambda j, c: step(), None)
      else:
        pl.when(i == 0)(step)
      o_gmem[pl.ds(i * 128, 128)] = acc[...]
    return kernel(a, b)
  return mm


@pytest.mark.parametrize("control, primitive", [("while", "while"), ("cond", "cond")])
def test_operands_are_followed_into_loops_and_branches(rows_seen, control, primitive):
  """A's (128, 16) allows a 32-byte swizzle, so B's 256-byte rows load in 32."""
  fn = _wgmma_under(control)
  a, b = jax.ShapeDtypeStruct((256, 16), jnp.float16), jax.ShapeDtypeStruct((16, 128),
                                                                              jnp.float16)
  with capture.force_sim():
    closed = jax.make_jaxpr(fn)(a, b)
  assert primitive in str(closed)  # (the wgmma is inside one)
  assert rows_seen(fn, a, b) == [(32,), (32,)]


def _lowering_rows(fn, *args):
  """The row bytes of every TMA load's box as JAX's own Mosaic GPU lowering
  gives them (its layout inference, run on this CPU by jax.export for
  CUDA): the box's minor extent, or the swizzle of the transforms it
  inferred for the SMEM side, whichever is narrower."""
  from jax.experimental.mosaic.gpu import layout_inference
  modules = []
  infer = layout_inference.infer_layout

  def spy(module, *a, **k):
    out = infer(module, *a, **k)
    modules.append(str(module))
    return out
  layout_inference.infer_layout = spy
  try:
    with capture.force_real():
      jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)
  finally:
    layout_inference.infer_layout = infer
  rows = set()
  for line in "\n".join(modules).splitlines():
    if '"mosaic_gpu.async_load"' not in line:
      continue
    box = [int(x) for x in re.search(r"slice_lengths = array<i64: ([0-9, ]+)>", line)
           .group(1).split(",")]
    item = {"f16": 2, "bf16": 2, "f32": 4}[re.search(r"x(f16|bf16|f32)>", line).group(1)]
    swizzle = re.search(r"swizzle<(\d+)", line)
    width = box[-1] * item
    rows.add(min(width, int(swizzle.group(1))) if swizzle else width)
  return rows


@settings(max_examples=12, deadline=None)
@given(tile_n=st.sampled_from([16, 32, 48, 64, 96, 128, 256]),
       tile_k=st.sampled_from([16, 32, 48, 64, 128]),
       dtype=st.sampled_from([jnp.float16, jnp.bfloat16]))
@example(tile_n=256, tile_k=128, dtype=jnp.float16)  # (past the SMEM)
def test_rows_are_the_real_lowerings(tile_n, tile_k, dtype):
  """Whatever the tiles, each load moves the rows JAX's lowering infers; a
  configuration past the SMEM (256x128 tiles at two slots) is refused by both."""
  shape = jax.ShapeDtypeStruct((256, 768), dtype), jax.ShapeDtypeStruct((768, 768), dtype)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k)
  try:
    want = _lowering_rows(fn, *shape)
  except ValueError as e:
    assert "exceeds available shared memory" in str(e)
    with pytest.raises(ps.SmemOverflowError):
      ps.estimate(fn, *shape, gpu="h200")
    return
  assert set().union(*_estimated_rows(fn, *shape).values()) == want
