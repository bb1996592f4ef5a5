"""ps.estimate given shapes walks the function's jaxpr and hands its kernels
to the simulator with no XLA program run (backends/sim/frontend/shapes_only.py): the
same report as running it on zeros, the same errors, and the ordinary run
wherever the walk cannot go."""
import os

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.frontend import capture
from test_errors import line_of, pipeline_copy
from test_estimate import _times
from test_quickstart import matmul_mcs

F16, F32 = jnp.float16, jnp.float32
S = jax.ShapeDtypeStruct
HERE = os.path.basename(__file__)


@pytest.fixture
def callbacks(monkeypatch):
  """How many kernels reached the simulator through an XLA callback."""
  seen = []
  real = capture.jx.callback.io_callback

  def counting(*a, **k):
    seen.append(1)
    return real(*a, **k)
  monkeypatch.setattr(capture.jx.callback, "io_callback", counting)
  return seen


def add_one(x):
  @plgpu.kernel(out_type=S(x.shape, x.dtype))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0
  return k(x)


def test_given_shapes_no_xla_program_runs_and_the_report_is_the_same(callbacks):
  a = S((512, 256), F16)
  b = S((256, 512), F16)
  walked = ps.estimate(matmul_mcs, a, b)
  assert callbacks == [] and len(walked.kernels) == 1
  zeros = ps.estimate(matmul_mcs, jnp.zeros(a.shape, F16), jnp.zeros(b.shape, F16))
  assert len(callbacks) == 1
  assert _times(walked) == _times(zeros)


def test_kernels_inside_calls_are_reached_and_run_in_order(callbacks):
  """jit, custom_vjp and checkpoint bodies are walked; plain operations in
  between run eagerly on what the kernels returned."""
  @jax.custom_vjp
  def twice(x):
    return add_one(add_one(x))
  twice.defvjp(lambda x: (twice(x), None), lambda _, g: (g,))

  @jax.jit
  def fn(x, y):
    u = jax.checkpoint(add_one)(x) * 2.0
    return twice(u), matmul_mcs(y, y)

  rep = ps.estimate(fn, S((128, 128), F32), S((128, 128), F16))
  assert callbacks == []
  assert [k.name for k in rep.kernels] == ["k", "k", "k", "kernel"]


def test_a_kernel_in_a_loop_runs_at_every_trip():
  """A scan is bound as it is: its kernel runs through XLA, three times."""
  def fn(x):
    return lax.scan(lambda c, _: (add_one(c), None), x, length=3)[0]
  rep = ps.estimate(fn, S((128, 128), F32))
  assert len(rep.kernels) == 3


def test_a_function_that_needs_values_while_traced_runs_on_zeros(callbacks):
  def fn(x, tile):
    if float(x[0, 0]) == 0.0:  # (Python control flow on a value: zeros stand in)
      return matmul_mcs(x, x, tile_n=tile)
    raise AssertionError("zeros stand in for shapes")
  rep = ps.estimate(fn, S((256, 256), F16), tile=64)
  assert len(callbacks) == 1 and len(rep.kernels) == 1
  assert rep.kernels[0].num_blocks == 2 * 4


def test_arrays_and_python_values_beside_shapes_keep_their_kind(callbacks):
  seen = {}

  def fn(x, y, *, scale, tile):
    seen["kinds"] = (type(scale), type(tile))
    return matmul_mcs(x * scale, y, tile_n=tile)
  y = jnp.ones((256, 256), F16)
  rep = ps.estimate(fn, S((256, 256), F16), y, scale=2.0, tile=128)
  assert seen["kinds"] == (float, int) and callbacks == []
  assert rep.kernels[0].num_blocks == 2 * 2


def test_static_errors_name_the_users_line_through_the_walk(callbacks):
  with pytest.raises(ps.SmemOverflowError) as e:
    ps.estimate(pipeline_copy, S((512, 256), F32))
  assert "smem_bytes=262160 > max_smem_bytes=232448" in str(e.value)

  @plgpu.kernel(out_type=S((128,), F32))
  def k(x_ref, o_ref):
    o_ref[...] = jnp.sort(x_ref[...])  # not modelled
  with pytest.raises(ps.LoweringError) as e:
    ps.estimate(k, S((128,), F32))
  line = f"{HERE}:{line_of(test_static_errors_name_the_users_line_through_the_walk, 'jnp.sort')}"
  assert line in str(e.value) and e.value.primitive == "sort"
  assert callbacks == []


def test_errors_found_while_running_raise_at_the_end(callbacks):
  @plgpu.kernel(out_type=S((128,), F32), scratch_types=[plgpu.Barrier(num_arrivals=1)])
  def k(x_ref, o_ref, bar):
    plgpu.barrier_wait(bar)  # never completes
    o_ref[...] = x_ref[...]
  with pytest.raises(ps.DeadlockError) as e:
    ps.estimate(k, S((128,), F32))
  assert f"{HERE}:{line_of(test_errors_found_while_running_raise_at_the_end, 'never completes')}" \
      in str(e.value)
  assert callbacks == []
