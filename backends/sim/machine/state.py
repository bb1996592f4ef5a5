"""Per-block and per-thread state that rules read and update."""
import collections

import numpy as np

from pallas_sim.backends.sim.machine import races
from pallas_sim.errors import UnsupportedPrimitiveError
from pallas_sim.backends.sim.machine.scheduler import Resource, Scheduler, Thread, Wait


class BlockStats:
  __slots__ = ("tma_load_bytes", "tma_store_bytes", "wgmma_flops")

  def __init__(self):
    self.tma_load_bytes = 0
    self.tma_store_bytes = 0
    self.wgmma_flops = 0


class BlockState:
  """One CTA: its scheduler, shared allocations and per-SM engines."""

  def __init__(self, index, gpu, trace=None, tracker=None, num_threads=1):
    self.index = index
    self.gpu = gpu
    # Race detection (None when off): clock components 1..4n belong to the
    # n threads and their wgmma / TMA-store-read / TMA-store-write channels
    # (0 is "none"); barriers get theirs on first use.
    self.tracker = tracker
    self.num_threads = num_threads
    self.next_comp = 1 + 4 * num_threads
    self.barriers = []
    self.sched = Scheduler()
    self.shared = {}          # (id(eqn), occurrence) -> list of Buffers
    self.tc_free = 0.0        # when the SM's tensor cores are next free
    self.tma_free = 0.0       # when the SM's TMA engine is next free
    self.stats = BlockStats()
    self.trace = trace        # list of (thread, name, start, end) or None

  def barrier_comp(self, slot):
    """The clock component of a barrier, assigned on first use."""
    if slot.comp is None:
      if self.next_comp >= races.CAP:
        raise races_capacity_error(slot)
      slot.comp = self.next_comp
      slot.base = self.tracker.base
      self.next_comp += 1
      self.barriers.append(slot)
      tracker = self.tracker

      def misuse(tid, where, text):
        site = tracker.log.site("thread", "barrier_wait", where, slot.name,
                                "wait", tid)
        tracker.misuse("lost barrier completion", site, self.index, text)
      slot.misuse = misuse
    return slot.comp

  def event(self, who, name, start, end):
    if self.trace is not None:
      self.trace.append((self.index, who, name, start, end))


class ThreadCtx(Thread):
  """One Pallas thread (warpgroup) of a block."""
  __slots__ = ("block", "tid", "axes", "wgmma", "wgmma_res", "stores",
               "store_res", "open_group", "bar_waits", "scope_counts",
               "vc", "avc", "base", "wg_issued", "store_groups")

  def __init__(self, block, tid, axes, name):
    super().__init__(name, block.sched)
    self.block = block
    self.tid = tid
    self.axes = axes            # axis name -> index (grid, cluster, thread)
    self.wgmma = collections.deque()   # pending wgmma groups, oldest first
    self.wgmma_res = Resource(f"{name} wgmma")
    self.stores = collections.deque()  # committed TMA store groups
    self.store_res = Resource(f"{name} TMA stores")
    self.open_group = []        # TMA stores not yet committed to a group
    self.bar_waits = {}         # id(BarrierSlot) -> waits done by this thread
    self.scope_counts = {}      # id(eqn) -> times this thread entered it
    self.wg_issued = 0          # wgmma groups issued so far
    self.store_groups = 0       # TMA store groups committed so far
    # Vector clocks (race detection only): `vc` is what this thread knows
    # happened before its next step; `avc` the same with thread components
    # cut back to what is fenced for the async proxy (commit_smem).
    self.vc = self.avc = None
    if block.tracker is not None:
      base = self.base = block.tracker.base
      self.vc = races.new_vector(base)
      self.avc = races.new_vector(base)
      self.vc[tid + 1] = base + 1

  # clock components of this thread and its channels
  @property
  def comp(self):
    return 1 + self.tid

  @property
  def wg_comp(self):
    return 1 + self.block.num_threads + self.tid

  @property
  def sr_comp(self):
    return 1 + 2 * self.block.num_threads + self.tid

  @property
  def sw_comp(self):
    return 1 + 3 * self.block.num_threads + self.tid

  def tick(self):
    """After a release: later accesses are not covered by what it published."""
    self.vc[self.tid + 1] += 1

  def commit(self):
    """commit_smem: the plain SMEM accesses this thread knows of (its own and,
    fences being cumulative, those of threads it synchronized with) become
    visible to the async work it issues from now on."""
    n = self.block.num_threads
    np.maximum(self.avc[1:n + 1], self.vc[1:n + 1], out=self.avc[1:n + 1])
    self.tick()

  def learn(self, comp, clock):
    """Observed an async channel up to `clock` (waits)."""
    if self.vc[comp] < clock:
      self.vc[comp] = self.avc[comp] = clock

  def join(self, vc, avc):
    np.maximum(self.vc, vc, out=self.vc)
    np.maximum(self.avc, avc, out=self.avc)

  def op_vectors(self, **own):
    """Vectors for async work issued now (then tick): what it is ordered
    after; `own` sets this thread's channel components for in-order work."""
    self.tick()  # the issue gets a clock of its own, after earlier accesses
    vc, avc = self.vc.copy(), self.avc.copy()
    for comp, clock in own.values():
      vc[comp] = avc[comp] = clock
    self.tick()
    return vc, avc

  def site(self, agent, prim, where, buffer, access):
    return self.block.tracker.log.site(agent, prim, where, buffer, access,
                                       self.tid)

  def check(self, ref, write, site):
    """A plain load or store by this thread (its clock ticks at each, so
    that every access has its own stamp)."""
    buf = ref.buf
    if buf.data.dtype != object:
      c = self.tid + 1
      self.vc[c] += 1
      self.block.tracker.access(buf, ref.view, self.vc, c, self.vc[c], site,
                                write)

  def wait_wgmma(self, n, what, where):
    """Generator: blocks until at most `n` wgmma groups are in flight; then
    all but the newest n are observed."""
    if len(self.wgmma) > n:
      yield Wait(lambda: len(self.wgmma) <= n, (self.wgmma_res,), what, where)
    if self.vc is not None:
      self.learn(self.wg_comp, self.base + self.wg_issued - n)


def races_capacity_error(slot):
  return UnsupportedPrimitiveError(
      f"race detection tracks at most {races.CAP - 1} clocks (4 per thread, 1 "
      f"per barrier) per block; {slot.name} is one too many (run with "
      "check_races=False)")
