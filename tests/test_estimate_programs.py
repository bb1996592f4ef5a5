"""ps.estimate against ps.simulate on kernels drawn by hypothesis: each
block runs a short program of steps that may or may not depend on its grid
index, nested in conds, loops and scopes (backends/sim/blocks/block_classes.py
and blocks/paths.py must see every way blocks can differ). The estimate must equal
the full simulation: times, tallies, HBM bytes. (PROGRAMS=400 in the
environment draws more of them than a test run's 40.)"""
import os

import jax
import jax.numpy as jnp
import pytest
from hypothesis import example, given, settings, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from test_estimate import _full, _times

# (programs may draw boxes wholly outside their arrays: what TMA makes of them
# is part of what the estimate must follow)
pytestmark = pytest.mark.filterwarnings("ignore::pallas_sim.errors.OutOfBoundsWarning")


F32 = jnp.float32
S = jax.ShapeDtypeStruct
ROWS = 8  # (a tile: ROWS x 128 f32)


def _index(draw, depth):
  """An integer of the block index b and the loop counters in scope: a
  constant, b, b % m, b // m, or a loop counter."""
  kind = draw(st.sampled_from(["const"] * 3 + ["b", "mod", "div"] + ["loop"] * (depth > 0)))
  m = draw(st.integers(1, 3))
  return (kind, m, draw(st.integers(0, depth - 1)) if kind == "loop" else 0)


def _steps(draw, depth, loops):
  n = draw(st.integers(1, 3))
  out = []
  for _ in range(n):
    kinds = ["work", "load", "store"] + ["cond", "loop", "scope"] * (depth < 2)
    kind = draw(st.sampled_from(kinds))
    if kind in ("cond", "loop", "scope"):
      inner_loops = loops + (kind == "loop")
      out.append((kind, _index(draw, loops), draw(st.integers(0, 2)),
                  _steps(draw, depth + 1, inner_loops)))
    else:
      out.append((kind, _index(draw, loops), draw(st.integers(0, 2)), None))
  return out


@st.composite
def _programs(draw):
  """(blocks, rows of x: whole tiles or not, the program)."""
  return (draw(st.integers(1, 6)), draw(st.sampled_from([3 * ROWS, 3 * ROWS + ROWS // 2])),
          _steps(draw, 0, 0))


def _value(idx, b, counters):
  kind, m, which = idx
  if kind == "const":
    return jnp.int32(m)
  if kind == "b":
    return b
  if kind == "mod":
    return b % (m + 1)
  if kind == "div":
    return b // (m + 1)
  return counters[which]


def _kernel(nblocks, rows, program):
  """The drawn program as a kernel: "work" a tile's worth of exp, index + k
  times; "load" a TMA load of the tile at row (index * ROWS) of x (cut or
  wholly past the end for large indices); "store" a TMA store of the tile
  to the block's output row where index + k is even; "cond" the steps
  inside where index + k is even; "loop" the steps inside index + k times;
  "scope" the steps inside a run_scoped allocating k + 1 tiles."""

  def fn(x):
    @plgpu.kernel(out_type=S((nblocks, ROWS, 128), F32), grid=(nblocks,), grid_names=("b",),
                  scratch_types=[plgpu.SMEM((ROWS, 128), F32), plgpu.Barrier()])
    def k(x_ref, o_ref, tile, bar):
      b = lax.axis_index("b")
      tile[...] = jnp.zeros((ROWS, 128), F32)

      def run(steps, counters):
        for kind, idx, k, inner in steps:
          v = _value(idx, b, counters)
          if kind == "work":
            def body(i, t):
              return jnp.exp(t) * 0.5
            tile[...] = lax.fori_loop(0, v + k, body, tile[...])
          elif kind == "load":
            plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(v * ROWS, ROWS)], tile, bar)
            plgpu.barrier_wait(bar)
          elif kind == "store":
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(tile, o_ref.at[b], predicate=(v + k) % 2 == 0)
            plgpu.wait_smem_to_gmem(0)
          elif kind == "cond":
            lax.cond((v + k) % 2 == 0, lambda: run(inner, counters), lambda: None)
          elif kind == "loop":
            def step(i, c):
              run(inner, counters + [i])
              return c
            lax.fori_loop(0, v + k, step, None)
          else:  # scope
            def scoped(*allocs):
              run(inner, counters)
              allocs[0][...] = tile[...]
            pl.run_scoped(scoped, *[plgpu.SMEM((ROWS, 128), F32)] * (k + 1))
      run(program, [])
      o_ref[b, 0] = tile[0]
    return k(x)
  return fn


@settings(max_examples=int(os.environ.get("PROGRAMS", 40)), deadline=None)
@given(drawn=_programs())
# (found by a seed: block 3 loads at (3 % 4) * 8, wholly past 24 rows; the
# remainder had no bounds, and its start looked like any multiple of 8)
@example(drawn=(4, 24, [("load", ("mod", 3, 0), 0, None)]))
def test_estimate_equals_the_simulation_on_drawn_programs(drawn):
  nblocks, rows, program = drawn
  fn = _kernel(nblocks, rows, program)
  x = jnp.ones((rows, 128), F32)
  est, full = ps.estimate(fn, S(x.shape, F32)), _full(fn, x)
  assert _times(est) == _times(full), program
  assert est.kernels[0].hbm_bytes == full.kernels[0].hbm_bytes
