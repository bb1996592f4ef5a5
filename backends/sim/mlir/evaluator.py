"""A SIMT evaluator of the Mosaic GPU IR that `plgpu.inline_mgpu` bodies build.

An inline_mgpu body is Python that emits MLIR (FragmentedArray operations
unroll into per-thread register code: arith, vector, llvm pointer loads and
stores, nvvm.ldmatrix, gpu.thread_id...). The simulator builds that IR once
per kernel (interpret/rules/inline_mgpu.py) and evaluates it here for the lanes that
run it, all at once: every SSA value is a numpy array whose leading axis is
the lane (of size 1 where the value is the same in every lane), so one op
costs one numpy operation, not one per thread.

Memory is a byte arena of the buffers the body may touch (its refs, staged
in the physical order the GPU has them: tiled and swizzled SMEM), with real
byte addresses, because FragmentedArray code computes swizzled addresses
and goes through pointers. Lanes run in lockstep, so barriers among the
lanes that run the body order nothing more here. Named barriers (bar.sync,
bar.arrive, nvvm.barrier...) and async-proxy fences at the body's top level
split it into segments (`run_segments`): the rule carries each out between
them, so that a bar.sync can wait for other warpgroups. Nested in the
body's control flow, a fence is handed to the rule with its segment, and a
named barrier must be the lanes' own (its count theirs). Control flow whose
condition differs between lanes runs both arms under masks.

An op this evaluator does not know raises UnsupportedPrimitiveError naming
it, never a silent skip.
"""
import math
import re
from collections.abc import Callable
from typing import Any, TypeVar

import ml_dtypes
import numpy as np

from pallas_sim.backends.sim.machine.numerics import division, rounding
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.errors import KernelError, UnsupportedPrimitiveError

ARENA_BASE = 1 << 20  # (an address that is no null pointer, 1024-aligned)
_DYN64 = -(1 << 63)    # MLIR's ShapedType::kDynamic
_DYN32 = -(1 << 31)    # llvm.getelementptr's dynamic index marker

_FLOATS = (
    (jx.ir.F16Type, np.float16), (jx.ir.BF16Type, ml_dtypes.bfloat16),
    (jx.ir.F32Type, np.float32), (jx.ir.F64Type, np.float64),
    (jx.ir.Float8E4M3FNType, ml_dtypes.float8_e4m3fn),
    (jx.ir.Float8E5M2Type, ml_dtypes.float8_e5m2),
)


def unsupported(what):
  return UnsupportedPrimitiveError(
      f"inline_mgpu: {what} is not modelled by pallas-sim's IR evaluator")


def dtype_of(t):
  """The numpy dtype that holds values of MLIR element type t: integers are
  signless, kept unsigned (ops that care view them signed); i1 is bool."""
  if isinstance(t, jx.ir.IndexType):
    return np.dtype(np.int64)
  if isinstance(t, jx.ir.IntegerType):
    w = jx.ir.IntegerType(t).width
    if w == 1:
      return np.dtype(bool)
    if w in (8, 16, 32, 64):
      return np.dtype(f"u{w // 8}")
    raise unsupported(f"the integer type {t}")
  for cls, dt in _FLOATS:
    if isinstance(t, cls):
      return np.dtype(dt)
  if "!llvm.ptr" in str(t):
    return np.dtype(np.int64)
  raise unsupported(f"the type {t}")


def _signed(a):
  return a.view(f"i{a.dtype.itemsize}") if a.dtype.kind == "u" else a


def _unsigned(a):
  return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "i" else a


class MemRef:
  """A memref descriptor: base address (bytes), offset, sizes and strides
  (elements). The offset may differ per lane (an array)."""
  __slots__ = ("base", "offset", "shape", "strides", "dtype", "space")

  def __init__(self, base, offset, shape, strides, dtype, space="gmem"):
    self.base, self.offset = base, offset
    self.shape, self.strides, self.dtype = tuple(shape), tuple(strides), dtype
    self.space = space

  def addresses(self, idx):
    off = self.offset
    for i, s in zip(idx, self.strides):
      off = off + np.asarray(i, np.int64) * s
    return self.base + np.asarray(off, np.int64) * self.dtype.itemsize


class Arena:
  """The bytes an evaluation may touch; `read`/`written` mark what it did."""

  def __init__(self, nbytes):
    self.data = np.zeros(nbytes, np.uint8)
    self.read = np.zeros(nbytes, bool)
    self.written = np.zeros(nbytes, bool)

  def _index(self, addr, nbytes):
    idx = np.asarray(addr, np.int64)[..., None] - ARENA_BASE + np.arange(nbytes)
    if idx.size and (idx.min() < 0 or idx.max() >= self.data.size):
      raise KernelError("inline_mgpu: an access outside the refs passed to "
                        "the body (out of bounds)")
    return idx

  def load(self, addr, dtype, count=1, mask=None):
    """Loads of `count` elements at each address: addr (lanes,) or any
    shape with no mask; only the lanes in `mask` load (the others get 0)."""
    tail = (count,) if count > 1 else ()
    addr = np.asarray(addr, np.int64)
    if mask is not None and not np.all(mask):
      n = max(addr.shape[0] if addr.ndim else 1, np.size(mask))
      addr = np.broadcast_to(addr.reshape(-1), (n,))
      m = np.broadcast_to(np.asarray(mask).reshape(-1), (n,))
      out = np.zeros((n,) + tail, dtype)
      if m.any():
        out[m] = self.load(addr[m], dtype, count)
      return out
    idx = self._index(addr, dtype.itemsize * count)
    self.read[idx] = True
    return self.data[idx].reshape(-1).view(dtype).reshape(addr.shape + tail)

  def store(self, addr, value, dtype, count=1, mask=None):
    """Stores per lane: addr (lanes,) (or (1,): the same for every lane),
    value (lanes,) or (lanes, count), both broadcast; only the lanes in
    `mask` store."""
    addr = np.asarray(addr, np.int64).reshape(-1)
    value = np.asarray(value, dtype)
    value = value.reshape((-1, count) if count > 1 else (-1,))
    n = max(len(addr), value.shape[0], np.size(mask) if mask is not None else 1)
    addr = np.broadcast_to(addr, (n,))
    value = np.broadcast_to(value, (n,) + value.shape[1:])
    if mask is not None:
      m = np.broadcast_to(np.asarray(mask).reshape(-1), (n,))
      addr, value = addr[m], value[m]
    idx = self._index(addr, dtype.itemsize * count)
    self.data[idx] = np.ascontiguousarray(value).reshape(-1).view(np.uint8).reshape(idx.shape)
    self.written[idx] = True


class Lanes:
  """Who evaluates: `tid` the thread_id.x of each lane, the block's place in
  the CUDA grid, and `marker(op_index, operand values)` for the launch
  context's operations (async copies) that the rule implements."""
  fences: list["Sync"]  # the nested fences of the segment run last (run_segments)

  def __init__(self, tid, block_dim, block_id, grid_dim, cluster_block_id,
               cluster_dim_blocks, arena, marker=None):
    self.tid = np.asarray(tid, np.int64)
    self.n = len(self.tid)
    self.block_dim = block_dim
    self.block_id, self.grid_dim = block_id, grid_dim
    self.cluster_block_id, self.cluster_dim_blocks = cluster_block_id, cluster_dim_blocks
    self.arena = arena
    self.marker = marker


# --- compilation: ops -> steps ------------------------------------------------

# A step: (handler, its static operand, operand slots, result slots).
Step = tuple[Callable[..., Any], Any, list[int], list[int]]


class Program:
  """A block's ops as steps over an environment of slots. At the top level
  the steps come in `segments`: (steps, Sync or None), each segment's steps
  then the synchronization that ends it."""
  __slots__ = ("steps", "args", "results", "nslots", "segments")
  steps: list[Step]
  args: list[int]             # slots of the block's arguments
  results: list[int]          # slots of its terminator's operands
  nslots: int                 # (the top level's: slots of the whole body)
  segments: list[tuple[list[Step], "Sync | None"]]


class Sync:
  """A named barrier or fence the rule carries out (interpret/rules/
  inline_mgpu.py): `kind` "bar" (`op` "sync" or "arrive") or "fence" (`op`
  the proxy it orders: "async_shared", "async_global", "async"); the
  barrier's id and thread count, each an int, None (the default: barrier
  0, every thread of the block) or ("operand", slot)."""
  __slots__ = ("kind", "op", "id", "count", "text")

  def __init__(self, kind, op, bid=None, count=None, text=""):
    self.kind, self.op, self.id, self.count, self.text = kind, op, bid, count, text

  def value(self, spec, env):
    if isinstance(spec, tuple):
      return _uniform(_signed(np.asarray(env[spec[1]])), f"the {self.text} operand")
    return spec


# `bar.sync a{, b};` and its spellings (barrier.sync.aligned, bar.cta.arrive...)
_BAR_PTX = re.compile(r"^(bar|barrier)(\.cta)?\.(sync|arrive|red)(\.aligned)?"
                      r"(\.[a-z0-9]+)*\s+([^;]*);?$")


def _ptx_operand(text, operands):
  text = text.strip()
  if re.fullmatch(r"\$\d+", text):
    return ("operand", operands[int(text[1:])])
  try:
    return int(text, 0)
  except ValueError:
    raise unsupported(f"the barrier operand '{text}' in inline PTX") from None


def sync_of(op, ctx):
  """The Sync an op is, None if it is none (or only orders the lanes that
  run the body: bar.warp.sync, thread fences); raises for barrier forms that
  are not modelled."""
  name = op.name
  slots = lambda vals: [ctx.slot(v) for v in vals]
  if name == "llvm.inline_asm":
    if any(str(r.type) != "!llvm.void" for r in op.results):
      text = str(jx.ir.StringAttr(_attr(op, "asm_string")).value)
      if _BAR_PTX.match(" ".join(text.split())):
        raise unsupported(f"inline PTX '{' '.join(text.split())}' (a barrier with a "
                          "reduction)")
      return None
    text = " ".join(str(jx.ir.StringAttr(_attr(op, "asm_string")).value).split())
    m = _BAR_PTX.match(text)
    if m:
      if text.startswith("@") or m.group(3) == "red":
        raise unsupported(f"inline PTX '{text}' (a predicated barrier or one with "
                          "a reduction)")
      operands = slots(op.operands)
      args = [a for a in m.group(6).split(",") if a.strip()]
      if not 1 <= len(args) <= 2:
        raise unsupported(f"inline PTX '{text}'")
      bid = _ptx_operand(args[0], operands)
      count = _ptx_operand(args[1], operands) if len(args) > 1 else None
      return Sync("bar", m.group(3), bid, count, text)
    if text.startswith("fence.proxy.async"):
      space = ("async_shared" if ".shared" in text else
               "async_global" if ".global" in text else "async")
      return Sync("fence", space, text=text)
    return None
  if name in ("gpu.barrier", "nvvm.barrier0"):
    return Sync("bar", "sync", 0, None, name)
  if name in ("nvvm.barrier", "nvvm.barrier.arrive"):
    view = op.opview  # (its optional operands by name)
    bid, count = view.barrierId, view.numberOfThreads
    return Sync("bar", "sync" if name == "nvvm.barrier" else "arrive",
                0 if bid is None else ("operand", ctx.slot(bid)),
                None if count is None else ("operand", ctx.slot(count)), name)
  if name == "nvvm.barrier.reduction":
    raise unsupported("nvvm.barrier.reduction (a barrier with a reduction)")
  if name == "nvvm.fence.proxy":
    kind = str(_attr(op, "kind"))
    if "async" not in kind:
      return None
    space = str(op.attributes["space"]) if "space" in op.attributes else ""
    return Sync("fence", "async_shared" if "shared" in kind + space else
                "async_global" if "global" in kind + space else "async", text=name)
  return None


class _Ctx:
  def __init__(self):
    self.slots: dict[Any, int] = {}

  def slot(self, v):
    s = self.slots.get(v)
    if s is None:
      s = self.slots[v] = len(self.slots)
    return s


def compile_block(block, ctx=None):
  """Compiles an MLIR block; its terminator's operands are the results."""
  top = ctx is None
  ctx = ctx or _Ctx()
  prog = Program()
  prog.args = [ctx.slot(a) for a in block.arguments]
  prog.steps = []
  prog.segments = []
  prog.results = []
  products: dict[Any, tuple[Any, ...]] = {}  # mulf results of this block -> their operands
  for op in block.operations:
    op = op.operation
    name = op.name
    if name in ("scf.yield", "func.return", "mosaic_gpu.return"):
      prog.results = [ctx.slot(v) for v in op.operands]
      continue
    sync = sync_of(op, ctx)
    if sync is not None:
      if top:  # (the rule carries it out between segments)
        prog.segments.append((prog.steps, sync))
        prog.steps = []
      else:
        prog.steps.append((_nested_sync, sync, [], []))
      continue
    if name == "arith.mulf":
      products[op.results[0]] = tuple(op.operands)
    fused = _contracted(op, products, ctx) if name in ("arith.addf", "arith.subf") else None
    if fused is not None:
      prog.steps.append(fused)
      continue
    handler = _OPS.get(name)
    if handler is None:
      raise unsupported(f"the MLIR operation '{name}'")
    static = handler.prepare(op, ctx) if hasattr(handler, "prepare") else op
    ins = [ctx.slot(v) for v in op.operands]
    outs = [ctx.slot(v) for v in op.results]
    prog.steps.append((handler, static, ins, outs))
  prog.segments.append((prog.steps, None))
  if top:
    prog.nslots = len(ctx.slots)
  return prog


def _nested_sync(lanes, mask, sync):
  """A barrier or fence inside the body's control flow: a fence goes to the
  rule with its segment; a named barrier can only be the lanes' own (the
  body cannot wait for other threads from inside its control flow)."""
  if mask is not None and not np.any(mask):
    return None
  if sync.kind == "fence":
    lanes.fences.append(sync)
    return None
  env = _ENV[-1]
  count = sync.value(sync.count, env)
  if count != lanes.n or (mask is not None and not np.all(mask)):
    raise unsupported(
        f"'{sync.text}' inside control flow of the body (a barrier over "
        f"{count if count is not None else 'all the block'}'s threads where "
        f"{lanes.n} lanes run it: only barriers at the body's top level can wait "
        "for other threads here)")
  return None


def _contracted(op, products, ctx):
  """A float add/sub with an operand that a mulf of the same block computed,
  as the GPU's compiler emits it: one fused multiply-add, rounded once (as
  for kernels' own jaxprs, interpret.contractions; the first operand's
  product where both are)."""
  a, b = op.operands
  dt = _elem_dtype(op.results[0].type)
  if dt == np.float64:  # (rounding.fma is exact for operands of <= 26 bits)
    return None
  sub = op.name == "arith.subf"
  for i, v in enumerate((a, b)):
    if v in products:
      x, y = products[v]
      other = b if i == 0 else a
      sp = -1.0 if (sub and i == 1) else 1.0
      sc = -1.0 if (sub and i == 0) else 1.0
      ins = [ctx.slot(x), ctx.slot(y), ctx.slot(other)]
      return (_fused, (dt, sp, sc), ins, [ctx.slot(op.results[0])])
  return None


def _fused(lanes, mask, static, x, y, c):
  dt, sp, sc = static
  return rounding.fma(np.asarray(x, np.float64) * sp, y, np.asarray(c, np.float64) * sc, dt)


def _run(prog, lanes, env, args, mask):
  for s, a in zip(prog.args, args):
    env[s] = a
  _steps(prog.steps, lanes, env, mask)
  return [env[i] for i in prog.results]


def _steps(steps, lanes, env, mask):
  for handler, static, ins, outs in steps:
    res = handler(lanes, mask, static, *[env[i] for i in ins])
    if len(outs) == 1:
      env[outs[0]] = res
    elif outs:
      for o, v in zip(outs, res):
        env[o] = v


_OPS: dict[str, Callable[..., Any]] = {}
H = TypeVar("H", bound=Callable[..., Any])


def op(*names: str) -> Callable[[H], H]:
  def deco(f: H) -> H:
    for n in names:
      _OPS[n] = f
    return f
  return deco


def prepares(fn: Callable[[Any, _Ctx], Any]) -> Callable[[H], H]:
  """Gives an op handler a compile-time `prepare(op, ctx) -> static`."""
  def deco(f: H) -> H:
    setattr(f, "prepare", fn)  # (compile_block asks each handler for one)
    return f
  return deco


def _attr(op, name):
  return op.attributes[name]


def _i64s(attr):
  return list(jx.ir.DenseI64ArrayAttr(attr))


def _result_type(op, i=0):
  return op.results[i].type


def _elem_dtype(t):
  if isinstance(t, jx.ir.VectorType):
    return dtype_of(jx.ir.VectorType(t).element_type)
  return dtype_of(t)


def _vshape(t):
  return tuple(jx.ir.VectorType(t).shape) if isinstance(t, jx.ir.VectorType) else ()


# --- arith / llvm integer and float arithmetic -------------------------------

def _typed(op):
  t = _result_type(op)
  return _elem_dtype(t), _vshape(t)


def _const_value(attr, t):
  dt = _elem_dtype(t)
  shape = _vshape(t)
  if isinstance(attr, jx.ir.DenseElementsAttr):
    d = jx.ir.DenseElementsAttr(attr)
    if d.is_splat:
      v = _scalar_attr(d.get_splat_value(), dt)
      return np.full((1,) + shape, v, dt)
    try:
      vals = np.array(d)
    except TypeError:
      vals = np.array(None)
    if vals.dtype == object or vals.size != math.prod(shape):  # (bf16, fp8: their text)
      dense = re.match(r"dense<(.*)>\s*:", str(attr))
      assert dense is not None, attr  # (how a DenseElementsAttr prints)
      body = dense.group(1)
      try:
        vals = np.array([float(v) for v in body.replace("[", "").replace("]", "").split(",")])
      except ValueError:
        raise unsupported(f"the constant {attr}") from None
    if dt.kind in "iu":
      vals = vals.astype(np.int64)
    return rounding.to_dtype(vals.astype(np.float64), dt).reshape((1,) + shape) \
        if vals.dtype.kind == "f" and dt.kind not in "iub" else \
        vals.astype(dt).reshape((1,) + shape)
  return np.full((1,) + shape, _scalar_attr(attr, dt), dt)


def _scalar_attr(a, dt):
  if isinstance(a, jx.ir.IntegerAttr):
    v = jx.ir.IntegerAttr(a).value
    if dt == bool:
      return bool(v & 1)
    return np.array(v).astype(np.int64).astype(dt) if dt.kind in "iu" else dt.type(v)
  if isinstance(a, jx.ir.FloatAttr):
    return rounding.to_dtype(np.float64(jx.ir.FloatAttr(a).value), dt)
  if isinstance(a, jx.ir.BoolAttr):
    return bool(jx.ir.BoolAttr(a).value)
  raise unsupported(f"the constant {a}")


@op("arith.constant", "llvm.mlir.constant")
@prepares(lambda o, c: _const_value(_attr(o, "value"), _result_type(o)))
def _constant(lanes, mask, value):
  return value


def _int_binop(f, signed=False):
  def h(lanes, mask, dt, a, b):
    a, b = np.asarray(a), np.asarray(b)
    if signed:
      r = f(_signed(a), _signed(b))
    else:
      r = f(_unsigned(a), _unsigned(b)) if a.dtype != bool else f(a, b)
    return np.asarray(r).astype(dt.type, copy=False) if r.dtype != dt else r
  return prepares(lambda o, c: _elem_dtype(_result_type(o)))(h)


def _safe(b):
  return np.where(b == 0, 1, b)


def _divs(a, b):
  # (in 64 bits: |INT_MIN| does not fit its own width; index is wrapped)
  a64, b64 = a.astype(np.int64), _safe(b).astype(np.int64)
  q = np.abs(a64) // np.abs(b64)
  return np.where((a64 < 0) != (b64 < 0), -q, q).astype(a.dtype)


def _rems(a, b):
  return (a.astype(np.int64) - _divs(a, b).astype(np.int64) * _safe(b).astype(np.int64)
          ).astype(a.dtype)


def _shl(a, b):
  w = a.dtype.itemsize * 8
  return np.where(b >= w, 0, a << np.minimum(b, w - 1).astype(a.dtype)).astype(a.dtype)


def _shr(a, b):
  w = a.dtype.itemsize * 8
  return np.where(b >= w, 0, a >> np.minimum(b, w - 1).astype(a.dtype)).astype(a.dtype)


def _shrs(a, b):
  w = a.dtype.itemsize * 8
  return (a >> np.minimum(_unsigned(np.asarray(b)), w - 1).astype(a.dtype)).astype(a.dtype)


for _names, _f, _s in (
    (("arith.addi", "llvm.add"), np.add, False),
    (("arith.subi", "llvm.sub"), np.subtract, False),
    (("arith.muli", "llvm.mul"), np.multiply, False),
    (("arith.andi", "llvm.and"), np.bitwise_and, False),
    (("arith.ori", "llvm.or"), np.bitwise_or, False),
    (("arith.xori", "llvm.xor"), np.bitwise_xor, False),
    (("arith.divui", "llvm.udiv"), lambda a, b: a // _safe(b), False),
    (("arith.remui", "llvm.urem"), lambda a, b: a % _safe(b), False),
    (("arith.divsi", "llvm.sdiv"), _divs, True),
    (("arith.remsi", "llvm.srem"), _rems, True),
    (("arith.shli", "llvm.shl"), _shl, False),
    (("arith.shrui", "llvm.lshr"), _shr, False),
    (("arith.shrsi", "llvm.ashr"), _shrs, True),
    (("arith.maxsi",), np.maximum, True), (("arith.minsi",), np.minimum, True),
    (("arith.maxui",), np.maximum, False), (("arith.minui",), np.minimum, False),
    (("arith.ceildivui",), lambda a, b: (a + _safe(b) - 1) // _safe(b), False),
    (("arith.ceildivsi",), lambda a, b: -((-a) // _safe(b)), True),
    (("arith.floordivsi",), lambda a, b: a // _safe(b), True),
):
  _OPS.update({n: _int_binop(_f, _s) for n in _names})


@op("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui",
    "arith.trunci", "llvm.zext", "llvm.sext", "llvm.trunc")
@prepares(lambda o, c: (o.name, _elem_dtype(o.operands[0].type), _elem_dtype(_result_type(o))))
def _int_cast(lanes, mask, static, a):
  """Integer width changes: sign- or zero-extension, truncation (index is
  a 64-bit integer: index_cast sign-extends into it, truncates out of it)."""
  name, src, dst = static
  a = np.asarray(a)
  sign = name in ("arith.extsi", "llvm.sext") or (
      name == "arith.index_cast" and src != np.int64)
  if src == bool:
    v = -a.astype(np.int64) if sign else a.astype(np.int64)  # (i1 true: -1 signed)
  else:
    v = (_signed(a) if sign else _unsigned(a)).astype(np.int64)
  return (v & 1).astype(bool) if dst == bool else v.astype(dst)


def _float_binop(f):
  def h(lanes, mask, dt, a, b):
    with np.errstate(all="ignore"):
      return f(np.asarray(a, np.float64), np.asarray(b, np.float64), dt)
  return prepares(lambda o, c: _elem_dtype(_result_type(o)))(h)


def _exact(f):
  return lambda a, b, dt: rounding.to_dtype(f(a, b), dt)


def _sum(a, b, dt):
  if dt == np.float64:
    return a + b
  return rounding.to_dtype(rounding.odd_sum(*np.broadcast_arrays(a, b)), dt)


_OPS["arith.addf"] = _float_binop(_sum)
_OPS["arith.subf"] = _float_binop(lambda a, b, dt: _sum(a, -b, dt))
_OPS["arith.mulf"] = _float_binop(_exact(np.multiply))
_OPS["arith.divf"] = _float_binop(
    lambda a, b, dt: division.div_full(a, b, dt) if dt.itemsize <= 4
    else rounding.to_dtype(a / b, dt))
_OPS["arith.maximumf"] = _float_binop(_exact(np.maximum))
_OPS["arith.minimumf"] = _float_binop(_exact(np.minimum))
_OPS["arith.maxnumf"] = _float_binop(_exact(np.fmax))
_OPS["arith.minnumf"] = _float_binop(_exact(np.fmin))


@op("arith.negf")
@prepares(lambda o, c: None)
def _negf(lanes, mask, _, a):
  return -np.asarray(a)


@op("math.absf")
@prepares(lambda o, c: None)
def _absf(lanes, mask, _, a):
  return np.abs(np.asarray(a))


@op("math.fma", "vector.fma")
@prepares(lambda o, c: _elem_dtype(_result_type(o)))
def _fma(lanes, mask, dt, a, b, c):
  return rounding.fma(a, b, c, dt)


@op("arith.extf", "arith.truncf", "arith.sitofp", "arith.uitofp", "arith.fptosi",
    "arith.fptoui")
@prepares(lambda o, c: (o.name, _elem_dtype(_result_type(o))))
def _fcast(lanes, mask, static, a):
  name, dst = static
  a = np.asarray(a)
  with np.errstate(all="ignore"):
    if name == "arith.sitofp":
      return rounding.to_dtype(_signed(a).astype(np.float64), dst)
    if name == "arith.uitofp":
      return rounding.to_dtype(_unsigned(a).astype(np.float64), dst)
    if name in ("arith.fptosi", "arith.fptoui"):
      it = f"i{dst.itemsize}" if name == "arith.fptosi" else f"u{dst.itemsize}"
      info = np.iinfo(it)
      x = np.trunc(a.astype(np.float64))
      x = np.where(np.isnan(x), 0, np.clip(x, info.min, info.max))
      return x.astype(it).view(dst)
    return rounding.to_dtype(a.astype(np.float64), dst)


@op("arith.bitcast", "vector.bitcast", "llvm.bitcast")
@prepares(lambda o, c: _typed(o))
def _bitcast(lanes, mask, static, a):
  dt, shape = static
  a = np.ascontiguousarray(a)
  lead = a.shape[0] if a.ndim else 1
  return a.reshape(lead, -1).view(dt).reshape((lead,) + shape)


_CMPI = {
    0: (np.equal, 0), 1: (np.not_equal, 0), 2: (np.less, 1), 3: (np.less_equal, 1),
    4: (np.greater, 1), 5: (np.greater_equal, 1), 6: (np.less, 2),
    7: (np.less_equal, 2), 8: (np.greater, 2), 9: (np.greater_equal, 2),
}


@op("arith.cmpi")
@prepares(lambda o, c: _CMPI[jx.ir.IntegerAttr(_attr(o, "predicate")).value])
def _cmpi(lanes, mask, static, a, b):
  f, kind = static
  a, b = np.asarray(a), np.asarray(b)
  if kind == 1:
    a, b = _signed(a), _signed(b)
  elif kind == 2:
    a, b = _unsigned(a), _unsigned(b)
  return f(a, b)


def _ordered(f):
  return lambda a, b: f(a, b) & ~np.isnan(a) & ~np.isnan(b)


def _unordered(f):
  return lambda a, b: f(a, b) | np.isnan(a) | np.isnan(b)


_CMPF = {
    0: lambda a, b: np.zeros(np.broadcast_shapes(a.shape, b.shape), bool),
    1: _ordered(np.equal), 2: _ordered(np.greater), 3: _ordered(np.greater_equal),
    4: _ordered(np.less), 5: _ordered(np.less_equal), 6: _ordered(np.not_equal),
    7: lambda a, b: ~np.isnan(a) & ~np.isnan(b),
    8: _unordered(np.equal), 9: _unordered(np.greater), 10: _unordered(np.greater_equal),
    11: _unordered(np.less), 12: _unordered(np.less_equal), 13: _unordered(np.not_equal),
    14: lambda a, b: np.isnan(a) | np.isnan(b),
    15: lambda a, b: np.ones(np.broadcast_shapes(a.shape, b.shape), bool),
}


@op("arith.cmpf")
@prepares(lambda o, c: _CMPF[jx.ir.IntegerAttr(_attr(o, "predicate")).value])
def _cmpf(lanes, mask, f, a, b):
  with np.errstate(all="ignore"):
    return f(np.asarray(a, np.float64), np.asarray(b, np.float64))


@op("arith.select", "llvm.select")
@prepares(lambda o, c: _vshape(_result_type(o)))
def _select(lanes, mask, shape, c, a, b):
  c = np.asarray(c)
  if c.ndim == 1 and shape:  # a scalar condition per lane, vector operands
    c = c.reshape(c.shape + (1,) * len(shape))
  return np.where(c, a, b)


# --- math --------------------------------------------------------------------

def _math(f):
  def h(lanes, mask, dt, a):
    with np.errstate(all="ignore"):
      return rounding.to_dtype(f(np.asarray(a, np.float64)), dt)
  return prepares(lambda o, c: _elem_dtype(_result_type(o)))(h)


_OPS["math.sqrt"] = _math(np.sqrt)
# (Approximate on the GPU; these are correctly rounded: may differ in the last bit.)
_OPS["math.exp"] = _math(np.exp)
_OPS["math.exp2"] = _math(np.exp2)
_OPS["math.log"] = _math(np.log)
_OPS["math.tanh"] = _math(np.tanh)
_OPS["math.rsqrt"] = _math(lambda x: 1 / np.sqrt(x))


# --- vector ------------------------------------------------------------------

@op("vector.broadcast", "vector.splat")
@prepares(lambda o, c: _vshape(_result_type(o)))
def _broadcast(lanes, mask, shape, a):
  a = np.asarray(a)
  if a.ndim == 0:
    a = a.reshape(1)
  n = a.shape[0]
  src = a.shape[1:]
  a = a.reshape((n,) + (1,) * (len(shape) - len(src)) + src)
  return np.broadcast_to(a, (n,) + shape)


@op("vector.extract")
@prepares(lambda o, c: _i64s(_attr(o, "static_position")))
def _vextract(lanes, mask, pos, v, *dyn):
  v = np.asarray(v)
  dyns = iter(dyn)
  idx = []
  for p in pos:
    if p == _DYN64:
      d = np.asarray(next(dyns))
      if d.size > 1 and np.any(d != d.reshape(-1)[0]):
        raise unsupported("vector.extract at a position that differs between lanes")
      p = int(d.reshape(-1)[0])
    idx.append(p)
  return v[(slice(None),) + tuple(idx)]


@op("vector.insert")
@prepares(lambda o, c: _i64s(_attr(o, "static_position")))
def _vinsert(lanes, mask, pos, src, dest, *dyn):
  dest = np.asarray(dest)
  src = np.asarray(src)
  if _DYN64 in pos:
    raise unsupported("vector.insert at a dynamic position")
  n = max(dest.shape[0], src.shape[0] if src.ndim else 1)
  out = np.array(np.broadcast_to(dest, (n,) + dest.shape[1:]))
  out[(slice(None),) + tuple(pos)] = src
  return out


@op("vector.extract_strided_slice")
@prepares(lambda o, c: tuple([jx.ir.IntegerAttr(x).value for x in jx.ir.ArrayAttr(_attr(o, k))]
                              for k in ("offsets", "sizes", "strides")))
def _vslice(lanes, mask, static, v):
  offs, sizes, strides = static
  sl = tuple(slice(o, o + s * st, st) for o, s, st in zip(offs, sizes, strides))
  return np.asarray(v)[(slice(None),) + sl]


@op("vector.shuffle")
@prepares(lambda o, c: _i64s(_attr(o, "mask")))
def _vshuffle(lanes, mask, m, a, b):
  a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
  both = np.concatenate([a, b], axis=1)
  return both[:, m]


@op("vector.load")
@prepares(lambda o, c: _typed(o))
def _vload(lanes, mask, static, ref, *idx):
  dt, shape = static
  if len(shape) != 1:
    raise unsupported("vector.load of a vector of rank other than 1")
  addr = ref.addresses(idx)
  return lanes.arena.load(np.atleast_1d(addr), dt, shape[0], mask).reshape((-1,) + shape)


@op("vector.store")
@prepares(lambda o, c: _elem_dtype(o.operands[0].type))
def _vstore(lanes, mask, dt, val, ref, *idx):
  val = np.asarray(val)
  addr = np.atleast_1d(ref.addresses(idx))
  lanes.arena.store(addr, val, dt, val.shape[-1], mask)
  return None


# --- memref ------------------------------------------------------------------

@op("memref.load")
@prepares(lambda o, c: _elem_dtype(_result_type(o)))
def _mload(lanes, mask, dt, ref, *idx):
  return lanes.arena.load(np.atleast_1d(ref.addresses(idx)), dt, 1, mask)


@op("memref.store")
@prepares(lambda o, c: None)
def _mstore(lanes, mask, _, val, ref, *idx):
  lanes.arena.store(np.atleast_1d(ref.addresses(idx)), np.atleast_1d(val), ref.dtype,
                    1, mask)
  return None


def _uniform(x, what):
  a = np.asarray(x)
  if a.size > 1 and np.any(a != a.reshape(-1)[0]):
    raise unsupported(f"{what} that differs between lanes")
  return int(a.reshape(-1)[0])


def _mixed(static, dyn):
  out = []
  for s in static:
    out.append(next(dyn) if s == _DYN64 else s)
  return out


def _kept_dims(sizes, out_shape):
  """Which dims of a rank-reducing subview remain, from its static sizes:
  unit dims are dropped while there are more dims than the result has
  (which of several unit dims goes changes no address)."""
  keep, j = [], 0
  for d, sz in enumerate(sizes):
    extra = (len(sizes) - d) - (len(out_shape) - j)  # dims still to drop
    matches = j < len(out_shape) and (sz == out_shape[j] or _DYN64 in (sz, out_shape[j]))
    if sz == 1 and extra > 0 and (not matches or out_shape[j] == 1):
      keep.append(False)
    else:
      keep.append(True)
      j += 1
  return keep


@op("memref.subview")
@prepares(lambda o, c: (_i64s(_attr(o, "static_offsets")), _i64s(_attr(o, "static_sizes")),
                        _i64s(_attr(o, "static_strides")),
                        _kept_dims(_i64s(_attr(o, "static_sizes")),
                                   tuple(jx.ir.MemRefType(_result_type(o)).shape))))
def _subview(lanes, mask, static, src, *dyn):
  offs, sizes, steps, keep = static
  dyns = iter(dyn)
  offs = _mixed(offs, dyns)
  sizes = [_uniform(v, "a subview size") for v in _mixed(sizes, dyns)]
  steps = [_uniform(v, "a subview stride") for v in _mixed(steps, dyns)]
  offset = src.offset
  for o, st in zip(offs, src.strides):
    offset = offset + np.asarray(o, np.int64) * st
  strides = [v * k for v, k in zip(src.strides, steps)]
  shape = [v for v, k in zip(sizes, keep) if k]
  kept = [v for v, k in zip(strides, keep) if k]
  return MemRef(src.base, offset, shape, kept, src.dtype, src.space)


def _reassoc(o):
  return [[jx.ir.IntegerAttr(i).value for i in jx.ir.ArrayAttr(g)]
          for g in jx.ir.ArrayAttr(_attr(o, "reassociation"))]


@op("memref.expand_shape")
@prepares(lambda o, c: (_reassoc(o), tuple(jx.ir.MemRefType(_result_type(o)).shape)))
def _expand(lanes, mask, static, src, *dyn):
  groups, out_shape = static
  strides = [0] * len(out_shape)
  for d, g in enumerate(groups):
    st = src.strides[d]
    for k in reversed(g):
      strides[k] = st
      st *= out_shape[k]
  return MemRef(src.base, src.offset, out_shape, strides, src.dtype, src.space)


@op("memref.collapse_shape")
@prepares(lambda o, c: (_reassoc(o), tuple(jx.ir.MemRefType(_result_type(o)).shape)))
def _collapse(lanes, mask, static, src):
  groups, out_shape = static
  strides = [src.strides[g[-1]] for g in groups]
  return MemRef(src.base, src.offset, out_shape, strides, src.dtype, src.space)


@op("memref.cast")
@prepares(lambda o, c: None)
def _mcast(lanes, mask, _, src):
  return src


@op("memref.extract_aligned_pointer_as_index")
@prepares(lambda o, c: None)
def _aligned_ptr(lanes, mask, _, src):
  return np.asarray([src.base], np.int64)


@op("memref.reinterpret_cast")
@prepares(lambda o, c: (_i64s(_attr(o, "static_offsets")), _i64s(_attr(o, "static_sizes")),
                        _i64s(_attr(o, "static_strides")), _elem_dtype(
                            jx.ir.MemRefType(_result_type(o)).element_type)))
def _reinterpret(lanes, mask, static, src, *dyn):
  offs, sizes, strides, dt = static
  dyns = iter(dyn)
  off = _mixed(offs, dyns)[0]
  sizes = [_uniform(s, "a size") for s in _mixed(sizes, dyns)]
  strides = [_uniform(s, "a stride") for s in _mixed(strides, dyns)]
  return MemRef(src.base, np.asarray(off, np.int64), sizes, strides, dt, src.space)


# --- llvm: pointers, structs, memory ----------------------------------------

def _llvm_type_size(t):
  s = str(t)
  if isinstance(t, jx.ir.VectorType):
    return _elem_dtype(t).itemsize * math.prod(_vshape(t))
  if s.startswith("!llvm.ptr"):
    return 8
  return dtype_of(t).itemsize


@op("llvm.getelementptr")
@prepares(lambda o, c: ([int(x) for x in jx.ir.DenseI32ArrayAttr(_attr(o, "rawConstantIndices"))],
                        _llvm_type_size(jx.ir.TypeAttr(_attr(o, "elem_type")).value)))
def _gep(lanes, mask, static, base, *dyn):
  consts, size = static
  if len(consts) != 1:
    raise unsupported("llvm.getelementptr with more than one index")
  i = next(iter(dyn)) if consts[0] == _DYN32 else consts[0]
  i = np.asarray(i)
  if i.dtype.kind == "u":
    i = _signed(i)
  return np.asarray(base, np.int64) + i.astype(np.int64) * size


@op("llvm.load")
@prepares(lambda o, c: _typed(o))
def _lload(lanes, mask, static, ptr):
  dt, shape = static
  n = math.prod(shape) if shape else 1
  out = lanes.arena.load(np.atleast_1d(ptr), dt, n, mask)
  return out.reshape((-1,) + shape)


@op("llvm.store")
@prepares(lambda o, c: _typed_operand(o, 0))
def _lstore(lanes, mask, static, val, ptr):
  dt, shape = static
  n = math.prod(shape) if shape else 1
  val = np.asarray(val)
  if shape:
    val = val.reshape((val.shape[0], n))
  lanes.arena.store(np.atleast_1d(ptr), val, dt, n, mask)
  return None


def _typed_operand(o, i):
  t = o.operands[i].type
  return _elem_dtype(t), _vshape(t)


@op("builtin.unrealized_conversion_cast")
@prepares(lambda o, c: (str(o.results[0].type) if len(o.results) else "",
                        jx.ir.MemRefType(o.results[0].type) if len(o.results) == 1
                        and isinstance(o.results[0].type, jx.ir.MemRefType) else None))
def _ucast(lanes, mask, static, *xs):
  rtype, mem = static
  if len(xs) == 1 and isinstance(xs[0], MemRef) and rtype.startswith("!llvm.struct"):
    m = xs[0]  # (a memref descriptor: rank 0 has no sizes and strides)
    d = [np.asarray([m.base]), np.asarray([m.base]), np.atleast_1d(m.offset)]
    if m.shape:
      d += [[np.asarray([v]) for v in m.shape], [np.asarray([v]) for v in m.strides]]
    return d
  if len(xs) == 1 and isinstance(xs[0], list) and mem is not None:
    d = xs[0]
    base = _uniform(d[1], "a memref's base pointer")
    sizes, strides = (d[3], d[4]) if len(d) > 3 else ((), ())
    return MemRef(base, np.asarray(d[2], np.int64), [_uniform(v, "a size") for v in sizes],
                  [_uniform(v, "a stride") for v in strides],
                  _elem_dtype(mem.element_type),
                  "smem" if "workgroup" in str(mem.memory_space) else "gmem")
  if len(xs) == 1:
    return xs[0]
  raise unsupported(f"a conversion cast to {rtype}")


_DESCRIPTOR = re.compile(
    r"!llvm\.struct<\(ptr(?:<\d+>)?, ptr(?:<\d+>)?, i64(?:, array<(\d+) x i64>, "
    r"array<\d+ x i64>)?\)>")


def _struct_fields(t):
  """An empty (undef) value of an llvm struct/array type, as nested lists."""
  s = str(t)
  m = _DESCRIPTOR.match(s)
  if m:  # a memref descriptor (pointers of any address space; rank 0: 3 fields)
    if m.group(1) is None:
      return [None, None, None]
    rank = int(m.group(1))
    return [None, None, None, [None] * rank, [None] * rank]
  if s.startswith("!llvm.struct<("):
    return [None] * (s.count(",") + 1)
  return None


@op("llvm.mlir.undef", "llvm.mlir.poison")
@prepares(lambda o, c: (_struct_fields(_result_type(o)), _result_type(o)))
def _undef(lanes, mask, static):
  fields, t = static
  if fields is not None:
    return [list(f) if isinstance(f, list) else f for f in fields]
  return np.zeros((1,) + _vshape(t), _elem_dtype(t))


@op("llvm.extractvalue")
@prepares(lambda o, c: _i64s(_attr(o, "position")))
def _extractvalue(lanes, mask, pos, s):
  for p in pos:
    s = s[p]
  return s


@op("llvm.insertvalue")
@prepares(lambda o, c: _i64s(_attr(o, "position")))
def _insertvalue(lanes, mask, pos, s, v):
  s = _copy_struct(s)
  t = s
  for p in pos[:-1]:
    t = t[p]
  t[pos[-1]] = v
  return s


def _copy_struct(s):
  return [_copy_struct(x) if isinstance(x, list) else x for x in s]


@op("llvm.inttoptr", "llvm.ptrtoint", "llvm.addrspacecast")
@prepares(lambda o, c: None)
def _ptrcast(lanes, mask, _, p):
  return np.asarray(p).astype(np.int64)


# Inline PTX that only orders the lanes that run the body (warp barriers,
# thread fences): nothing to do for lanes in lockstep. (Named barriers and
# proxy fences are Syncs: compile_block.)
_LOCAL_PTX = ("bar.warp.sync", "fence.acq_rel", "fence.sc")


# Max/min instructions FragmentedArray emits as inline PTX ("max.NaN.f32
# $0, $1, $2;", packed "min.bf16x2", integer "max.s16x2"...): per lane, on
# the bit patterns their operands carry.
_MINMAX = re.compile(r"^(max|min)(\.NaN)?\.(f32|f16|bf16|s16|u16|s32|u32)(x2)?"
                     r" \$0, \$1, \$2;$")
_LANE_TYPES = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
               "s16": np.int16, "u16": np.uint16, "s32": np.int32, "u32": np.uint32}


def _minmax(m, a, b, out_dt):
  kind, nan, ty, _ = m.groups()
  lane = np.dtype(_LANE_TYPES[ty])
  # Each operand: one register per lane, viewed as its 1 or 2 lane values.
  a, b = (np.ascontiguousarray(v).reshape(v.shape[0], -1).view(lane) for v in (a, b))
  a, b = np.broadcast_arrays(a, b)
  if lane.kind in "iu":
    r = (np.maximum if kind == "max" else np.minimum)(a, b)
    return r.astype(lane).view(out_dt).reshape(-1)
  a, b = a.astype(np.float64), b.astype(np.float64)
  if kind == "max":  # (-0 orders below +0)
    pick_a = (a > b) | ((a == b) & ~np.signbit(a))
  else:
    pick_a = (a < b) | ((a == b) & np.signbit(a))
  r = np.where(pick_a, a, b)
  if nan:  # a NaN operand gives the canonical NaN
    bad = np.isnan(a) | np.isnan(b)
  else:    # IEEE maxNum/minNum: the other operand; NaN only if both are
    r = np.where(np.isnan(a), b, np.where(np.isnan(b), a, r))
    bad = np.isnan(r)
  bits = r.astype(lane).view(f"u{lane.itemsize}").copy()
  bits[bad] = {2: 0x7FFF, 4: 0x7FFFFFFF}[lane.itemsize]
  return bits.view(out_dt).reshape(-1)


@op("llvm.inline_asm")
@prepares(lambda o, c: (str(jx.ir.StringAttr(_attr(o, "asm_string")).value),
                        sum(str(r.type) != "!llvm.void" for r in o.results),
                        _elem_dtype(o.results[0].type)
                        if len(o.results) and str(o.results[0].type) != "!llvm.void"
                        else None))
def _inline_asm(lanes, mask, static, *xs):
  text, nres, out_dt = static
  if not nres and text.strip().split(" ", 1)[-1 if text.startswith("@") else 0].startswith(
      _LOCAL_PTX):
    return None
  m = _MINMAX.match(text.strip())
  if m and nres == 1 and len(xs) == 2:
    return _minmax(m, np.asarray(xs[0]), np.asarray(xs[1]), out_dt)
  short = " ".join(text.split())
  raise unsupported(f"inline PTX assembly ('{short[:120]}{'...' if len(short) > 120 else ''}')")


# --- gpu / nvvm: where a lane is, warp-level data movement -------------------

def _dim(o):
  s = str(_attr(o, "dimension"))
  return "xyz".index(s[-2])


@op("gpu.thread_id")
@prepares(lambda o, c: _dim(o))
def _thread_id(lanes, mask, d):
  return lanes.tid if d == 0 else np.zeros(1, np.int64)


@op("gpu.lane_id")
@prepares(lambda o, c: None)
def _lane_id(lanes, mask, _):
  return lanes.tid % 32


def _grid_fact(field):
  def h(lanes, mask, d):
    return np.asarray([getattr(lanes, field)[d]], np.int64)
  return prepares(lambda o, c: _dim(o))(h)


_OPS["gpu.block_dim"] = _grid_fact("block_dim")
_OPS["gpu.block_id"] = _grid_fact("block_id")
_OPS["gpu.grid_dim"] = _grid_fact("grid_dim")
_OPS["gpu.cluster_block_id"] = _grid_fact("cluster_block_id")
_OPS["gpu.cluster_dim_blocks"] = _grid_fact("cluster_dim_blocks")


@op("gpu.cluster_id")
@prepares(lambda o, c: _dim(o))
def _cluster_id(lanes, mask, d):
  return np.asarray([lanes.block_id[d] // lanes.cluster_dim_blocks[d]], np.int64)


@op("gpu.cluster_dim")
@prepares(lambda o, c: _dim(o))
def _cluster_dim(lanes, mask, d):
  return np.asarray([lanes.grid_dim[d] // lanes.cluster_dim_blocks[d]], np.int64)


_SREG = {
    "nvvm.read.ptx.sreg.tid.x": lambda l: l.tid,
    "nvvm.read.ptx.sreg.laneid": lambda l: l.tid % 32,
    "nvvm.read.ptx.sreg.warpid": lambda l: l.tid // 32,
    "nvvm.read.ptx.sreg.ctaid.x": lambda l: np.asarray([l.block_id[0]]),
    "nvvm.read.ptx.sreg.ctaid.y": lambda l: np.asarray([l.block_id[1]]),
    "nvvm.read.ptx.sreg.ctaid.z": lambda l: np.asarray([l.block_id[2]]),
}


def _sreg(f):
  def h(lanes, mask, dt):
    return np.asarray(f(lanes)).astype(dt)
  return prepares(lambda o, c: _elem_dtype(_result_type(o)))(h)


for _n, _read in _SREG.items():
  _OPS[_n] = _sreg(_read)


@op("nvvm.bar.warp.sync", "nvvm.fence.proxy", "nvvm.fence.proxy.acquire",
    "nvvm.fence.proxy.release", "nvvm.fence.mbarrier.init",
    "nvvm.cp.async.bulk.commit.group", "nvvm.fence.sc.cluster")
@prepares(lambda o, c: None)
def _sync(lanes, mask, _, *xs):
  # Lanes run in lockstep here: what a warp barrier or a fence that is no
  # Sync (sync_of) orders is done.
  return None


def _active(lanes, mask):
  return np.ones(lanes.n, bool) if mask is None else np.broadcast_to(mask, (lanes.n,))


@op("nvvm.elect.sync")
@prepares(lambda o, c: None)
def _elect(lanes, mask, _, *xs):
  act = _active(lanes, mask)
  warp = lanes.tid // 32
  out = np.zeros(lanes.n, bool)
  for w in np.unique(warp):
    sel = np.nonzero((warp == w) & act)[0]
    if len(sel):
      out[sel[0]] = True
  return out


def _by_lane(lanes, v):
  """v broadcast to one row per lane."""
  v = np.asarray(v)
  return np.broadcast_to(v, (lanes.n,) + v.shape[1:])


@op("nvvm.shfl.sync")
@prepares(lambda o, c: str(_attr(o, "kind")))
def _shfl(lanes, mask, kind, membermask, val, offset, clamp):
  val = _by_lane(lanes, val)
  lane = lanes.tid % 32
  base = lanes.tid - lane
  off = np.asarray(offset).astype(np.int64)
  c = np.asarray(clamp).astype(np.int64) & 31
  if "bfly" in kind:
    src = lane ^ off
  elif "idx" in kind:
    src = off & 31
  elif "down" in kind:
    src = np.where(lane + off <= c, lane + off, lane)
  else:  # up
    src = np.where(lane - off >= 0, lane - off, lane)
  pos = base + np.clip(src, 0, 31) - lanes.tid[0]  # (lanes are consecutive threads)
  return val[np.broadcast_to(pos, (lanes.n,))]


@op("nvvm.ldmatrix")
@prepares(lambda o, c: (jx.ir.IntegerAttr(_attr(o, "num")).value, "col" in str(_attr(o, "layout")),
                        str(_attr(o, "eltType")) if "eltType" in o.attributes else "b16"))
def _ldmatrix(lanes, mask, static, ptr):
  num, trans, elt = static
  if "b16" not in elt:
    raise unsupported(f"nvvm.ldmatrix of {elt} elements")
  if lanes.n % 32:
    raise unsupported("nvvm.ldmatrix outside whole warps")
  # Lanes 8m..8m+7 of a warp give the addresses of matrix m's 8 rows.
  ptr = _by_lane(lanes, ptr).reshape(-1, 32)[:, :8 * num]
  rows = lanes.arena.load(ptr, np.dtype(np.uint16), 8)   # warp, lane, column
  rows = rows.reshape(-1, num, 8, 8)                       # warp, matrix, row, column
  if trans:
    rows = rows.transpose(0, 1, 3, 2)
  # Lane l receives elements (l // 4, 2 * (l % 4) + {0, 1}) of each matrix.
  lane = np.arange(32)
  r, c0 = lane // 4, 2 * (lane % 4)
  lo, hi = rows[:, :, r, c0], rows[:, :, r, c0 + 1]               # warp, matrix, lane
  words = lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)
  words = words.transpose(0, 2, 1).reshape(lanes.n, num)          # lane, matrix
  out = [words[:, m].copy() for m in range(num)]
  return out if num > 1 else out[0]


# --- scf ----------------------------------------------------------------------

@op("scf.if")
@prepares(lambda o, c: (compile_block(o.regions[0].blocks[0], c),
                        compile_block(o.regions[1].blocks[0], c)
                        if len(o.regions[1].blocks) else None, len(o.results)))
def _if(lanes, mask, static, cond):
  then, other, nres = static
  cond = np.asarray(cond).reshape(-1)
  act = _active(lanes, mask)
  c = np.broadcast_to(cond, (lanes.n,))
  taken = act & c
  not_taken = act & ~c
  env = _ENV[-1]
  if not not_taken.any():
    return _results(_run(then, lanes, env, (), mask), nres)
  if not taken.any():
    if other is None:
      return _results([], nres)
    return _results(_run(other, lanes, env, (), mask), nres)
  a = _run(then, lanes, env, (), taken)
  b = _run(other, lanes, env, (), not_taken) if other is not None else []
  merged = []
  for x, y in zip(a, b):
    x, y = np.asarray(x), np.asarray(y)
    cc = taken.reshape((-1,) + (1,) * (max(x.ndim, y.ndim) - 1))
    merged.append(np.where(cc, x, y))
  return _results(merged, nres)


def _results(vals, n):
  if n == 1:
    return vals[0]
  return vals if n else None


@op("scf.for")
@prepares(lambda o, c: (compile_block(o.regions[0].blocks[0], c), len(o.results)))
def _for(lanes, mask, static, lb, ub, step, *init):
  body, nres = static
  # (signless bounds compare signed, as scf.for does by default)
  lo, hi, st = (_uniform(_signed(np.asarray(v)), "a loop bound") for v in (lb, ub, step))
  carry = list(init)
  dt = np.asarray(lb).dtype
  env = _ENV[-1]
  for i in range(lo, hi, st):
    carry = _run(body, lanes, env, [np.array([i]).astype(dt), *carry], mask)
  return _results(carry, nres)


# Region ops evaluate their blocks in the enclosing run's environment (their
# values are the function's SSA values).
_ENV: list[list[Any]] = []


def run(prog, lanes, args):
  """Evaluates a compiled block for `lanes`; returns its results. Its
  barriers and fences order nothing beyond the lanes (see run_segments)."""
  segments = run_segments(prog, lanes, args)
  try:
    while True:
      next(segments)
  except StopIteration as stop:
    return stop.value


def run_segments(prog, lanes, args):
  """Evaluates a compiled block for `lanes`, segment by segment: a generator
  that yields (Sync, its id, its count) after each segment a top-level
  barrier or fence ends, and returns the block's results."""
  env = [None] * prog.nslots
  lanes.fences = []
  for s, a in zip(prog.args, args):
    env[s] = a
  for steps, sync in prog.segments:
    _ENV.append(env)
    try:
      _steps(steps, lanes, env, None)
    finally:
      _ENV.pop()
    if sync is not None:
      yield sync, sync.value(sync.id, env), sync.value(sync.count, env)
  return [env[i] for i in prog.results]


@op("pallas_sim.marker")
@prepares(lambda o, c: jx.ir.IntegerAttr(_attr(o, "index")).value)
def _marker(lanes, mask, index, *xs):
  if mask is not None and not np.any(mask):
    return None
  return lanes.marker(index, xs)


@op("nvvm.stmatrix")
@prepares(lambda o, c: ("col" in str(_attr(o, "layout")),
                        str(_attr(o, "eltType")) if "eltType" in o.attributes else "b16"))
def _stmatrix(lanes, mask, static, ptr, *words):
  trans, elt = static
  num = len(words)
  if "b16" not in elt:
    raise unsupported(f"nvvm.stmatrix of {elt} elements")
  if lanes.n % 32:
    raise unsupported("nvvm.stmatrix outside whole warps")
  if mask is not None and not np.all(mask):
    raise unsupported("nvvm.stmatrix under a condition that differs between lanes")
  # The inverse of ldmatrix: lane l gives (l // 4, 2 * (l % 4) + {0, 1}) of
  # each matrix; lanes 8m..8m+7 give the addresses of matrix m's rows.
  w = np.stack([np.broadcast_to(np.asarray(x).astype(np.uint32), (lanes.n,)) for x in words],
               axis=1).reshape(-1, 32, num)                       # warp, lane, matrix
  lane = np.arange(32)
  rows = np.zeros((w.shape[0], num, 8, 8), np.uint16)            # warp, matrix, row, col
  r, c0 = lane // 4, 2 * (lane % 4)
  rows[:, :, r, c0] = (w & 0xFFFF).astype(np.uint16).transpose(0, 2, 1)
  rows[:, :, r, c0 + 1] = (w >> 16).astype(np.uint16).transpose(0, 2, 1)
  if trans:
    rows = rows.transpose(0, 1, 3, 2)
  ptr = _by_lane(lanes, ptr).reshape(-1, 32)[:, :8 * num]
  lanes.arena.store(ptr.reshape(-1), rows.reshape(-1, 8), np.dtype(np.uint16), 8)
  return None


@op("llvm.extractelement", "vector.extractelement")
@prepares(lambda o, c: None)
def _extractelement(lanes, mask, _, v, pos):
  return np.asarray(v)[:, _uniform(_signed(np.asarray(pos)), "an element position")]


@op("llvm.insertelement", "vector.insertelement")
@prepares(lambda o, c: None)
def _insertelement(lanes, mask, _, v, x, pos):
  v, x = np.asarray(v), np.asarray(x)
  n = max(v.shape[0], x.shape[0] if x.ndim else 1)
  out = np.array(np.broadcast_to(v, (n,) + v.shape[1:]))
  out[:, _uniform(_signed(np.asarray(pos)), "an element position")] = x
  return out
