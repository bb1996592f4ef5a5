"""The simulator's own checks, each on its own: with the real lowering's check
switched off (check_lowering=False) every kernel below must still be
rejected, with our error class, our message and the line of the offending
call in this file; the real lowering (jax.export for Hopper, on the CPU)
must reject the same kernel; and with the lowering check on (the default),
our error must come first, so that it names the precise line."""
import inspect
import os

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from test_lowering_agreement import lowering_error

F16, BF16, F32, I32 = jnp.float16, jnp.bfloat16, jnp.float32, jnp.int32
HERE = os.path.relpath(__file__)  # (how reports name files: relative to the cwd)


def _line(fn, tag="# <-"):
  """The line in this file marked with `tag` inside fn's source."""
  src, start = inspect.getsourcelines(fn)
  [i] = [i for i, s in enumerate(src) if tag in s]
  return f"{HERE}:{start + i}"


def copy_kernel(shape, dtype, box, tiled=False):
  """A TMA round trip of a `box` of x through SMEM."""
  T = dict(transforms=(plgpu.TilingTransform((8, 128 // jnp.dtype(dtype).itemsize)),
                       plgpu.SwizzleTransform(128))) if tiled else {}

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, dtype),
                scratch_types=[plgpu.SMEM(box, dtype, **T), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    idx = tuple(pl.ds(0, b) for b in box)
    plgpu.copy_gmem_to_smem(x_ref.at[idx], smem, bar)  # <-
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref.at[idx])
    plgpu.wait_smem_to_gmem(0)
  return k, (jnp.ones(shape, dtype),)


def indexed_copy_kernel(shape, index, dtype=BF16):
  """A TMA round trip through SMEM of x.at[index]: an int drops its
  dimension, a pair (start, size) slices it."""
  idx = tuple(i if isinstance(i, int) else pl.ds(*i) for i in index)
  box = tuple(i[1] for i in index if not isinstance(i, int))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(shape, dtype),
                scratch_types=[plgpu.SMEM(box, dtype), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[idx], smem, bar)  # <-
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref.at[idx])
    plgpu.wait_smem_to_gmem(0)
  return k, (jnp.ones(shape, dtype),)


def store_kernel(n, dtype):
  """A TMA store of n elements (a row under 16 bytes when n is small)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((8, n), dtype),
                scratch_types=[plgpu.SMEM((8, n), dtype)])
  def k(o_ref, smem):
    smem[...] = jnp.zeros((8, n), dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)  # <-
    plgpu.wait_smem_to_gmem(0)
  return k, ()


def reduce_store_kernel(op, dtype):
  """A TMA reduction store (`op`) of SMEM into the output."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), dtype),
                scratch_types=[plgpu.SMEM((128,), dtype)])
  def k(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref, reduction_op=op)  # <-
    plgpu.wait_smem_to_gmem(0)
  return k, (jnp.ones((128,), dtype),)


def wgmma_kernel(m=64, n=128, k=64, a_dtype=F16, b_dtype=F16, acc_dtype=F32,
                 transpose_a=False, transpose_b=False, swizzle=None):
  """One wgmma of an (m, k) and a (k, n) SMEM operand (A stored (k, m) and B
  (n, k), passed transposed, with transpose_a/b); explicit swizzle
  transforms if given."""
  def T(dtype):
    if swizzle is None:
      return {}
    return dict(transforms=(plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
                            plgpu.SwizzleTransform(swizzle)))
  a_shape = (k, m) if transpose_a else (m, k)
  b_shape = (n, k) if transpose_b else (k, n)
  halves = 1 if b_shape[1] <= 256 else 2

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((m, n), acc_dtype),
                scratch_types=dict(a_s=plgpu.SMEM(a_shape, a_dtype, **T(a_dtype)),
                                   b_s=plgpu.SMEM(b_shape, b_dtype, **T(b_dtype)),
                                   bar=plgpu.Barrier(num_arrivals=1 + halves),
                                   acc=plgpu.ACC((m, n), acc_dtype)))
  def kern(a_ref, b_ref, o_ref, a_s, b_s, bar, acc):
    plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    # (B in column halves where it is wider than a TMA box may be)
    for h in range(halves):
      cols = pl.ds(h * n // halves, n // halves)
      plgpu.copy_gmem_to_smem(b_ref.at[:, cols], b_s.at[:, cols], bar)
    plgpu.barrier_wait(bar)
    plgpu.wgmma(acc, a_s.T if transpose_a else a_s, b_s.T if transpose_b else b_s)  # <-
    o_ref[...] = acc[...]
  return kern, (jnp.ones(a_shape, a_dtype), jnp.ones(b_shape, b_dtype))


def smem_kernel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32),  # <-
                scratch_types=[plgpu.SMEM((240 * 1024 // 4,), F32)])
  def k(x_ref, o_ref, smem):
    smem[pl.ds(0, 128)] = x_ref[...]
    o_ref[...] = smem[pl.ds(0, 128)]
  return k, (jnp.ones((128,), F32),)


def gmem_scratch_kernel():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), I32),  # <-
                scratch_types=[plgpu.GMEM((128,), I32)])
  def k(o_ref, g_ref):
    o_ref[...] = jnp.zeros((128,), I32)
  return k, ()


# (id, kernel factory and its arguments, our class, our message (regex), what
# the lowering says where it names the same rule)
def print_kernel(fmt, what="scalar", dtype=F32):
  """A debug_print of `what`: a scalar of dtype, x as an array, two arrays,
  or a keyword argument (jax.debug.print)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32))
  def k(x_ref, o_ref):
    x = x_ref[...]
    args = {"scalar": (x_ref[0].astype(dtype),), "two arrays": (x, x)}.get(what, ())
    kw = dict(x=x_ref[0]) if what == "keyword" else {}
    (jax.debug.print if kw else pl.debug_print)(fmt, *args, **kw)  # <-
    o_ref[...] = x
  return k, (jnp.ones((128,), F32),)


CHECKS = [
    ("smem_overflow", smem_kernel, {}, ps.SmemOverflowError,
     r"Mosaic GPU kernel exceeds available shared memory: smem_bytes=245760 > "
     r"max_smem_bytes=232448", "smem_bytes=245760 > max_smem_bytes=232448"),
    ("scoped_gmem", gmem_scratch_kernel, {}, ps.KernelError,
     r"Unsupported memory space: gmem", "Unsupported memory space: gmem"),
    ("tma_row_under_16_bytes", store_kernel, dict(n=2, dtype=I32), ps.KernelError,
     r"\[copy_smem_to_gmem\] .*Async copies require all GMEM strides except the last "
     r"one to be a multiple of 16 bytes", None),
    ("tma_box_row_under_16_bytes", copy_kernel, dict(shape=(16, 8), dtype=I32, box=(8, 2)),
     ps.KernelError,
     r"\[copy_gmem_to_smem\] .*Async copies require the number of bits copied along "
     r"the last dimension to be divisible by 128, but got 64",
     "divisible by 128, but got 64"),
    # (rows of 40 bytes: the box's 16 are fine, the indexed dimension's stride not)
    ("tma_indexed_row_stride", indexed_copy_kernel, dict(shape=(4, 20), index=(1, (0, 8))),
     ps.KernelError, r"\[copy_gmem_to_smem\] .*all GMEM strides except the last one to be "
     r"a multiple of 16 bytes", "all GMEM strides except the last one to be a multiple of 16"),
    # (the indexed dimension's 2-byte stride: last in the array, not in the
    # descriptor, which puts indexed dimensions first)
    ("tma_indexed_inner_stride", indexed_copy_kernel,
     dict(shape=(16, 8, 1), index=((0, 8), 3, (0, 1))),
     ps.KernelError, r"\[copy_gmem_to_smem\] .*all GMEM strides except the last one to be "
     r"a multiple of 16 bytes", "all GMEM strides except the last one to be a multiple of 16"),
    ("tma_box_over_256", copy_kernel, dict(shape=(16, 512), dtype=F32, box=(8, 512)),
     ps.KernelError,
     r"\[copy_gmem_to_smem\] .*Async copies only support copying <=256 elements "
     r"along each dimension, got \(8, 512\)",
     "Async copies only support copying <=256 elements along each dimension, got (8, 512)"),
    ("tma_box_over_256_rows", copy_kernel, dict(shape=(1024, 16), dtype=F16, box=(512, 16)),
     ps.KernelError, r"<=256 elements along each dimension, got \(512, 16\)",
     "<=256 elements along each dimension, got (512, 16)"),
    ("tma_reduction_type", reduce_store_kernel, dict(op="max", dtype=F32),
     ps.KernelError, r"\[copy_smem_to_gmem\] Reduction op max not supported by the "
     r"TMA implementation for element type float32",
     "Reduction op max not supported by the TMA implementation for element type f32"),
    ("wgmma_m", wgmma_kernel, dict(m=32), ps.KernelError,
     r"\[wgmma_ref\] M must be a multiple of 64, got: 32", None),
    ("wgmma_n", wgmma_kernel, dict(n=512), ps.KernelError,
     r"\[wgmma_ref\] N must be a multiple of 8 and <= 256, got: 512", None),
    ("wgmma_k_of_the_swizzle", wgmma_kernel,
     dict(k=32, swizzle=128, transpose_a=True),
     ps.KernelError, r"\[wgmma_ref\] K must be a multiple of 64, got: 32",
     "K must be a multiple of 64, got: 32"),
    ("wgmma_int32_operands", wgmma_kernel, dict(a_dtype=I32, b_dtype=I32),
     ps.KernelError, r"Unsupported wgmma types: accumulator float32, operand int32",
     None),
    ("wgmma_tf32_transposed_b", wgmma_kernel, dict(a_dtype=F32, b_dtype=F32),
     ps.KernelError, r"Only f16 WGMMA supports transposes",
     "Only f16 WGMMA supports transposes"),
    ("wgmma_int8_into_f32", wgmma_kernel,
     dict(a_dtype=jnp.int8, b_dtype=jnp.int8, transpose_b=True, k=128),
     ps.KernelError, r"Unsupported wgmma types: accumulator float32, operand int8",
     None),
    ("wgmma_bf16_into_f16", wgmma_kernel, dict(a_dtype=BF16, b_dtype=BF16, acc_dtype=F16),
     ps.KernelError, r"Unsupported wgmma types: accumulator float16, operand bfloat16",
     "only supports accumulators of type f32"),
    ("debug_print_format_spec", print_kernel, dict(fmt="x {:.2f}"), ps.KernelError,
     r"\[debug_print\] The format string should not contain any format specs",
     "The format string should not contain any format specs or conversions"),
    ("debug_print_placeholders", print_kernel, dict(fmt="x {} {}"), ps.KernelError,
     r"\[debug_print\] The format string expects 2 arguments, but got 1",
     "The format string expects 2 arguments, but got 1"),
    ("debug_print_keywords", print_kernel, dict(fmt="x {x}", what="keyword"),
     ps.KernelError, r"Only positional arguments are supported by debug_print",
     "Only positional arguments are supported by debug_print on Pallas"),
    ("debug_print_two_arrays", print_kernel, dict(fmt="{} {}", what="two arrays"),
     ps.UnsupportedPrimitiveError, r"debug_print only supports printing of scalar "
     r"values, or a single array", "only supports printing of scalar values"),
    ("debug_print_fp8", print_kernel, dict(fmt="x {}", dtype=jnp.float8_e4m3fn),
     ps.UnsupportedPrimitiveError, r"Can't print the type float8_e4m3fn", None),
]


@pytest.mark.parametrize("name,make,kw,cls,msg,real_msg", CHECKS,
                         ids=[c[0] for c in CHECKS])
def test_own_check_rejects_alone_with_our_message_and_line(name, make, kw, cls, msg,
                                                           real_msg):
  fn, args = make(**kw)
  where = _line(make)
  with pytest.raises(cls, match=msg) as e:
    ps.run(fn, *args, backend="sim", check_lowering=False)
  assert not isinstance(e.value, ps.LoweringError)
  assert e.value.where == where, (e.value.where, where)
  assert str(e.value).startswith(f"{where}: ")
  real = lowering_error(fn, *args)
  assert real is not None, "the real lowering accepts this kernel"
  if real_msg:
    assert real_msg in real, real
  # With the lowering check on, ours still comes first.
  with pytest.raises(cls, match=msg) as e2:
    ps.run(fn, *args, backend="sim")
  assert not isinstance(e2.value, ps.LoweringError) and e2.value.where == where


def barrier_misuse_kernel(what):
  """A barrier operation on SMEM that holds no barrier, or on an array of
  barriers not indexed down to one."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32),
                scratch_types=[plgpu.SMEM((128,), F32), plgpu.Barrier(num_barriers=2)])
  def k(x_ref, o_ref, smem, bar):
    if what == "smem":
      plgpu.barrier_wait(smem)  # <-
    else:
      plgpu.barrier_arrive(bar)  # <-
    o_ref[...] = x_ref[...]
  return k, (jnp.ones((128,), F32),)


@pytest.mark.parametrize("what, msg", [
    ("smem", r"\[barrier_wait\] barrier_wait: smem is not a barrier ref"),
    ("array", r"\[barrier_arrive\] barrier_arrive: barrier ref bar of shape \(2,\) must be "
              r"indexed down to one barrier")])
def test_a_barrier_operation_on_what_is_not_one_barrier_is_refused_at_its_line(what, msg):
  """Checked as the kernel runs: with the lowering's check on (the default),
  the lowering refuses the kernel first, at the same line (for SMEM with
  "'OpResult' object has no attribute 'wait'")."""
  fn, args = barrier_misuse_kernel(what)
  src, start = inspect.getsourcelines(barrier_misuse_kernel)
  marked = [start + i for i, s in enumerate(src) if "# <-" in s]
  where = f"{HERE}:{marked[0] if what == 'smem' else marked[1]}"
  with pytest.raises(ps.KernelError, match=msg) as e:
    ps.run(fn, *args, backend="sim", check_lowering=False)
  assert e.value.where == where, (e.value.where, where)
  with pytest.raises(ps.LoweringError) as e2:
    ps.run(fn, *args, backend="sim")
  assert e2.value.where == where, (e2.value.where, where)
