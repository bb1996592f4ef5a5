"""Happens-before, as an observer the rules call at every event that orders
or accesses memory, whether race checking is on or not: `NoObserver` does
nothing; `HappensBefore` keeps vector clocks and checks every access against
the element shadows of machine/races.py.

Agents and their clock components, by key (per group of blocks):
- each warpgroup: ("wg", block, i), ticking at every release it makes and
  at each of its plain accesses;
- the async work a warpgroup issues, as channels whose clock is a sequence
  number, because waits observe them in order: ("wgmma", block, i) (wgmma_wait
  (n) observes all but the newest n), ("store_read", block, i) and
  ("store_write", block, i) for TMA store groups (wait_smem_to_gmem(n,
  wait_read_only=...));
- each barrier: ("barrier", block, allocation, index), whose clock is its
  phase; a TMA load that completes phase k is stamped with it, and a wait
  that observed phase k learns everything that arrived in it.
An access is ordered after an earlier one stamped (c, k) iff the accessing
agent's vector V has V[c] >= k. Async work sees its warpgroup's plain SMEM
accesses only up to its last commit_smem (the async-proxy fence): its vector
takes warpgroup components from the warpgroup's `avc`. The number of
components is known before a group runs (clock_components), so vectors never
grow.
"""
import numpy as np

from pallas_sim.backends.sim.machine import races
from pallas_sim.backends.sim.machine.races import timing_verdict

INF = np.iinfo(np.int64).max


class NoObserver:
  """Race checking off: every hook does nothing."""

  def warpgroup(self, wg): pass
  def plain(self, wg, ref, write, prim, where, atomic=False): pass
  def commit_smem(self, wg): pass
  def tma_load(self, wg, slot, src, dst, where, prim="copy_gmem_to_smem",
               atomic=False): return None
  def tma_load_lands(self, op): pass
  def store_group(self, wg): return None
  def store_read(self, op, src, where): pass
  def store_write(self, op, dst, where, atomic): pass
  def stores_awaited(self, wg, n, read_only): pass
  def wgmma(self, wg, operands, where): return None
  def wgmma_done(self, op): pass
  def wgmma_awaited(self, wg, n): pass
  def arrive(self, wg, slot): pass
  def phase_completed(self, slot): pass
  def waited(self, wg, slot, n): pass
  def unordered_waiter(self, slot, wg): return False
  def store_pending(self, op, src, where): pass
  def scope_end(self, wg, bufs, where): pass
  def sem_signal(self, wg, sem): pass
  def sem_acquire(self, wg, sem): pass
  def fork(self, wg, warps): pass
  def join(self, wg, warps): pass
  def ready(self): pass
  def end_group(self): pass


class _WgClock:
  """A warpgroup's (or a warp's) vectors and components; a warpgroup's
  `warps`: the clocks its warps take in warp_map."""
  __slots__ = ("vc", "avc", "thread", "wgmma", "store_read", "store_write", "pos",
               "warps")


class _BarrierClock:
  """A barrier's component, clock base, the vectors arrived in the pending
  phase, those of each completed phase, and each waiter's clock after it
  observed its last completion."""
  __slots__ = ("comp", "base", "acc", "phases", "waits")

  def __init__(self, comp, base):
    self.comp, self.base = comp, base
    self.acc = None
    self.phases = []
    self.waits = {}


class _Op:
  __slots__ = ("wg", "vc", "avc", "comp", "clock", "sites", "atomic", "t")


class HappensBefore:
  """Vector clocks for one group of blocks at a time; shadows and reports in
  `tracker` (races.Tracker, reused by the groups of a launch)."""

  def __init__(self, tracker, size, events, comps=None, warps=0):
    self.tracker = tracker
    self.warps = warps        # warps per warpgroup with clocks (warp_map), 0 or 4
    self.size = size          # clock components (clock_components)
    self.base = tracker.base  # every clock of earlier groups is below this
    # key -> component; keys name a block by its place in the group, so
    # groups of one shape can share the table (`comps`)
    self.comps = {} if comps is None else comps
    self.wgs = []
    self.threads = []         # thread components, by `pos` (warpgroups and warps)
    self.barriers = []
    self.top = {}             # barrier component -> clock base for its next slot
    # Async work not yet done, by the SMEM it will touch: (id(op), id(ref))
    # -> (op, ref, agent, primitive, where, writes it), for scope_end.
    self.pending = {}
    tracker.start_group(events)

  def comp(self, key):
    c = self.comps.get(key)
    if c is None:
      c = self.comps[key] = len(self.comps) + 1
      if c >= self.size:
        raise AssertionError(f"clock components: {key} is over {self.size}")
    return c

  def new_vector(self):
    v = np.full(self.size, self.base, np.int64)
    v[0] = INF  # component 0: "no access"
    return v

  # --- warpgroups -----------------------------------------------------------

  def warpgroup(self, wg):
    key = (wg.block.member, wg.index)
    h = _WgClock()
    h.thread = self.comp(("wg",) + key)
    h.wgmma = self.comp(("wgmma",) + key)
    h.store_read = self.comp(("store_read",) + key)
    h.store_write = self.comp(("store_write",) + key)
    h.pos = len(self.threads)
    self.threads.append(h.thread)
    h.vc, h.avc = self.new_vector(), self.new_vector()
    h.vc[h.thread] = self.base + 1
    # A warp's own component; its async channels are the warpgroup's.
    h.warps = []
    for w in range(self.warps):
      hw = _WgClock()
      hw.thread = self.comp(("warp",) + key + (w,))
      hw.wgmma, hw.store_read, hw.store_write = h.wgmma, h.store_read, h.store_write
      hw.pos = len(self.threads)
      self.threads.append(hw.thread)
      h.warps.append(hw)
    wg.hb = h
    self.wgs.append(wg)

  def ready(self):
    """Every warpgroup of the group is known: the tracker gets the thread
    components (warpgroups' and warps')."""
    self.tracker.thread_comps = np.array(self.threads)

  def fork(self, wg, warps):
    """warp_map: each warp starts knowing what its warpgroup knows."""
    h = wg.hb
    for warp in warps:
      hw = warp.hb = h.warps[warp.warp]
      hw.vc, hw.avc = h.vc.copy(), h.avc.copy()
      hw.vc[hw.thread] += 1  # (above its clocks of an earlier warp_map)
    self._tick(h)

  def join(self, wg, warps):
    """The end of warp_map: the warpgroup knows what every warp knew."""
    h = wg.hb
    for warp in warps:
      np.maximum(h.vc, warp.hb.vc, out=h.vc)
      np.maximum(h.avc, warp.hb.avc, out=h.avc)
    self._tick(h)

  @staticmethod
  def _tick(h):
    """After a release: later accesses are not covered by what it published."""
    h.vc[h.thread] += 1

  def _op(self, wg, **own):
    """Vectors for async work issued now (ticks before and after): what it
    is ordered after; `own` sets the warpgroup's channel components for
    in-order work."""
    h = wg.hb
    self._tick(h)
    op = _Op()
    op.wg, op.vc, op.avc = wg, h.vc.copy(), h.avc.copy()
    op.t = wg.time  # (issued: from then on it may touch its memory)
    for comp, clock in own.values():
      op.vc[comp] = op.avc[comp] = clock
    self._tick(h)
    return op

  @staticmethod
  def _learn(h, comp, clock):
    if h.vc[comp] < clock:
      h.vc[comp] = h.avc[comp] = clock

  def _site(self, wg, agent, prim, where, buffer, access):
    return self.tracker.log.site(agent, prim, where, buffer, access, wg.index)

  def _access(self, wg, buf, view, vec, comp, clock, site, write, atomic=False,
              issued=None, since=None):
    """`since`: for async work, when it was issued; it takes effect now (the
    event's time). A plain access takes effect at the thread's clock."""
    now = wg.block.sched.now if since is not None else wg.time
    span = (now if since is None else since, now)
    if wg.block.zombies and buf.smem_range:
      self._zombies(wg, buf, vec, site, span)
    self.tracker.access(buf, view, vec, comp, clock, site, write, wg.hb,
                        wg.block, atomic=atomic, issued=issued, span=span)

  def plain(self, wg, ref, write, prim, where, atomic=False):
    """A load or store by the thread; `atomic`: an atomic read-modify-write
    (recorded as a write that does not race with other atomic ones)."""
    buf = ref.buf
    if buf.data.dtype == object:  # barriers
      return
    h = wg.hb
    c = h.thread
    h.vc[c] += 1
    site = self._site(wg, "thread", prim, where, buf.name, "write" if write else "read")
    self._access(wg, buf, ref.view, h.vc, c, h.vc[c], site, write, atomic)

  def commit_smem(self, wg):
    """The plain SMEM accesses this warpgroup knows of (its own and, fences
    being cumulative, those of warpgroups it synchronized with) become
    visible to the async work it issues from now on."""
    h = wg.hb
    tc = self.tracker.thread_comps
    h.avc[tc] = np.maximum(h.avc[tc], h.vc[tc])
    self._tick(h)

  # --- TMA --------------------------------------------------------------------

  def tma_load(self, wg, slot, src, dst, where, prim="copy_gmem_to_smem",
               atomic=False):
    """A load completing the pending phase of `slot`: stamped with it. `src`
    None: from registers (async_store_smem); `atomic`: a reduction into dst."""
    b = self._barrier(slot)
    op = self._op(wg)
    op.comp, op.clock = b.comp, b.base + slot.completions + 1
    op.atomic = atomic
    self._accumulate(b, op.vc, op.avc)
    op.sites = [(dst, self._site(wg, "tma_load", prim, where, dst.buf.name, "write"))]
    if src is not None:
      op.sites.append((src, self._site(wg, "tma_load", prim, where, src.buf.name,
                                       "read")))
    self.pending[(id(op), id(dst))] = (op, dst, "tma_load", prim, where, True)
    return op

  def tma_load_lands(self, op):
    (dst, w_site), *read = op.sites
    self.pending.pop((id(op), id(dst)), None)
    self._access(op.wg, dst.buf, dst.view, op.avc, op.comp, op.clock, w_site, True,
                 atomic=op.atomic, issued=op.vc, since=op.t)
    for src, r_site in read:
      self._access(op.wg, src.buf, src.view, op.vc, op.comp, op.clock, r_site, False,
                   issued=op.vc, since=op.t)

  def store_group(self, wg):
    op = self._op(wg)
    op.comp, op.clock = wg.hb.store_read, self.base + wg.store_groups
    return op

  def store_pending(self, op, src, where):
    """A TMA store of `op`'s group will read `src`."""
    self.pending[(id(op), id(src))] = (op, src, "tma_store", "copy_smem_to_gmem",
                                       where, False)

  def store_read(self, op, src, where):
    self.pending.pop((id(op), id(src)), None)
    wg = op.wg
    site = self._site(wg, "tma_store", "copy_smem_to_gmem", where, src.buf.name, "read")
    self._access(wg, src.buf, src.view, op.avc, wg.hb.store_read, op.clock, site, False,
                 issued=op.vc, since=op.t)

  def store_write(self, op, dst, where, atomic):
    wg = op.wg
    site = self._site(wg, "tma_store", "copy_smem_to_gmem", where, dst.buf.name, "write")
    self._access(wg, dst.buf, dst.view, op.vc, wg.hb.store_write, op.clock, site, True,
                 atomic=atomic, since=op.t)

  def stores_awaited(self, wg, n, read_only):
    done = self.base + wg.store_groups - n
    self._learn(wg.hb, wg.hb.store_read, done)
    if not read_only:
      self._learn(wg.hb, wg.hb.store_write, done)

  # --- wgmma --------------------------------------------------------------------

  def wgmma(self, wg, operands, where):
    """Group s of a warpgroup is ordered after its group s-1 (they retire in
    order). `operands`: (ref, "read" | "write") pairs."""
    h = wg.hb
    s = self.base + wg.wg_issued
    op = self._op(wg, prev=(h.wgmma, s - 1))
    op.comp, op.clock = h.wgmma, s
    op.sites = [(r, self._site(wg, "wgmma", "wgmma", where, r.buf.name, access))
                for r, access in operands]
    for r, access in operands:
      if r.buf.space == "smem":
        self.pending[(id(op), id(r))] = (op, r, "wgmma", "wgmma", where,
                                         access == "write")
    return op

  def wgmma_done(self, op):
    for r, site in op.sites:
      self.pending.pop((id(op), id(r)), None)
      vec = op.vc if r.buf.space == "regs" else op.avc
      self._access(op.wg, r.buf, r.view, vec, op.comp, op.clock, site,
                   site.access == "write", issued=op.vc, since=op.t)

  def wgmma_awaited(self, wg, n):
    self._learn(wg.hb, wg.hb.wgmma, self.base + wg.wg_issued - n)

  # --- barriers -------------------------------------------------------------------

  def _barrier(self, slot):
    """A barrier's clock state; a slot allocated again (a scope in a loop)
    continues its component's clocks above the last slot's."""
    b = slot.hb
    if b is None:
      comp = self.comp(("barrier", slot.block.member, slot.key))
      b = slot.hb = _BarrierClock(comp, self.top.get(comp, self.base))
      self.barriers.append((slot, b))
    return b

  @staticmethod
  def _accumulate(b, vc, avc):
    if b.acc is None:
      b.acc = (vc.copy(), avc.copy())
    else:
      np.maximum(b.acc[0], vc, out=b.acc[0])
      np.maximum(b.acc[1], avc, out=b.acc[1])

  def arrive(self, wg, slot):
    h = wg.hb
    self._accumulate(self._barrier(slot), h.vc, h.avc)
    self._tick(h)

  def phase_completed(self, slot):
    b = self._barrier(slot)
    vc, avc = b.acc if b.acc is not None else (self.new_vector(), self.new_vector())
    clock = b.base + slot.completions
    vc[b.comp] = avc[b.comp] = clock
    b.phases.append((vc, avc))
    b.acc = None
    self.top[b.comp] = max(self.top.get(b.comp, self.base), clock)

  def unordered_waiter(self, slot, wg):
    """Whether the completion just made is not known to happen after `wg`
    observed the one before (a lost completion, by happens-before)."""
    b = self._barrier(slot)
    clock = b.waits.get(wg)
    return clock is not None and b.phases[-1][0][wg.hb.thread] < clock

  def waited(self, wg, slot, n):
    b = self._barrier(slot)
    h = wg.hb
    np.maximum(h.vc, b.phases[n - 1][0], out=h.vc)
    np.maximum(h.avc, b.phases[n - 1][1], out=h.avc)
    b.waits[wg] = int(h.vc[h.thread])
    self._tick(h)

  # --- run_scoped -----------------------------------------------------------------

  def scope_end(self, wg, bufs, where):
    """`wg` leaves a run_scoped whose SMEM is `bufs`. The lowering hands
    those bytes to later scopes (resources.scope_layout), so async work that
    `wg` issued on them and has not observed (still in flight, or landed
    but not awaited) may clash with whatever a later scope puts there: it
    is remembered, and checked at every access to those bytes (_zombies)."""
    ids = {id(b): b for b in bufs}
    blk = wg.block
    for key, (op, ref, agent, prim, opwhere, write) in self.pending.items():
      if op.wg is wg and id(ref.buf) in ids and ref.buf.smem_range:
        site = self._site(wg, agent, prim, opwhere, ref.buf.name,
                          "write" if write else "read")
        blk.zombies.append((ref.buf, key, op.comp, op.clock, site, None, where))
    tracker = self.tracker
    h = wg.hb
    for buf in bufs:
      sh = buf.shadow
      if sh is None or sh.group != tracker.group or not buf.smem_range:
        continue
      for comps, clocks in [(sh.wc, sh.wk)] + [sh.slot(i) for i in range(sh.read_slots)]:
        if races.all_ordered(comps, clocks, h.vc):  # (the common case, in one call)
          continue
        late = (clocks > h.vc[comps]) & (comps != 0)
        late &= ~np.isin(comps, self.threads)
        if not late.any():
          continue
        for c, k in set(zip(comps[late].tolist(), clocks[late].tolist())):
          entry = tracker.sites.get((sh.uid, c, k))
          if entry is not None and entry[0].thread == wg.index:
            blk.zombies.append((buf, None, c, k, entry[0], entry[3], where))

  def _zombies(self, wg, buf, vec, site, span):
    """An access to SMEM bytes that async work of an ended scope may still
    touch, unobserved by the accessing agent: a race with that work."""
    lo, hi = buf.smem_range
    blk = wg.block
    keep = []
    for z in blk.zombies:
      old, pending, comp, clock, first, first_span, end_where = z
      zlo, zhi = old.smem_range
      if old is buf or zhi <= lo or hi <= zlo:
        keep.append(z)
        continue
      in_flight = pending in self.pending
      if not in_flight and vec[comp] >= clock:
        continue  # (observed: those bytes are free now)
      timing = (True, 0.0) if in_flight else (
          timing_verdict(first_span, span) if first_span else (False, 0.0))
      self.tracker.events.append((
          "race", "async work outlives its run_scoped", first, site, blk.index,
          f"(bytes {max(lo, zlo)}..{min(hi, zhi)} of SMEM)",
          f"{first.describe()} was not awaited before its run_scoped ended "
          f"({end_where}), and the lowering gives those bytes to {buf.name}: "
          "await it (barrier_wait, wgmma_wait or wait_smem_to_gmem) before the "
          "scope ends", timing))
    blk.zombies = keep

  # --- semaphores -----------------------------------------------------------------

  def sem_signal(self, wg, sem):
    """A signal releases what the signalling thread knows."""
    h = wg.hb
    if sem.acc is None:
      sem.acc = (h.vc.copy(), h.avc.copy())
    else:
      np.maximum(sem.acc[0], h.vc, out=sem.acc[0])
      np.maximum(sem.acc[1], h.avc, out=sem.acc[1])
    self._tick(h)

  def sem_acquire(self, wg, sem):
    """A wait (or read) acquires every signal made so far (more than the
    hardware promises when a wait needed fewer of them)."""
    if sem.acc is not None:
      h = wg.hb
      np.maximum(h.vc, sem.acc[0], out=h.vc)
      np.maximum(h.avc, sem.acc[1], out=h.avc)
      self._tick(h)

  def end_group(self):
    """The next group's clocks start above every clock this one used."""
    top = self.base
    for wg in self.wgs:
      top = max(top, int(wg.hb.vc[1:].max()), self.base + wg.wg_issued,
                self.base + wg.store_groups)
    for slot, b in self.barriers:
      top = max(top, b.base + slot.completions)
    self.tracker.end_group(top + 1)


def clock_components(blocks, warpgroups, barriers_per_block, warps=0):
  """How many clock components a group needs: per warpgroup four (itself and
  its wgmma, TMA-store-read and TMA-store-write channels) and one per warp
  when the kernel has a warp_map (`warps`), per block one per barrier the
  kernel allocates (a scope entered again reuses its barrier's component);
  0 is "no access"."""
  return 1 + blocks * ((4 + warps) * warpgroups + barriers_per_block)
