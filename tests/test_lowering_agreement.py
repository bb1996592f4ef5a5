"""Errors agree with the real Mosaic GPU lowering, which runs on a CPU too:
`jax.export(..., platforms=["cuda"])` lowers a kernel for Hopper without a GPU.
The simulator must reject what the lowering rejects, with the same numbers,
and nothing it accepts."""
import re

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

import pallas_sim as ps
from test_errors import pipeline_copy
from test_quickstart import matmul_mcs


def lowering_error(fn, *args):
  """The real lowering's error message for this kernel, or None if it lowers."""
  try:
    jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)
  except Exception as e:  # the lowering raises ValueError, NotImplementedError...
    return str(e)
  return None


def real_smem_error(fn, *args):
  """The real lowering's smem_bytes if it rejects the kernel for SMEM, else None."""
  try:
    jax.export.export(jax.jit(fn), platforms=["cuda"])(*args)
  except ValueError as e:
    m = re.search(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)", str(e))
    if m:
      return int(m.group(1)), int(m.group(2))
    raise
  return None


def sim_smem_error(fn, *args):
  """The simulator's own SMEM verdict (without the real lowering's check)."""
  try:
    ps.run(fn, *args, backend="sim", check_lowering=False)
  except ps.SmemOverflowError as e:
    return e.smem_bytes, e.max_smem_bytes
  return None


def lowering_smem_bytes(fn, *args):
  """The SMEM bytes the real lowering requests for a kernel that fits: with
  its limit at 0 (its own testing hook) it reports them. (A fresh function:
  JAX caches lowerings per function, the limit is not part of the key.)"""
  from jax.experimental.mosaic.gpu import core as mgpu_core
  with mgpu_core.artificial_shared_memory_limit(0):
    try:
      jax.export.export(jax.jit(lambda *a: fn(*a)), platforms=["cuda"])(*args)
    except ValueError as e:
      return int(re.search(r"smem_bytes=(\d+)", str(e)).group(1))
  return 0


CASES = [
    ("pipeline f32 64x256 mcs2", lambda x: pipeline_copy(x, (64, 256), 2), (512, 256)),
    ("pipeline f32 32x256 mcs2", lambda x: pipeline_copy(x, (32, 256), 2), (512, 256)),
    ("pipeline f32 32x256 mcs4", lambda x: pipeline_copy(x, (32, 256), 4), (512, 256)),
    ("pipeline f32 64x128 mcs3", lambda x: pipeline_copy(x, (64, 128), 3), (512, 128)),
]


@pytest.mark.parametrize("name,fn,shape", CASES, ids=[c[0] for c in CASES])
def test_smem_verdict_and_numbers_match_the_lowering(name, fn, shape):
  x = jnp.ones(shape, jnp.float32)
  assert sim_smem_error(fn, x) == real_smem_error(fn, x)


@pytest.mark.parametrize("tile_n,tile_k,mcs", [(128, 64, 2), (256, 128, 4),
                                                (256, 64, 3), (128, 128, 4)])
def test_matmul_smem_verdict_matches_the_lowering(tile_n, tile_k, mcs):
  a = jnp.ones((512, 512), jnp.float16)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k,
                               max_concurrent_steps=mcs)
  assert sim_smem_error(fn, a, a) == real_smem_error(fn, a, a)


# --- the real lowering as the simulator's last static check ------------------
# Kernels the agreement suite found that the simulator's own model accepted
# but the lowering rejects: the simulator now rejects them too, before running.

def _k(shape, body, dtype=jnp.float32, scratch=()):
  from jax.experimental.pallas import mosaic_gpu as plgpu
  return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(shape, dtype),
                      scratch_types=list(scratch))


def test_unimplemented_primitive_is_a_lowering_error_at_the_users_line():
  def body(x_ref, o_ref):
    o_ref[...] = jnp.log1p(x_ref[...])
  k = _k((128,), body)
  x = jnp.ones((128,), jnp.float32)
  assert "log1p" in lowering_error(k, x)
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, x, backend="sim")
  assert e.value.primitive == "log1p"
  assert "test_lowering_agreement.py" in e.value.where
  # The simulator's own model can still run it, when asked to skip the check.
  out = ps.run(k, x, backend="sim", check_lowering=False)
  assert abs(float(out[0]) - 0.6931472) < 1e-6


def test_layout_inference_failures_are_rejected_by_both():
  def small(x_ref, o_ref):  # 64 elements: fewer than a warpgroup's lanes
    o_ref[...] = x_ref[...] + 1
  def reduce_unlaid(x_ref, o_ref):  # a reduction needs the WGMMA layout
    o_ref[...] = jnp.sum(x_ref[...], axis=1)
  for k, x in [(_k((64,), small), jnp.ones((64,), jnp.float32)),
               (_k((128,), reduce_unlaid), jnp.ones((128, 128), jnp.float32))]:
    msg = lowering_error(k, x)
    assert "Failed to infer a possible set of layouts" in msg
    with pytest.raises(ps.LoweringError, match="Failed to infer"):
      ps.run(k, x, backend="sim")


def _smem_cases():
  import kernels as K
  import quickstart as Q
  cases = [("quickstart matmul", Q.matmul, K.hand_pipelined_matmul_args(0))]
  cases += [(name, fn, make(0)) for name, fn, make, _ in K.EXAMPLES
            if name not in K.NOT_LOWERABLE]
  cases += [("fill_42", Q.fill_42, ()), ("iota", Q.iota, ())]
  cases += [(c[0], c[1], (jnp.ones(c[2], jnp.float32),))
            for c in (CASES[1], CASES[3])]  # (the two that fit)

  from jax.experimental.pallas import mosaic_gpu as plgpu

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.SMEM((100, 3), jnp.float32),
                               plgpu.SMEM((2, 136), jnp.float16),
                               plgpu.Barrier(num_barriers=3), plgpu.SMEM((128,), jnp.float32)])
  def odd_sizes(x_ref, o_ref, a, b, bars, c):
    c[...] = x_ref[...]
    o_ref[...] = c[...]
  cases.append(("allocations of odd sizes", odd_sizes, (jnp.ones((128,), jnp.float32),)))
  return cases


SMEM_CASES = _smem_cases()


@pytest.mark.parametrize("name,fn,args", SMEM_CASES, ids=[c[0] for c in SMEM_CASES])
def test_smem_bytes_of_kernels_that_fit_match_the_lowering(name, fn, args):
  sim = ps.simulate(fn, *args, check_lowering=False, on_race="report")
  assert [k.smem_bytes for k in sim.report.kernels][:1] == [lowering_smem_bytes(fn, *args)]


def test_a_kernel_run_again_is_lowered_once_and_a_rejected_one_every_time(monkeypatch):
  """The real lowering's acceptance is kept per process for a kernel given
  the same everything (its jaxpr, operands, parameters); a kernel that
  differs in any of them, and a rejected one, are lowered again."""
  from pallas_sim.backends.sim.frontend import capture
  calls = []
  real = capture.real_lowering_error
  monkeypatch.setattr(capture, "real_lowering_error",
                      lambda *a, **kw: calls.append(1) or real(*a, **kw))
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3 + 1
  def other(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3 - 1
  x = jnp.arange(128, dtype=jnp.float32) + 0.25  # (a value no other test uses)
  k = _k((128,), body)
  first = ps.run(k, x, backend="sim")
  assert calls == [1]
  again = ps.run(_k((128,), body), x + 1, backend="sim")  # (traced afresh)
  assert calls == [1] and float(again[0]) == float(first[0]) + 3
  ps.run(_k((128,), other), x, backend="sim")  # another body
  ps.run(_k((256,), body), jnp.ones(256, jnp.float32), backend="sim")  # other shapes
  assert calls == [1, 1, 1]
  def log1p(x_ref, o_ref):
    o_ref[...] = jnp.log1p(x_ref[...])
  for _ in range(2):
    with pytest.raises(ps.LoweringError):
      ps.run(_k((128,), log1p), x, backend="sim")
  assert calls == [1, 1, 1, 1, 1]


def test_the_smem_bound_of_jaxs_tests_is_part_of_what_was_lowered():
  """JAX's tests lower under artificial_shared_memory_limit: a kernel
  accepted without it is lowered again under it, and rejected."""
  from jax.experimental.mosaic.gpu import core as mgpu_core
  x = jnp.ones((512, 128), jnp.float32) * 0.5
  fn = lambda x: pipeline_copy(x, (64, 128), 2)
  ps.run(fn, x, backend="sim")
  with mgpu_core.artificial_shared_memory_limit(1024):
    with pytest.raises(ps.SmemOverflowError, match="max_smem_bytes=1024"):
      ps.run(fn, x, backend="sim")
