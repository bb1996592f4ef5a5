"""Per-block and per-thread state that rules read and update."""
import collections

from pallas_sim.backends.sim.machine.scheduler import Resource, Scheduler, Thread, Wait


class BlockStats:
  __slots__ = ("tma_load_bytes", "tma_store_bytes", "wgmma_flops",
               "barrier_waits", "smem_peak")

  def __init__(self):
    self.tma_load_bytes = 0
    self.tma_store_bytes = 0
    self.wgmma_flops = 0
    self.barrier_waits = 0
    self.smem_peak = 0


class BlockState:
  """One CTA: its scheduler, shared allocations and per-SM engines."""

  def __init__(self, index, gpu, trace=None):
    self.index = index
    self.gpu = gpu
    self.sched = Scheduler()
    self.shared = {}          # (id(eqn), occurrence) -> list of Buffers
    self.tc_free = 0.0        # when the SM's tensor cores are next free
    self.tma_free = 0.0       # when the SM's TMA engine is next free
    self.stats = BlockStats()
    self.trace = trace        # list of (thread, name, start, end) or None

  def event(self, who, name, start, end):
    if self.trace is not None:
      self.trace.append((self.index, who, name, start, end))


class ThreadCtx(Thread):
  """One Pallas thread (warpgroup) of a block."""
  __slots__ = ("block", "tid", "axes", "wgmma", "wgmma_res", "stores",
               "store_res", "open_group", "bar_waits", "scope_counts")

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

  def wait_wgmma(self, n, what, where):
    """Generator: blocks until at most `n` wgmma groups are in flight."""
    if len(self.wgmma) > n:
      yield Wait(lambda: len(self.wgmma) <= n, (self.wgmma_res,), what, where)
