"""wgmma: asynchronous warpgroup matmul-accumulate into an ACC, wgmma_wait,
and reading/writing the accumulator; and `plgpu.mma`, the synchronous
register matmul (Ampere mma.sync).

Each `wgmma` is one committed group with its own end time from the SM's
tensor-core timeline. The group reads its SMEM operands and updates the
accumulator when it completes, so operands overwritten while it is in flight
corrupt the result here as on hardware. Numerics follow the hardware bit for
bit (machine/numerics/tensor_core.py, fitted on an H200): f32 operands are truncated to
tf32 (the low 13 mantissa bits are ignored); products are aligned and
truncated per instruction slice of K; fp8 sums keep 13 fraction bits; int8
accumulates exactly in int32.
"""
import ml_dtypes
import numpy as np

from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.analysis import given_layouts
from pallas_sim.backends.sim.interpret import operands
from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.interpret.compiler import Gen, rule
from pallas_sim.backends.sim.machine.numerics import tensor_core
from pallas_sim.errors import KernelError, not_modelled

_HALF = {np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16),
         np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)}


def to_tf32(x):
  """f32 -> the tf32 value the tensor core uses (low 13 mantissa bits dropped)."""
  x = np.ascontiguousarray(x, dtype=np.float32)
  return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def operand(x, acc_dtype):
  """A wgmma operand as the tensor core sees it, in the accumulation type."""
  dt = x.dtype
  if dt == np.float32:
    return to_tf32(x)
  if dt in _HALF:
    return tensor_core.values_f32(x)
  if dt.kind in "iu":
    return x.astype(np.int32)
  raise KernelError(f"wgmma operand dtype {dt} is not supported on Hopper")


_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
_FP8 = {np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)}


def _types_ok(acc_dt, ab_dt):
  if acc_dt == _F32:
    return ab_dt in _HALF or ab_dt == _F32
  if acc_dt == _F16:
    return ab_dt == _F16 or ab_dt in _FP8
  if acc_dt == np.dtype(np.int32):
    return ab_dt.kind in "iu" and ab_dt.itemsize == 1
  return False


def _k_minor(view, k_axis):
  """True when K is the contiguous axis of an SMEM operand view."""
  return view.strides[k_axis] <= view.strides[1 - k_axis]


def validate(acc, a, b, a_in_smem, swizzle=None):
  """The lowering's wgmma restrictions (jax/experimental/mosaic/gpu/wgmma.py),
  with its messages, so the simulator rejects what it rejects. `swizzle`:
  the operands' swizzle in bytes where their transforms name it (the
  lowering infers one otherwise: at least 32)."""
  m, k = a.shape
  n = b.shape[1]
  for x in (a, b):
    if not _types_ok(acc.dtype, x.dtype):
      raise KernelError(
          f"Unsupported wgmma types: accumulator {acc.dtype}, operand {x.dtype}")
  if a.dtype.itemsize != b.dtype.itemsize:
    raise KernelError(f"wgmma operands differ in width: {a.dtype} and {b.dtype}")
  if n % 8 or n > 256:
    raise KernelError(f"N must be a multiple of 8 and <= 256, got: {n}")
  if m % 64:
    raise KernelError(f"M must be a multiple of 64, got: {m}")
  k_group = (swizzle or 32) // a.dtype.itemsize  # elements per swizzle-wide K group
  if k % k_group:
    raise KernelError(f"K must be a multiple of {k_group}, got: {k}")
  # Only 16-bit operands may be transposed in SMEM: others must be K-minor.
  if a.dtype.itemsize != 2 and (not _k_minor(b, 0) or (a_in_smem and not _k_minor(a, 1))):
    raise KernelError("Only f16 WGMMA supports transposes: 32-bit (tf32) and 8-bit "
                      "operands must have K as their contiguous axis in SMEM (store B "
                      "as (N, K) and pass its transposed view, b_smem.T)")


def _role(ref, role, words=None):
  """An operand as reports name it: its role, and its buffer's name where
  that says more (a ref checked from avals alone is named by its role)."""
  words = words or role
  return words if ref.buf.name == role else f"{words} {ref.buf.name}"


def _check_operands(acc_r, a_r, a_val, b_r):
  """Spaces, shapes and the lowering's rules for one wgmma; a_r is the lhs
  ref (None when the lhs is a register value a_val)."""
  if a_r is not None and a_r.buf.space != "smem":
    raise KernelError(f"wgmma {_role(a_r, 'lhs')} must be in SMEM or registers")
  if b_r.buf.space != "smem":
    raise KernelError(f"wgmma {_role(b_r, 'rhs')} must be in SMEM")
  if acc_r.buf.space != "regs":
    raise KernelError(f"wgmma {_role(acc_r, 'acc', 'accumulator')} must be a plgpu.ACC")
  a = a_r.view if a_r is not None else a_val
  (m, k), (k2, n) = a.shape, b_r.view.shape
  if k != k2 or acc_r.view.shape != (m, n):
    raise KernelError(f"wgmma shapes do not match: acc {acc_r.view.shape}, "
                      f"lhs {(m, k)}, rhs {(k2, n)}")
  validate(acc_r.view, a, b_r.view, a_r is not None, b_r.swizzle)


def _static_check(eqn, cx, ops, a_is_ref):
  """_check_operands from avals alone, when the kernel is compiled (before the
  real lowering's checks, at the user's line); False where the operands
  cannot be built statically (then the first issue checks them). `ops`:
  the wgmma's operands (operands.Wgmma)."""
  acc_r, a_r, b_r = (refview.static_ref(eqn.invars[r.index].aval, r.tree, name,
                                        given_layouts.of(cx.launch, eqn, r.index))
                     for r, name in ((ops.acc, "acc"), (ops.a, "lhs"), (ops.b, "rhs")))
  a_val = None
  if not a_is_ref:
    aval = eqn.invars[ops.a.index].aval
    a_r, a_val = None, np.broadcast_to(np.zeros((), aval.dtype), aval.shape)
  if acc_r is None or b_r is None or (a_is_ref and a_r is None):
    return False
  _check_operands(acc_r, a_r, a_val, b_r)
  return True


def mma(acc_view, a, b, sync=False):
  """acc += a @ b as the tensor core computes it (`sync`: for mma.sync)."""
  if acc_view.dtype == _F32:
    tensor_core.mma_f32(acc_view, operand(a, _F32), operand(b, _F32),
                        a.dtype.itemsize, sync)
    return
  r = np.matmul(operand(a, acc_view.dtype), operand(b, acc_view.dtype))
  acc_view[...] = acc_view + r.astype(acc_view.dtype)


@rule("wgmma_ref")
def _wgmma_ref(eqn, cx):
  ops = operands.wgmma(eqn)
  acc_op, a_op, b_op = ops.acc, ops.a, ops.b
  acc_at, a_at, b_at = (refview.compile_transforms(r.tree) for r in (acc_op, a_op, b_op))
  timing = cx.timing
  numerics = cx.numerics
  a_is_ref = hasattr(eqn.invars[a_op.index].aval, "inner_aval")
  where = cx.where(eqn)
  checked = [True] if _static_check(eqn, cx, ops, a_is_ref) else []

  def wgmma(wg, *args):
    acc_r = acc_at(args[acc_op.index], args[acc_op.leaves])
    b_r = b_at(args[b_op.index], args[b_op.leaves])
    if a_is_ref:
      a_r, a_val = a_at(args[a_op.index], args[a_op.leaves]), None
      m, k = a_r.view.shape
    else:
      a_r, a_val = None, np.asarray(args[a_op.index])  # registers: read at issue
      m, k = a_val.shape
    if not checked:
      _check_operands(acc_r, a_r, a_val, b_r)
      checked.append(True)
    n = b_r.view.shape[1]
    blk = wg.block
    blk.stats.wgmma_flops += 2 * m * n * k
    blk.stats.tensor_f16_flops += 2 * m * n * k * timing.f16_equivalent(b_r.view.dtype)
    if any(blk.engines.spill):  # (timing/occupancy.py, timing/model.py)
      # The accumulator goes out and back once the tensor cores are done
      # with it: after the wgmma before, then this one starts.
      since = wg.time
      t = max(wg.time, blk.engines.tc_free)
      wg.time = t + timing.spill(blk.engines, t)
      blk.stats.stalls["spill"] += wg.time - since
    start, done, held, issued = timing.wgmma(blk.engines, wg.time, m, n, k,
                                             b_r.view.dtype)
    wg.time = held
    if held > issued:  # (in the issue while the tensor cores' queue was full)
      wg.stalled("tensor core", issued)
    if wg.wgmma:
      done = max(done, wg.wgmma[-1][0])  # groups retire in order
    acc_view, b_view = acc_r.view, b_r.view
    a_view = a_r.view if a_r is not None else a_val
    group = [done]
    wg.wgmma.append(group)
    wg.wg_issued += 1
    op = blk.hb.wgmma(wg, [(r, access) for r, access in (
        (a_r, "read"), (b_r, "read"), (acc_r, "write")) if r is not None], where)

    def finish():
      blk.hb.wgmma_done(op)
      for r in (a_r, b_r):
        if r is not None:
          blk.group.read(r, "wgmma", "wgmma", where, wg.index, blk)
      if numerics:
        mma(acc_view, a_view, b_view)
      wg.wgmma.remove(group)
      blk.sched.notify(wg.wgmma_res)
    blk.at(done, finish)
    blk.event(f"{wg.name} wgmma", f"wgmma {m}x{n}x{k}", start, done)
    return []
  return wgmma


@rule("wgmma_wait")
def _wgmma_wait(eqn, cx):
  n = eqn.params["n"]
  where = cx.where(eqn)

  def wait(wg):
    yield from wg.wait_wgmma(n, f"wgmma_wait({n})", where)
    return []
  return Gen(wait)


@rule("wgmma_accumulator_deref")
def _acc_deref(eqn, cx):
  # acc[...] is wgmma_accumulator_load(acc, wait_n=0); wait_n=None waits
  # for nothing. A report names the call the user wrote.
  n = jx.param(eqn, "wait_n")
  label = "acc[...]" if n == 0 else f"wgmma_accumulator_load(wait_n={n})"
  where = cx.where(eqn)

  def deref(wg, acc):
    if n is not None:
      yield from wg.wait_wgmma(n, f"accumulator read ({label})", where)
    wg.block.hb.plain(wg, acc, False, label, where)
    return acc.view.copy()
  return Gen(deref)


@rule("wgmma_accumulator_store")
def _acc_store(eqn, cx):
  where = cx.where(eqn)

  def store(wg, acc, val):
    wg.block.hb.plain(wg, acc, True, "acc[...] =", where)
    acc.view[...] = val
    return []
  return store


@rule("mma")
def _mma_sync(eqn, cx):
  """acc + a @ b from registers, synchronously (mma.sync). Integer operands
  accumulate exactly in int32 (wrapping); float ones into f32 as the tensor
  core sums (machine/numerics/tensor_core.py SYNC, fitted on an H200). Other
  accumulators (f16, f64) are not fitted on the GPU and are rejected."""
  acc_dt = np.dtype(eqn.invars[0].aval.dtype)
  if acc_dt not in (_F32, np.dtype(np.int32)):
    raise not_modelled(
        f"mma with a {acc_dt} accumulator: only f32 and int32 accumulation is "
        "modelled (the tensor core's rounding into others is not measured)")

  def run(wg, acc, a, b):
    a, b = np.asarray(a), np.asarray(b)
    if acc_dt == np.int32:
      prod = a.astype(np.int64) @ b.astype(np.int64)
      return (np.asarray(acc, np.int64) + prod).astype(np.int32)
    out = np.array(acc, _F32, copy=True)
    mma(out, a, b, sync=True)
    return out
  return run
