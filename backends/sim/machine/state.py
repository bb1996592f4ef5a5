"""Per-block and per-warpgroup state that rules read and update."""
import collections

from pallas_sim.backends.sim.machine.scheduler import Resource, Task, Wait


class BlockStats:
  __slots__ = ("tma_load_bytes", "tma_store_bytes", "wgmma_flops")

  def __init__(self):
    self.tma_load_bytes = 0
    self.tma_store_bytes = 0
    self.wgmma_flops = 0


class Block:
  """One CTA of a group: its SMEM allocations, the SM engines it runs on
  (machine/timing.py), its statistics and trace events. The group's
  scheduler, happens-before observer and event log are shared by its
  blocks."""

  def __init__(self, index, number, group, engines, trace=None, cluster=()):
    self.index = index        # grid coordinates (then cluster coordinates, in a cluster)
    self.cluster = cluster    # coordinates in its cluster
    self.number = number      # position in the launch (0-based)
    self.member = len(group.blocks)  # position in its group
    group.blocks.append(self)
    group.by_cluster[cluster] = self
    self.group = group
    self.sched = group.sched
    self.hb = group.hb
    self.engines = engines
    self.shared = {}          # (id(eqn), occurrence) -> list of Buffers
    self.stats = BlockStats()
    self.trace = trace        # list of (block, agent, name, start, end) or None
    self.until = 0.0          # when its last async work completes
    self.warpgroups = []

  def at(self, time, fn):
    """Schedules async work of this block completing at `time`."""
    if time > self.until:
      self.until = time
    self.sched.at(time, fn)

  def event(self, who, name, start, end):
    if self.trace is not None:
      self.trace.append((self.index, who, name, start, end))

  def cycles(self):
    return max([wg.time for wg in self.warpgroups] + [self.until])


class Warpgroup(Task):
  """One Pallas thread of a block: a warpgroup of 128 lanes, running the
  kernel body as a coroutine."""
  __slots__ = ("block", "index", "axes", "wgmma", "wgmma_res", "stores",
               "store_res", "open_group", "bar_waits", "scope_counts",
               "wg_issued", "store_groups", "store_reads_awaited", "hb")

  def __init__(self, block, index, axes, name):
    super().__init__(name, block.sched)
    self.block = block
    self.index = index          # the Pallas thread index (thread_name axis)
    self.axes = axes            # axis name -> (index, size): grid, cluster, thread
    self.wgmma = collections.deque()   # pending wgmma groups, oldest first
    self.wgmma_res = Resource(f"{name} wgmma")
    self.stores = collections.deque()  # committed TMA store groups
    self.store_res = Resource(f"{name} TMA stores")
    self.open_group = []        # TMA stores not yet committed to a group
    self.bar_waits = {}         # id(BarrierSlot) -> waits done by this warpgroup
    self.scope_counts = {}      # id(eqn) -> times this warpgroup entered it
    self.wg_issued = 0          # wgmma groups issued so far
    self.store_groups = 0       # TMA store groups committed so far
    self.store_reads_awaited = 0  # of those, how many it awaited the reads of
    self.hb = None              # the observer's per-warpgroup state
    block.warpgroups.append(self)
    block.hb.warpgroup(self)

  def wait_wgmma(self, n, what, where):
    """Generator: blocks until at most `n` wgmma groups are in flight; then
    all but the newest n are observed."""
    if len(self.wgmma) > n:
      yield Wait(lambda: len(self.wgmma) <= n, (self.wgmma_res,), what, where)
    self.block.hb.wgmma_awaited(self, n)
