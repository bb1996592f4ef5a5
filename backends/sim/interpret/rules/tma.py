"""TMA: copy_gmem_to_smem (async load completing on a barrier),
copy_smem_to_gmem (async store, in bulk groups), commit_group and
wait_smem_to_gmem.

A load is its own agent: it arrives on its barrier at issue (announcing its
bytes), writes SMEM when it completes and only then completes the barrier's
transaction. A store reads SMEM when its read finishes and writes GMEM when it
completes, so a kernel that reuses the SMEM too early, or reads the GMEM too
early, sees what real hardware could.
"""
import numpy as np

from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.analysis import given_layouts
from pallas_sim.backends.sim.interpret import operands
from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.interpret.compiler import Gen, rule
from pallas_sim.backends.sim.machine import barriers
from pallas_sim.backends.sim.machine.scheduler import Wait
from pallas_sim.backends.sim.base.loads import Load
from pallas_sim.backends.sim.timing.model import OpClass
from pallas_sim.backends.sim.interpret.rules.atomics import OPS, unsigned
from pallas_sim.backends.sim.interpret.rules.barriers import peer_slot
from pallas_sim.backends.sim.interpret.rules.refs import peer_ref
from pallas_sim.backends.sim.base.events import BoxOutside
from pallas_sim.errors import KernelError, OutOfBoundsError, not_modelled


def _box(ref):
  """The box of a TMA transfer of this SMEM ref, as the lowering builds its
  descriptor: the view's shape, tiled as its buffer is."""
  shape, t = ref.view.shape, ref.tiling
  if t and len(shape) >= len(t):
    lead, minor = shape[:-len(t)], shape[-len(t):]
    shape = lead + tuple(d // e for d, e in zip(minor, t)) + tuple(t)
  return tuple(shape)


def _row_bytes(ref):
  """The bytes of a row of the box a TMA copy into this SMEM ref moves: its
  tiling's, or where the lowering infers a swizzle for it, no wider than
  that (analysis/smem_swizzle.py)."""
  box = _box(ref)
  row = (box[-1] if box else 1) * ref.view.dtype.itemsize
  swizzle = ref.buf.inferred_swizzle if ref.tiling is None else None
  return min(row, swizzle) if swizzle else row


def run_bytes(view):
  """The bytes of the longest runs a GMEM box `view` (a numpy view) lies in
  contiguously: its rows where they are pieces of longer rows, more where
  whole rows follow one another. The TMA rules price a box's HBM traffic by
  it (gpus.GPU.hbm_cost); tests/test_hbm_model.py checks it on views."""
  run = view.itemsize
  for n, stride in zip(reversed(view.shape), reversed(view.strides)):
    if n > 1 and stride != run:
      break
    run *= n
  return run


def _check_box(ref, what, bulk=False, gmem=None):
  """The lowering's TMA limits (mosaic/gpu/launch_context.py), its messages.
  `bulk`: the copy takes the plain bulk path (cp.async.bulk of one
  contiguous range), which has no limit on a dimension's length. `gmem`:
  the GMEM side, where the limits apply once the dimensions where both it
  and the box are 1 are dropped (jx.TMA_DROPS_UNIT_DIMS)."""
  box = _box(ref)
  if gmem is not None:
    # (the strides are the whole array's, those of the dimensions an integer
    # index drops included: the descriptor walks the array, not the view)
    full = gmem.buf.data
    strides = full.strides
    if jx.TMA_DROPS_UNIT_DIMS:
      unit = [n == 1 for n in full.shape]
      # (the lowering moves the indexed dimensions to the front, then drops
      # the 1-long ones)
      kept = _view_dims(gmem)
      order = list(range(full.ndim)) if kept is None else (
          [d for d in range(full.ndim) if d not in kept] + kept)
      strides = tuple(full.strides[d] for d in order if not unit[d])
      if ref.tiling is None and kept is not None and len(kept) == len(box):
        box = tuple(b for b, d in zip(box, kept) if not unit[d])  # (a tiled box: its tiles')
    if any(st % 16 for st in strides[:-1]):
      raise KernelError(f"{what}: Async copies require all GMEM strides except the "
                        "last one to be a multiple of 16 bytes")
  bits = (box[-1] if box else 1) * ref.view.dtype.itemsize * 8
  if bits % 128:
    raise KernelError(
        f"{what}: Async copies require the number of bits copied along the last"
        f" dimension to be divisible by 128, but got {bits}")
  if box and max(box) > 256 and not bulk:
    raise KernelError(
        f"{what}: Async copies only support copying <=256 elements along each"
        f" dimension, got {box}")


def _view_dims(gmem):
  """Which of its array's dimensions a GMEM view keeps, in order (an
  integer index drops one), matched by stride from the innermost; None
  where they do not match. Two dimensions share a stride only where the
  inner one is 1 long, and a 1-long view dimension is then taken for it:
  that decides only whether the box drops a 1, which TMA's limits (the
  last dimension's bits, the longest) do not see unless it is the last."""
  full, view = gmem.buf.data, gmem.view
  kept, d = [], full.ndim - 1
  for i in reversed(range(view.ndim)):
    while d >= 0 and not (full.strides[d] == view.strides[i] and full.shape[d] >= view.shape[i]):
      d -= 1
    if d < 0:
      return None
    kept.append(d)
    d -= 1
  return kept[::-1]


def _may_be_bulk(smem_ref):
  """The SMEM side of the lowering's `is_simple_contiguous_copy` (one plain
  bulk copy): not swizzled. (The callers check the rest: no reduction, no
  multicast, no zero fill past the ends, and a contiguous GMEM slice.)"""
  return smem_ref.swizzle is None


def _contiguous(gmem_ref):
  """The GMEM slice is one contiguous range of its array."""
  v = gmem_ref.view
  isz = v.itemsize
  expected = 1
  for dim, stride in zip(reversed(v.shape), reversed(v.strides)):
    if dim != 1 and stride != expected * isz:
      return False
    expected *= dim
  return True


def _static_check(eqn, cx, what, smem_operand, name, gmem_operand, bulk_possible=False):
  """Checks a copy from avals alone (refview.static_ref), when the kernel is
  compiled: before the real lowering's checks, at the user's line. False
  where the ref cannot be built statically, or the limits depend on the GMEM
  slice (then each copy is checked). (Memory spaces, shapes and dtypes of
  both sides JAX checks while tracing.) `smem_operand`: the SMEM side's
  RefOperand, called `name`; `gmem_operand` the GMEM side's."""
  i = smem_operand.index
  ref = refview.static_ref(eqn.invars[i].aval, smem_operand.tree, name,
                           given_layouts.of(cx.launch, eqn, i))
  if ref is None:
    return False
  gmem = refview.static_ref(eqn.invars[gmem_operand.index].aval, gmem_operand.tree)
  if bulk_possible and _may_be_bulk(ref):
    _check_box(ref, what, bulk=True, gmem=gmem)  # (the length limit waits for the slice)
    return False
  _check_box(ref, what, gmem=gmem)
  return gmem is not None  # (else each copy checks its GMEM side)


def _wholly_outside(inb):
  """Whether a clipped box's in-bounds part (apply_clipped) is empty."""
  return any(sl.start >= sl.stop for sl in inb)


def _outside(wg, where, ref, what):
  """Notes a TMA box wholly outside its array (the launch warns of the
  first at each line: events.BoxOutside)."""
  wg.block.group.events.append(BoxOutside(where, (
      f"a TMA box lies wholly outside {ref.buf.name} of shape "
      f"{tuple(ref.buf.data.shape)} (first in block {wg.block.index}): {what}. Almost "
      "always a wrong index_map, or a grid longer than the array")))


@rule("copy_gmem_to_smem", op=OpClass.TMA_LOAD)
def _copy_gmem_to_smem(eqn, cx):
  collective = tuple(jx.param(eqn, "collective_axes") or ())
  if jx.param(eqn, "leader_tracked") is not None:
    raise not_modelled("leader-tracked (partitioned or replicated) "
                       "collective TMA loads are not modelled yet")
  if not jx.param(eqn, "has_barrier"):
    raise KernelError("copy_gmem_to_smem without a barrier is only supported on "
                      "pre-Hopper GPUs, which use the cp.async implementation")
  ops = operands.tma_load(eqn)
  src, dst, bar = ops.src, ops.dst, ops.barrier
  src_at = refview.compile_clipped(src.tree)
  dst_at = refview.compile_transforms(dst.tree)
  bar_at = refview.compile_transforms(bar.tree)
  # Out of the array's bounds, TMA loads fill zeros by default (the
  # lowering's default for copy_gmem_to_smem), leave SMEM as it was with
  # UNDEFINED, and must not go with PROMISE_IN_BOUNDS.
  oob = jx.param(eqn, "oob_mode")
  oob = "ZEROS" if oob is None else oob.name
  pred_at = ops.predicate
  timing = cx.timing
  site = cx.site(eqn)  # (bytes per load site: the L2 model, timing/model.py)
  what = "copy_gmem_to_smem"
  where = cx.where(eqn)
  # Checks that need no data run now, before the real lowering's.
  bulk_possible = not collective and oob != "ZEROS"
  static = _static_check(eqn, cx, what, dst, "dst", src, bulk_possible)
  # (the copy leaves as its issue ends: the interpreter charges the warpgroup
  # the same cycles after the rule, Timing.issue_split)
  issue = timing.issue_cycles(OpClass.TMA_LOAD, eqn)

  def load(wg, *args):
    s, _, inb = src_at(args[src.index], args[src.leaves])
    d = dst_at(args[dst.index], args[dst.leaves])
    b = bar_at(args[bar.index], args[bar.leaves])
    pred = args[pred_at] if pred_at is not None else True
    if not static:
      _check_box(d, what, bulk_possible and _may_be_bulk(d) and _contiguous(s), s)
    slot = refview.barrier_of(b, what)
    if not pred:
      barriers.arrive(slot, at=wg.time)
      return []
    blk = wg.block
    nbytes = d.view.nbytes
    barriers.arrive(slot, expect_tx=nbytes, at=wg.time)  # (tx pending: no completion)
    targets, fill = [(d, slot)], False
    if inb is not None:
      if _wholly_outside(inb):
        _outside(wg, where, s, "a TMA load reads zeros there")
      if oob == "PROMISE_IN_BOUNDS" or collective:
        raise OutOfBoundsError(
            f"TMA box of {s.buf.name} reaches past its ends"
            + (" (a multicast past the ends is not modelled)" if collective else
               " with oob_mode=PROMISE_IN_BOUNDS"))
      fill = oob == "ZEROS"
    elif collective:
      # Multicast: the blocks of the cluster along `collective` each load a
      # part of the box (the first axis it divides, as the lowering
      # partitions it) into every one of them, completing each one's
      # barrier by that part's bytes; each expects the whole box.
      peers = blk.group.peers(blk, collective)
      s, d = partition(s, d, peers.index(blk), len(peers))
      targets = [(d, slot) if peer is blk else
                 (peer_ref(peer, d), peer_slot(peer, slot)) for peer in peers]
    tx = d.view.nbytes  # what each target's barrier gets: the box, or this block's part
    cost = timing.gpu.hbm_cost(run_bytes(s.view))[0]
    start, _, done = timing.tma(blk.engines, wg.time + issue, tx, site, _row_bytes(d),
                                shared=not collective, hbm_cost=cost,
                                source=((site, s.buf), s.buf.nbytes),
                                own=bool(blk.engines.hbm_cycles)  # (only HBM's part asks)
                                and in_own_part(s, blk.number, blk.engines.blocks))
    blk.stats.hbm_read_cost += s.view.nbytes * cost
    if blk.engines.loads is not None:  # (the L2 model follows this kernel's loads)
      blk.engines.loads.append(Load(start, source_key(s), s.view.nbytes, wg.index, site))
    blk.stats.tma_load_bytes += s.view.nbytes
    tally = blk.stats.load_sites.get(site)
    if tally is None:
      tally = blk.stats.load_sites[site] = [0, 0]
    tally[0] += s.view.nbytes
    tally[1] += 1
    for pd, pslot in targets:
      _land_at(done, wg, s, pd, pslot, tx, where, what, inb, fill)
    blk.event(f"{wg.name} TMA", f"load {s.buf.name}->{d.buf.name}", start, done)
    return []
  return load


def _land_at(done, wg, s, d, slot, nbytes, where, what, inb=None, fill=False,
             value=None, combine=None):
  """Schedules a load's landing in `d` (some block's SMEM), completing `slot`
  (that block's barrier) by `nbytes`; stamped with the phase it completes.
  `inb`: the part of the box in the array's bounds (the rest is zeros with
  `fill`, else left as it was), or None. `s` None: `value` (registers) lands,
  combined with what is there by `combine` where given."""
  blk = wg.block
  inside = d if inb is None else refview.Ref(d.buf, d.view[inb])
  written = d if inb is None or fill else inside
  op = blk.hb.tma_load(wg, slot, s, written, where, what, combine is not None)
  sview = value if s is None else s.view
  dview, iview = d.view, inside.view

  def land():
    blk.hb.tma_load_lands(op)
    if s is not None:
      blk.group.read(s, "tma_load", what, where, wg.index, blk)
    if combine is not None:
      blk.group.read(inside, "tma_load", what, where, wg.index, blk)
    if fill:
      dview[...] = 0
    iview[...] = sview if combine is None else combine(iview, sview)
    blk.group.wrote(written)
    barriers.complete_tx(slot, nbytes)
  blk.at(done, land)


@rule("async_store_smem")
def _async_store_smem(eqn, cx):
  """A store of registers into the SMEM of a block of the cluster (this one
  or a peer), completing that block's barrier: it arrives there announcing
  the bytes, and they complete it when they land (st.async)."""
  p = eqn.params
  ops = operands.async_store_smem(eqn)
  ref, bar = ops.ref, ops.barrier
  ref_at = refview.compile_transforms(ref.tree)
  bar_at = refview.compile_transforms(bar.tree)
  value_at, cluster_at = ops.value, ops.cluster_index
  dim = p["cluster_dim"]
  combine = OPS[p["atomic"]] if p["atomic"] is not None else None
  timing = cx.timing
  where = cx.where(eqn)
  what = "async_store_smem"

  def store(wg, *args):
    d = ref_at(args[ref.index], args[ref.leaves])
    slot = refview.barrier_of(bar_at(args[bar.index], args[bar.leaves]), what)
    blk = wg.block
    peer = refview.cluster_peer(wg, (dim,), (args[cluster_at],), what)
    if peer is not blk:
      d, slot = peer_ref(peer, d), peer_slot(peer, slot)
    nbytes = d.view.nbytes
    barriers.arrive(slot, expect_tx=nbytes, at=wg.time)
    blk.hb.arrive(wg, slot, where)
    start, _, done = timing.tma(blk.engines, wg.time, nbytes, via_l2=False)
    _land_at(done, wg, None, d, slot, nbytes, where, what,
             value=np.array(args[value_at], copy=True), combine=combine)
    blk.event(f"{wg.name} TMA", f"async store ->{d.buf.name}", start, done)
    return []
  return store


def in_own_part(s, number, blocks):
  """Whether a load's box lies in the launch's `number`-th block's own part
  of its buffer, the buffer cut in `blocks` equal runs in launch order: data
  the block streams that no other block reads (a row kernel's rows, a
  copy's tiles), unlike a matmul's tiles, which blocks share. The TMA load
  rule passes it to the timing model as a load's `own` (timing/model.py
  Timing.tma); tests/test_hbm_model.py checks it on boxes of a buffer."""
  if blocks <= 1:
    return True
  v = s.view
  lo = _byte_offset(s)
  if v.size == 0 or any(st < 0 for st in v.strides):
    return False
  hi = lo + sum((n - 1) * st for n, st in zip(v.shape, v.strides)) + v.itemsize
  part = s.buf.nbytes / blocks
  return number * part <= lo and hi <= (number + 1) * part


def _byte_offset(s):
  """Where a ref's view starts in its buffer, in bytes."""
  return s.view.__array_interface__["data"][0] - s.buf.data.__array_interface__["data"][0]


def source_key(s):
  """What a TMA load reads, for the L2 model: (buffer, byte offset, box)."""
  return (s.buf.name, _byte_offset(s), s.view.shape)


def partition(s, d, k, n):
  """The k-th of n parts of a copy from s to d, split along the first axis
  of the box that n divides."""
  for ax, size in enumerate(d.view.shape):
    if size % n == 0:
      lo, hi = k * size // n, (k + 1) * size // n
      cut = (slice(None),) * ax + (slice(lo, hi),)
      return (refview.Ref(s.buf, s.view[cut]), refview.Ref(d.buf, d.view[cut]))
  raise KernelError(f"None of the leading dimensions in the slice shape "
                    f"{d.view.shape} is divisible by the collective size {n}")


class _StoreGroup:
  __slots__ = ("unread", "unwritten")

  def __init__(self, n):
    self.unread = n
    self.unwritten = n


# reduction op -> (combine, the element types the lowering takes for it: the
# PTX table of cp.reduce.async.bulk, mosaic/gpu/launch_context.py)
def _wrapping_inc(old, bound):
  """PTX's .inc (as CUDA's atomicInc): old + 1, or 0 once old reaches bound."""
  return np.where(old >= bound, np.zeros_like(old), old + np.ones_like(old))


def _wrapping_dec(old, bound):
  """PTX's .dec (as CUDA's atomicDec): old - 1, or bound where old is 0 or
  past it."""
  return np.where((old == 0) | (old > bound), bound, old - np.ones_like(old))


_REDUCE = {
    None: (None, None),
    # (i32 or u32, both taken as unsigned, as the lowering emits them)
    "inc": (unsigned(_wrapping_inc), {"int32", "uint32"}),
    "dec": (unsigned(_wrapping_dec), {"int32", "uint32"}),
    "add": (np.add, {"float16", "bfloat16", "float32", "int32", "int64", "uint32",
                     "uint64"}),
    "min": (np.minimum, {"float16", "bfloat16"}),
    "max": (np.maximum, {"float16", "bfloat16"}),
    "smin": (np.minimum, {"int32", "int64"}), "smax": (np.maximum, {"int32", "int64"}),
    "umin": (unsigned(np.minimum), {"int32", "int64", "uint32", "uint64"}),
    "umax": (unsigned(np.maximum), {"int32", "int64", "uint32", "uint64"}),
    "and": (np.bitwise_and, {"int32", "int64", "uint32", "uint64"}),
    "or": (np.bitwise_or, {"int32", "int64", "uint32", "uint64"}),
    "xor": (np.bitwise_xor, {"int32", "int64", "uint32", "uint64"}),
}


@rule("copy_smem_to_gmem", op=OpClass.TMA_STORE)
def _copy_smem_to_gmem(eqn, cx):
  ops = operands.tma_store(eqn)
  src, dst = ops.src, ops.dst
  src_at = refview.compile_transforms(src.tree)
  dst_at = refview.compile_clipped(dst.tree)
  pred_at = ops.predicate
  commit = jx.param(eqn, "commit_group")
  op = jx.param(eqn, "reduction_op")
  if op not in _REDUCE:
    raise not_modelled(f"TMA store reduction {op!r}")
  reduce, types = _REDUCE[op]
  dtype = np.dtype(eqn.invars[src.index].aval.inner_aval.dtype)
  if types is not None and dtype.name not in types:
    raise KernelError(f"Reduction op {op} not supported by the TMA implementation "
                      f"for element type {dtype.name}")
  timing = cx.timing
  what = "copy_smem_to_gmem"
  where = cx.where(eqn)
  static = _static_check(eqn, cx, what, src, "src", dst, bulk_possible=op is None)
  # (the committed stores leave as its issue ends)
  issue = timing.issue_cycles(OpClass.TMA_STORE, eqn)

  def store(wg, *args):
    s = src_at(args[src.index], args[src.leaves])
    d, _, inb = dst_at(args[dst.index], args[dst.leaves])
    pred = args[pred_at] if pred_at is not None else True
    if not static:
      _check_box(s, what, op is None and _may_be_bulk(s) and _contiguous(d), d)
    if inb is not None:  # past the array's ends: TMA drops those elements
      if _wholly_outside(inb) and pred:
        _outside(wg, where, d, "a TMA store writes nothing there")
      s = refview.Ref(s.buf, s.view[inb])
    if pred:
      wg.open_group.append((s, d, reduce, where))
    if commit:
      _commit(wg, timing, issue)
    return []
  return store


def _commit(wg, timing, after=0.0):
  """Commits the warpgroup's open TMA stores as one bulk group: each reads
  SMEM until its transfer ends and writes GMEM when it completes. They
  start `after` cycles on: the issue of the store that commits them (the
  interpreter then charges the warpgroup for it, Timing.issue_split)."""
  copies, wg.open_group = wg.open_group, []
  group = _StoreGroup(len(copies))
  wg.stores.append(group)
  blk = wg.block
  sched = blk.sched
  res = wg.store_res
  wg.store_groups += 1
  if copies:
    wg.stored_group = wg.store_groups
  op = blk.hb.store_group(wg)
  for s, d, reduce, where in copies:
    blk.hb.store_pending(op, s, where)
    sview, dview = s.view, d.view
    nbytes = sview.nbytes
    cost = timing.gpu.hbm_cost(run_bytes(dview))[1]
    free = timing.store_queue(blk.engines, wg.time)
    if free > wg.time:  # (the engine holds as many reading stores as it takes)
      since, wg.time = wg.time, free
      wg.stalled("TMA store", since)
    start, read_done, done = timing.tma(blk.engines, wg.time + after, nbytes, store=True,
                                        hbm_cost=cost)
    blk.engines.store_reads.append((wg.time, read_done))
    blk.stats.tma_store_bytes += nbytes
    blk.stats.hbm_write_cost += nbytes * cost
    snap: list[np.ndarray] = []

    def read(s=s, sview=sview, snap=snap, where=where):
      blk.hb.store_read(op, s, where)
      blk.group.read(s, "tma_store", "copy_smem_to_gmem", where, wg.index, blk)
      snap.append(sview.copy())
      group.unread -= 1
      sched.notify(res)

    def write(d=d, dview=dview, snap=snap, reduce=reduce, where=where):
      blk.hb.store_write(op, d, where, atomic=reduce is not None)
      if reduce is None:
        dview[...] = snap[0]
      else:
        blk.group.read(d, "tma_store", "copy_smem_to_gmem", where, wg.index, blk,
                       replayed=True)
        dview[...] = reduce(dview, snap[0])
      blk.group.wrote(d, reduce, snap[0])
      group.unwritten -= 1
      sched.notify(res)
    blk.at(read_done, read)
    blk.at(done, write)
    blk.event(f"{wg.name} TMA", f"store {s.buf.name}->{d.buf.name}", start, done)


@rule("commit_group")
def _commit_group(eqn, cx):
  timing = cx.timing

  def commit(wg):
    _commit(wg, timing)
    return []
  return commit


@rule("wait_smem_to_gmem")
def _wait_smem_to_gmem(eqn, cx):
  n = eqn.params["n"]
  read_only = jx.param(eqn, "wait_read_only")
  where = cx.where(eqn)
  field = "unread" if read_only else "unwritten"

  def ready_fn(wg):
    def ready():
      groups = wg.stores
      while groups and groups[0].unwritten == 0:
        groups.popleft()
      older = len(groups) - n
      for i in range(max(older, 0)):
        if getattr(groups[i], field):
          return False
      return True
    return ready

  def wait(wg):
    ready = ready_fn(wg)
    if not ready():
      start = wg.time
      yield Wait(ready, (wg.store_res,),
                 f"wait_smem_to_gmem({n}, wait_read_only={read_only})", where)
      wg.stalled("TMA store", start)
    # all but the newest n groups are observed (their reads at least)
    wg.store_reads_awaited = max(wg.store_reads_awaited, wg.store_groups - n)
    wg.block.hb.stores_awaited(wg, n, read_only, where)
    return []
  return Gen(wait)


@rule("async_prefetch")
def _async_prefetch(eqn, cx):
  """A TMA prefetch of GMEM into L2: no effect on any value, and L2 is
  coherent, so nothing to order. The L2 model does not see it either: a
  load after it costs what it would without it."""
  return lambda wg, ref, *leaves: []
