"""A group of blocks run by one scheduler: a block, or the blocks of a
cluster (they share barriers and multicast). Groups of a launch are
unordered with each other; each returns a GroupResult that the executor
merges in block order."""
import dataclasses
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import numpy as np

from pallas_sim.backends.sim.base.events import (GmemRead, GmemWrite, RaceFound, Uninit,
                                                  UninitGmem)
from pallas_sim.backends.sim.interpret import refview
from pallas_sim.backends.sim.interpret.compiler import run_gen
from pallas_sim.backends.sim.machine import aliasing, memory
from pallas_sim.backends.sim.checks import initcheck
from pallas_sim.backends.sim.checks.observer import (HappensBefore, NoObserver,
                                                      clock_components)
from pallas_sim.backends.sim.checks.races import RaceLog, Tracker
from pallas_sim.backends.sim.execute.prepare import Prepared
from pallas_sim.backends.sim.frontend.capture import KernelLaunch
from pallas_sim.backends.sim.report.profiler import Recorder
from pallas_sim.backends.sim.timing.model import LaunchTiming, Timing
from pallas_sim.backends.sim.machine.aliasing import element_map
from pallas_sim.backends.sim.machine.scheduler import Scheduler
from pallas_sim.backends.sim.machine.state import Block, Warpgroup


@dataclasses.dataclass
class GroupResult:
  numbers: list     # the blocks' positions in the launch
  cycles: list      # per block: when its last warpgroup or async work ended
  stats: list       # per block: machine.state.BlockStats
  # In order (base/events.py): RaceFound, GmemAccess (for the
  # cross-block check) and Uninit; a detached or logged group also has
  # UninitGmem and GmemRead.
  events: list
  writes: list      # detached or logged groups: events.GmemWrite


class Group:
  """What the blocks of a group share: the scheduler, the timing model, the
  happens-before observer and the event list; and, when detached, the log
  of its GMEM writes. `check_init`: SMEM it allocates is tracked for
  uninitialized reads (checks/initcheck.py)."""

  def __init__(self, timing: Timing, log: RaceLog, events: list[Any], detached: bool,
               check_init: bool = False) -> None:
    self.sched = Scheduler()
    self.timing = timing
    self.log = log        # races.RaceLog: the launch's sites
    self.events = events
    self.hb: NoObserver | HappensBefore = NoObserver()
    # a detached group's GMEM writes (GmemWrite), replayed at the merge
    self.writes: list[GmemWrite] | None = [] if detached else None
    self.check_init = check_init
    self.blocks: list[Block] = []
    self.by_cluster: dict[tuple[int, ...], Block] = {}  # cluster coordinates -> Block
    self.number = 0       # the group's number in the launch (its first block's)
    self.makers: dict[int, Any] = {}  # run_scoped equation id -> its allocators (peer lookups)
    self.cluster_axes: dict[Any, tuple[int, int]] = {}  # cluster axis name -> (dimension, size)
    self.globals: dict[Any, Any] = {}  # get_global's semaphores (the launch's)
    self.profile: Recorder | None = None  # when the kernel is profiled

  def peers(self, block: Block, axes: Sequence[Any], line: bool = False) -> list[Block]:
    """The blocks of this group whose cluster coordinates equal `block`'s
    except along the cluster axes `axes` (names or tuples of names): all
    of them (line=False, a multicast), or those differing along at most
    one of the axes (line=True, a cluster barrier's arrival)."""
    groups = [[self.cluster_axes[n][0] for n in (a if isinstance(a, tuple) else (a,))]
              for a in axes]
    free = {d for g in groups for d in g}
    out = []
    for c, blk in self.by_cluster.items():
      diff = {d for d, (x, y) in enumerate(zip(c, block.cluster)) if x != y}
      if line:
        if not diff or any(diff <= set(g) for g in groups):
          out.append(blk)
      elif diff <= free:
        out.append(blk)
    return out

  def read(self, ref: Any, agent: str, prim: str, where: str, thread: int, block: Block,
           replayed: bool = False) -> None:
    """A read through `ref` by `agent` ("thread", "tma_load", "tma_store",
    "wgmma"): elements nothing wrote before it are an event. `replayed`: the
    read of a reduction, which the merge replays (its value is not used)."""
    if ref.buf.aliases is not None:
      aliasing.read(ref)
    elif ref.buf.packed is not None:
      aliasing.read_packed(ref.buf)
    if self.writes is not None and ref.buf.space == "gmem":
      if ref.view.size and not ref.buf.lent:  # (a lent input: never written)
        emap = element_map(ref.buf, ref.view)
        if not replayed:  # (what it read, for parallel.Visibility)
          self.events.append(GmemRead(ref.buf, *emap))
        # (Elements an earlier group wrote count as written: decided at the
        # merge, against the launch's buffers, merge.py.)
        m = initcheck.unwritten_at(ref.buf, *emap)
        if m is not None:
          self.events.append(UninitGmem(agent, prim, where, thread, ref.buf,
                                        block.index, *emap, m))
      return
    rng = initcheck.unwritten_in(ref)
    if rng is not None:
      self.events.append(Uninit(agent, prim, where, ref.buf.name, thread, block.index,
                                rng, ref.buf.space == "smem"))

  def misuse(self, kind: str, site: Any, block: Block, text: str) -> None:
    self.events.append(RaceFound(kind, None, site, block.index, "", text))

  def wrote(self, ref: Any, reduce: Callable[[Any, Any], Any] | None = None,
            operand: Any = None) -> None:
    """A write through `ref` happened: its elements count as written. GMEM
    writes are logged when the group is detached or logged, as the values
    written, or for a reduction (atomics, TMA reductions: combine(old,
    operand), applied already) as the reduction, to be replayed on the
    launch's buffer at the merge."""
    buf = ref.buf
    logged = self.writes if buf.space == "gmem" else None
    if logged is not None or (buf.written is not None and ref.view.size):
      emap = element_map(buf, ref.view)
      initcheck.mark_view(buf, *emap)
    if buf.aliases is not None:
      aliasing.wrote(ref)
    if buf.packed is not None:
      aliasing.pack(buf)
    if logged is not None:
      values = np.array(ref.view if reduce is None else operand, ref.view.dtype)
      logged.append(GmemWrite(buf.origin, *emap, reduce, values))


@dataclasses.dataclass(frozen=True)
class RunChecks:
  """How a launch's groups run, beside what the launch is: what to check,
  whether each group works on copies of GMEM (detached: a worker's), and
  what an earlier run of the launch found its semaphore waits need."""
  races: bool = False
  uninitialized: bool = False
  detached: bool = False
  group_size: int = 1          # the most blocks a group holds (a cluster's)
  release_bytes: int = 16 << 20  # element shadows kept before the oldest go
  profile: Recorder | None = None  # when the kernel asks for a profile
  # group number -> {semaphore acquire key: the signals it acquires}, from an
  # earlier run of the launch (checks/semaphore_order.py)
  sem_order: Mapping[int, Any] = dataclasses.field(default_factory=dict)


class GroupRunner:
  """Runs the groups of one launch. `io_bufs`: the kernel's GMEM operands,
  inputs then outputs (each group copies them first when detached). With
  race checking, its `tracker` holds the launch's element shadows."""

  def __init__(self, prep: Prepared, io_bufs: Sequence[memory.Buffer],
               launch: KernelLaunch, timing: Timing, placement: LaunchTiming,
               log: RaceLog, checks: RunChecks = RunChecks()) -> None:
    self.prep, self.launch, self.timing = prep, launch, timing
    self.sem_order = checks.sem_order
    self.placement, self.log = placement, log
    self.io_bufs = io_bufs
    self.detached = checks.detached
    self.check_init = checks.uninitialized
    self.group: Group | None = None  # the group running now (for a Ctrl-C backtrace)
    self.refs = None if self.detached else [refview.root_ref(b) for b in io_bufs]
    nt = launch.num_threads
    self.clocks = clock_components(1, nt, prep.barriers, prep.warps)
    self.comps: dict[Any, Any] = {}  # clock components by key, for the groups of one block
    most = clock_components(checks.group_size, nt, prep.barriers, prep.warps)
    self.tracker = Tracker(log, np.uint8 if most <= 256 else np.int32,
                           checks.release_bytes) if checks.races else None
    self.globals: dict[Any, Any] = {}  # get_global's semaphores: one per call site, per launch
    self.profile = checks.profile
    self.cluster_axes = {n: (d, c) for d, (n, c) in enumerate(
        zip(launch.cluster_names, launch.cluster))}
    names = tuple(launch.grid_names)
    self.axis_keys = [((names[d],) if d < len(names) else ()) + (("grid", d),)
                      for d in range(len(launch.grid))]
    self.thread_axes = [({launch.thread_name: (w, nt)} if launch.thread_name is not None
                         else {}) for w in range(nt)]
    self.suffix = [f" thread {w}" if nt > 1 else "" for w in range(nt)]

  def run(self, members: Sequence[tuple[int, tuple[int, ...], tuple[int, ...]]],
          trace: list[Any] | None = None, log_writes: bool = False) -> GroupResult:
    """Runs the blocks `members` ((launch position, grid index, cluster
    index) triples: a block, or the blocks of one cluster) to completion as
    one group. `log_writes`: log GMEM writes without copying GMEM (a worker
    process, whose GMEM is its own: parallel.py)."""
    launch = self.launch
    events: list[Any] = []
    group = self.group = Group(self.timing, self.log, events,
                               self.detached or log_writes, self.check_init)
    group.number = members[0][0]
    group.cluster_axes = self.cluster_axes
    group.globals = self.globals
    group.profile = self.profile
    if self.tracker is not None:
      one = len(members) == 1
      size = self.clocks if one else clock_components(
          len(members), launch.num_threads, self.prep.barriers, self.prep.warps)
      group.hb = HappensBefore(self.tracker, size, events, self.comps if one else None,
                               self.prep.warps, group.number,
                               self.sem_order.get(group.number),
                               launch.no_auto_barriers)
    refs = self.refs
    if refs is None:
      copies = {id(b): memory.Buffer(b.name, "gmem", b.data.copy(), origin=b)
                for b in self.io_bufs}
      for b in self.io_bufs:
        initcheck.copy_state(b, copies[id(b)])
      refs = [refview.root_ref(copies[id(b)]) for b in self.io_bufs]
    program = self.prep.program
    in_cluster = len(members) > 1
    for num, idx, cidx in members:
      blk = Block(idx + cidx if in_cluster else idx, num, group,
                  self.placement.engines(num), trace, cidx)
      axes = {}
      for keys, i, g in zip(self.axis_keys, idx, launch.grid):
        for key in keys:
          axes[key] = (i, g)
      for name, i, c in zip(launch.cluster_names, cidx, launch.cluster):
        axes[name] = (i, c)
      # (a path slice's blocks as lanes: index arrays, not printed whole)
      where = (f"block {blk.index}" if not any(isinstance(i, np.ndarray) for i in idx)
               else f"blocks as {np.size(idx[0])} lanes from block {num}")
      for w, thread_axes in enumerate(self.thread_axes):
        wg = Warpgroup(blk, w, {**axes, **thread_axes}, where + self.suffix[w])
        group.sched.spawn(wg, _warpgroup(program, refs, wg, launch, group))
    group.hb.ready()
    try:
      group.sched.run()
      group.hb.end_group()
    except KeyboardInterrupt:  # (kept whole: the backtrace shows every thread)
      raise
    except BaseException:  # (a deadlock, a rule's error: freed all the same)
      _free(group)
      raise
    blocks = group.blocks
    result = GroupResult([b.number for b in blocks], [b.finish() for b in blocks],
                         [b.stats for b in blocks], events, group.writes or [])
    _free(group)
    return result


def _free(group: Group) -> None:
  """Blocks, warpgroups and their buffers reference each other: free the
  SMEM now rather than at some later cyclic collection (a launch of
  thousands of blocks would hold all of theirs until then). A barrier names
  its buffer, whose object array holds it: numpy arrays are invisible to the
  cyclic collector, so that cycle (and through the barrier's block, the
  whole group) was never freed."""
  for b in group.blocks:
    for bufs in b.shared.values():
      for buf in bufs:
        if buf is not None and buf.data.dtype == object:
          buf.data.fill(None)
    b.shared.clear()
    b.zombies.clear()
    b.warpgroups.clear()
  group.by_cluster.clear()
  group.makers.clear()


def _warpgroup(prog: Any, refs: list[Any], wg: Warpgroup, launch: KernelLaunch,
               group: Group) -> Generator[Any, Any, None]:
  """A warpgroup's coroutine; at its end, TMA stores whose SMEM reads it
  never awaited are reported: the lowering does not wait for them at the end
  (jax 0.11.2 awaits only in wait_smem_to_gmem), and the SMEM they read may
  be freed. (Their GMEM writes still land: seen on an H200,
  lab/gpu_probes.py, so an unawaited write side is not reported.) Groups
  committed with no store in them (emit_pipeline_warp_specialized commits
  one each step, outputs or not) read nothing: PTX makes them empty bulk
  groups, which need no wait."""
  if group.profile is not None:  # (the kernel's prologue: its profile's first range)
    group.profile.event(wg, "Init", True)
    group.profile.event(wg, "Init", False)
  yield from run_gen(prog, refs, wg)
  group.hb.thread_exit(wg, launch.where)
  if wg.open_group or wg.store_reads_awaited < wg.stored_group:
    site = group.log.site("thread", "end of kernel", launch.where, "TMA stores", "end",
                          wg.index)
    group.misuse("unawaited TMA store", site, wg.block,
                 f"thread {wg.index} ends with TMA stores still reading SMEM: "
                 "wait_smem_to_gmem(0) before the kernel ends")
