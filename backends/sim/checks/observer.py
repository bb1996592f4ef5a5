"""Happens-before, as an observer the rules call at every event that orders
or accesses memory, whether race checking is on or not: `NoObserver` does
nothing; `HappensBefore` keeps vector clocks and checks every access against
the element shadows of checks/races.py.

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

Under CompilerParams(unsafe_no_auto_barriers=True) a thread's lanes order
their plain accesses with each other only through barriers of every lane:
each thread also keeps `lanes` (what every one of its lanes has ordered), a
plain access is checked against its own thread's accesses by that, and what
one lane releases (a TMA load's issue, a ClusterBarrier's arrival, a
semaphore signal) carries of its thread's accesses only that.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pallas_sim.backends.sim.checks import races, semaphore_order
from pallas_sim.backends.sim.base.events import RaceFound, SemaphoreNeeds
from pallas_sim.backends.sim.checks.races import timing_verdict

if TYPE_CHECKING:
  from pallas_sim.backends.sim.machine.state import Warpgroup

INF = np.iinfo(np.int64).max

# An async agent's reads and writes end where its issuing thread waits for it.
_AWAIT = {"wgmma": "wgmma_wait(0)",
          "tma_store": "wait_smem_to_gmem(0, wait_read_only=True)"}


def block_of(blk):
  """How reports tell a block from the others of its group: its coordinates
  in its cluster, in a cluster (so that reports fold over the clusters of
  the grid); its grid index in a group of blocks that wait on each other's
  semaphores; None when the group is the block alone."""
  if len(blk.group.blocks) == 1:
    return None
  return blk.cluster if blk.cluster else blk.index


def block_words(blk):
  return "cluster block" if blk.cluster else "block"


def _names(threads):
  """The threads (_WgClock), as reports name them, in order."""
  return ", ".join(sorted(h.who for h in threads))


def _arrivals(n):
  return f"{n} arrival{'s' if n > 1 else ''}"


_CLUSTER_END = ("Before the kernel ends, a cluster barrier that each block arrives "
                "on after its last access to a peer's SMEM and waits on (every "
                "block then knows its peers are done with its SMEM)")

_PARITY = ("the wait is for an earlier phase: mbarrier waits go by phase "
           "parity, so each thread waits once for each completion it needs (or "
           "give each buffer its own barrier)")


# The hooks' operands: `wg` a warpgroup or a warp (machine/state.py), `ref`,
# `src`, `dst` refs (interpret/refview.py), `slot` an mbarrier or a named
# barrier (machine/memory.py, machine/named_barriers.py), `op` what an issue
# hook returned, `where` the user's file:line. Threads and barriers are Any:
# their `hb`, which the observer sets, is untyped where they are defined.
class NoObserver:
  """Race checking off: every hook does nothing."""

  def warpgroup(self, wg: Any) -> None: pass
  def plain(self, wg: Any, ref: Any, write: bool, prim: str, where: str | None,
            atomic: bool = False) -> None: pass
  def commit_smem(self, wg: Any, barrier: bool = True) -> None: pass
  def tma_load(self, wg: Any, slot: Any, src: Any, dst: Any, where: str | None,
               prim: str = "copy_gmem_to_smem", atomic: bool = False) -> _Op | None:
    return None
  def tma_load_lands(self, op: _Op | None) -> None: pass
  def store_group(self, wg: Any) -> _Op | None: return None
  def store_read(self, op: _Op | None, src: Any, where: str | None) -> None: pass
  def store_write(self, op: _Op | None, dst: Any, where: str | None,
                  atomic: bool) -> None: pass
  def stores_awaited(self, wg: Any, n: int, read_only: bool,
                     where: str | None = None) -> None: pass
  def wgmma(self, wg: Any, operands: Sequence[tuple[Any, str]],
            where: str | None) -> _Op | None: return None
  def wgmma_done(self, op: _Op | None) -> None: pass
  def wgmma_awaited(self, wg: Any, n: int, where: str | None = None) -> None: pass
  def arrive(self, wg: Any, slot: Any, where: str | None = None,
             one_lane: bool = False) -> None: pass
  def named_arrive(self, wg: Any, nb: Any, where: str | None) -> None: pass
  def phase_completed(self, slot: Any) -> None: pass
  def waited(self, wg: Any, slot: Any, n: int, where: str | None = None) -> None: pass
  def unordered_waiter(self, slot: Any, wg: Any) -> bool: return False
  def made_by(self, slot: Any, n: int) -> str: return ""
  def arrival_count_note(self, slot: Any) -> str: return ""
  def store_pending(self, op: _Op | None, src: Any, where: str | None) -> None: pass
  def scope_end(self, wg: Any, bufs: Sequence[Any], where: str | None) -> None: pass
  def thread_exit(self, wg: Any, where: str | None) -> None: pass
  def sem_signal(self, wg: Any, log: semaphore_order.SemLog, inc: int,
                 where: str | None = None) -> None: pass
  def sem_acquire(self, wg: Any, log: semaphore_order.SemLog, want: int, decrement: bool,
                  where: str | None = None, read: bool = False) -> None: pass
  def fork(self, wg: Any, warps: Sequence[Any]) -> None: pass
  def join(self, wg: Any, warps: Sequence[Any]) -> None: pass
  def ready(self) -> None: pass
  def end_group(self) -> None: pass


class _WgClock:
  """A warpgroup's (or a warp's) vectors and components; a warpgroup's
  `warps`: the clocks its warps take in warp_map; `who`: how reports name
  it; `read_only_wait`: where it last waited for its TMA stores with
  wait_read_only=True (explain)."""
  __slots__ = ("vc", "avc", "thread", "wgmma", "store_read", "store_write", "pos",
               "warps", "wg", "warp", "read_only_wait", "last_waits", "acquired",
               "counts", "lanes", "family", "sync")
  vc: np.ndarray              # what it knows
  avc: np.ndarray             # what its async work knows (up to its last commit_smem)
  thread: int                 # its components: its own, its async channels'
  wgmma: int
  store_read: int
  store_write: int
  pos: int                    # its place among the group's thread components
  warps: list[_WgClock]
  wg: Warpgroup
  warp: int | None            # (a warp's number in its warpgroup)
  read_only_wait: str | None
  # "store" / "wgmma" -> (n, where) of its last wait for them
  last_waits: dict[str, tuple[int, str | None]]
  # id(SemLog) -> (the log, its last acquire of it)
  acquired: dict[int, tuple[semaphore_order.SemLog, semaphore_order.Acquire]]
  counts: list[int]           # signals and semaphore acquires made
  # Under CompilerParams(unsafe_no_auto_barriers=True) (else None): per thread
  # component, the clock up to which that thread's accesses are ordered
  # before every lane of this one, not just before the lane that made them
  # (HappensBefore.plain).
  lanes: np.ndarray | None
  # The components of its warpgroup and of that one's warps: whose accesses
  # its lanes order only through `lanes`
  family: np.ndarray
  sync: np.ndarray | None     # (beyond vc, for the lost-completion check: HappensBefore)

  @property
  def who(self) -> str:
    wg = self.wg
    block = block_of(wg.block)
    return (f"thread {wg.index}" + (f" of {block_words(wg.block)} {block}"
                                    if block is not None else "")
            + (f" warp {self.warp}" if self.warp is not None else ""))


class _BarrierClock:
  """A barrier's component, clock base, the vectors arrived in the pending
  phase, those of each completed phase, and each waiter's clock after it
  observed its last completion. For reports: what made the pending phase
  and each completed one (`by`, `phase_by`: (the arriving or issuing
  thread's _WgClock, where, whether an arrival: else a TMA load), named only
  when a report needs them), and where each thread observed each completion
  (`seen_at`: (thread component, completion) -> where)."""
  __slots__ = ("comp", "base", "acc", "phases", "waits", "by", "phase_by", "seen_at",
               "clocks", "last", "lanes_acc", "lanes", "one_lane", "phase_one_lane",
               "told_acc", "told")

  def __init__(self, comp, base):
    self.comp, self.base = comp, base
    self.acc = None
    self.phases = []
    self.waits = {}
    self.by = []
    self.phase_by = []
    self.seen_at = {}
    # A named barrier's arrivals as (thread's _WgClock, its clock then,
    # where): the pending phase's, and the last completed phase's
    self.clocks = []
    self.last = []
    # What the pending phase's arrivals and each completed phase carry of
    # _WgClock.lanes (arrivals by every lane of a thread only: not a TMA
    # load's, whose issue and arrival are one lane's)
    self.lanes_acc = None
    self.lanes = []
    # One lane's arrivals (TMA loads', a ClusterBarrier's) in the pending
    # phase and each completed one, as (the thread's _WgClock, its clock
    # then, where, what): for a report, where a wait orders only that lane's
    # accesses
    self.one_lane = []
    self.phase_one_lane = []
    # What a wait on the pending phase and on each completed one learns
    # under unsafe_no_auto_barriers: `phases` less what the threads whose one
    # lane arrived had not ordered for every lane
    self.told_acc = None
    self.told = []


class _Op:
  """Async work (a TMA load or store group, a wgmma): its issuer, what it is
  ordered after, its channel's component and clock, the accesses it makes
  ((ref, site)), and when it was issued."""
  __slots__ = ("wg", "vc", "avc", "comp", "clock", "sites", "atomic", "t")
  # (a Warpgroup, machine/state.py, whose `hb` the observer sets: the hooks
  # take their threads as Any)
  wg: Any
  vc: np.ndarray
  avc: np.ndarray
  comp: int
  clock: int
  sites: list[tuple[Any, races.Site]]
  atomic: bool
  t: float


class HappensBefore:
  """Vector clocks for one group of blocks at a time; shadows and reports in
  `tracker` (races.Tracker, reused by the groups of a launch)."""

  def __init__(self, tracker, size, events, comps=None, warps=0, number=0,
               sem_order=None, no_auto_barriers=False):
    self.tracker = tracker
    # CompilerParams(unsafe_no_auto_barriers=True): the lowering puts no
    # warpgroup barrier around plain loads and stores, so a thread's lanes
    # see each other's accesses in order only across a barrier (plain())
    self.no_auto_barriers = no_auto_barriers
    self.events = events
    self.number = number      # the group's number in the launch
    # The signals each semaphore acquire is to acquire, by its key, when an
    # earlier run of the launch worked them out (checks/semaphore_order.py);
    # None: every signal made before it.
    self.sem_order = sem_order
    self.sem_logs = {}        # id -> semaphore_order.SemLog, the group's semaphores
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
    self.owners = {}          # thread or TMA-store-write component -> _WgClock
    # SMEM buffers of blocks that ended (their SMEM is gone): id -> (block,
    # the site of its end); threads of each block that ended
    self.gone = {}
    self.ended = {}
    tracker.start_group(events)
    tracker.explain = self.explain

  def comp(self, key: tuple[Any, ...]) -> int:
    c = self.comps.get(key)
    if c is None:
      c = self.comps[key] = len(self.comps) + 1
      if c >= self.size:
        raise AssertionError(f"clock components: {key} is over {self.size}")
    return c

  def new_vector(self) -> np.ndarray:
    v = np.full(self.size, self.base, np.int64)
    v[0] = INF  # component 0: "no access"
    return v

  # --- warpgroups -----------------------------------------------------------

  def warpgroup(self, wg: Any) -> None:
    key = (wg.block.member, wg.index)
    h = _WgClock()
    h.thread = self.comp(("wg",) + key)
    h.wgmma = self.comp(("wgmma",) + key)
    h.store_read = self.comp(("store_read",) + key)
    h.store_write = self.comp(("store_write",) + key)
    h.pos = len(self.threads)
    self.threads.append(h.thread)
    h.wg, h.warp, h.read_only_wait, h.last_waits, h.acquired = wg, None, None, {}, {}
    h.counts = [0, 0]  # (signals and semaphore acquires made: their keys)
    self.owners[h.thread] = self.owners[h.store_write] = self.owners[h.wgmma] = h
    h.vc, h.avc = self.new_vector(), self.new_vector()
    h.vc[h.thread] = self.base + 1
    h.lanes = self.new_vector() if self.no_auto_barriers else None
    # Under unsafe_no_auto_barriers: what it knows of other threads' progress
    # beyond vc, which a TMA load's phase tells its waiters of its issuer only
    # as far as every lane had ordered (that bounds what their accesses are
    # ordered after, not whether a wait came before): the phases it arrives
    # on carry it, for the lost-completion check (unordered_waiter).
    h.sync = self.new_vector() if self.no_auto_barriers else None
    # A warp's own component; its async channels are the warpgroup's.
    h.warps = []
    family = [h.thread]
    for w in range(self.warps):
      hw = _WgClock()
      hw.thread = self.comp(("warp",) + key + (w,))
      hw.wgmma, hw.store_read, hw.store_write = h.wgmma, h.store_read, h.store_write
      hw.pos = len(self.threads)
      self.threads.append(hw.thread)
      hw.wg, hw.warp, hw.read_only_wait = wg, w, None
      hw.last_waits, hw.acquired = h.last_waits, h.acquired
      hw.counts = [0, 0]
      hw.lanes = self.new_vector() if self.no_auto_barriers else None
      hw.sync = self.new_vector() if self.no_auto_barriers else None
      self.owners[hw.thread] = hw
      h.warps.append(hw)
      family.append(hw.thread)
    h.family = np.array(family)
    for hw in h.warps:
      hw.family = h.family
    wg.hb = h
    self.wgs.append(wg)

  def ready(self) -> None:
    """Every warpgroup of the group is known: the tracker gets the thread
    components (warpgroups' and warps')."""
    self.tracker.thread_comps = np.array(self.threads)

  def fork(self, wg: Any, warps: Sequence[Any]) -> None:
    """warp_map: each warp starts knowing what its warpgroup knows."""
    h = wg.hb
    for warp in warps:
      hw = warp.hb = h.warps[warp.warp]
      hw.vc, hw.avc = h.vc.copy(), h.avc.copy()
      hw.vc[hw.thread] += 1  # (above its clocks of an earlier warp_map)
      if h.lanes is not None:  # (without the auto barriers no barrier starts the map)
        np.maximum(hw.lanes, h.lanes, out=hw.lanes)
        np.maximum(hw.sync, h.sync, out=hw.sync)
    self._tick(h)

  def join(self, wg: Any, warps: Sequence[Any]) -> None:
    """The end of warp_map: the warpgroup knows what every warp knew."""
    h = wg.hb
    for warp in warps:
      np.maximum(h.vc, warp.hb.vc, out=h.vc)
      np.maximum(h.avc, warp.hb.avc, out=h.avc)
      if h.sync is not None:
        np.maximum(h.sync, warp.hb.sync, out=h.sync)
    if h.lanes is not None:
      # (no barrier ends the map either: what every lane of every warp has
      # ordered, every lane of the warpgroup has)
      every = np.minimum.reduce([warp.hb.lanes for warp in warps])
      np.maximum(h.lanes, every, out=h.lanes)
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
    blk = wg.block
    return self.tracker.log.site(agent, prim, where, buffer, access, wg.index,
                                 block_of(blk), bool(blk.cluster))

  def _access(self, wg, buf, view, vec, comp, clock, site, write, atomic=False,
              issued=None, since=None, against_writes=None, against_reads=None):
    """`since`: for async work, when it was issued; it takes effect now (the
    event's time). A plain access takes effect at the thread's clock."""
    now = wg.block.sched.now if since is not None else wg.time
    span = (now if since is None else since, now)
    if wg.block.zombies and buf.smem_range:
      self._zombies(wg, buf, vec, site, span)
    if self.gone and id(buf) in self.gone:
      owner, end = self.gone[id(buf)]
      self.tracker.events.append(RaceFound(
          "SMEM access after its block ended", end, site, wg.block.index, "",
          f"{block_words(owner)} {block_of(owner)} had ended ({end.where}) when "
          f"{site.describe()} "
          "touched its SMEM: on hardware the launch fails "
          "(CUDA_ERROR_LAUNCH_FAILED). " + _CLUSTER_END, None))
    self.tracker.access(buf, view, vec, comp, clock, site, write, wg.hb,
                        wg.block, atomic=atomic, issued=issued, span=span,
                        against_writes=against_writes, against_reads=against_reads)

  def plain(self, wg: Any, ref: Any, write: bool, prim: str, where: str | None,
            atomic: bool = False) -> None:
    """A load or store by the thread; `atomic`: an atomic read-modify-write
    (recorded as a write that does not race with other atomic ones)."""
    buf = ref.buf
    if buf.data.dtype == object:  # barriers
      return
    h = wg.hb
    c = h.thread
    h.vc[c] += 1
    site = self._site(wg, "thread", prim, where, buf.name, "write" if write else "read")
    if h.lanes is None:
      self._access(wg, buf, ref.view, h.vc, c, h.vc[c], site, write, atomic)
      return
    # Without the auto barriers the lowering's loads and stores are each
    # lane's own, and which lane holds which element follows the layouts: a
    # read and a write of the thread's are ordered only up to what its last
    # barrier ordered for every lane (JAX's contract for the flag: no region
    # read and written by one thread). Its writes alone may meet unordered,
    # as its reads alone do: the contract allows both.
    lanes = self._every_lane(h, h.vc)
    self._access(wg, buf, ref.view, lanes, c, h.vc[c], site, write, atomic,
                 issued=h.vc, against_writes=h.vc if write else lanes,
                 against_reads=lanes if write else h.vc)

  @staticmethod
  def _every_lane(h, vc):
    """`vc` (a copy) with the components of h's warpgroup and its warps held
    to what every lane of h has ordered (h.lanes): what a plain access of h
    is ordered after, and what one lane of h releases."""
    out = vc.copy()
    out[h.family] = np.minimum(vc[h.family], h.lanes[h.family])
    return out

  @staticmethod
  def _own(h):
    """The components whose accesses a barrier of every lane of h orders: a
    warpgroup's own and its warps'; a warp's own."""
    return h.family if h.warp is None else h.thread

  def commit_smem(self, wg: Any, barrier: bool = True) -> None:
    """The plain SMEM accesses this warpgroup knows of (its own and, fences
    being cumulative, those of warpgroups it synchronized with) become
    visible to the async work it issues from now on. `barrier`: the fence
    ends in a warpgroup barrier (plgpu.commit_smem's does; a fence alone,
    in inline_mgpu, does not)."""
    h = wg.hb
    tc = self.tracker.thread_comps
    h.avc[tc] = np.maximum(h.avc[tc], h.vc[tc])
    if h.lanes is not None and barrier:  # (it orders every lane's accesses)
      own = self._own(h)
      h.lanes[own] = h.vc[own]
    self._tick(h)

  # --- TMA --------------------------------------------------------------------

  def tma_load(self, wg: Any, slot: Any, src: Any, dst: Any, where: str | None,
               prim: str = "copy_gmem_to_smem", atomic: bool = False) -> _Op:
    """A load completing the pending phase of `slot`: stamped with it. `src`
    None: from registers (async_store_smem); `atomic`: a reduction into dst."""
    b = self._barrier(slot)
    op = self._op(wg)
    op.comp, op.clock = b.comp, b.base + slot.completions + 1
    op.atomic = atomic
    h = wg.hb
    self._accumulate(b, op.vc if h.sync is None else np.maximum(op.vc, h.sync), op.avc)
    if h.lanes is not None:
      # One lane issues the copy and announces its bytes: the phase releases
      # that lane's accesses, so its waiters learn of the thread's own only
      # what every lane had ordered.
      self._tell(b, self._every_lane(h, op.vc))
      b.one_lane.append((h, int(op.vc[h.thread]), where, "TMA load"))
    b.by.append((wg.hb, where, False))
    op.sites = [(dst, self._site(wg, "tma_load", prim, where, dst.buf.name, "write"))]
    if src is not None:
      op.sites.append((src, self._site(wg, "tma_load", prim, where, src.buf.name,
                                       "read")))
    self.pending[(id(op), id(dst))] = (op, dst, "tma_load", prim, where, True)
    return op

  def tma_load_lands(self, op: _Op) -> None:
    (dst, w_site), *read = op.sites
    self.pending.pop((id(op), id(dst)), None)
    self._access(op.wg, dst.buf, dst.view, op.avc, op.comp, op.clock, w_site, True,
                 atomic=op.atomic, issued=op.vc, since=op.t)
    for src, r_site in read:
      self._access(op.wg, src.buf, src.view, op.vc, op.comp, op.clock, r_site, False,
                   issued=op.vc, since=op.t)

  def store_group(self, wg: Any) -> _Op:
    op = self._op(wg)
    op.comp, op.clock = wg.hb.store_read, self.base + wg.store_groups
    return op

  def store_pending(self, op: _Op, src: Any, where: str | None) -> None:
    """A TMA store of `op`'s group will read `src`."""
    self.pending[(id(op), id(src))] = (op, src, "tma_store", "copy_smem_to_gmem",
                                       where, False)

  def store_read(self, op: _Op, src: Any, where: str | None) -> None:
    self.pending.pop((id(op), id(src)), None)
    wg = op.wg
    site = self._site(wg, "tma_store", "copy_smem_to_gmem", where, src.buf.name, "read")
    self._access(wg, src.buf, src.view, op.avc, wg.hb.store_read, op.clock, site, False,
                 issued=op.vc, since=op.t)

  def store_write(self, op: _Op, dst: Any, where: str | None, atomic: bool) -> None:
    wg = op.wg
    site = self._site(wg, "tma_store", "copy_smem_to_gmem", where, dst.buf.name, "write")
    self._access(wg, dst.buf, dst.view, op.vc, wg.hb.store_write, op.clock, site, True,
                 atomic=atomic, since=op.t)

  def stores_awaited(self, wg: Any, n: int, read_only: bool,
                     where: str | None = None) -> None:
    done = self.base + wg.store_groups - n
    wg.hb.last_waits["store"] = (n, where)
    self._learn(wg.hb, wg.hb.store_read, done)
    if not read_only:
      self._learn(wg.hb, wg.hb.store_write, done)
    else:
      wg.hb.read_only_wait = where

  # --- wgmma --------------------------------------------------------------------

  def wgmma(self, wg: Any, operands: Sequence[tuple[Any, str]],
            where: str | None) -> _Op:
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

  def wgmma_done(self, op: _Op) -> None:
    for r, site in op.sites:
      self.pending.pop((id(op), id(r)), None)
      vec = op.vc if r.buf.space == "regs" else op.avc
      self._access(op.wg, r.buf, r.view, vec, op.comp, op.clock, site,
                   site.access == "write", issued=op.vc, since=op.t)

  def wgmma_awaited(self, wg: Any, n: int, where: str | None = None) -> None:
    self._learn(wg.hb, wg.hb.wgmma, self.base + wg.wg_issued - n)
    wg.hb.last_waits["wgmma"] = (n, where)

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

  @staticmethod
  def _tell(b, vc):
    if b.told_acc is None:
      b.told_acc = vc.copy()
    else:
      np.maximum(b.told_acc, vc, out=b.told_acc)

  def arrive(self, wg: Any, slot: Any, where: str | None = None,
             one_lane: bool = False) -> None:
    """Every lane of the thread arrives (a barrier_arrive, a named barrier's,
    async_store_smem's expect_tx), each releasing its own accesses; or, with
    `one_lane`, one lane arrives for it (on a ClusterBarrier: one per block
    arrived on), releasing that lane's, which under unsafe_no_auto_barriers
    is what every lane had ordered. A TMA load's arrival is tma_load's."""
    h = wg.hb
    b = self._barrier(slot)
    self._accumulate(b, h.vc if h.sync is None else np.maximum(h.vc, h.sync), h.avc)
    if h.lanes is not None and one_lane:
      self._tell(b, self._every_lane(h, h.vc))
      b.one_lane.append((h, int(h.vc[h.thread]), where, "arrival"))
    elif h.lanes is not None:
      self._tell(b, h.vc)
      lanes = h.lanes.copy()
      own = self._own(h)
      lanes[own] = h.vc[own]
      if b.lanes_acc is None:
        b.lanes_acc = lanes
      else:
        np.maximum(b.lanes_acc, lanes, out=b.lanes_acc)
    b.by.append((h, where, True))
    self._tick(h)

  def named_arrive(self, wg: Any, nb: Any, where: str | None) -> None:
    """An arrival on a named barrier (machine/named_barriers.py): it counts
    towards the pending phase only if every arrival of the phase before is
    ordered before it; otherwise, on the hardware, it can come first and
    fill that phase in another thread's place."""
    h = wg.hb
    b = self._barrier(nb)
    late = [(who, at) for who, clock, at in b.last if h.vc[who.thread] < clock]
    if late:
      who, at = late[0]
      k = nb.completions
      site = self._site(wg, "thread", "named barrier", where, nb.name, "arrive")
      wg.block.group.misuse(
          "named barrier arrival in an earlier phase", site, wg.block,
          f"{h.who}'s arrival on {nb.name} ({where}) counts towards its phase "
          f"#{k + 1}, but nothing orders it after {who.who}'s arrival for phase "
          f"#{k} ({at}): on the hardware it can come first and complete phase "
          f"#{k} in that thread's place, releasing the threads that sync on it "
          f"too early. Make {h.who} wait for phase #{k} before it arrives again "
          f"(bar.sync in place of bar.arrive, or a barrier that {who.who} "
          "arrives on after its own arrival)")
    b.clocks.append((h, int(h.vc[h.thread]), where))
    self.arrive(wg, nb, where)

  def phase_completed(self, slot: Any) -> None:
    b = self._barrier(slot)
    b.last, b.clocks = b.clocks, []
    vc, avc = b.acc if b.acc is not None else (self.new_vector(), self.new_vector())
    clock = b.base + slot.completions
    vc[b.comp] = avc[b.comp] = clock
    b.phases.append((vc, avc))
    if self.no_auto_barriers:
      b.lanes.append(b.lanes_acc if b.lanes_acc is not None else self.new_vector())
      b.lanes_acc = None
      b.phase_one_lane.append(b.one_lane)
      b.one_lane = []
      told = b.told_acc if b.told_acc is not None else self.new_vector()
      told[b.comp] = clock
      b.told.append(told)
      b.told_acc = None
    b.phase_by.append(b.by)
    b.by = []
    b.acc = None
    self.top[b.comp] = max(self.top.get(b.comp, self.base), clock)

  def made_by(self, slot: Any, n: int) -> str:
    """What made completion n of `slot`, for a report."""
    return self._made_by(self._barrier(slot), n)

  def arrival_count_note(self, slot: Any) -> str:
    """A sentence for a report when more threads arrive on `slot` than its
    phases wait for; else ""."""
    arrivers = self._arrivers(self._barrier(slot))
    if len(arrivers) <= slot.num_arrivals:
      return ""
    return (f". Note that {len(arrivers)} threads arrive on {slot.name} "
            f"({_names(arrivers)}) while a phase completes after "
            f"{_arrivals(slot.num_arrivals)} (its num_arrivals): if each phase is meant "
            f"to wait for all of them, num_arrivals={len(arrivers)} is the fix")

  def unordered_waiter(self, slot: Any, wg: Any) -> bool:
    """Whether the completion just made is not known to happen after `wg`
    observed the one before (a lost completion, by happens-before)."""
    b = self._barrier(slot)
    clock = b.waits.get(wg)
    return clock is not None and b.phases[-1][0][wg.hb.thread] < clock

  def waited(self, wg: Any, slot: Any, n: int, where: str | None = None) -> None:
    b = self._barrier(slot)
    h = wg.hb
    b.seen_at[(h.thread, n)] = where
    np.maximum(h.vc, b.phases[n - 1][0] if h.lanes is None else b.told[n - 1], out=h.vc)
    np.maximum(h.avc, b.phases[n - 1][1], out=h.avc)
    if h.lanes is not None:
      np.maximum(h.lanes, b.lanes[n - 1], out=h.lanes)
      np.maximum(h.sync, b.phases[n - 1][0], out=h.sync)
    b.waits[wg] = int(h.vc[h.thread])
    self._tick(h)

  # --- what a report says ------------------------------------------------------------

  def explain(self, rec: Any, cur: Any, h: _WgClock, vc: np.ndarray, avc: np.ndarray,
              swapped: bool = False, buf: Any = None) -> str | None:
    """Why two accesses the tracker found unordered are, where the kernel
    has synchronization meant to order them: a wait that observed an
    earlier phase than the one that carries the other access, a barrier
    whose phases complete before every arriving thread arrived, an arrival
    without commit_smem before it, a read-only wait for a TMA store, an
    arrival made only before the access. Text, or None (then races.advice
    says what to add). `rec`: the recorded access, (site, component,
    clock); `cur`: the current one, the same, made by `h`, which knew vc
    (and, for async work, avc) when it made or issued it; `swapped`: the
    recorded access knew of the current one's issue (it is the later);
    `buf`: the buffer both touched."""
    (rsite, c, k), (csite, cc, ck) = rec, cur
    rh = self.owners.get(c)
    if (self.no_auto_barriers and rh is not None and rsite.agent == csite.agent == "thread"
        and rh.wg is h.wg and (c == cc or None in (rh.warp, h.warp))):
      # (a thread's own two accesses, or its warp's and its own: two warps'
      # get the advice for warps)
      return _lanes_unordered(rsite, csite) if not swapped else _lanes_unordered(csite, rsite)
    if self.no_auto_barriers and rh is not None and not swapped:
      text = (self._one_lanes_phase(rsite, rh, k, csite, h)
              or self._one_lanes_signal(rsite, rh, k, csite, h))
      if text:
        return text
    by_own = sorted(self.barriers, key=lambda sb: sb[1].comp != c)
    if not swapped:
      for slot, b in by_own:
        text = self._missed_phase(slot, b, rsite, c, k, csite, h, vc, avc)
        if text:
          return text
    # A TMA load another block issued into this block's SMEM (a multicast,
    # async_store_smem to a peer) completes on this block's copy of its
    # barrier: this block waits on that, not on a cluster barrier. (After
    # the phases: a plain read that such a load overwrites, released through
    # an arrival with no commit_smem, is told so there.)
    key = getattr(buf, "alloc_key", None)
    owner = key[3] if key and len(key) > 3 else None
    for load, plain, ph in ((rsite, csite, h), (csite, rsite, rh)):
      if (load.agent == "tma_load" and load.access == "write" and plain.agent == "thread"
          and ph is not None and load.block != plain.block
          and ph.wg.block.member == owner):
        return (f"the {load.prim} issued by {load.who} ({load.where}) writes the SMEM "
                f"of {plain.block_name} too, and completes on that block's "
                f"own copy of its barrier: barrier_wait on it in {plain.who} before "
                f"the {plain.access} ({plain.where})")
    # The current access is a TMA load (stamped with the completion it
    # makes): did the recorded thread wait on that barrier, for an earlier one?
    if (csite.agent == "tma_load" and rsite.agent == "thread" and rh is not None
        and vc[c] < k):
      for slot, b in self.barriers:
        seen = [n for (t, n) in b.seen_at if t == rh.thread]
        m = ck - b.base
        if b.comp == cc and seen and max(seen) < m:
          n = max(seen)
          return (f"{rh.who}'s wait on {slot.name} ({b.seen_at[(rh.thread, n)]}) "
                  f"observed completion #{n} ({self._made_by(b, n)}), but this TMA "
                  f"load ({csite.where}) completes #{m}: {rh.who}'s "
                  f"{rsite.access} ({rsite.where}) needs a wait for #{m} first: "
                  + _PARITY)
    store = (rsite, rh, h) if not swapped else (csite, h, rh)
    site, sh, other = store
    if (site.agent == "tma_store" and site.access == "write" and sh is not None
        and other is not None and sh.read_only_wait
        and (swapped or vc[sh.store_read] >= k)):
      then = (f"so what it then releases to {other.who} does not include the "
              "write: wait with wait_read_only=False before releasing"
              if other.wg is not sh.wg else
              "so the wait does not order the store's write before this access: "
              "wait with wait_read_only=False before it")
      return (f"{sh.who} waited for the TMA store ({site.where}) with "
              f"wait_smem_to_gmem(..., wait_read_only=True) ({sh.read_only_wait}), "
              "which waits until the store has read its SMEM, not until its GMEM "
              f"writes land, {then}")
    # Its own async work, awaited by a wait that leaves it in flight.
    # (the async one first, then the thread that should have awaited it)
    for work, issuer, plain, waiter in ((rsite, rh, csite, h), (csite, h, rsite, rh)):
      kind = {"wgmma": "wgmma", "tma_store": "store"}.get(work.agent)
      if (kind and plain.agent == "thread" and issuer is not None and waiter is not None
          and issuer.wg is waiter.wg and waiter.last_waits.get(kind, (0,))[0]):
        n, where = waiter.last_waits[kind]
        what = "wgmma groups" if kind == "wgmma" else "TMA store groups"
        return (f"the last wait before this {plain.access} ({where}) leaves the newest "
                f"{n} {what} in flight, and the {races.agent_words(work.agent)} at "
                f"{work.where} is one of them: wait with n=0 there (wait_n=0 for "
                "wgmma_accumulator_load), or issue the work earlier")
    if rh is not None:
      text = (self._signalled_early(rsite, rh, c, k, h, vc) if not swapped else
              self._signalled_early(csite, h, cc, ck, rh, None))
      if text:
        return text
    if not swapped:
      for slot, b in by_own:
        text = self._no_arrival_after(slot, b, rsite, c, k, csite, h, vc)
        if text:
          return text
    return None

  def _one_lanes_signal(self, rsite, rh, k, csite, h):
    """Under unsafe_no_auto_barriers: `h` acquired a semaphore that `rh`
    signalled after its access; one lane signals, with no barrier before it
    to order the other lanes' accesses. Text, or None."""
    for log in self.sem_logs.values():
      if not any(a.who is h for a in log.acquires):
        continue
      for sig in log.signals:
        if sig.who is rh and sig.clock >= k:
          return (f"{rh.who} signals {log.name} ({sig.where}) after its "
                  f"{rsite.access} ({rsite.where}), and {h.who} waits on it before "
                  f"its {csite.access} ({csite.where}), but with "
                  "unsafe_no_auto_barriers=True the lowering puts no barrier before "
                  "the signal, which one lane makes: it releases that lane's "
                  "accesses only (which lane holds which element follows the "
                  f"layouts). commit_smem in {rh.who} between the {rsite.access} "
                  "and the signal orders every lane's, or drop the flag")
    return None

  def _one_lanes_phase(self, rsite, rh, k, csite, h):
    """Under unsafe_no_auto_barriers: `h` waited on a phase that one lane of
    `rh` completed after its access (a TMA load's issue, a ClusterBarrier's
    arrival); that orders that lane's accesses only. Text, or None."""
    for slot, b in self.barriers:
      for n, issued in enumerate(b.phase_one_lane, 1):
        if (h.thread, n) not in b.seen_at:
          continue
        for who, clock, where, what in issued:
          if who is rh and clock >= k:
            how = ("one lane issues the copy and announces its bytes" if what ==
                   "TMA load" else "one lane arrives for each block")
            return (f"{rh.who}'s {rsite.access} ({rsite.where}) comes before the "
                    f"{what} ({where}) that completes the phase of {slot.name} "
                    f"{h.who} waited on ({b.seen_at[(h.thread, n)]}), but with "
                    "unsafe_no_auto_barriers=True nothing orders the other lanes' "
                    f"accesses before it: {how}, and the phase releases that lane's "
                    "accesses only (which lane holds which element follows the "
                    f"layouts). commit_smem in {rh.who} between the {rsite.access} "
                    f"and the {what.split()[-1].lower()} orders every lane's")
    return None

  @staticmethod
  def _observed(slot, b, h, vc):
    """(the completion of `slot` that `h`, knowing vc, last observed, words
    for that wait), or None where it observed none of this slot's."""
    n = int(vc[b.comp]) - b.base
    if not 0 < n <= len(b.phases):
      return None
    seen = b.seen_at.get((h.thread, n))
    return n, (f"{h.who}'s wait on {slot.name} ({seen})" if seen else
               f"what {h.who} knows of {slot.name}")

  def _missed_phase(self, slot, b, rsite, c, k, csite, h, vc, avc):
    """explain() for one barrier the current access's agent observed."""
    if slot.block is not None and slot.block is not h.wg.block:
      # (a thread waits on its own block's copy only: what it knows of a
      # peer block's barrier came through another one, which is to blame)
      return None
    observed = self._observed(slot, b, h, vc)
    if observed is None:
      return None
    n, wait = observed
    if getattr(slot, "kind", None) == "named":
      return self._named_phase(slot, b, n, wait, rsite, c, k, csite, h, vc)
    asynchronous = csite.agent != "thread"
    phases = b.phases + ([b.acc] if b.acc is not None else [])
    carry = next((i + 1 for i, (pv, _) in enumerate(phases) if pv[c] >= k), None)
    if vc[c] >= k:  # (known to it: only the async proxy's view misses it)
      carry = None
    if carry is not None and carry > n:
      arrivers = self._arrivers(b)
      if len(arrivers) > slot.num_arrivals and all(
          sum(arrival for _, _, arrival in by) == slot.num_arrivals for by in b.phase_by):
        cause = (f"{slot.name} completes a phase after {_arrivals(slot.num_arrivals)} "
                 f"(its num_arrivals), but {len(arrivers)} threads arrive on it "
                 f"({_names(arrivers)}): completion #{n} did not wait for the arrival "
                 f"that follows this {rsite.access}; with num_arrivals="
                 f"{len(arrivers)} each phase waits for all of them")
      elif self._next_arrival_needed(b, h, n):
        # Waiting for #carry would deadlock: it needs this thread's own next
        # arrival, which comes after this access.
        # The write that reuses the buffer is to wait for the read (where
        # one of the two is a read).
        first, then = ((rsite, csite) if rsite.access == "read" or csite.access != "read"
                       else (csite, rsite))
        cause = (f"{h.who} cannot wait for #{carry} here, since that completion "
                 f"needs its own next arrival on {slot.name}: nothing tells "
                 f"{then.who} that {first.who}'s {first.access} ({first.where}) is "
                 f"done before its {then.access} ({then.where}). It takes a second "
                 f"barrier, one that {first.who} arrives on after its {first.access} "
                 f"and {then.who} waits on before its {then.access}, or a second "
                 "buffer")
      else:
        cause = _PARITY
      return (f"{wait} observed completion #{n} ({self._made_by(b, n)}), but "
              f"{rsite.describe()} reaches {slot.name} only with completion "
              f"#{carry} ({self._made_by(b, carry)}): {cause}")
    carry = next((i + 1 for i, (pv, _) in enumerate(b.phases[:n]) if pv[c] >= k), None)
    if (asynchronous and rsite.agent == "thread" and carry is not None
        and b.phases[carry - 1][1][c] < k and self.owners.get(c) is not h):
      return (f"{rsite.who} arrives on {slot.name} after its plain {rsite.access} "
              f"({rsite.where}), and {wait} observed that arrival, but no commit_smem "
              f"comes between the {rsite.access} and the arrival: plain SMEM accesses "
              f"reach async work ({csite.where}) only through commit_smem before the "
              "arrival")
    return None

  def _named_phase(self, slot, b, n, wait, rsite, c, k, csite, h, vc):
    """explain() for a named barrier whose phase #n the current access's
    agent observed: the recorded thread arrived in it before its access, or
    the access reached the agent through it but not across an async-proxy
    fence."""
    rh = self.owners.get(c)
    if rh is None or rsite.agent != "thread":
      return None
    mine = [where for who, where, _ in b.phase_by[n - 1] if who is rh]
    if vc[c] < k and mine:
      return (f"{wait} observed phase #{n}, which {rh.who} joined "
              f"({mine[0]}) before its {rsite.access} ({rsite.where}): an arrival "
              f"releases only what its thread did before it; arrive after the "
              f"{rsite.access}")
    if vc[c] >= k and csite.agent != "thread":
      return (f"{rsite.who}'s plain {rsite.access} ({rsite.where}) is ordered before "
              f"{csite.where} through {slot.name} ({wait}), but only for the generic "
              "proxy: async work sees plain SMEM accesses across an async-proxy fence. "
              f"Fence in {rsite.who} after the {rsite.access} and before its arrival "
              f"(commit_smem, or nvvm.fence_proxy(async_shared, shared_cta) in "
              f"inline_mgpu), or in {h.who} after it observed the phase and before "
              f"{csite.where}")
    return None

  @staticmethod
  def _signalled_early(rsite, rh, c, k, h, vc):
    """explain(): `h` acquired a semaphore `rh` signals, but not through a
    signal that covers `rh`'s access (rsite, stamped (c, k)): the wait could
    complete without that signal (semaphore_order.why_not), the signal came
    first, or the access is a TMA store not awaited before it. `vc`: what
    `h` knew at its access, where known."""
    for log, a in h.acquired.values():
      mine = [sig for sig in log.signals if sig.who is rh]
      wait = f"{h.who} waits on {log.name} ({a.where})"
      if mine and rsite.agent == "tma_store" and rsite.access == "write":
        return (f"{wait}, which {rh.who} signals ({mine[-1].where}), but a signal "
                f"covers the GMEM writes of a TMA store ({rsite.where}) only once "
                f"they are awaited: wait_smem_to_gmem(0) in {rh.who} (with "
                "wait_read_only=False), then signal")
      if rsite.agent != "thread" or c != rh.thread:
        continue
      text = semaphore_order.why_not(log, a, c, k)
      if text:
        return text
      if vc is not None and mine and all(sig.clock < k for sig in mine):
        return (f"{wait}, but {rh.who} signals it ({mine[-1].where}) before its "
                f"{rsite.access} ({rsite.where}): a signal releases only what its "
                f"thread did before it; signal after the {rsite.access}")
    return None

  def _no_arrival_after(self, slot, b, rsite, c, k, csite, h, vc):
    """explain(): the recorded thread arrives on a barrier the current one
    observed, but only before its access."""
    observed = self._observed(slot, b, h, vc)
    phases = b.phases + ([b.acc] if b.acc is not None else [])
    if observed is None or any(pv[c] >= k for pv, _ in phases):
      return None
    n, wait = observed
    rh = self.owners.get(c)
    if rh is None or rh not in self._arrivers(b):
      return None
    if rsite.agent in _AWAIT:
      # (the arrival may follow the issue: what it does not follow is the
      # async read's end, which only the thread's own wait observes)
      return (f"{wait} observed completion #{n} ({self._made_by(b, n)}); {rh.who}'s "
              f"{races.agent_words(rsite.agent)} ({rsite.where}) may still be "
              f"{'reading' if rsite.access == 'read' else 'writing'} when {rh.who} "
              f"arrives on {slot.name}: {_AWAIT[rsite.agent]} before that arrival (in "
              "a pipeline's body, before the body returns: the pipeline arrives for "
              "the step's slots then)")
    return (f"{wait} observed completion #{n} ({self._made_by(b, n)}); {rh.who} "
            f"arrives on {slot.name} only before its {rsite.access} "
            f"({rsite.where}), so nothing tells {h.who} that it is done: it takes "
            f"an arrival after the {rsite.access} that {h.who} waits for before "
            f"{csite.where} (a second barrier, the buffer's release), or a second "
            "buffer")

  @staticmethod
  def _next_arrival_needed(b, h, n):
    """Whether `h` arrives on the barrier, but only in its first n phases."""
    phases = [i + 1 for i, by in enumerate(b.phase_by + [b.by])
              if any(who is h and arrival for who, _, arrival in by)]
    return bool(phases) and max(phases) <= n

  @staticmethod
  def _arrivers(b):
    """The threads (_WgClock) that arrived on the barrier so far."""
    return {who for by in b.phase_by + [b.by] for who, _, arrival in by if arrival}

  @staticmethod
  def _made_by(b, n):
    by = b.phase_by[n - 1] if n <= len(b.phase_by) else b.by
    done = "made by " if n <= len(b.phase_by) else "pending: "
    return done + (" and ".join(
        (f"{who.who}'s arrival" if arrival else f"the TMA load issued by {who.who}")
        + (f" at {where}" if where else "") for who, where, arrival in by)
        or "no arrival")

  # --- run_scoped -----------------------------------------------------------------

  def scope_end(self, wg: Any, bufs: Sequence[Any], where: str | None) -> None:
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
    h = wg.hb
    for buf in bufs:
      if not buf.smem_range:
        continue
      for c, k, entry in self._not_before(buf, h.vc):
        # (its own thread's async work, or a cluster peer's access)
        if (entry[0].block not in (None, block_of(blk))
            or entry[0].thread == wg.index and entry[0].agent != "thread"):
          blk.zombies.append((buf, None, c, k, entry[0], entry[3], where))

  def _not_before(self, buf, vc):
    """(component, clock, tracker.sites entry) of each access this group
    recorded in `buf`'s shadow that vc does not know of."""
    tracker = self.tracker
    sh = buf.shadow
    if sh is None or sh.group != tracker.group:
      return
    for comps, clocks in [(sh.wc, sh.wk)] + [sh.slot(i) for i in range(sh.read_slots)]:
      if races.all_ordered(comps, clocks, vc):  # (the common case, in one call)
        continue
      late = (clocks > vc[comps]) & (comps != 0)
      for c, k in set(zip(comps[late].tolist(), clocks[late].tolist())):
        entry = tracker.sites.get((sh.uid, c, k))
        if entry is not None:
          yield c, k, entry

  def thread_exit(self, wg: Any, where: str | None) -> None:
    """`wg` ran to its end; once every thread of its block has, the block
    ends and its SMEM is released. In a cluster, a peer block's access to
    that SMEM (cluster_ref, a multicast, async_store_smem into it) must be
    ordered before the end: one that is not, or that comes after, fails the
    launch on hardware."""
    blk = wg.block
    done = self.ended[blk.member] = self.ended.get(blk.member, 0) + 1
    if done < len(blk.warpgroups) or len(blk.group.blocks) == 1:
      return
    end_vc = self.new_vector()
    for w in blk.warpgroups:
      np.maximum(end_vc, w.hb.vc, out=end_vc)
    bufs = {id(b): b for bb in blk.shared.values() for b in bb
            if b is not None and b.space == "smem" and b.data.dtype != object}
    for b in bufs.values():
      self.gone[id(b)] = (blk, self._site(wg, "thread", "end of kernel", where,
                                          b.name, "end"))
    now = blk.sched.now
    for key, (op, ref, agent, prim, opwhere, write) in self.pending.items():
      if id(ref.buf) in bufs and op.wg.block is not blk:
        first = self._site(op.wg, agent, prim, opwhere, ref.buf.name,
                           "write" if write else "read")
        self._ended_under(blk, first, self.gone[id(ref.buf)][1], None)
    for b in bufs.values():
      for _, _, (first, _, _, first_span) in self._not_before(b, end_vc):
        if first.block not in (None, block_of(blk)):
          self._ended_under(blk, first, self.gone[id(b)][1],
                            timing_verdict(first_span, (now, now)))

  def _ended_under(self, blk, first, end, timing):
    self.tracker.events.append(RaceFound(
        "block ends while a peer may access its SMEM", first, end,
        blk.index, "",
        f"{block_words(blk)} {block_of(blk)} ends ({end.where}) with nothing ordering "
        f"{first.describe()} before its end: on hardware the launch fails "
        "(CUDA_ERROR_LAUNCH_FAILED) when the access comes after it. " + _CLUSTER_END,
        timing))

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
      peer = first.block not in (None, block_of(blk))
      self.tracker.events.append(RaceFound(
          "SMEM reused while a peer block may access it" if peer else
          "async work outlives its run_scoped", first, site, blk.index,
          f"(bytes {max(lo, zlo)}..{min(hi, zhi)} of SMEM)",
          (f"{first.describe()} (a peer block's access to this block's SMEM) is "
           f"not ordered before this block's run_scoped ended ({end_where}), and "
           f"the lowering gives those bytes to {buf.name}: a cluster barrier that "
           "the peer arrives on after its access, waited for before the scope ends"
           if peer else
           f"{first.describe()} was not awaited before its run_scoped ended "
           f"({end_where}), and the lowering gives those bytes to {buf.name}: "
           "await it (barrier_wait, wgmma_wait or wait_smem_to_gmem) before the "
           "scope ends"), timing))
    blk.zombies = keep

  # --- semaphores -----------------------------------------------------------------

  def sem_signal(self, wg: Any, log: semaphore_order.SemLog, inc: int,
                 where: str | None = None) -> None:
    """A signal releases what the signalling thread knows (one lane signals:
    under unsafe_no_auto_barriers, of the thread's own accesses only what
    every lane had ordered; else the lowering's barrier before it orders
    them all)."""
    h = wg.hb
    s = semaphore_order.Signal()
    s.key, s.who, s.thread, s.where = (h.thread, h.counts[0]), h, h.thread, where
    s.clock, s.inc, s.order = int(h.vc[h.thread]), inc, len(log.signals)
    if h.lanes is None or h.sync is None:
      s.vc = s.sync = h.vc.copy()
    else:
      s.vc, s.sync = self._every_lane(h, h.vc), np.maximum(h.vc, h.sync)
    s.avc = h.avc.copy()
    h.counts[0] += 1
    log.signals.append(s)
    log.by_key[s.key] = s
    self.sem_logs[id(log)] = log
    if log.acc is None:
      log.acc = (s.vc.copy(), h.avc.copy())
    else:
      np.maximum(log.acc[0], s.vc, out=log.acc[0])
      np.maximum(log.acc[1], h.avc, out=log.acc[1])
    log.sync = s.sync.copy() if log.sync is None else np.maximum(log.sync, s.sync)
    self._tick(h)

  def sem_acquire(self, wg: Any, log: semaphore_order.SemLog, want: int, decrement: bool,
                  where: str | None = None, read: bool = False) -> None:
    """A wait for `want` (or a read that returned it) acquires the signals
    it cannot complete without, as an earlier run worked them out
    (semaphore_order.py); in the first run, every signal made so far."""
    h = wg.hb
    a = semaphore_order.Acquire()
    a.key, a.who, a.thread, a.where = (h.thread, h.counts[1]), h, h.thread, where
    a.want, a.decrement, a.order, a.read = int(want), bool(decrement), len(log.signals), read
    h.counts[1] += 1
    a.need = None if self.sem_order is None else self.sem_order.get(a.key)
    a.got = semaphore_order.join(log, a.need, h.vc, h.avc, h.sync)
    if h.lanes is not None and not read:  # (the wait ends in a barrier of every lane)
      own = self._own(h)
      h.lanes[own] = h.vc[own]
    self._tick(h)
    a.clock, a.vc = int(h.vc[h.thread]), h.vc.copy()
    a.sync = a.vc if h.sync is None else np.maximum(a.vc, h.sync)
    log.acquires.append(a)
    self.sem_logs[id(log)] = log
    if not read:
      h.acquired[id(log)] = (log, a)

  def end_group(self) -> None:
    """The next group's clocks start above every clock this one used."""
    top = self.base
    for wg in self.wgs:
      top = max(top, int(wg.hb.vc[1:].max()), self.base + wg.wg_issued,
                self.base + wg.store_groups)
    for slot, b in self.barriers:
      top = max(top, b.base + slot.completions)
    self.tracker.end_group(top + 1)
    needs = semaphore_order.needs(self.sem_logs.values())
    if needs:  # (a wait acquired more than it needs: the launch runs again)
      self.events.append(SemaphoreNeeds(self.number, needs))


def clock_components(blocks, warpgroups, barriers_per_block, warps=0):
  """How many clock components a group needs: per warpgroup four (itself and
  its wgmma, TMA-store-read and TMA-store-write channels) and one per warp
  when the kernel has a warp_map (`warps`), per block one per barrier the
  kernel allocates (a scope entered again reuses its barrier's component);
  0 is "no access"."""
  return 1 + blocks * ((4 + warps) * warpgroups + barriers_per_block)


def _lanes_unordered(first, second):
  """A thread's own two plain accesses (or its and one of its warps'),
  unordered under CompilerParams(unsafe_no_auto_barriers=True)
  (HappensBefore.plain)."""
  second_who = "its" if second.who == first.who else f"{second.who}'s"
  return (f"with unsafe_no_auto_barriers=True the lowering puts no barrier between "
          f"{first.who}'s {first.access} ({first.where}) and {second_who} "
          f"{second.access} ({second.where}), so the lanes may make them in either "
          "order, and a lane may touch an element another lane wrote or read "
          "(which one holds which follows the layouts): JAX's contract for the flag is that no "
          "region is read and written by one thread. Put a barrier between the "
          "two (commit_smem, or an arrival and a wait on a barrier: a named "
          "barrier's sync, a plgpu.Barrier another thread passes back), use "
          "separate buffers, or drop the flag")
