"""Bad kernels get clear, located errors before or while running; never a hang."""
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

HERE = os.path.basename(__file__)


def line_of(fn, needle):
  import inspect
  src, start = inspect.getsourcelines(fn)
  for i, l in enumerate(src):
    if needle in l:
      return start + i
  raise AssertionError(needle)


def pipeline_copy(x, tile=(64, 256), mcs=2):
  """emit_pipeline elementwise kernel, f32 tiles in and out."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype))
  def k(x_gmem, o_gmem):
    def body(_, x_smem, o_smem):
      o_smem[...] = x_smem[...] + 1.0

    plgpu.emit_pipeline(
        body, grid=(x.shape[0] // tile[0],),
        in_specs=[plgpu.BlockSpec(tile, lambda i: (i, 0))],
        out_specs=[plgpu.BlockSpec(tile, lambda i: (i, 0))],
        max_concurrent_steps=mcs)(x_gmem, o_gmem)
  return k(x)


def test_smem_overflow_reports_the_lowerings_numbers():
  # Measured on an H200: smem_bytes=262160 > max_smem_bytes=232448.
  x = jnp.ones((512, 256), jnp.float32)
  with pytest.raises(ps.SmemOverflowError) as e:
    ps.run(pipeline_copy, x, backend="sim")
  assert e.value.smem_bytes == 262160 and e.value.max_smem_bytes == 232448
  assert "smem_bytes=262160 > max_smem_bytes=232448" in str(e.value)
  assert "Mosaic GPU kernel exceeds available shared memory" in str(e.value)
  # and where the bytes go: the pipeline's two slots of its in and out tiles,
  # at the emit_pipeline call, each named as the pipeline names it
  line = line_of(pipeline_copy, "plgpu.emit_pipeline(")
  at = rf"at \S*{re.escape(HERE)}:{line}"
  assert re.search(rf"Where it goes, largest first: 128 KiB emit_pipeline's in_smem_refs\[0\] "
                   rf"float32\[2, 64, 256\] {at}; 128 KiB emit_pipeline's out_smem_refs\[0\] "
                   rf"float32\[2, 64, 256\] {at}\. Fewer pipeline slots",
                   str(e.value)), str(e.value)


def test_smem_just_fitting_runs():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((512, 256)), jnp.float32)
  out = ps.run(lambda x: pipeline_copy(x, tile=(32, 256)), x, backend="sim")
  np.testing.assert_array_equal(out, np.asarray(x) + 1)


def test_unsupported_primitive_names_itself_and_the_users_line():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  def k(x_ref, o_ref):
    o_ref[...] = jnp.sort(x_ref[...])  # not modelled

  x = jnp.ones((128,), jnp.float32)
  line = f"{HERE}:{line_of(test_unsupported_primitive_names_itself_and_the_users_line, 'jnp.sort')}"
  with pytest.raises(ps.UnsupportedPrimitiveError) as e:
    ps.run(k, x, backend="sim", check_lowering=False)
  msg = str(e.value)
  assert "'sort'" in msg and "not modelled" in msg and line in msg
  assert e.value.primitive == "sort"
  # The GPU rejects it too: then the lowering's reason is the one given.
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, x, backend="sim")
  assert "Unimplemented primitive in Pallas Mosaic GPU lowering: sort" in str(e.value)
  assert line in str(e.value) and e.value.primitive == "sort"


@pytest.mark.parametrize("form", ["batched dot_general", "negative pad"])
def test_a_form_we_do_not_model_gives_the_lowerings_reason_where_it_rejects_too(form):
  """A primitive we model, in a form we do not: where the GPU rejects the
  kernel as well, its reason comes first (the kernel cannot run anywhere);
  without the lowering's check, ours, at the same line."""
  def body(x_ref, o_ref):
    x = x_ref[...]
    if form == "batched dot_general":
      o_ref[...] = jnp.einsum("bij,bjk->bik", x, x)  # <- the form
    else:
      o_ref[...] = lax.pad(x, 0.0, [(0, 0, 0), (0, 0, 0), (-2, 2, 0)])  # <- the form
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((2, 16, 16), jnp.float32))
  x = jnp.ones((2, 16, 16), jnp.float32)
  line = f"{HERE}:{line_of(body, form.split()[-1].replace('dot_general', 'einsum'))}"
  with pytest.raises(ps.UnsupportedPrimitiveError) as e:
    ps.run(k, x, backend="sim", check_lowering=False)
  assert form.split()[0] in str(e.value) and line in str(e.value)
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, x, backend="sim")
  assert "Unimplemented primitive in Pallas Mosaic GPU lowering" in str(e.value)
  assert line in str(e.value)


def test_a_lowering_error_inside_a_scope_with_an_accumulator_names_its_line():
  """A kernel with a plgpu.ACC is lowered through a state discharge of its
  scoped body, which re-traces each equation under JAX's user_context: the
  simulator's own tracing (which keeps real stacks) must not leak into it,
  or every op there loses its line and the error names the kernel's def."""
  def body(a_gmem, b_gmem, o_gmem, a, b, acc, bar):
    a[...] = a_gmem[...]  # <- the lowering cannot plan this GMEM load
    plgpu.copy_gmem_to_smem(b_gmem, b, bar)
    plgpu.commit_smem()
    plgpu.barrier_wait(bar)
    plgpu.wgmma(acc, a, b)
    plgpu.wgmma_wait(0)
    o_gmem[...] = acc[...]
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                   scratch_types=dict(a=plgpu.SMEM((64, 64), jnp.float16),
                                      b=plgpu.SMEM((64, 128), jnp.float16),
                                      acc=plgpu.ACC((64, 128), jnp.float32),
                                      bar=plgpu.Barrier(num_arrivals=1)))
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((64, 64), jnp.float16), jnp.ones((64, 128), jnp.float16),
           backend="sim")
  assert "the Mosaic GPU lowering rejects this kernel" in str(e.value)
  assert e.value.where.endswith(f"{HERE}:{line_of(body, '<- the lowering cannot plan')}"), \
      e.value.where


def test_an_mlir_verifier_error_is_placed_at_the_op_it_names():
  # The verifier runs after later equations were lowered: its error names
  # the op it rejected, with that op's line, which the report gives.
  # (jnp.stack, after it, is a primitive the simulator does not model from
  # jax 0.12.1: the lowering's error, which comes first, is the one given)
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  def k(x_ref, o_ref):
    v = x_ref[...]
    empty = v[:0]  # a vector of no elements: MLIR rejects its type
    o_ref[...] = jnp.stack([v, v])[1] + jnp.sum(empty)

  fn = test_an_mlir_verifier_error_is_placed_at_the_op_it_names
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((128,), jnp.float32), backend="sim")
  msg = str(e.value)
  where, _, rest = msg.partition(": ")
  assert where.endswith(f"{HERE}:{line_of(fn, 'empty = v[:0]')}"), msg
  assert rest.startswith("the Mosaic GPU lowering rejects this kernel (MLIRError)"), msg
  assert "vector types must have positive constant sizes" in msg


def test_an_unimplemented_primitive_under_a_jit_of_jaxs_own_names_the_users_line():
  # jnp.cumsum traces its cumsum under a jit of JAX's own: that equation's
  # traceback holds no frame of the user's, the jit's equation does. (It
  # was placed at the kernel's decorator.)
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128, 64), jnp.float32))
  def k(x_gmem, o_gmem):
    def body(_, x_smem, o_smem):
      o_smem[...] = jnp.cumsum(x_smem[...], axis=1)

    plgpu.emit_pipeline(
        body, grid=(2,), in_specs=[plgpu.BlockSpec((64, 64), lambda i: (i, 0))],
        out_specs=[plgpu.BlockSpec((64, 64), lambda i: (i, 0))],
        max_concurrent_steps=2)(x_gmem, o_gmem)

  fn = test_an_unimplemented_primitive_under_a_jit_of_jaxs_own_names_the_users_line
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((128, 64), jnp.float32), backend="sim")
  msg = str(e.value)
  assert e.value.primitive == "cumsum", msg
  assert msg.partition(": ")[0].endswith(f"{HERE}:{line_of(fn, 'jnp.cumsum(x_smem')}"), msg


def test_a_verifier_error_of_jaxs_own_lowering_is_told_once_at_the_users_line():
  # A load from a transposed SMEM ref: JAX's lowering makes a vector.load
  # that MLIR's verifier rejects, and raises its VerificationError, whose
  # constructor prefixes a request for a bug report. Our error is still one
  # (code that catches JAX's class catches it), says what the verifier said
  # first, and the request once, at the end.
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32))
  def k(x_gmem, o_gmem):
    def body(_, x_smem, o_smem):
      o_smem[...] = x_smem.T[...]

    plgpu.emit_pipeline(
        body, grid=(2,),
        in_specs=[plgpu.BlockSpec((64, 64), lambda j: (j, 0))],
        out_specs=[plgpu.BlockSpec((64, 64), lambda j: (0, j))],
        max_concurrent_steps=2)(x_gmem, o_gmem)

  fn = test_a_verifier_error_of_jaxs_own_lowering_is_told_once_at_the_users_line
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((128, 64), jnp.float32), backend="sim")
  assert "VerificationError" in {c.__name__ for c in type(e.value).__mro__}
  msg = str(e.value)
  where, _, rest = msg.partition(": ")
  assert where.endswith(f"{HERE}:{line_of(fn, 'x_smem.T[...]')}"), msg
  assert rest.startswith("the Mosaic GPU lowering rejects this kernel (VerificationError): "
                         "'vector.load' op"), msg
  assert msg.count("bug report") == 1 and "Pallas encountered" not in msg, msg


def test_a_dialect_lowering_error_is_placed_at_the_op_it_lowers():
  # A reduction across warps needs reduction_scratch_bytes of SMEM to pass
  # partial results between them; too few, and Mosaic GPU's dialect
  # lowering (a pass after Pallas's) rejects the reduction's op. Its error
  # names no line: the op's own location is the one given.
  def call(x, scratch):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                  scratch_types=[plgpu.SMEM((128, 128), jnp.float32), plgpu.Barrier()],
                  compiler_params=plgpu.CompilerParams(reduction_scratch_bytes=scratch))
    def k(x_gmem, o_gmem, x_smem, bar):
      plgpu.copy_gmem_to_smem(x_gmem, x_smem, bar)
      plgpu.barrier_wait(bar)
      x = plgpu.load(x_smem, layout=plgpu.Layout.WGMMA)
      o_gmem[...] = jnp.sum(x, axis=0)  # across the warps of the warpgroup
    return k(x)

  x = jnp.asarray(np.random.default_rng(0).standard_normal((128, 128)), jnp.float32)
  out = ps.run(lambda x: call(x, 2048), x, backend="sim")
  np.testing.assert_allclose(out, np.asarray(x).sum(0), rtol=1e-5, atol=1e-5)
  with pytest.raises(ps.LoweringError) as e:
    ps.run(lambda x: call(x, 256), x, backend="sim")
  msg = str(e.value)
  where, _, rest = msg.partition(": ")
  line = line_of(test_a_dialect_lowering_error_is_placed_at_the_op_it_lowers, "jnp.sum(x")
  assert where.endswith(f"{HERE}:{line}"), msg
  assert "Required reduction scratch size (1024 bytes)" in rest, msg
  assert "available scratch size (256 bytes)" in rest, msg


def test_a_pallas_call_with_index_maps_says_no_release_lowers_it_for_mosaic_gpu():
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((256,), jnp.float32), grid=(2,),
                     in_specs=[pl.BlockSpec((128,), lambda i: (i,))],
                     out_specs=pl.BlockSpec((128,), lambda i: (i,)),
                     compiler_params=plgpu.CompilerParams())
  with pytest.raises(ps.UnsupportedPrimitiveError) as e:
    with ps.backend("sim"):
      f(jnp.arange(256, dtype=jnp.float32))
  msg = str(e.value)
  fn = test_a_pallas_call_with_index_maps_says_no_release_lowers_it_for_mosaic_gpu
  assert f"{HERE}:{line_of(fn, 'def k(')}" in msg, msg
  assert f"pl.pallas_call has no Mosaic GPU lowering in jax {jax.__version__}" in msg, msg
  assert "plgpu.kernel" in msg and "emit_pipeline" in msg, msg


def test_a_pallas_call_built_before_the_backend_is_simulated_in_it():
  # pl.pallas_call takes its interpret mode when it builds the kernel's
  # function: one built before ps.backend("sim") is entered is simulated
  # there as one built inside (it would otherwise run on the GPU, or fail on
  # a CPU). The real lowering's check then says what a GPU would: no
  # Mosaic GPU lowering of pallas_call in the window.
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0

  f = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((256,), jnp.float32),
                     compiler_params=plgpu.CompilerParams())
  x = jnp.arange(256, dtype=jnp.float32)
  for _ in range(2):  # (the second simulation's trace is the one JAX's jit cache keeps)
    with ps.backend("sim", check_lowering=False) as report:
      out = f(x)
    np.testing.assert_array_equal(out, np.asarray(x) * 2)
    assert len(report.kernels) == 1
  # A simulation that runs the kernel from that cache, untraced, still
  # checks it against the real lowering, under its own options.
  with pytest.raises(ps.LoweringError) as e:
    with ps.backend("sim"):
      f(x)
  msg = str(e.value)
  assert f"{HERE}:{line_of(test_a_pallas_call_built_before_the_backend_is_simulated_in_it, 'def k(')}" in msg
  assert "pl.pallas_call has no Mosaic GPU lowering" in msg and "plgpu.kernel" in msg, msg


def test_a_bare_assertion_of_the_lowering_says_where_it_was_raised():
  # Some of the lowering's checks are bare asserts (layout inference's, on a
  # TMA copy's indices): their message is empty, so the report says where
  # in JAX it came from rather than nothing.
  from pallas_sim.backends.sim.analysis import resources

  def layout_check():
    raise AssertionError  # (pytest rewrites a plain assert's message)

  try:
    layout_check()
  except AssertionError as exc:
    err = resources.lowering_error(exc, where="kernel.py:7")
  msg = str(err)
  assert isinstance(err, ps.LoweringError)
  line = line_of(test_a_bare_assertion_of_the_lowering_says_where_it_was_raised,
                 "raise AssertionError")
  assert msg.startswith("kernel.py:7: the Mosaic GPU lowering rejects this kernel "
                        "(AssertionError): an assertion with no message, at "), msg
  assert f"{HERE}:{line} (layout_check)" in msg, msg


def test_a_mosaic_pass_error_names_the_op_it_held():
  # Mosaic GPU's passes after Pallas's (layout inference, the dialect's
  # lowering) raise while holding the op they check in a local `op`: the
  # report takes the user's line, or else the primitive, from its location.
  # (A stand-in pass: a function compiled as if it were in JAX's mosaic/gpu.)
  from pallas_sim.backends.sim.base import jax_internals as jx
  from pallas_sim.backends.sim.base import locations
  from pallas_sim.backends.sim.analysis import resources

  fake = os.path.join(os.sep, "x", "jax", "experimental", "mosaic", "gpu", "layout_inference.py")
  code = compile("def check(op):\n  raise AssertionError\n", fake, "exec")
  scope = {}
  exec(code, scope)  # pylint: disable=exec-used

  def held(make_loc):
    with jx.mlir.make_ir_context(), make_loc():
      module = jx.ir.Module.create()
      with jx.ir.InsertionPoint(module.body):
        op = jx.arith.ConstantOp(jx.ir.IntegerType.get_signless(32), 7)
      try:
        scope["check"](op)
      except AssertionError as exc:
        return locations.mlir_location(exc), str(resources.lowering_error(exc))

  where, _ = held(lambda: jx.ir.Location.name(
      "copy_gmem_to_smem:", childLoc=jx.ir.Location.file("/home/me/kernel.py", 12, 5)))
  assert where == "/home/me/kernel.py:12", where
  where, msg = held(lambda: jx.ir.Location.name("copy_gmem_to_smem:"))
  assert where is None
  assert "an assertion with no message, at jax/experimental/mosaic/gpu/" \
         "layout_inference.py:2 (check), on the op of a copy_gmem_to_smem" in msg, msg


def test_out_of_bounds_store_names_index_and_shape():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((1024,), jnp.float32), grid=(8,),
                grid_names=("i",))
  def k(o_ref):
    i = lax.axis_index("i")
    o_ref[pl.ds(i * 128 + 64, 128)] = jnp.zeros((128,), jnp.float32)  # last block overruns

  with pytest.raises(ps.OutOfBoundsError) as e:
    ps.run(k, backend="sim")
  msg = str(e.value)
  assert "960:1088" in msg and "o_ref of shape (1024,)" in msg and "block (7,)" in msg
  assert f"{HERE}:{line_of(test_out_of_bounds_store_names_index_and_shape, 'overruns')}" in msg


def test_deadlock_on_a_barrier_nobody_arrives_on():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.Barrier(num_arrivals=1)])
  def k(o_ref, bar):
    plgpu.barrier_wait(bar)  # never completes
    o_ref[...] = jnp.zeros((128,), jnp.float32)

  t0 = time.perf_counter()
  with pytest.raises(ps.DeadlockError) as e:
    ps.run(k, backend="sim")
  assert time.perf_counter() - t0 < 10
  msg = str(e.value)
  assert "barrier_wait" in msg and "block ()" in msg
  assert f"{HERE}:{line_of(test_deadlock_on_a_barrier_nobody_arrives_on, 'never completes')}" in msg


def test_a_deadlocked_barrier_wait_says_what_its_phase_still_lacks():
  """num_arrivals=2, and the TMA load's arrival the only one: the report
  says the phase has 1 of its 2 arrivals (the copy's bytes have landed)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.SMEM((128,), jnp.float32),
                               plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  with pytest.raises(ps.DeadlockError) as e:
    ps.run(k, jnp.ones((128,), jnp.float32), backend="sim")
  assert "barrier_wait on bar (completion #1; its phase has 1 of its 2 arrivals)" in \
      str(e.value), str(e.value)
  [(_, what, _)] = e.value.blocked
  assert what.endswith("1 of its 2 arrivals)"), what


def test_deadlock_cycle_between_two_threads_names_both():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.Barrier(num_arrivals=1, num_barriers=2)],
                num_threads=2, thread_name="wg")
  def k(o_ref, bars):
    wg = lax.axis_index("wg")
    # Each thread waits for the other's arrival before arriving itself.
    plgpu.barrier_wait(bars.at[wg])
    plgpu.barrier_arrive(bars.at[1 - wg])

    @pl.when(wg == 0)
    def _():
      o_ref[...] = jnp.zeros((128,), jnp.float32)

  with pytest.raises(ps.DeadlockError) as e:
    ps.run(k, backend="sim")
  assert len(e.value.blocked) == 2
  assert "thread 0" in str(e.value) and "thread 1" in str(e.value)


def test_mismatched_tma_shapes_are_jaxs_own_trace_time_error():
  # JAX checks a copy's shapes, dtypes and memory spaces while tracing, before
  # any backend sees the kernel: the simulator has no check of its own here,
  # and the user gets JAX's message, the same as on the GPU.
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.SMEM((64,), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(0, 128)], smem, bar)
    plgpu.barrier_wait(bar)

  for check_lowering in (True, False):
    with pytest.raises(ValueError, match=r"Expected source shape to be \(64,\), but "
                       r"got \(128,\)") as e:
      ps.run(k, jnp.ones((256,), jnp.float32), backend="sim",
             check_lowering=check_lowering)
    assert not isinstance(e.value, ps.SimError)


def test_bad_backend_and_gpu_names():
  with pytest.raises(ValueError, match="backend="):
    ps.run(lambda: None, backend="tpu")
  with pytest.raises(ValueError, match="gpu="):
    ps.simulate(lambda: None, gpu="a100")


def test_bad_options_are_named_with_what_they_take():
  with pytest.raises(TypeError, match=r"ps.backend: unknown option\(s\) \['max_cycle'\]; "
                                      r"options are the fields of ps.Options"):
    with ps.backend("sim", max_cycle=10):
      pass
  with pytest.raises(ValueError, match=r"on_race='explode': choose one of"):
    ps.simulate(lambda: None, on_race="explode")
  with pytest.raises(ValueError, match=r"library_races='quiet': choose one of"):
    ps.Options(library_races="quiet")
  with pytest.raises(ValueError, match=r"max_cycles=0: must be positive"):
    ps.Options(max_cycles=0)
  with pytest.raises(ValueError, match=r"workers=0: a positive number of processes"):
    ps.Options(workers=0)


def test_runtime_error_in_backend_block_raises_at_its_end_and_later_runs_work():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.Barrier(num_arrivals=1)])
  def stuck(o_ref, bar):
    plgpu.barrier_wait(bar)

  with pytest.raises(ps.DeadlockError):
    with ps.backend("sim"):
      stuck()
  # The failed launch leaves nothing behind: the next simulation is fine.
  from quickstart import iota
  np.testing.assert_array_equal(ps.run(iota, backend="sim"), np.arange(1024.0))


def test_blackwell_primitives_are_rejected_with_their_reason():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.TMEM((128, 128), jnp.float32)])
  def tmem(o_ref, t):
    o_ref[...] = jnp.zeros((128,), jnp.float32)
  with pytest.raises(ps.UnsupportedPrimitiveError, match="Blackwell .sm_100. only"):
    ps.run(tmem, backend="sim")

  # (a TMEM load's primitive is named "async_load": the error names the call too)
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                scratch_types=[plgpu.TMEM((128, 128), jnp.float32)])
  def load(o_ref, t):
    o_ref[...] = plgpu.async_load_tmem(t)
    plgpu.wait_load_tmem()
  with pytest.raises(ps.UnsupportedPrimitiveError,
                     match=r"'async_load' \(plgpu.async_load_tmem\) is not supported: a "
                           r"Blackwell \(sm_100\) instruction"):
    ps.run(load, backend="sim", check_lowering=False)


def test_griddepcontrol_needs_nothing_between_launches_run_in_order():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  def k(x_ref, o_ref):
    plgpu.griddepcontrol_wait()
    o_ref[...] = x_ref[...] + 1.0
    plgpu.griddepcontrol_launch_dependents()
  x = jnp.arange(128, dtype=jnp.float32)
  np.testing.assert_array_equal(ps.run(k, x, backend="sim"), x + 1)


def test_kernel_parameter_names_follow_the_source_text(tmp_path):
  """Reports name buffers by the kernel's own parameters, read from its
  source (parsed once per text of the file: an edited file is read again)."""
  import linecache

  from pallas_sim.backends.sim.base import locations
  path = tmp_path / "k.py"
  path.write_text("@deco\ndef kernel(a_ref, o_ref):\n  pass\n")
  assert locations.parameter_names_at(str(path), 1) == ("a_ref", "o_ref")
  assert locations.parameter_names_at(str(path), 2) == ("a_ref", "o_ref")
  path.write_text("@deco\ndef kernel(x_gmem, y_gmem, z):\n  pass\n")
  linecache.checkcache(str(path))
  assert locations.parameter_names_at(str(path), 1) == ("x_gmem", "y_gmem", "z")
  assert locations.parameter_names_at(str(path), 3) == ()


def test_a_tma_load_without_a_barrier_is_refused_at_its_line():
  """Hopper's TMA completes on an mbarrier; the lowering's barrier-less copy
  is pre-Hopper cp.async, which an sm_90 kernel cannot use."""
  def body(x_ref, o_ref, s):
    plgpu.copy_gmem_to_smem(x_ref, s)
    o_ref[...] = s[...]
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                   scratch_types=[plgpu.SMEM((128, 128), jnp.float32)])
  with pytest.raises(ps.KernelError) as e:
    ps.run(k, jnp.ones((128, 128), jnp.float32), backend="sim")
  msg = str(e.value)
  assert "copy_gmem_to_smem without a barrier" in msg and "pre-Hopper" in msg
  assert f"{HERE}:{line_of(body, 'copy_gmem_to_smem(x_ref, s)')}" in msg


def test_an_arrival_past_the_barriers_count_is_an_overflow_at_its_line():
  """num_arrivals=1 and the TMA load's own arrival (arrive_expect_tx) already
  made: a second arrival in the phase, before the copy lands, overflows the
  count (PTX leaves that undefined)."""
  def body(x_ref, o_ref, s, bar):
    plgpu.copy_gmem_to_smem(x_ref, s, bar)
    plgpu.barrier_arrive(bar)  # <- the second arrival
    plgpu.barrier_wait(bar)
    o_ref[...] = s[...]
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32),
                   scratch_types=[plgpu.SMEM((128, 128), jnp.float32),
                                  plgpu.Barrier(num_arrivals=1)])
  with pytest.raises(ps.KernelError) as e:
    ps.run(k, jnp.ones((128, 128), jnp.float32), backend="sim")
  msg = str(e.value)
  assert "barrier bar: 2 arrivals in one phase" in msg and "num_arrivals=1" in msg
  assert f"{HERE}:{line_of(body, '<- the second arrival')}" in msg


@pytest.mark.parametrize("entry", ["run", "backend"])
def test_a_static_error_carries_no_frames_of_jax_or_the_simulator(entry):
  """An error a static check raises while the kernel is traced reaches the
  user with their own frames and the entry point's, not JAX's lowering and
  the simulator's (contextlib would give it its first traceback back)."""
  import traceback
  k = plgpu.kernel(lambda x_ref, o_ref, s: None,
                   out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                   scratch_types=[plgpu.SMEM((512, 128), jnp.float32)])
  x = jnp.ones((128,), jnp.float32)
  with pytest.raises(ps.SmemOverflowError) as e:
    if entry == "run":
      ps.run(k, x, backend="sim")
    else:
      with ps.backend("sim"):
        k(x)
  files = [f.filename for f in traceback.extract_tb(e.value.__traceback__)]
  assert not [f for f in files if os.sep + "jax" + os.sep in f or
              os.sep + "backends" + os.sep in f], files
  assert not any("JAX has removed its internal frames" in n
                 for n in getattr(e.value, "__notes__", [])), e.value.__notes__


def test_a_pass_error_names_the_primitive_of_the_op_it_held():
  """Layout inference rejects math.erf with MLIR text only: the report tags
  it with the primitive whose op the pass held, as Pallas's own errors are."""
  def body(x_ref, o_ref):
    o_ref[...] = lax.erf(x_ref[...])  # <- no layout rule
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32))
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((128,), jnp.float32), backend="sim")
  assert e.value.primitive == "erf", str(e.value)
  assert "[erf] the Mosaic GPU lowering rejects this kernel" in str(e.value)
  assert e.value.where.endswith(f"{HERE}:{line_of(body, '<- no layout rule')}")


def _line(text):
  """The line of this file that holds `text` alone."""
  src = open(__file__).read().splitlines()
  return next(i for i, s in enumerate(src, 1) if s.strip() == text)


def test_layout_inference_that_finds_no_layouts_says_how_to_help_it():
  """A row sum carried through emit_pipeline from a plain jnp.zeros: the
  lowering's layout inference finds no layouts, and says only that; the
  report adds where to give it one. The error names no primitive (the pass
  held the kernel's op as a whole)."""
  tm, tn = 64, 256

  def body(x_ref, o_ref, o_smem):
    i = lax.axis_index("i")

    def step(_, xs, acc):
      r = acc + jnp.sum(xs[...].astype(jnp.float32), axis=1)
      plgpu.commit_smem()
      return r
    total = plgpu.emit_pipeline(
        step, grid=(512 // tn,), in_specs=[plgpu.BlockSpec((tm, tn), lambda j: (i, j))],
        max_concurrent_steps=2, init_carry=jnp.zeros((tm,), jnp.float32))(x_ref)
    o_smem[...] = total
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, o_ref.at[pl.ds(i * tm, tm)])
    plgpu.wait_smem_to_gmem(0)
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                   scratch_types=[plgpu.SMEM((tm,), jnp.float32)],
                   grid=(2,), grid_names=("i",))
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((128, 512), jnp.bfloat16), backend="sim")
  assert "Failed to infer a possible set of layouts" in str(e.value)
  # (the row sum is of a tile loaded with no layout: the fix goes on the load,
  # with which the kernel lowers and runs, and the error is placed there)
  load = _line("r = acc + jnp.sum(xs[...].astype(jnp.float32), axis=1)")
  assert (f"the reduce_sum at tests/test_errors.py:{load} is of a value loaded with no "
          f"layout at tests/test_errors.py:{load}") in str(e.value), str(e.value)
  assert "plgpu.load(ref.at[idx], layout=plgpu.Layout.WGMMA)" in str(e.value)
  assert e.value.where == f"tests/test_errors.py:{load}"
  assert e.value.primitive is None and "[mpmd_map]" not in str(e.value)


def test_layout_inference_over_a_read_narrower_than_a_warpgroup_names_the_read():
  """64 elements, fewer than a warpgroup's 128 threads, read and stored: no
  layout a read can take fits them, whatever the user casts; the error
  names the read and its size (it used to advise a layout_cast)."""
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64,), jnp.float32))
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((64,), jnp.float32), backend="sim")
  msg = str(e.value)
  at = f"{HERE}:{line_of(body, 'x_ref[...] + 1')}"
  assert "Failed to infer a possible set of layouts" in msg
  assert msg.partition(": ")[0].endswith(at), msg
  assert re.search(rf"the read at \S*{re.escape(at)} gives 64 elements, not a multiple of "
                   "a warpgroup's 128", msg), msg
  assert "layout_cast" not in msg and "loaded with no layout" not in msg, msg


def test_layout_inference_with_no_load_to_blame_says_where_layouts_can_be_given():
  """A loop's carry made by jnp.zeros, with no layout, summed over its rows:
  no load is to blame and no read is too narrow, so the error gives the
  general advice, which names the carry."""
  def body(x_ref, o_ref):
    acc = lax.fori_loop(0, 2, lambda i, a: a + x_ref[...], jnp.zeros((64, 128), jnp.float32))
    o_ref[...] = jnp.sum(acc, axis=0)[None, :] + acc
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((64, 128), jnp.float32))
  with pytest.raises(ps.LoweringError) as e:
    ps.run(k, jnp.ones((64, 128), jnp.float32), backend="sim")
  msg = str(e.value)
  assert "Failed to infer a possible set of layouts" in msg
  assert "plgpu.layout_cast(x, plgpu.Layout.WGMMA) on a loop's initial carry" in msg, msg
  assert "loaded with no layout" not in msg and "elements, not a multiple" not in msg, msg


@pytest.mark.parametrize("grid", [2, 3])
def test_a_tma_box_wholly_outside_its_array_warns_at_the_copy(grid):
  """A pipeline whose grid runs past the array: its last step's boxes lie
  wholly outside (the load reads zeros, the store writes nothing, as on the
  GPU); a warning names the copy's line. Within the array, no warning."""
  def body(x_ref, o_ref):
    def step(_, x_smem, o_smem):
      o_smem[...] = x_smem[...] + 1.0
    plgpu.emit_pipeline(  # <- the copies
        step, grid=(grid,),
        in_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0))],
        out_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0))])(x_ref, o_ref)
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128, 128), jnp.float32))
  x = jnp.ones((128, 128), jnp.float32)
  import warnings
  with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    np.testing.assert_array_equal(ps.run(k, x, backend="sim"), 2.0)
  outside = [w for w in got if issubclass(w.category, ps.OutOfBoundsWarning)]
  if grid == 2:
    assert not outside, [str(w.message) for w in outside]
    return
  assert outside and all(w.filename.endswith(HERE) and
                         w.lineno == line_of(body, "<- the copies") for w in outside)
  assert "a TMA box lies wholly outside x_ref of shape (128, 128)" in str(outside[0].message)
  assert "a TMA load reads zeros there" in str(outside[0].message)


def test_an_axis_of_a_jax_mesh_in_a_kernel_is_named_with_what_to_do():
  """lax.axis_index of a shard_map's axis in a kernel: the real lowering's
  check runs on the kernel alone (where it cannot resolve the axis) and the
  simulator runs one GPU; the error names the axis, the kernel's own axes and
  what to do, at the user's line. (Outside shard_map JAX itself refuses the
  name as it traces.)"""
  from jax.sharding import Mesh, PartitionSpec as P

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                grid=(1,), grid_names=("g",))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...] + lax.axis_index("x").astype(jnp.float32)

  x = jnp.arange(128, dtype=jnp.float32)
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
  f = jax.shard_map(k, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
  with pytest.raises(ps.UnsupportedPrimitiveError) as e:
    ps.run(f, x, backend="sim")
  text = str(e.value)
  assert e.value.primitive == "axis_index", text
  assert "lax.axis_index('x'): 'x' is not an axis of this kernel" in text, text
  assert "axes: g)" in text and "shard_map" in text, text
  assert e.value.where.endswith(
      f":{_line('o_ref[...] = x_ref[...] + lax.axis_index(\"x\").astype(jnp.float32)')}")
