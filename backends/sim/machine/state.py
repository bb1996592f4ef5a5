"""Per-block and per-warpgroup state that rules read and update."""
import collections
from typing import Any

from pallas_sim.backends.sim.machine.scheduler import Resource, Task, Wait


# What a warpgroup waits for (Warpgroup.stalled): an async copy's bytes
# (a barrier a TMA load completed), other threads' arrivals (barriers,
# semaphores, a warp_map's join), the tensor cores (wgmma waits, and a
# wgmma's issue while their queue is full), TMA stores
# (their SMEM reads or GMEM writes); and time spent moving spilled
# registers (timing/occupancy.py).
STALLS = ("TMA", "barrier", "tensor core", "TMA store", "spill", "GMEM load")


class BlockStats:
  """A block's traffic and work, and its warpgroups' time: issuing
  (`thread_cycles`, every warpgroup's clock at its end, summed) and stalled,
  by what they waited for (`stalls`, cycles summed over warpgroups); the
  cycles its SM's units worked for it (`tma_cycles`, `tensor_cycles`)."""
  __slots__ = ("tma_load_bytes", "tma_store_bytes", "wgmma_flops", "tensor_f16_flops",
               "hbm_read_cost", "hbm_write_cost", "plain_load_bytes", "plain_store_bytes",
               "thread_cycles", "stalls", "tma_cycles", "tensor_cycles", "load_sites", "loads",
               "path")

  def __init__(self):
    self.tma_load_bytes = 0
    self.tma_store_bytes = 0
    self.wgmma_flops = 0
    self.tensor_f16_flops = 0.0  # (as many f16 FLOP as take the tensor cores as long)
    # TMA bytes loaded and stored, each weighted by what a byte in runs as
    # long as its box's costs HBM (gpus.GPU.hbm_cost)
    self.hbm_read_cost = 0.0
    self.hbm_write_cost = 0.0
    # GMEM bytes its threads read and wrote with plain loads and stores (no
    # TMA): what they move counts toward HBM's floor (execute/kernel_report.py)
    self.plain_load_bytes = 0
    self.plain_store_bytes = 0
    self.thread_cycles = 0.0
    self.stalls = dict.fromkeys(STALLS, 0.0)
    self.tma_cycles = 0.0
    self.tensor_cycles = 0.0
    self.load_sites = {}  # TMA load site (Compiler.site) -> [bytes, loads] there
    self.loads = None     # its TMA loads (base/loads.py Load), where the L2 model follows them
    self.path = None      # its control decisions, where backends/sim/blocks/paths.py follows them

  def add(self, other, times=1):
    """Adds another block's tallies (`times` blocks like it)."""
    for name in ("tma_load_bytes", "tma_store_bytes", "wgmma_flops", "tensor_f16_flops",
                 "hbm_read_cost", "hbm_write_cost", "plain_load_bytes", "plain_store_bytes",
                 "thread_cycles", "tma_cycles",
                 "tensor_cycles"):
      setattr(self, name, getattr(self, name) + times * getattr(other, name))
    for k, v in other.stalls.items():
      self.stalls[k] += times * v
    for k, (nbytes, loads) in other.load_sites.items():
      mine = self.load_sites.setdefault(k, [0, 0])
      mine[0] += times * nbytes
      mine[1] += times * loads


class Block:
  """One CTA of a group: its SMEM allocations, the SM engines it runs on
  (timing/model.py), its statistics and trace events. The group's
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
    self.trace = trace        # list of (number, block, agent, name, start, end) or None
    self.until = 0.0          # when its last async work completes
    self.warpgroups = []
    self.named = {}           # id -> its named barrier (machine/named_barriers.py), once used
    self.gmem_read = set()    # ids of the GMEM buffers its plain loads read (the L1's)
    # Async work on SMEM of run_scoped scopes that ended before it was
    # observed (checks/observer.py, scope_end).
    self.zombies = []

  def at(self, time, fn):
    """Schedules async work of this block completing at `time`."""
    if time > self.until:
      self.until = time
    self.sched.at(time, fn)

  def event(self, who, name, start, end):
    if self.trace is not None:
      self.trace.append((self.number, self.index, who, name, start, end))

  def cycles(self):
    return max([wg.time for wg in self.warpgroups] + [self.until])

  def finish(self):
    """Its cycles, once its group ran; tallies what the units did for it."""
    st = self.stats
    st.thread_cycles = sum(wg.time for wg in self.warpgroups)
    st.tma_cycles = self.engines.tma_work
    st.tensor_cycles = self.engines.tc_work
    st.loads = self.engines.loads
    st.path = self.engines.path
    return self.cycles()


class Warpgroup(Task):
  """One Pallas thread of a block: a warpgroup of 128 lanes, running the
  kernel body as a coroutine."""
  __slots__ = ("block", "index", "axes", "wgmma", "wgmma_res", "stores",
               "store_res", "open_group", "bar_waits", "warp_waits", "scope_counts",
               "wg_issued", "store_groups", "store_reads_awaited", "stored_group",
               "hb")

  def __init__(self, block, index, axes, name):
    super().__init__(name, block.sched)
    self.block = block
    self.index = index          # the Pallas thread index (thread_name axis)
    self.axes = axes            # axis name -> (index, size): grid, cluster, thread
    self.wgmma: collections.deque[Any] = collections.deque()   # pending wgmma groups, oldest first
    self.wgmma_res = Resource(f"{name} wgmma")
    self.stores: collections.deque[Any] = collections.deque()  # committed TMA store groups
    self.store_res = Resource(f"{name} TMA stores")
    self.open_group = []        # TMA stores not yet committed to a group
    self.bar_waits = {}         # BarrierSlot -> waits done by this warpgroup
    # BarrierSlot -> waits done by each of its warps, where warp_map's warps
    # waited on it unequally (each warp's lanes keep their own phase)
    self.warp_waits = {}
    self.scope_counts = {}      # id(eqn) -> times this warpgroup entered it
    self.wg_issued = 0          # wgmma groups issued so far
    self.store_groups = 0       # TMA store groups committed so far
    self.store_reads_awaited = 0  # of those, how many it awaited the reads of
    # The number of the newest of those that holds a store (a commit with no
    # store before it makes an empty group: nothing of it reads SMEM)
    self.stored_group = 0
    self.hb = None              # the observer's per-warpgroup state
    block.warpgroups.append(self)
    block.hb.warpgroup(self)

  def wait_wgmma(self, n, what, where):
    """Generator: blocks until at most `n` wgmma groups are in flight; then
    all but the newest n are observed."""
    if len(self.wgmma) > n:
      start = self.time
      yield Wait(lambda: len(self.wgmma) <= n, (self.wgmma_res,), what, where)
      self.stalled("tensor core", start)
    self.block.hb.wgmma_awaited(self, n, where)

  def stalled(self, kind, since):
    """It waited from `since` until now for `kind` (STALLS)."""
    self.block.stats.stalls[kind] += self.time - since


WARPS_PER_WARPGROUP = 4


def _parents(name):
  return property(lambda self: getattr(self.parent, name),
                  lambda self, v: setattr(self.parent, name, v))


class Warp(Warpgroup):
  """One of the four warps of a warpgroup inside `plgpu.warp_map` (an
  mpmd_map over a WarpMesh): a task of its own, forked when the warpgroup
  enters the map and joined when it leaves (the lowering's warpgroup
  barriers around it). Its clock and its barrier phases are its own; its
  async queues are the warpgroup's: TMA store groups and wgmma groups
  issued by any warp are awaited by a wait of the warpgroup after the join
  (each lane waits for its own bulk groups, and the lanes that issued them
  are among the warpgroup's). A wait inside one warp also waits for the
  other warps' groups: stronger than the hardware, where a lane waits only
  for its own (a documented blind spot of the race detector)."""
  __slots__ = ("parent", "warp")

  wgmma, wgmma_res = _parents("wgmma"), _parents("wgmma_res")
  stores, store_res = _parents("stores"), _parents("store_res")
  open_group, store_groups = _parents("open_group"), _parents("store_groups")
  store_reads_awaited = _parents("store_reads_awaited")
  stored_group = _parents("stored_group")
  wg_issued, scope_counts = _parents("wg_issued"), _parents("scope_counts")

  def __init__(self, parent, warp, axes):
    Task.__init__(self, f"{parent.name} warp {warp}", parent.sched)
    self.parent = parent
    self.warp = warp
    self.block = parent.block
    self.index = f"{parent.index} warp {warp}"  # ("thread 0 warp 1" in reports)
    self.axes = axes
    self.bar_waits = dict(parent.bar_waits)
    for slot, counts in parent.warp_waits.items():
      self.bar_waits[slot] = counts[warp]
    self.time = parent.time
    self.hb = None
