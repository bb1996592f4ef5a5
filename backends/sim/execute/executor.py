"""Runs kernel launches: each is prepared (prepare.py), its blocks run in
groups, each group on its own scheduler (group.py), here or over workers
(dispatch.py), their results merge in block order (merge.py), and the
timing model gives the kernel's time (kernel_report.py, clock.py).

A group is the unit of sequential simulated time: a block, or the blocks of
a cluster. Groups are unordered on hardware; here they run in block order,
deterministically, and a run over workers gives the same results."""
import contextlib
import copy
import dataclasses
import itertools
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pallas_sim import gpus
from pallas_sim.backends.sim.checks import races
from pallas_sim.backends.sim.execute import (clock, dispatch, estimate_check, extrapolate,
                                            findings, parallel)
from pallas_sim.backends.sim.execute.buffers import footprint, gmem_buffers, input_bytes
from pallas_sim.backends.sim.execute.classes import Classes
from pallas_sim.backends.sim.execute.group import GroupRunner, RunChecks
from pallas_sim.backends.sim.interpret.compiler import Compiler
from pallas_sim.backends.sim.execute.kernel_report import kernel_report
from pallas_sim.backends.sim.execute.merge import Merge
from pallas_sim.backends.sim.execute.prepare import Prepared, Preparer
from pallas_sim.backends.sim.frontend.capture import KernelLaunch
from pallas_sim.backends.sim.execute.progress import Progress, backtrace
from pallas_sim.backends.sim.execute.tuning import Tuning
from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.report import FailedLaunch, Report, profiler
from pallas_sim.backends.sim.timing.model import LaunchTiming, Timing
from pallas_sim.errors import SimError
from pallas_sim.options import ESTIMATING, Options

# Runs of one launch at most, refining the signals its semaphore waits
# acquire (checks/semaphore_order.py).
SEMAPHORE_ROUNDS = 8


# group number -> {semaphore acquire key: the signals it needs}
SemOrder = dict[int, dict[Any, Any]]


@dataclasses.dataclass
class LaunchSetup:
  """What one run of a launch works with: its prepared kernel, GMEM buffers,
  groups of blocks ((launch position, grid index, cluster index) triples, a
  group per cluster), the blocks' placement on SMs, the race log, the
  profiler's recorder, the semaphore order of an earlier run, and the group
  runner made from them."""
  prep: Prepared
  in_bufs: list[memory.Buffer]
  out_bufs: list[memory.Buffer]
  grid: tuple[int, ...]
  groups: list[list[tuple[int, tuple[int, ...], tuple[int, ...]]]]
  blocks: list[tuple[int, tuple[int, ...], tuple[int, ...]]]
  placement: LaunchTiming
  log: races.RaceLog
  recorder: profiler.Recorder | None
  sem_order: SemOrder | None
  runner: GroupRunner = dataclasses.field(init=False)  # (made from the rest)


class Executor:
  """Receives launches from capture; accumulates a Report.

  options: what the user asked (pallas_sim.options.Options); tuning: how
  this machine's time and memory are spent (tuning.Tuning); shapes_only:
  ps.estimate was given shapes, not arrays; recipe: (fn, args, kwargs) that
  ps.simulate runs, which a Ray task runs again; replay: in a Ray task, the
  launch and groups it runs (ray_engine.Replay). All fixed when it is made."""

  def __init__(self, options: Options | None = None, tuning: Tuning | None = None, *,
               shapes_only: bool = False, recipe: tuple[Any, Any, Any] | None = None,
               replay: Any = None, checking_estimate: bool = False,
               paths_cache: dict[Any, Any] | None = None) -> None:
    self.options = opts = options or Options()
    self.tuning = tuning = tuning or Tuning()
    # Without a clock asked for, each launch runs at the one its power
    # allows (timing/power.py): first at the boost clock.
    g = gpus.get(opts.gpu)
    self.gpu = gpus.at_clock(g, opts.clock_mhz or g.boost_mhz)
    self.timing = Timing(self.gpu)
    self.report = Report(self.gpu.name, clock_mhz=opts.clock_mhz,
                         races_checked=opts.check_races,
                         uninitialized_checked=opts.check_uninitialized)
    self.shapes_only, self.recipe, self.replay = shapes_only, recipe, replay
    self.checking_estimate = checking_estimate  # (estimate_check.py's own Executor)
    self.preparer = Preparer(opts, self.gpu, self.timing, shapes_only)
    self.classes = Classes(opts, self.timing, shapes_only, paths_cache)
    self.errors: list[BaseException] = []
    self.stopped = False  # (a failed launch stopped the program: stop_at_error)
    self.interrupted: str | None = None  # Ctrl-C: where every thread was (text)
    # (launch, block number, grid index, group runner), or ("parallel",
    # launch, workers) while workers run its groups
    self._running: tuple[Any, ...] | None = None
    self.launches = 0        # launches received (a Ray task finds its own by it)

  def record_error(self, e: BaseException, launch: KernelLaunch | None = None) -> None:
    """A launch failed: its error, raised when the simulation ends (or, under
    Options.stop_at_error, where the program next waits on JAX); the report
    lists the launch."""
    self.errors.append(e)
    if launch is not None:
      self.report.failed.append(FailedLaunch(launch.name, launch.where, e))

  def prepare(self, launch: KernelLaunch) -> Prepared:
    return self.preparer.prepare(launch)

  def check_lowering(self, launch: KernelLaunch, lower: Callable[[float | None], Any],
                     where: str | None = None) -> None:
    return self.preparer.check_lowering(launch, lower, where)

  def execute(self, launch: KernelLaunch, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Runs one launch; returns its outputs. After a Ctrl-C (here or in an
    earlier launch) returns poison at once: the API raises KeyboardInterrupt
    when the user's function returns."""
    self.launches += 1
    if self.replay is not None:  # (a Ray task: execute/ray_engine.py)
      return self._replay(launch, arrays)
    if self.interrupted is None and launch.lower is not None and not self.checking_estimate:
      # (JAX's jit cache can run a kernel traced under another simulation,
      # whose options skipped the real lowering's check: it runs under these.
      # Done already when this simulation traced it.)
      try:
        self.check_lowering(launch, launch.lower)
      except SimError as e:
        self.record_error(e, launch)
        return [memory.poison(a.shape, a.dtype) for a in launch.out_avals]
    if self.interrupted is None:
      try:
        with np.errstate(all="ignore"):
          out = self.run_launch(launch, arrays)
          clock.settle(self, launch, arrays)
          if self.options.check_estimate and not self.checking_estimate:
            estimate_check.check(self, launch, arrays, self.options.check_estimate)
          return out
      except KeyboardInterrupt as e:
        self.interrupted = where = self._where_interrupted(e)
        sys.stderr.write(where + "\n")
        sys.stderr.flush()
    return [memory.poison(a.shape, a.dtype) for a in launch.out_avals]

  def estimated(self, launch: KernelLaunch, arrays: Sequence[np.ndarray],
                **changes: Any) -> "Executor":
    """The launch run again as ps.estimate runs it (no tensor-core sums, no
    checks, one block per class), with these options changed: the Executor
    that ran it. Nothing the user sees twice: no profile written, no
    debug_print lines."""
    opts = dataclasses.replace(self.options, **ESTIMATING, check_lowering=False,
                               **changes)
    ex = Executor(opts, self.tuning, shapes_only=self.shapes_only, checking_estimate=True,
                  paths_cache=self.classes.paths)
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
        contextlib.redirect_stderr(null):
      ex.run_launch(launch, arrays)
      clock.settle(ex, launch, arrays)  # (as execute: at the clock its power allows)
    return ex

  def _where_interrupted(self, exc: BaseException) -> str:
    """Where every thread of the block running at a Ctrl-C was."""
    if self._running is None:
      return "pallas-sim: interrupted before any block ran"
    if self._running[0] == "parallel":
      _, launch, workers = self._running
      return (f"pallas-sim: interrupted in kernel {launch.name} ({launch.where}), "
              f"while {workers} worker processes ran its blocks (workers=1 runs "
              "them here, and shows where each thread was at a Ctrl-C)")
    launch, number, idx, runner = self._running
    group = runner.group
    total = math.prod(launch.grid or ()) * math.prod(launch.cluster or ())
    lines = [f"pallas-sim: interrupted in kernel {launch.name} ({launch.where}), "
             f"block {idx} ({number + 1} of {total}):"]
    lines += backtrace(group.sched.tasks if group else (), exc.__traceback__)
    return "\n".join(lines)

  def _replay(self, launch: KernelLaunch, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """In a Ray task: the launch it was given runs the groups of its task
    (ray_engine.Replay); every other launch runs as usual before it, and
    not at all after it (poison: the task's work is done)."""
    r = self.replay
    if self.launches - 1 < r.launch:
      return self.run_launch(launch, arrays)
    if self.launches - 1 == r.launch:
      s = self._setup(launch, arrays)
      # (as a forked worker runs its task)
      r.results = parallel.run_groups(parallel.Job(s.runner, s.groups, r.trace_blocks),
                                      r.task)
    return [memory.poison(a.shape, a.dtype) for a in launch.out_avals]

  def run_launch(self, launch: KernelLaunch, arrays: Sequence[np.ndarray],
                 copy_inputs: bool = False) -> list[np.ndarray]:
    """Runs one launch to its outputs: again serially in this process where
    its workers asked for that (dispatch.Rerun), and again on copies of its
    inputs where it wrote one it was lent read-only (buffers.py). `execute`
    (the frontend's entry) adds a Ctrl-C's handling and the estimate's
    check around it; `estimated` runs it on an executor of its own. Tests
    wrap it to make a run fail."""
    try:
      try:
        return self._execute_once(launch, arrays, copy_inputs=copy_inputs)
      except dispatch.Rerun:
        return self._execute_once(launch, arrays, serial=True, copy_inputs=copy_inputs)
    except Exception as e:
      if copy_inputs or not memory.wrote_read_only(e):
        raise
    # (the kernel wrote an input it was lent read-only: buffers.py)
    return self.run_launch(launch, arrays, copy_inputs=True)

  def _semaphores_again(self, launch: KernelLaunch, arrays: Sequence[np.ndarray],
                        copy_inputs: bool, sem_order: SemOrder, sem_round: int
                        ) -> list[np.ndarray]:
    """The launch once more, its semaphore waits acquiring only the signals
    they need (checks/semaphore_order.py): what this run found is dropped,
    and what it printed is not printed again. In this process: a Ray task
    runs its launch afresh, without the order found here."""
    with self._options(progress=False), open(os.devnull, "w") as null, \
        contextlib.redirect_stdout(null):
      return self._execute_once(launch, arrays, True, copy_inputs, sem_order, sem_round)

  @contextlib.contextmanager
  def _options(self, **changes: Any) -> Iterator[None]:
    """self.options with these changed, for a run of a launch again."""
    options = self.options
    self.options = dataclasses.replace(options, **changes)
    try:
      yield
    finally:
      self.options = options

  def _garbage_reaches(self, launch: KernelLaunch, arrays: Sequence[np.ndarray],
                       out_bufs: list[memory.Buffer], copy_inputs: bool) -> tuple[Any, ...]:
    """After a launch that read memory nothing wrote: the launch once more
    with other bits in that memory (seeded, no checks). () when every output
    element the first run wrote comes out the same (what it read there
    reaches nothing it wrote), else (the first output that differs, the
    element)."""
    first = [(b.data.copy(), None if b.written is None else b.written.copy())
             for b in out_bufs]
    rep = self.report
    kept = [(x, len(x)) for x in (rep.kernels, rep.races, rep.uninitialized, self.errors)]
    try:
      with self._options(check_races=False, check_uninitialized=False, progress=False), \
          memory.other_garbage(0), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the first run warned of what it found)
        again = self._execute_once(launch, arrays, serial=True, copy_inputs=copy_inputs)
    finally:
      for found, n in kept:
        del found[n:]
    for b, (data, written), other in zip(out_bufs, first, again):
      same = (data.view(np.uint8) == np.asarray(other).view(np.uint8)).reshape(
          data.shape + (-1,)).all(-1) if data.ndim else np.array(
              data.tobytes() == np.asarray(other).tobytes())
      if written is not None:
        same |= ~written
      if not same.all():
        return b.name, tuple(int(i) for i in np.argwhere(~same)[0])
    return ()

  def _setup(self, launch: KernelLaunch, arrays: Sequence[np.ndarray],
             copy_inputs: bool = False, sem_order: SemOrder | None = None) -> LaunchSetup:
    """A launch's buffers, groups, placement, race log and group runner."""
    prep = self.prepare(launch)
    in_bufs, out_bufs = gmem_buffers(launch, arrays, prep, self.options,
                                     self.shapes_only, copy_inputs)
    grid = tuple(launch.grid) or ()
    clusters = list(itertools.product(*[range(g) for g in grid]))
    # A group per cluster (a block each without clusters); blocks are
    # numbered cluster after cluster.
    in_cluster = list(itertools.product(*[range(c) for c in launch.cluster]))
    groups = [[(g * len(in_cluster) + j, idx, c) for j, c in enumerate(in_cluster)]
              for g, idx in enumerate(clusters)]
    blocks = [m for members in groups for m in members]
    if prep.together:  # (all resident at once, as the kernel assumes)
      groups = [blocks]
    placement = self.timing.launch(len(blocks), prep.smem, launch.num_threads,
                                   prep.regs, footprint(launch, arrays),
                                   input_bytes(launch, arrays))
    grid_index = np.array([idx for _, idx, _ in blocks],
                          dtype=np.int64).reshape(len(blocks), -1)
    placement.set_loads(grid_index, prep.load_axes)
    placement.trace_loads = prep.variation is not None
    s = LaunchSetup(prep, in_bufs, out_bufs, grid, groups, blocks, placement,
                    races.RaceLog(launch.name, launch.call_site),
                    profiler.Recorder(launch.profile) if launch.profile else None,
                    sem_order)
    s.runner = self._runner(prep, launch, s)
    return s

  def _runner(self, prep: Prepared, launch: KernelLaunch, s: LaunchSetup) -> GroupRunner:
    return GroupRunner(prep, s.in_bufs + s.out_bufs, launch, self.timing, s.placement,
                       s.log, RunChecks(
                           races=self.options.check_races,
                           uninitialized=self.options.check_uninitialized,
                           detached=self.tuning.detached_groups,
                           group_size=max(map(len, s.groups)),
                           release_bytes=self.tuning.release_bytes,
                           profile=s.recorder, sem_order=s.sem_order or {}))

  def _by_iterations(self, plan: extrapolate.Plan, loop: Any, launch: KernelLaunch,
                     s: LaunchSetup, merge: Merge, trace: list[Any]) -> int:
    """Runs an extrapolate.Plan's blocks, their persistent loop cut down to
    its iterations, and merges every block's result from theirs: how many
    blocks ran."""
    marks: dict[Any, Any] = {}
    cx = Compiler(self.timing, launch, self.options.max_cycles, s.prep.numerics,
                  skip_float_values=s.prep.skip_float_values, sites=s.prep.sites,
                  overrides={"while": plan.rule(loop, marks)})
    prep = copy.copy(s.prep)
    prep.program = cx.compile(prep.jaxpr)
    runner = self._runner(prep, launch, s)
    for members in s.groups:
      number = members[0][0]
      if number in plan.runs:
        self._running = (launch, number, members[0][1], runner)
        plan.ran(runner.run(members, trace if number < self.tuning.trace_blocks else None),
                 marks)
    for members in s.groups:
      merge.group(plan.result(members[0][0]))
    return len(plan.runs)

  def _execute_once(self, launch: KernelLaunch, arrays: Sequence[np.ndarray],
                    serial: bool = False, copy_inputs: bool = False,
                    sem_order: SemOrder | None = None, sem_round: int = 0
                    ) -> list[np.ndarray]:
    t0 = time.perf_counter()
    s = self._setup(launch, arrays, copy_inputs, sem_order)
    prep, groups, runner = s.prep, s.groups, s.runner
    merge = Merge(len(s.blocks), s.log, launch.call_site, self.options.check_races)
    trace: list[Any] = []
    t1 = time.perf_counter()  # (the first groups' times decide on workers)
    classes, note, found = self.classes.choose(prep, launch, s)
    by_iterations = isinstance(classes, extrapolate.Plan)
    workers, on_ray = (1, False) if serial or classes else dispatch.workers(
        self.options, self.recipe, prep, launch, groups)
    after_s, trace_blocks = self.tuning.parallel_after_s, self.tuning.trace_blocks
    used = 1
    reps: dict[int, Any] = {}
    simulated = 0
    if by_iterations:
      simulated = self._by_iterations(classes, found.loop, launch, s, merge, trace)
    with Progress(launch.name, len(s.blocks), on=self.options.progress) as progress:
      for g, members in enumerate([] if by_iterations else groups):
        number, idx, _ = members[0]
        progress.done = number
        per = dispatch.group_seconds(g, t1) if g and workers > 1 else None
        if workers > 1 and (on_ray or (g and dispatch.go_parallel(g, len(groups), per,
                                                                   after_s))):
          self._running = ("parallel", launch, workers)
          dispatch.run_parallel(self, runner, groups, g, trace, merge.group, workers,
                                progress, on_ray, group_s=per)
          used = workers
          simulated = len(s.blocks)
          break
        elif g == 1:
          t1 = time.perf_counter()
        if g and time.perf_counter() - t0 > after_s:
          workers = 1  # (decided: this process)
        if classes and classes[g] != g:  # (its class ran: its times are those)
          merge.same_as(groups[g], reps[classes[g]], found)
          continue
        self._running = (launch, number, idx, runner)
        result = runner.run(members, trace if number < trace_blocks else None)
        merge.group(result)
        simulated += len(members)
        if classes:
          reps[g] = result
    self._running = None
    # (Each run's waits need no more than the last's: the runs end. The cap
    # only guards against a kernel whose order keeps changing: its last run
    # orders more than the hardware promises, which can hide, never invent,
    # a race.)
    if merge.sem_needs and sem_round < SEMAPHORE_ROUNDS:
      return self._semaphores_again(launch, arrays, copy_inputs,
                                    {**(sem_order or {}), **merge.sem_needs},
                                    sem_round + 1)
    if s.recorder is not None and not self.checking_estimate:  # (its one file: the run's)
      s.recorder.dump(launch, self.gpu.num_sms)
    wall = time.perf_counter() - t0
    # (reads of memory nothing wrote: do they reach what the launch wrote?)
    garbage = (self._garbage_reaches(launch, arrays, s.out_bufs, copy_inputs)
               if merge.init_log.smem_reads() and not self.shapes_only else None)
    self.errors.extend(findings.conclude(launch, self.options, self.report, merge, prep,
                                         s.in_bufs, s.out_bufs, s.grid, garbage))
    rep = kernel_report(self.gpu, launch, arrays, prep, s.grid, s.placement, merge, wall,
                        trace, used)
    rep.simulated_blocks, rep.classes = simulated, note
    self.report.kernels.append(rep)
    return [b.data for b in s.out_bufs]
