"""Refs: plain loads and stores (get/swap/addupdate) and scoped allocation
(run_scoped), which allocates SMEM per block and accumulators per thread."""
import math

import numpy as np

from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.analysis import given_layouts, resources, walker
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.interpret.compiler import Gen, in_gmem, rule, run_gen, run_plain
from pallas_sim.backends.sim.timing.model import OpClass
from pallas_sim.backends.sim.checks import initcheck
from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.checks.races import element_view
from pallas_sim.backends.sim.machine.aliasing import element_map
from pallas_sim.backends.sim.interpret.rules import semaphores
from pallas_sim.errors import KernelError, UnsupportedPrimitiveError


def _value(a):
  return a.copy() if a.ndim else a[()]




@rule("get", "load")  # plgpu.load: a get whose result gets a layout_cast
def _get(eqn, cx):
  at = refview.compile_transforms(eqn.params["tree"])
  where = cx.where(eqn)
  gmem = in_gmem(eqn)

  def get(wg, ref, *idx):
    r = at(ref, idx, wg)
    blk = wg.block
    blk.hb.plain(wg, r, False, "load", where)
    blk.group.read(r, "thread", "load", where, wg.index, blk)
    if gmem:
      blk.stats.plain_load_bytes += r.view.nbytes
    return _value(r.view)
  return get


@rule("swap")
def _swap(eqn, cx):
  at = refview.compile_transforms(eqn.params["tree"])
  where = cx.where(eqn)
  gmem = in_gmem(eqn)

  def swap(wg, ref, val, *idx):
    r = at(ref, idx, wg)
    wg.block.hb.plain(wg, r, True, "store", where)
    view = r.view
    old = _value(view)
    view[...] = val
    wg.block.group.wrote(r)
    if gmem:
      wg.block.stats.plain_store_bytes += view.nbytes
    return old
  return swap


@rule("store")
def _store(eqn, cx):
  # plgpu.store: a swap without its result (`optimized` only steers which
  # instructions the lowering emits, and whether it accepts the store).
  swap = _swap(eqn, cx)

  def store(wg, ref, val, *idx):
    swap(wg, ref, val, *idx)
    return []
  return store


@rule("addupdate")
def _addupdate(eqn, cx):
  at = refview.compile_transforms(eqn.params["tree"])
  where = cx.where(eqn)
  gmem = in_gmem(eqn)

  def addupdate(wg, ref, val, *idx):
    r = at(ref, idx, wg)
    blk = wg.block
    blk.hb.plain(wg, r, True, "addupdate", where)
    blk.group.read(r, "thread", "addupdate", where, wg.index, blk)
    r.view[...] = r.view + val
    wg.block.group.wrote(r)
    if gmem:
      blk.stats.plain_load_bytes += r.view.nbytes
      blk.stats.plain_store_bytes += r.view.nbytes
    return []
  return addupdate


def _barriers(label, shape, num_arrivals, orders_tensor_core, collective=(),
              leader_tracked=False):
  def make(block, key):
    buf = memory.Buffer(label, "smem", memory.barrier_array(
        label, shape, num_arrivals, orders_tensor_core, block, key[:2]), alloc_key=key)
    for slot in buf.data.reshape(-1):
      slot.owner, slot.collective, slot.leader_tracked = buf, collective, leader_tracked
    return buf
  return True, make


def _cluster_arrivals(axes, launch):
  """How many blocks arrive on each block's copy of a cluster barrier over
  `axes`: those differing along at most one of them (as the lowering's
  CollectiveBarrierRef counts: sum of the sizes, minus the overcounted self)."""
  sizes = dict(zip(launch.cluster_names, launch.cluster))
  dims = []
  for a in axes:
    names = a if isinstance(a, tuple) else (a,)
    for n in names:
      if n not in sizes:
        raise KernelError(f"Unknown cluster axis {n}, available axes: "
                          f"{list(launch.cluster_names)}")
    dims.append(math.prod(sizes[n] for n in names))
  return sum(dims) - len(dims) + 1


def _allocator(aval, transforms, label, launch, inferred_swizzle=None):
  """Returns (shared?, make(block, key)) for one run_scoped allocation; `key`
  names the allocation alike in every block (race detection reuses its
  shadow; a barrier keeps its clock component; a cluster peer finds its
  copy by it)."""
  space = str(aval.memory_space)
  inner = aval.inner_aval
  dt = inner.dtype
  if isinstance(dt, jx.gpu_core.BarrierType):
    return _barriers(label, inner.shape, dt.num_arrivals, dt.orders_tensor_core)
  if isinstance(dt, jx.gpu_core.ClusterBarrierType):
    # Leader-tracked: every block's arrivals go to the leader's copy (block 0
    # along the axis), which counts them all; the others' copies get none.
    axes = tuple(dt.collective_axes)
    return _barriers(label, inner.shape,
                     dt.num_arrivals * _cluster_arrivals(axes, launch),
                     dt.orders_tensor_core, axes, dt.leader_tracked)
  members = given_layouts.union_members(aval, transforms)
  if members is not None:  # (a union's: one tuple of transforms a member)
    transforms = ()
  shape = given_layouts.logical_shape(tuple(inner.shape), transforms)
  tiling, swizzle = given_layouts.tiling_of(transforms)
  if space == "smem":
    def smem(block, key):
      buf = memory.Buffer(label, "smem", memory.poison(shape, dt), tiling, swizzle,
                          alloc_key=key)
      buf.inferred_swizzle = inferred_swizzle
      if members:
        buf.members = members
      if block.group.check_init:
        initcheck.track(buf)
      return buf
    return True, smem
  if space == "regs":
    # Accumulators start at zero: the lowering allocates them with
    # WGMMAAccumulator.zero. Registers belong to one warpgroup.
    return False, lambda block, key: memory.Buffer(label, "regs", np.zeros(shape, dt),
                                                   alloc_key=key)
  if semaphores.is_semaphore(inner):
    # A block's own semaphores (the lowering slices them per block out of a
    # zeroed GMEM array); shared by the block's threads.
    return True, lambda block, key: semaphores.Semaphores(label, shape)
  if space == "tmem":
    raise UnsupportedPrimitiveError(
        f"TMEM allocation {label}: tensor memory is Blackwell (sm_100) only; "
        "pallas-sim simulates a Hopper (sm_90) GPU, H100 or H200")
  # As the lowering: scoped GMEM (plgpu.GMEM scratch) is rejected too.
  raise KernelError(f"Unsupported memory space: {space} (allocation {label} "
                    "in run_scoped / scratch_types)")


def _shared(blk, key, count, allocs):
  """The block's SMEM allocations of the count-th entry to scope `key`
  (made on first use, by whichever of its threads or cluster peers asks)."""
  skey = (key, count)
  bufs = blk.shared.get(skey)
  if bufs is None:
    bufs = blk.shared[skey] = [make(blk, (key, i, count, blk.member)) if sh else None
                               for i, (sh, make) in enumerate(allocs)]
  return bufs


def peer_buffer(peer, buf):
  """`buf`'s counterpart in the SMEM of `peer`, a block of the same cluster
  (a multicast TMA load or a cluster barrier arrival reaches it)."""
  key, i, count = buf.alloc_key[:3]
  return _shared(peer, key, count, peer.group.makers[key])[i]


def peer_ref(peer, ref):
  """The same elements of `ref`'s allocation in cluster peer `peer`'s SMEM."""
  buf = peer_buffer(peer, ref.buf)
  off, estrides, shape = element_map(ref.buf, ref.view)
  return refview.Ref(buf, element_view(buf.data, off, shape, estrides))


@rule("run_scoped")
def _run_scoped(eqn, cx):
  jaxpr = walker.form_of(eqn, walker.Call).given[0]
  ref_transforms = jx.param(eqn, "ref_transforms") or ()
  base = cx.smem_base
  ranges, cx.smem_base = resources.scope_layout([v.aval for v in jaxpr.invars], base)
  try:
    prog = cx.compile_open(jaxpr)
  finally:
    cx.smem_base = base
  labels = resources.scope_names(jaxpr)
  allocs = []
  inferred = getattr(cx.launch, "smem_swizzle", None) or {}
  for i, v in enumerate(jaxpr.invars):
    label = labels[i] or f"scratch{i}"
    owner = jx.pipeline_allocation(eqn, label)
    if owner:  # (JAX's pipeline's own: the name alone does not say whose)
      label = f"{owner}'s {label}"
    trs = ref_transforms[i] if i < len(ref_transforms) else ()
    allocs.append(_allocator(v.aval, trs, label, cx.launch, inferred.get(v)))
  key = id(eqn)

  def allocate(wg):
    count = wg.scope_counts.get(key, 0)
    wg.scope_counts[key] = count + 1
    blk = wg.block
    blk.group.makers[key] = allocs
    bufs = _shared(blk, key, count, allocs)
    refs = [refview.root_ref(b if sh else make(blk, (key, i, count, blk.member, wg.index)))
            for i, (b, (sh, make)) in enumerate(zip(bufs, allocs))]
    for r, rng in zip(refs, ranges):
      if rng is not None and r.buf.space == "smem":
        r.buf.smem_range = rng
    return refs

  where = cx.where(eqn)

  def leave(wg, refs):
    """The scope's SMEM may go to a later scope: async work on it must be done."""
    smem = [r.buf for r in refs if r.buf.space == "smem" and r.buf.data.dtype != object]
    if smem:
      wg.block.hb.scope_end(wg, smem, where)

  if prog.blocking:
    def scoped_gen(wg, *operands):
      refs = allocate(wg)
      outs = yield from run_gen(prog, list(operands) + refs, wg)
      leave(wg, refs)
      return outs
    return Gen(scoped_gen)

  def scoped(wg, *operands):
    refs = allocate(wg)
    outs = run_plain(prog, list(operands) + refs, wg)
    leave(wg, refs)
    return outs
  return scoped


# Its own cost is none: the lowering wraps the operand registers as the
# accumulator (WGMMAAccumulator.from_registers) and hands them back, and its
# body's equations are charged as they run.
@rule("run_state", op=OpClass.SHAPE_ONLY)
def _run_state(eqn, cx):
  """Fresh refs initialized from the operands (or poisoned where
  `is_initialized` says none was given). Its results are the lowering's
  (mosaic_gpu/lowering.py, _run_state_lowering_rule): one per operand, a ref
  passed in is passed out, and the others take, in order, the body's own
  outputs first and then the final values of the refs (so `run_state(f)` of
  an accumulator returns what `f` returns, when it returns anything)."""
  jaxpr = walker.form_of(eqn, walker.RunState).given[0]
  prog = cx.compile(jaxpr)
  inits = eqn.params["is_initialized"]
  avals = [v.aval for v in jaxpr.invars]

  def make_refs(wg, operands):
    it = iter(operands)
    refs, passed = [], []
    for i, (init, aval) in enumerate(zip(inits, avals)):
      if init:
        x = next(it)
        if isinstance(x, refview.Ref):  # an existing ref passes through
          refs.append(x)
          passed.append(True)
          continue
      inner = aval.inner_aval
      space = str(getattr(aval, "memory_space", None) or "regs")
      data = (np.array(x, dtype=inner.dtype, copy=True) if init
              else memory.poison(inner.shape, inner.dtype))
      refs.append(refview.root_ref(memory.Buffer(f"state{i}", space, data)))
      passed.append(False)
    return refs, passed

  # The lowering awaits every wgmma group when run_state ends, so the
  # accumulator values it returns are final.
  where = cx.where(eqn)

  def state(wg, *operands):
    refs, passed = make_refs(wg, operands)
    outs = yield from run_gen(prog, refs, wg)
    yield from wg.wait_wgmma(0, "end of run_state (awaits its wgmma)", where)
    # (a body that returns a ref returns its final value, as the lowering reads it)
    outs = [_value(o.view) if isinstance(o, refview.Ref) else o for o in outs]
    vals = iter(outs + [_value(r.view) for r, p in zip(refs, passed) if not p])
    return [r if p else next(vals) for r, p in zip(refs, passed)]
  return Gen(state)
