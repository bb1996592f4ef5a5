"""ps.estimate where a TMA box's start depends on the block: a box that
reaches past the array's end in some blocks (TMA cuts it, or moves nothing)
makes those blocks differ, and block_classes must see it
(backends/sim/analysis/congruence.py says which starts are multiples of the box,
and within which bounds)."""
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.blocks import block_classes
from pallas_sim.backends.sim.analysis import congruence
from test_estimate import _full, _times

# (these draw boxes wholly outside their arrays on purpose: what TMA makes of
# them is what they test)
pytestmark = pytest.mark.filterwarnings("ignore::pallas_sim.errors.OutOfBoundsWarning")


F32 = jnp.float32
S = jax.ShapeDtypeStruct


def _windows(grid, box, stride, offset, chained=0, store=True, trips=0, step=0):
  """Block (i, j) loads the box `box` at (i * stride[0] + offset[0],
  j * stride[1] + offset[1]) (through a second indexer `chained` rows into
  a window twice the box's height, where chained; with `trips`, on each
  trip t of a loop, `step` * t rows further) and stores it as its output
  (by TMA, or from registers)."""
  (g0, g1), (b0, b1) = grid, box

  def fn(x):
    @plgpu.kernel(out_type=S((g0, g1, b0, b1), F32), grid=grid, grid_names=("i", "j"),
                  scratch_types=[plgpu.SMEM((b0, b1), F32), plgpu.Barrier()])
    def k(x_ref, o_ref, tile, bar):
      i, j = lax.axis_index("i"), lax.axis_index("j")

      def load(t):
        r = i * stride[0] + offset[0] + t * step
        c = j * stride[1] + offset[1]
        if chained:
          src = x_ref.at[pl.ds(r, 2 * b0), pl.ds(c, b1)].at[pl.ds(chained, b0)]
        else:
          src = x_ref.at[pl.ds(r, b0), pl.ds(c, b1)]
        plgpu.copy_gmem_to_smem(src, tile, bar)
        plgpu.barrier_wait(bar)
      if trips:
        lax.fori_loop(0, trips, lambda t, c: load(t), None)
      else:
        load(0)
      if store:
        plgpu.copy_smem_to_gmem(tile, o_ref.at[i, j])
        plgpu.wait_smem_to_gmem(0)
      else:
        o_ref[i, j] = tile[...]
    return k(x)
  return fn


def _estimated(fn, shape):
  x = jnp.ones(shape, F32)
  est, full = ps.estimate(fn, S(shape, F32)), _full(fn, x)
  assert _times(est) == _times(full)
  assert est.kernels[0].hbm_bytes == full.kernels[0].hbm_bytes
  return est.kernels[0]


@pytest.mark.parametrize("grid,box,stride,offset,shape,cut", [
    ((4, 1), (64, 32), (64, 0), (16, 0), (256, 32), True),   # (off the box's multiples)
    ((5, 1), (64, 32), (64, 0), (0, 0), (256, 32), True),    # (block 4: wholly past)
    ((4, 1), (64, 32), (56, 0), (8, 0), (256, 32), False),   # (all within: bounded)
    ((4, 1), (64, 32), (64, 0), (0, 0), (256, 32), False),   # (the quickstart's tiles)
    ((1, 3), (8, 32), (0, 40), (0, 0), (8, 128), False),     # (0, 40, 80: within)
    ((1, 3), (8, 32), (0, 52), (0, 0), (8, 128), True),      # (104 + 32 > 128)
    ((4, 1), (64, 32), (64, 0), (-8, 0), (256, 32), True),   # (block 0 from row -8)
])
def test_a_box_that_reaches_past_the_end_in_some_blocks_is_a_decision(
    grid, box, stride, offset, shape, cut):
  k = _estimated(_windows(grid, box, stride, offset), shape)
  assert (k.simulated_blocks > 1) == cut
  # (the report names the decision: the user's line, and what it is)
  assert ("test_box_cuts.py:" in k.classes and "a TMA load's box, which may be cut at "
          "the array's ends" in k.classes) == cut


@st.composite
def _layouts(draw):
  """Boxes, strides, offsets and array sizes around the cases that matter:
  strides and array sizes the box divides, offsets off its multiples or
  below 0, grids and loops that reach past the end (minor-axis starts
  16-byte aligned, as TMA needs)."""
  g0, g1 = draw(st.integers(1, 5)), draw(st.integers(1, 3))
  b0, b1 = draw(st.sampled_from([8, 16, 24])), draw(st.sampled_from([16, 32]))
  s0 = b0 * draw(st.integers(0, 2)) + draw(st.sampled_from([0, 0, 4, 8]))
  s1 = b1 * draw(st.integers(0, 2)) + draw(st.sampled_from([0, 0, 4]))
  o0, o1 = draw(st.sampled_from([-8, 0, 0, 4, 8, 16])), draw(st.sampled_from([0, 0, 8]))
  chained = draw(st.sampled_from([0, 0, 3, 8]))
  trips = draw(st.sampled_from([0, 0, 2, 3]))
  step = draw(st.sampled_from([0, b0, 8])) if trips else 0
  rows = max(b0 * draw(st.integers(1, 8)) + draw(st.sampled_from([0, 0, 4])),
             b0 + max(o0, 0) + chained)  # (block 0's first box starts inside)
  cols = max(b1 * draw(st.integers(1, 4)) + draw(st.sampled_from([0, 0, 4])), b1 + o1)
  return (g0, g1), (b0, b1), (s0, s1), (o0, o1), chained, trips, step, (rows, cols)


@settings(max_examples=40, deadline=None)
@given(layout=_layouts(), store=st.booleans())
def test_estimate_equals_the_simulation_wherever_boxes_start(layout, store):
  grid, box, stride, offset, chained, trips, step, shape = layout
  _estimated(_windows(grid, box, stride, offset, chained, store, trips, step), shape)


def _in_a_loop(start, trips=3, rows=256, closed=0):
  """Block b loads 64 rows from start(b, t) on each of `trips` loop trips,
  inside a run_scoped that closes over `closed` more values and allocates
  as many as it closes over when closed > 0 (the two counts alike)."""
  def fn(x):
    @plgpu.kernel(out_type=S((4, 64, 32), F32), grid=(4,), grid_names=("b",))
    def k(x_ref, o_ref):
      b = lax.axis_index("b")
      extra = [b + i for i in range(closed)]

      def body(tile, bar, *allocs):
        def step(t, c):
          plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(start(b, t) + 0 * sum(extra), 64)],
                                  tile, bar)
          plgpu.barrier_wait(bar)
          return c
        lax.fori_loop(0, trips, step, None)
        o_ref[b] = tile[...]
      # (allocations: as many as it closes over, x_ref, o_ref, b and extra)
      n = 3 + closed if closed else 2
      pl.run_scoped(body, plgpu.SMEM((64, 32), F32), plgpu.Barrier(),
                    *[plgpu.SMEM((8,), F32)] * (n - 2))
    return k(x)
  return fn


@pytest.mark.parametrize("start,cut", [
    (lambda b, t: (b + t) * 64, True),       # (block 3 goes past the end: the loop's bounds)
    (lambda b, t: b * 64 - t, True),         # (before row 0 from the second trip)
    (lambda b, t: b * 32 + t * 32, False),   # (off 64s multiples, but within: the bounds)
])
@pytest.mark.parametrize("closed", [0, 2])
def test_a_loop_counter_bounds_a_start_over_the_loops_length(start, cut, closed):
  k = _estimated(_in_a_loop(start, closed=closed), (256, 32))
  assert (k.simulated_blocks > 1) == cut


def test_a_decision_inside_a_scope_that_allocates_as_many_as_it_closes_over():
  """run_scoped's body takes what it closes over first, then its
  allocations; with as many of each, the grid index once lost its way (one
  class where there are two)."""
  def fn(x):
    @plgpu.kernel(out_type=S((4, 128), F32), grid=(4,), grid_names=("b",))
    def k(x_ref, o_ref):
      b = lax.axis_index("b")
      v = x_ref[b]

      def body(s1, s2, s3):  # (closes over b, v and o_ref: three)
        s1[...] = lax.cond(b % 2 == 0, lambda u: jnp.exp(u) * 0.5 + u, lambda u: u, v)
        s2[...] = s1[...]
        o_ref[b] = s2[...]
      pl.run_scoped(body, *[plgpu.SMEM((128,), F32)] * 3)
    return k(x)
  scopes = [e.params["jaxpr"] for e in _eqns(jax.make_jaxpr(fn)(S((4, 128), F32)).jaxpr)
            if e.primitive.name == "run_scoped"]
  assert any(len(j.constvars) == len(j.invars) == 3 for j in scopes)
  k = _estimated(fn, (4, 128))
  assert k.simulated_blocks == 2 and k.block_cycles_max > k.block_cycles_min


def test_a_start_read_from_memory_that_may_cut_runs_every_block_on_its_data():
  """Each block loads its own offset (a tile of int32 from the GMEM), then
  64 rows from there: block 3's box is cut at the end. Its start is data,
  not the grid index: a decision on data (every block runs, on its values)."""
  def fn(x, starts):
    @plgpu.kernel(out_type=S((4, 64, 32), F32), grid=(4,), grid_names=("b",),
                  scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.SMEM((128,), jnp.int32),
                                 plgpu.Barrier()])
    def k(x_ref, s_ref, o_ref, tile, idx, bar):
      b = lax.axis_index("b")
      plgpu.copy_gmem_to_smem(s_ref.at[b], idx, bar)
      plgpu.barrier_wait(bar)
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(idx[0], 64)], tile, bar)
      plgpu.barrier_wait(bar)
      o_ref[b] = tile[...]
    return k(x, starts)
  x = jnp.ones((256, 32), F32)
  starts = jnp.broadcast_to(jnp.array([0, 64, 128, 224], jnp.int32)[:, None], (4, 128))
  est, full = ps.estimate(fn, x, starts), _full(fn, x, starts)
  assert _times(est) == _times(full) and est.kernels[0].tma_load_bytes == 3 * 8192 + 4096 + 4 * 512
  assert "values read from memory" in est.kernels[0].classes


def test_congruences_and_bounds_of_index_math():
  c = congruence
  b = (1, 0, 0, 7)  # (a grid index of 8 blocks)
  assert c.is_multiple(c._mul(b, c.exactly(128)), 128)
  start = c.add(c._mul(b, c.exactly(128)), c._mul(c.TOP, c.exactly(64)))
  assert not c.is_multiple(start, 128) and c.is_multiple(start, 64)
  assert start[3] is None  # (the loop's part is unbounded)
  assert c._mul(b, c.exactly(128))[2:] == (0, 896)
  assert c.add(c.exactly(10), b, -1)[2:] == (3, 10)
  assert c.join(c.exactly(4), c.exactly(10)) == (6, 4, 4, 10)
  assert c.widen(c.exactly(0), c.exactly(1))[2:] == (0, None)
  assert c._rem(b, c.exactly(4)) == (1, 0, 0, 3)       # (b % 4, b >= 0)
  assert c._rem((8, 0, 0, 64), c.exactly(4)) == (4, 0, 0, 3)  # (a multiple of 8: 0)
  assert c._rem((1, 0, -5, 3), (3, 1, 1, 4))[2:] == (-3, 3)  # (the sign of the dividend)
  assert c._div((1, 0, -7, 7), c.exactly(2))[2:] == (-3, 3)  # (toward zero)
  assert c._rem((1, 0, 0, 3), (1, 0, -4, 1))[2:] == (0, 3)  # (a divisor spanning 0: jnp's %)
  assert c._rem((4, 1, 0, 8), c.exactly(0))[:2] == (1, 0)  # (rem by 0 is 0: no congruence)


def test_a_remainder_by_a_negative_divisor_bounds_a_start():
  """(b % -4 + 3) * 8 starts at 24, 0, 8, 16: block 0's box lies wholly past
  24 rows. jnp's % guards a zero divisor, which makes -4 one of [-4, 1]: a
  divisor spanning 0 still bounds the remainder (found by a review)."""
  def fn(x):
    @plgpu.kernel(out_type=S((4, 8, 128), F32), grid=(4,), grid_names=("b",),
                  scratch_types=[plgpu.SMEM((8, 128), F32), plgpu.Barrier()])
    def k(x_ref, o_ref, tile, bar):
      b = lax.axis_index("b")
      tile[...] = jnp.zeros((8, 128), F32)
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds((b % -4 + 3) * 8, 8)], tile, bar)
      plgpu.barrier_wait(bar)
      o_ref[b, 0] = tile[0]
    return k(x)
  assert _estimated(fn, (24, 128)).simulated_blocks == 2


def test_a_loop_counter_s_start_stays_a_multiple_of_its_box():
  """pl.ds(b * 64 + k * 64, 64) in a while loop over k (no trip count to
  bound k): a multiple of 64, however far k goes; on an axis 64 divides,
  never cut."""
  def fn(x):
    @plgpu.kernel(out_type=S((4, 64, 32), F32), grid=(4,), grid_names=("b",),
                  scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.Barrier()])
    def k(x_ref, o_ref, tile, bar):
      b = lax.axis_index("b")

      def step(t):
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(b * 64 + t * 64, 64)], tile, bar)
        plgpu.barrier_wait(bar)
        return t + 1
      lax.while_loop(lambda t: t < 3, step, 0)
      o_ref[b] = tile[...]
    return k(x)
  jaxpr = jax.make_jaxpr(fn)(S((448, 32), F32))
  assert block_classes.analyse(_kernel_jaxpr(jaxpr), ("b",), sizes={"b": 4})[0] is None
  assert _estimated(fn, (448, 32)).simulated_blocks == 1


def _eqns(jaxpr):
  """Every equation of a jaxpr, nested ones included."""
  stack = [jaxpr]
  while stack:
    j = stack.pop()
    for eqn in j.eqns:
      yield eqn
      for v in eqn.params.values():
        for sub in (v if isinstance(v, (tuple, list)) else (v,)):
          if hasattr(sub, "eqns"):
            stack.append(sub)
          elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
            stack.append(sub.jaxpr)


def _kernel_jaxpr(jaxpr):
  """The kernel body inside a traced plgpu.kernel call."""
  return next(e.params["jaxprs"][0] for e in _eqns(jaxpr.jaxpr)
              if e.primitive.name == "mpmd_map")
