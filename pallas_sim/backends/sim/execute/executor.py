"""Runs kernel launches: static checks, then the blocks in groups, each group
on its own scheduler (machine/group.py), then the merge of their results in
block order (race reports, cross-block races, statistics, GMEM writes) and
the timing model's kernel time.

A group is the unit of sequential simulated time: a block, or (later) the
blocks of a cluster. Groups are unordered on hardware; here they run one
after the other, in block order, deterministically."""
import contextlib
import copy
import dataclasses
import itertools
import math
import os
import sys
import time
import types
import warnings

import numpy as np

from pallas_sim import gpus
from pallas_sim.backends.sim.analysis import block_classes, paths, resources
from pallas_sim.backends.sim.frontend import capture
from pallas_sim.backends.sim.execute import estimate_check, parallel, ray_engine
from pallas_sim.backends.sim.report import profiler
from pallas_sim.backends.sim.interpret import rules  # noqa: F401  (registers all rules)
from pallas_sim.backends.sim.interpret.rules import semaphores
from pallas_sim.backends.sim.interpret.compiler import Compiler
from pallas_sim.backends.sim.timing import bound, occupancy, power, model as timing
from pallas_sim.backends.sim.checks import initcheck, races
from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.checks.cross_block import CrossBlock
from pallas_sim.backends.sim.machine.state import WARPS_PER_WARPGROUP, BlockStats
from pallas_sim.backends.sim.execute.group import GroupRunner
from pallas_sim.backends.sim.timing.model import Timing
from pallas_sim.backends.sim.execute.progress import Progress, backtrace
from pallas_sim.backends.sim.report import KernelReport, Report
from pallas_sim.errors import (LoweringTimeoutError, RaceError, RaceWarning,
                               UninitializedError, UnsupportedPrimitiveError)
from pallas_sim.options import take


class Prepared:
  """What a kernel needs before it runs, once per trace."""
  __slots__ = ("jaxpr", "program", "smem", "barriers", "warps", "together", "sem_inputs",
               "serial_only", "regs", "variation", "load_axes", "sites")


class _Rerun(Exception):
  """A group failed in a worker process: run the launch again, serially."""


def _from_the_pool(exc):
  """Whether an exception that ended a run over workers is the pool's own
  failure (a fork, a pipe, a pickle: Python's or ours), which a serial run
  gets past, rather than one a signal handler raised in this process (a
  test's time limit), which must pass: no user code runs here meanwhile."""
  top = type(exc).__module__.split(".")[0]
  return top in sys.stdlib_module_names or top == "pallas_sim"


def _axis_sizes(launch):
  """Axis name (a grid axis also by its dimension) -> its size: the bounds
  of the indices a kernel reads (block_classes.analyse)."""
  sizes = dict(zip(launch.cluster_names, launch.cluster))
  if launch.thread_name is not None and launch.num_threads:
    sizes[launch.thread_name] = launch.num_threads
  return sizes | dict(zip(launch.grid_names, launch.grid)) | dict(enumerate(launch.grid))


def _nbytes(a):
  """An array's (or an aval's) bytes, from its shape and dtype."""
  return math.prod(a.shape) * np.dtype(a.dtype).itemsize


def _footprint(launch, arrays):
  """The bytes a launch's inputs and outputs hold (an output that aliases
  an input counted once): what it can bring into the L2."""
  aliased = {o for _, o in launch.aliases}
  return (sum(map(_nbytes, arrays[:launch.num_inputs]))
          + sum(_nbytes(a) for i, a in enumerate(launch.out_avals) if i not in aliased))


class Executor:
  """Receives launches from capture; accumulates a Report.

  detached_groups: run each group on its own copy of GMEM and apply its
  writes at the merge, in block order (what a run over several processes
  does; outputs are the same unless blocks race)."""

  # A launch goes over worker processes when its first groups say the rest
  # would take at least this long here (a fork and its pool cost ~20 ms);
  # 0: always, after the first group (tests).
  parallel_after_s = 0.25
  checking_estimate = False  # (execute/estimate_check.py's own Executor)
  # Clocks tried after the first below the boost clock (_clock).
  clock_rounds = 2

  def __init__(self, options=None, trace_blocks=2, detached_groups=False, **named):
    self.options = opts = take(named, options)
    if named:
      raise TypeError(f"Executor: unknown option(s) {sorted(named)}")
    # Without a clock asked for, each launch runs at the one its power
    # allows (timing/power.py): first at the boost clock.
    g = gpus.get(opts.gpu)
    self.gpu = gpus.at_clock(g, opts.clock_mhz or g.boost_mhz)
    self.timing = Timing(self.gpu)
    self.report = Report(self.gpu.name, clock_mhz=opts.clock_mhz)
    self.trace_blocks = trace_blocks
    self.check_races = opts.check_races
    self.on_race = opts.on_race
    self.check_lowering_on = opts.check_lowering
    self.detached = detached_groups
    self.errors = []
    self.interrupted = None  # Ctrl-C: where every thread was (text)
    self._running = None     # (launch, block number, grid index, group runner)
    self.launches = 0        # launches received (a Ray task finds its own by it)
    self.recipe = None       # (fn, args, kwargs) that ps.simulate runs: for Ray
    self.replay = None       # in a Ray task: ray_engine.Replay
    self._prepared = {}
    self._lowered = {}
    # id(kernel jaxpr) -> (jaxpr, paths.Paths or the SliceError's words): the
    # blocks' paths, found once (the clock's timings of a launch share them)
    self._paths = {}
    self.shapes_only = False  # ps.estimate was given shapes, not arrays

  def record_error(self, e):
    self.errors.append(e)

  def prepare(self, launch):
    """Checks that need no data, before anything runs: shared memory against
    the limit, and every primitive modelled (with the rules' own static
    checks). Returns a Prepared."""
    key = id(launch.jaxpr)
    hit = self._prepared.get(key)
    if hit is not None and hit.jaxpr is launch.jaxpr:
      return hit
    if any(not bm.has_trivial_window() for bm in launch.block_mappings):
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: pallas_call BlockSpecs with index maps are not "
          "modelled (jax 0.11.2 cannot lower them for Mosaic GPU either); use "
          "plgpu.kernel with emit_pipeline", where=launch.where)
    jaxpr = launch.jaxpr
    extra = len(jaxpr.invars) - launch.num_inputs - launch.num_outputs
    if extra:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: {extra} kernel-level scratch operands "
          "(pallas_call scratch_shapes) are not modelled", where=launch.where)
    p = Prepared()
    p.jaxpr = jaxpr
    p.smem = resources.smem_bytes(jaxpr)
    if launch.profile is not None:  # (the profiler's buffer is in SMEM too)
      p.smem += launch.profile.smem_bytes(launch.num_threads)
    resources.check_smem(p.smem, self.gpu, where=launch.where)
    # Whether blocks' control flow differs (then estimate runs them all, and
    # the L2 model follows their loads: timing/model.py); per TMA load
    # site, the grid axes its address depends on (L2 reuse).
    found = block_classes.analyse(jaxpr, launch.grid_names, sizes=_axis_sizes(launch))
    p.variation, axes = found
    # Control flow that reads data runs on the values the kernel computes:
    # an estimate given arrays computes them for such a kernel (so that it
    # takes the paths the full simulation takes).
    numerics = self.options.numerics or (
        p.variation is not None and p.variation[0] == block_classes.DATA
        and not self.shapes_only)
    # Without numerics, and with no control decision on data nor any
    # decision or address on float math, no value a float operation
    # computes can change a time: estimate skips them.
    cx = Compiler(self.timing, launch, self.options.max_cycles, numerics,
                  skip_float_values=not numerics and not found.float_matters and (
                      p.variation is None or p.variation[0] != block_classes.DATA))
    p.program = cx.compile(jaxpr)
    p.load_axes = {n: axes.get(k) for k, n in cx.sites.items()}
    p.sites = dict(cx.sites)
    p.barriers = resources.barrier_count(jaxpr)
    p.regs = occupancy.registers(jaxpr, launch.num_threads, self.gpu.register_base)
    names = resources.primitive_names(jaxpr)
    # Warps of a warp_map get clock components of their own.
    p.warps = WARPS_PER_WARPGROUP if "mpmd_map" in names else 0
    # Operands that are semaphores (plgpu.alloc_semaphore): global too.
    p.sem_inputs = frozenset(
        i for i, v in enumerate(jaxpr.invars[:launch.num_inputs])
        if semaphores.holds_semaphores(v.aval))
    # Blocks that can wait for each other (global semaphores) run together.
    p.together = "get_global" in names or bool(p.sem_inputs)
    # What must run in this process, in block order: printing (the order of
    # lines), inline MLIR (built through JAX's MLIR bindings), global
    # semaphores (one group anyway).
    p.serial_only = p.together or bool({"debug_print", "inline_mgpu"} & names)
    if p.together and launch.cluster and math.prod(launch.cluster) > 1:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: global semaphores (pl.get_global, "
          "plgpu.alloc_semaphore) in a kernel with clusters are not modelled",
          where=launch.where)
    self._prepared[key] = p
    return p

  def check_lowering(self, launch, lower, where=None):
    """Raises what JAX's real Mosaic GPU lowering raises for this kernel, as
    our own error class, so that nothing the hardware backend rejects runs
    here. Once per kernel."""
    if not self.check_lowering_on:
      return
    key = id(launch.jaxpr)
    if self._lowered.get(key) is launch.jaxpr:  # (ids are reused: compare)
      return
    timeout = self.options.lowering_timeout_s
    err = lower(timeout)  # (exception, its user file:line or None) or None
    if err is not None and isinstance(err[0], capture.LoweringTimedOut):
      inside = err[0].where()
      raise LoweringTimeoutError(
          f"kernel {launch.name}: JAX's Mosaic GPU lowering did not finish in "
          f"{timeout:g} s (lowering_timeout_s)"
          + (f"; it was in {inside}" if inside else "") + ". A kernel normally "
          "lowers in under a second: JAX's layout inference may be searching for "
          "layouts it cannot settle (layout annotations, plgpu.load(..., layout=...) "
          "or plgpu.layout_cast, help it). Pass check_lowering=False to simulate "
          "without the real lowering's check, or lowering_timeout_s=None to wait "
          "for it.", where=launch.where)
    if err is not None:
      # (The lowering's traceback ends in the user's code where the MLIR op
      # it rejected came from: keep those frames last, as on the GPU.)
      where = where or err[1] or launch.where
      raise resources.lowering_error(err[0], where=where).with_traceback(
          capture.user_tail(err[0].__traceback__))
    self._lowered[key] = launch.jaxpr

  def execute(self, launch, arrays):
    """Runs one launch; returns its outputs. After a Ctrl-C (here or in an
    earlier launch) returns poison at once: the API raises KeyboardInterrupt
    when the user's function returns."""
    self.launches += 1
    if self.replay is not None:  # (a Ray task: execute/ray_engine.py)
      return self._replay(launch, arrays)
    if self.interrupted is None:
      try:
        with np.errstate(all="ignore"):
          out = self._execute(launch, arrays)
          self._clock(launch, arrays)
          if estimate_check.path() and not self.checking_estimate:
            estimate_check.check(self, launch, arrays)
          return out
      except KeyboardInterrupt as e:
        self.interrupted = self._where_interrupted(e)
        sys.stderr.write(self.interrupted + "\n")
        sys.stderr.flush()
    return [memory.poison(a.shape, a.dtype) for a in launch.out_avals]

  def _clock(self, launch, arrays):
    """The launch's clock and power (timing/power.py): where the clock was
    not asked for and the power at the boost clock passes the limit, the
    launch is timed again at lower clocks (as ps.estimate times it: one
    block per class, no checks) and takes the times of the last."""
    k = self.report.kernels[-1]
    g = self.gpu
    w = power.work(k)
    k.power_w = power.watts(g, k.sm_mhz, k.time_s, *w)
    k.clock_note = bound.clock_note(g, k.sm_mhz, self.options.clock_mhz, k.power_w)
    if self.options.clock_mhz is not None or k.power_w <= g.power_limit_w:
      return
    samples = [(k.sm_mhz, k.time_s)]
    mhz = power.first_guess(g, k.time_s, w)
    r = self._timed_at(launch, arrays, mhz)
    for _ in range(self.clock_rounds):
      samples.append((mhz, r.time_s))
      nxt = power.next_guess(g, samples, power.work(r))
      if abs(nxt - mhz) < g.clock_step_mhz:
        break
      mhz = nxt
      r = self._timed_at(launch, arrays, mhz)
    r.power_w = power.watts(g, r.sm_mhz, r.time_s, *power.work(r))
    r.clock_note = bound.clock_note(g, r.sm_mhz, None, r.power_w, k.power_w)
    r.wall_s += k.wall_s
    r.workers, r.simulated_blocks, r.classes = k.workers, k.simulated_blocks, k.classes
    self.report.kernels[-1] = r

  def _timed_at(self, launch, arrays, mhz):
    """The launch's kernel report at `mhz`, timed as ps.estimate times it."""
    ex = self.estimated(launch, arrays, clock_mhz=mhz)
    if ex.errors:
      raise ex.errors[0]
    return ex.report.kernels[-1]

  def estimated(self, launch, arrays, **changes):
    """The launch run again as ps.estimate runs it (no tensor-core sums, no
    checks, one block per class), with these options changed: the Executor
    that ran it. Nothing the user sees twice: no profile written, no
    debug_print lines."""
    opts = dataclasses.replace(self.options, numerics=False, block_classes=True,
                               check_races=False, check_uninitialized=False,
                               check_lowering=False, **changes)
    ex = Executor(options=opts)
    ex.shapes_only = self.shapes_only
    ex._paths = self._paths
    ex.checking_estimate = True
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), \
        contextlib.redirect_stderr(null):
      ex._execute(launch, arrays)
      ex._clock(launch, arrays)  # (as execute: at the clock its power allows)
    return ex

  def _where_interrupted(self, exc):
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

  def _buffers(self, launch, arrays, prep, copy_inputs=False):
    n_in, n_out = launch.num_inputs, launch.num_outputs
    names = list(launch.arg_names[:n_in + n_out])
    if len(names) < n_in + n_out:
      names = [f"in{i}" for i in range(n_in)] + [f"out{j}" for j in range(n_out)]
    aliases = dict((o, i) for i, o in launch.aliases)
    # ps.estimate given shapes: zeros stand for the inputs, and the outputs
    # need no poison (values are not computed): calloc'ed zeros, whose pages
    # only what the kernel touches costs.
    estimating = self.shapes_only and not self.options.numerics
    # An input the callback hands over read-only (its own copy of the
    # caller's array) is used as it is: most kernels never write an input,
    # and a copy of each would cost its size again (issue 10). A kernel
    # that does write one fails that write (numpy refuses it, before any
    # element changes) and the launch runs again with copies (_execute).
    # Copied at once: an input an output aliases, and the inputs of a
    # serial-only kernel (a re-run would print its debug_print lines twice).
    aliased = set(aliases.values())
    borrow = lambda i, a: (not copy_inputs and not prep.serial_only and i not in aliased
                           and isinstance(a, np.ndarray) and not a.flags.writeable)
    copy = ((lambda i, a: np.zeros(np.shape(a), np.asarray(a).dtype)) if estimating else
            (lambda i, a: a if borrow(i, a) else memory.copy(a)))
    in_bufs = [semaphores.input_semaphores(names[i], launch.jaxpr.invars[i].aval, a)
               if i in prep.sem_inputs else memory.Buffer(names[i], "gmem", copy(i, a))
               for i, a in enumerate(arrays[:n_in])]
    for b, a in zip(in_bufs, arrays[:n_in]):
      b.lent = b.data is a
    out_bufs = []
    for j, aval in enumerate(launch.out_avals):
      if j in aliases:  # (holds the input's values: counts as written)
        out_bufs.append(in_bufs[aliases[j]])
      else:
        buf = memory.Buffer(names[n_in + j], "gmem",
                            np.zeros(aval.shape, aval.dtype) if not self.options.numerics
                            else memory.poison(aval.shape, aval.dtype))
        if self.options.check_uninitialized:
          initcheck.track(buf)
        out_bufs.append(buf)
    return in_bufs, out_bufs

  @staticmethod
  def _merge(result, cycles, totals, log, init_log, cross, loads):
    """Merges a group's result, in block order."""
    for number, c, st in zip(result.numbers, result.cycles, result.stats):
      cycles[number] = c
      totals.add(st)
      if st.loads is not None:
        loads[number] = st.loads
    m = types.SimpleNamespace(log=log, init_log=init_log, cross=cross)
    for ev in result.events:
      ev.merge(m)
    for buf, off, estrides, shape, reduce, values in result.writes:
      view = races.element_view(buf.data, off, shape, estrides)
      view[...] = values if reduce is None else reduce(view, values)
      initcheck.mark_view(buf, off, estrides, shape)

  def _workers(self, prep, launch, groups):
    """How many processes may run this launch's groups (1: this one)."""
    if len(groups) < 3 or prep.serial_only or launch.profile is not None:
      return 1
    return min(self.options.workers or parallel.default_workers(), len(groups) - 1)

  def _on_ray(self):
    if self.options.engine != "ray":
      return False
    if self.recipe is None:
      warnings.warn("pallas-sim: engine='ray' re-runs the simulated function on "
                    "the cluster, which only ps.simulate and ps.run know; this "
                    "launch runs in this process", RuntimeWarning, stacklevel=2)
      return False
    return True

  def _replay(self, launch, arrays):
    """In a Ray task: the launch it was given runs the groups of its task
    (ray_engine.Replay); every other launch runs as usual before it, and
    not at all after it (poison: the task's work is done)."""
    r = self.replay
    if self.launches - 1 < r.launch:
      return self._execute(launch, arrays)
    if self.launches - 1 == r.launch:
      s = self._setup(launch, arrays)
      # (as a forked worker runs its task)
      r.results = parallel.run_groups(parallel.Job(s.runner, s.groups, r.trace_blocks),
                                      r.task)
    return [memory.poison(a.shape, a.dtype) for a in launch.out_avals]

  @staticmethod
  def _group_seconds(g, t1):
    """What a group took here, after g groups ran (t1: the end of the setup
    or, from g = 2, of the first group, which pays for warm-up): the first
    alone, then the mean of those after it."""
    return (time.perf_counter() - t1) / max(1, g - 1)

  def _go_parallel(self, g, n, per):
    """After g groups ran here, a group taking `per` seconds
    (_group_seconds): whether to run the rest over workers. A group must
    take a millisecond or more (the merge of one costs a fraction of that),
    and the rest parallel_after_s or more; judged from the groups after the
    first, or from the first alone when its warm-up cannot mislead much: 4
    ms or more, and the rest worth twice parallel_after_s (once, for a first
    group of parallel_after_s / 5)."""
    if not self.parallel_after_s:
      return True
    if g < 2:
      need = self.parallel_after_s * (1 if per >= self.parallel_after_s / 5 else 2)
      return per >= 4e-3 and per * (n - 1) >= need
    return per >= 1e-3 and per * (n - g) >= self.parallel_after_s

  def _run_parallel(self, runner, groups, first, trace, merge, workers, progress,
                    on_ray=False, group_s=None):
    """Groups first.. over forked workers (pallas_sim/backends/sim/execute/parallel.py), merged
    in block order as they arrive; a group that raised there makes the whole
    launch re-run here, serially (_Rerun)."""
    self._running = ("parallel", runner.launch, workers)
    try:
      seen = parallel.Visibility()
      if on_ray:
        results = ray_engine.run(self, runner, groups, self.trace_blocks, workers)
      else:
        results = parallel.run(runner, groups, first, self.trace_blocks, workers,
                               group_s=group_s)
      for g, result, group_trace in results:
        if not seen.check(g, result):
          raise _Rerun  # (it read what another block wrote: see execute/parallel.py)
        if group_trace:
          trace.extend(group_trace)
        merge(result)
        progress.done = groups[g][-1][0] + 1
    except parallel.GroupFailed as e:
      raise _Rerun from e
    except (_Rerun, KeyboardInterrupt, SystemExit):
      raise
    except BaseException as e:  # (the pool itself failed: not the kernel's doing)
      if not _from_the_pool(e):
        raise  # (a signal handler's: a test's time limit, say)
      warnings.warn(f"pallas-sim: the worker processes failed ({type(e).__name__}: "
                    f"{e}); kernel {runner.launch.name} runs again in this process",
                    RuntimeWarning, stacklevel=2)
      raise _Rerun from e

  def _execute(self, launch, arrays, copy_inputs=False):
    try:
      try:
        return self._execute_once(launch, arrays, copy_inputs=copy_inputs)
      except _Rerun:
        return self._execute_once(launch, arrays, serial=True, copy_inputs=copy_inputs)
    except Exception as e:
      if copy_inputs or not memory.wrote_read_only(e):
        raise
    # (the kernel wrote an input it was lent read-only: see _buffers)
    return self._execute(launch, arrays, copy_inputs=True)

  def _setup(self, launch, arrays, copy_inputs=False):
    """A launch's buffers, groups, placement, race log and group runner."""
    s = types.SimpleNamespace()
    s.prep = prep = self.prepare(launch)
    s.in_bufs, s.out_bufs = self._buffers(launch, arrays, prep, copy_inputs)
    s.grid = grid = tuple(launch.grid) or ()
    clusters = list(itertools.product(*[range(g) for g in grid]))
    # A group per cluster (a block each without clusters); blocks are
    # numbered cluster after cluster.
    in_cluster = list(itertools.product(*[range(c) for c in launch.cluster]))
    s.groups = [[(g * len(in_cluster) + j, idx, c) for j, c in enumerate(in_cluster)]
                for g, idx in enumerate(clusters)]
    s.blocks = [m for members in s.groups for m in members]
    if prep.together:  # (all resident at once, as the kernel assumes)
      s.groups = [s.blocks]
    s.placement = self.timing.launch(len(s.blocks), prep.smem, launch.num_threads,
                                     prep.regs, _footprint(launch, arrays))
    grid_index = np.array([idx for _, idx, _ in s.blocks],
                          dtype=np.int64).reshape(len(s.blocks), -1)
    s.placement.set_loads(grid_index, prep.load_axes)
    s.placement.trace_loads = prep.variation is not None
    s.log = races.RaceLog(launch.name, launch.call_site)
    s.runner = GroupRunner(prep, s.in_bufs + s.out_bufs, launch, self.timing,
                           s.placement, s.log, self.check_races,
                           max(map(len, s.groups)), detached=self.detached,
                           check_init=self.options.check_uninitialized)
    return s

  def _execute_once(self, launch, arrays, serial=False, copy_inputs=False):
    t0 = time.perf_counter()
    s = self._setup(launch, arrays, copy_inputs)
    prep, in_bufs, out_bufs, grid = s.prep, s.in_bufs, s.out_bufs, s.grid
    groups, blocks, placement, log, runner = (s.groups, s.blocks, s.placement, s.log,
                                              s.runner)
    nt = launch.num_threads
    cross = CrossBlock(log) if self.check_races else None
    cycles = np.zeros(len(blocks))
    totals = BlockStats()  # (summed over the launch's blocks)
    trace = []
    init_log = initcheck.InitLog(launch.call_site)
    recorder = profiler.Recorder(launch.profile) if launch.profile else None
    t1 = time.perf_counter()  # (the first groups' times decide on workers)
    runner.profile = recorder
    loads = {}  # block number -> its TMA loads, where the L2 model follows them
    merge = lambda result: self._merge(result, cycles, totals, log, init_log, cross,
                                       loads)
    on_ray = False
    classes, note, found = self._classes(prep, launch, s)
    workers = 1 if serial or classes else self._workers(prep, launch, groups)
    if workers > 1:
      on_ray = self._on_ray()
      if on_ray:
        workers = self.options.workers or ray_engine.cluster_cpus()
      elif self.options.engine == "ray" or not parallel.fork_safe():
        workers = 1
    used = 1
    reps, simulated = {}, 0
    with Progress(launch.name, len(blocks)) as progress:
      for g, members in enumerate(groups):
        number, idx, _ = members[0]
        progress.done = number
        per = self._group_seconds(g, t1) if g and workers > 1 else None
        if workers > 1 and (on_ray or (g and self._go_parallel(g, len(groups), per))):
          self._run_parallel(runner, groups, g, trace, merge, workers, progress, on_ray,
                             group_s=per)
          used = workers
          simulated = len(blocks)
          break
        elif g == 1:
          t1 = time.perf_counter()
        if g and time.perf_counter() - t0 > self.parallel_after_s:
          workers = 1  # (decided: this process)
        if classes and classes[g] != g:  # (its class ran: its times are those)
          self._same_as(groups[g], reps[classes[g]], cycles, totals, found, loads)
          continue
        self._running = (launch, number, idx, runner)
        result = runner.run(members, trace if number < self.trace_blocks else None)
        merge(result)
        simulated += len(members)
        if classes:
          reps[g] = result
    self._running = None
    if recorder is not None and not self.checking_estimate:  # (its one file: the run's)
      recorder.dump(launch, self.gpu.num_sms)
    wall = time.perf_counter() - t0

    found = log.races()
    self.report.races.extend(found)
    for i in sorted(prep.sem_inputs):
      if in_bufs[i].data.any():
        # (the callback holds a copy of the Ref's values: a GPU keeps them)
        warnings.warn(
            f"kernel {launch.name} leaves semaphores of {in_bufs[i].name} at "
            f"{in_bufs[i].data.tolist()}: the simulator starts every kernel "
            "with the values the Ref held before it (a later kernel here does "
            "not see these, as it would on a GPU)", stacklevel=2)
    for buf in out_bufs:
      init_log.unwritten_output(buf, grid)
    unset = init_log.findings()
    initcheck.link_causes(unset, found)
    self.report.uninitialized.extend(unset)
    if found and self.on_race == "raise":
      # Races inside jax's own code warn unless library_races="raise".
      strict = self.options.library_races == "raise"
      mine = [r for r in found if strict or not r.library]
      for r in found:
        if r.library and not strict:
          warnings.warn(RaceWarning(f"kernel {launch.name}: {r}"), stacklevel=2)
      if mine:
        self.record_error(RaceError(
            f"{len(mine)} race(s) in kernel {launch.name}:\n"
            + "\n".join(str(r) for r in mine) + initcheck.also_found(unset, "races"),
            races=mine, where=launch.where))
    if unset and self.options.on_uninitialized == "raise":
      self.record_error(UninitializedError(
          f"{len(unset)} uninitialized-memory finding(s) in kernel {launch.name}:\n"
          + "\n".join(str(f) for f in unset) + initcheck.also_found(found, "uninitialized"),
          findings=unset, where=launch.where))

    rep = self._kernel_report(launch, arrays, prep, grid, placement, cycles, totals,
                              wall, trace, used, loads)
    rep.simulated_blocks, rep.classes = simulated, note
    self.report.kernels.append(rep)
    return [b.data for b in out_bufs]

  def _classes(self, prep, launch, s):
    """With block_classes: ({group: the first group of its class}, a note
    for the report, the blocks' paths.Paths or None), or (None, note, None)
    when every group must run. A class: groups whose blocks share their SMs
    alike (timing/model.py) and take the same path (every block's, in a
    kernel whose control flow is the same in every block; where it depends
    on the grid index, each block's decisions: pallas_sim/backends/sim/analysis/paths.py)."""
    if not self.options.block_classes:
      return None, "", None
    groups, placement = s.groups, s.placement
    n = sum(map(len, groups))
    found = None
    if prep.variation is not None:
      why, where = prep.variation
      note = f"control flow depends on {why} ({where})"
      if why == block_classes.GRID:
        found = self._block_paths(prep, launch, s)
      if isinstance(found, str):
        note += f"; its paths were not followed ({found})"
      if not isinstance(found, paths.Paths):
        note += f": all {n} blocks simulated"
        if why == block_classes.DATA and self.shapes_only:
          note += ", on zeros for the inputs given as shapes"
        return None, note, None
      by = "by the path each block takes and blocks per SM"
    else:
      note, by = "control flow is the same in every block", "by blocks per SM"
    first, out = {}, {}
    for g, members in enumerate(groups):
      key = tuple((placement.share(number), found and found.key(number))
                  for number, _, _ in members)
      out[g] = first.setdefault(key, g)
    sims = sum(len(groups[g]) for g in set(first.values()))
    return out, (f"{note}: {len(first)} class(es) {by}, {sims} of {n} blocks "
                 "simulated"), found

  def _block_paths(self, prep, launch, s):
    """Every block's path (pallas_sim/backends/sim/analysis/paths.py): a paths.Paths, or why
    there is none (words). Once per kernel jaxpr."""
    hit = self._paths.get(id(prep.jaxpr))
    if hit is not None and hit[0] is prep.jaxpr:
      return hit[1]
    try:
      keep = paths.kernel_slice(prep.jaxpr)
      cx = Compiler(self.timing, launch, self.options.max_cycles, numerics=False,
                    keep=keep, overrides=paths.OVERRIDES, sites=prep.sites,
                    wrap=paths.lanes_checked)
      sliced = copy.copy(prep)
      sliced.program = cx.compile(prep.jaxpr)
      found = paths.follow(
          lambda placement: GroupRunner(sliced, s.in_bufs + s.out_bufs, launch,
                                        self.timing, placement,
                                        races.RaceLog(launch.name), False,
                                        max(map(len, s.groups))),
          s.groups, launch, prep.jaxpr)
    except Exception as e:  # (then every block runs, as before; the note says why)
      if isinstance(e, KeyboardInterrupt):
        raise
      found = (f"{type(e).__name__}: " if not isinstance(e, paths.SliceError) else ""
               ) + (str(e).splitlines() or [""])[0]
    self._paths[id(prep.jaxpr)] = (prep.jaxpr, found)
    return found

  @staticmethod
  def _same_as(members, result, cycles, totals, found=None, loads=None):
    """Group `members` took the times of `result`, its class's group (and,
    with the blocks' paths `found`, its loads' issue cycles)."""
    for (number, _, _), c, st in zip(members, result.cycles, result.stats):
      cycles[number] = c
      totals.add(st)
      if found is not None and st.loads is not None:
        loads[number] = found.joined(number, st.loads)

  def _kernel_report(self, launch, arrays, prep, grid, placement, cycles, totals, wall,
                     trace, workers, loads):
    """The timing model's verdict on a launch (timing/model.py, timing/bound.py)."""
    inputs = sum(map(_nbytes, arrays[:launch.num_inputs]))
    outputs = sum(map(_nbytes, launch.out_avals))
    if totals.tma_load_bytes + totals.tma_store_bytes:
      reads = (placement.hbm_reads_traced(loads) if placement.trace_loads else
               placement.hbm_reads(totals.load_sites, inputs))
      writes = totals.tma_store_bytes
    else:  # (kernels without TMA move their operands with plain loads and stores)
      reads, writes = inputs, outputs
    hbm = reads + writes
    kt = placement.kernel_time(cycles, reads, writes)
    util = bound.utilisation(kt, totals, self.gpu, hbm)
    words, why = bound.name(kt, totals, util, prep.regs)
    return KernelReport(
        name=launch.name, where=launch.where, grid=grid, num_threads=launch.num_threads,
        num_blocks=len(cycles), smem_bytes=prep.smem, blocks_per_sm=placement.per_sm,
        waves=placement.waves,
        block_cycles_min=float(cycles.min()) if len(cycles) else 0.0,
        block_cycles_mean=float(cycles.mean()) if len(cycles) else 0.0,
        block_cycles_max=float(cycles.max()) if len(cycles) else 0.0,
        time_s=kt.seconds, wall_s=wall, clock_hz=self.gpu.clock_hz, trace=trace,
        tma_load_bytes=totals.tma_load_bytes, tma_store_bytes=totals.tma_store_bytes,
        wgmma_flops=totals.wgmma_flops, tensor_f16_flops=totals.tensor_f16_flops,
        workers=workers, hbm_bytes=int(hbm),
        registers=prep.regs.per_thread, register_limit=prep.regs.limit,
        timing=kt, utilisation=util, stalls=bound.stall_shares(totals),
        bound=words, bound_reason=why, num_sms=self.gpu.num_sms)
