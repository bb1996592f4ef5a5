"""The groups of one launch over forked worker processes (the standard
library's multiprocessing pool, fork start method).

Why fork, and not a pool that outlives launches (loky, spawn): a worker
needs the launch as the executor prepared it (the compiled program holds
the kernel's jaxpr and the rules' closures, which do not pickle), and a
fork hands it over for free (~15 ms on this machine). The workers run only
numpy and numba, never JAX, so JAX's threads (which a fork does not copy)
are never waited on; the numba kernels (machine/numerics/tensor_core.py) start no
threads.

What keeps a parallel run identical to a serial one:
* groups run detached (their own GMEM copies; writes applied at the merge)
  and their results merge in block order, as in a serial detached run;
* a block's time depends on nothing simulated in another group
  (timing/model.py: co-resident blocks share their SM's units fairly);
* race sites are re-interned in the launch's log by what they are, not by
  the worker's numbering; GMEM buffers travel as their position in the
  launch's operands;
* a failing group makes the executor re-run the launch serially, so that
  the error (deadlock, runaway, a rule's) is raised exactly as in a serial
  run, with its traceback.
"""
import gc
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from typing import Any

import numpy as np

from pallas_sim.backends.sim.base.events import GmemRead
from pallas_sim.backends.sim.execute.group import GroupResult
from pallas_sim.backends.sim.execute.tuning import Tuning
from pallas_sim.backends.sim.checks import races

_JOB = None  # the launch being run (set in the parent before the fork)


def fork_safe():
  """Whether this process may fork workers: not while Ray runs in it (its
  gRPC threads do not survive a fork: the process crashed). Warns once."""
  ray = sys.modules.get("ray")
  if ray is None or not ray.is_initialized():
    return True
  global WARNED
  if not WARNED:
    WARNED = True
    warnings.warn("pallas-sim: Ray is running in this process, which cannot fork "
                  "safely: launches run in this process (engine='ray' spreads "
                  "them over Ray instead)", RuntimeWarning, stacklevel=3)
  return False


# Whether fork_safe has warned in this process: it warns once, and later
# launches run in the process without a warning. tests/test_ray.py sets it
# back to False to see the warning again.
WARNED = False


def default_workers():
  """Every core this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # (not on Linux)
    return os.cpu_count() or 1


def tasks(n, size):
  """Group indices 0..n-1 in runs of about `size` (groups share no timing
  state: timing/model.py gives each block its share of its SM's units)."""
  return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


class Job:
  """What a worker needs: the runner, the groups, which to trace, and how
  to name the launch's GMEM operands."""

  def __init__(self, runner, groups, trace_blocks):
    self.runner, self.groups, self.trace_blocks = runner, groups, trace_blocks
    self.buf_index = {id(b): i for i, b in enumerate(runner.io_bufs)}


def _portable(result, job):
  """A GroupResult that pickles small: sites as their keys, GMEM buffers as
  their operand index (events.py)."""
  index = lambda b: job.buf_index[id(b.origin)]
  return GroupResult(result.numbers, result.cycles, result.stats,
                     [ev.portable(index) for ev in result.events],
                     [w.portable(index) for w in result.writes])


def restore(result, io_bufs, log):
  """The parent's side of _portable."""
  return GroupResult(result.numbers, result.cycles, result.stats,
                     [ev.restored(io_bufs, log) for ev in result.events],
                     [w.restored(io_bufs, log) for w in result.writes])


def worker_release_bytes(release_bytes, workers):
  """Each worker keeps touched GMEM shadow pages up to its share of the
  budget one process has, 2 MiB at least: 16 workers with 16 MiB each held
  256 MiB (at 8192^3, more than the output's 128). Pages given back cost ~1
  us each when touched again: a fraction of a percent of a group there."""
  return max(2 << 20, release_bytes // workers)


def _init_worker(release_bytes):
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the parent handles Ctrl-C)
  assert _JOB is not None  # (set before the pool forks its workers)
  tracker = _JOB.runner.tracker  # (this process's copy of the parent's)
  if tracker is not None:
    tracker.release_bytes = release_bytes
  # (jaxlib's absl installs a failure handler that reports a SIGTERM, which
  # is how the pool ends its workers: ended quietly instead)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_groups(job, task):
  """The groups of `task` (indices), in order, on this process's GMEM,
  writes logged. Returns [(group index, portable GroupResult, trace)] or
  ("error", group index, text) at the first group that raised."""
  out = []
  for g in task:
    members = job.groups[g]
    trace: list[Any] | None = [] if members[0][0] < job.trace_blocks else None
    try:
      out.append((g, _portable(job.runner.run(members, trace, log_writes=True), job),
                  trace))
    except BaseException as e:  # noqa: BLE001 (reported; the parent re-runs serially)
      return ("error", g, f"{type(e).__name__}: {e}")
  return out


def _run_task(task):
  """In a forked worker."""
  return run_groups(_JOB, task)


def in_order(done, runner, first):
  """Task results (run_groups's, in task order) as (group index,
  GroupResult with this process's objects, trace) in group order."""
  pending, nxt = {}, first  # results that arrived before an earlier group's
  for out in done:
    if isinstance(out, tuple):
      raise GroupFailed(*out[1:])
    for g, result, trace in out:
      pending[g] = (result, trace)
    while nxt in pending:
      result, trace = pending.pop(nxt)
      yield nxt, restore(result, runner.io_bufs, runner.log), trace
      nxt += 1


def run(runner, groups, first, trace_blocks, workers, per_task=None, group_s=None,
        tuning=Tuning()):
  """Runs groups[first:] over `workers` forked processes; yields (group
  index, GroupResult with the parent's objects, trace or None) in group
  order. Raises GroupFailed if a group raised in a worker.

  group_s (the seconds a group took here, if known) decides whether each
  task gets a worker of its own: pages of an output that both a worker and
  the parent's merges wrote stay in memory three times (the page as it was
  at the fork, kept by the other workers, and the writers' copies) for as
  long as the worker lives. A worker that ends with its task frees them
  (an 8192^3 matmul on 16 workers: ~300 MiB). A later fork sees the
  parent's merges so far: what Visibility rejects all the same."""
  global _JOB
  size = per_task or max(1, -(-(len(groups) - first) // (workers * 8)))
  todo = tasks(len(groups) - first, size)
  writable = sum(b.data.nbytes for b in runner.io_bufs if b.data.flags.writeable)
  fresh = (group_s is not None and group_s * size >= tuning.fresh_task_s
           and writable >= tuning.fresh_min_bytes)
  todo = [[g + first for g in task] for task in todo]
  _JOB = Job(runner, groups, trace_blocks)
  ctx = multiprocessing.get_context("fork")
  # (A collection in a worker would write to every object the parent has,
  # copying each page of its heap (JAX's is ~300 MB): the parent's objects
  # are left out of collections while workers run.)
  gc.freeze()
  with warnings.catch_warnings():
    # (JAX and Python warn at any fork of a threaded process; the workers
    # never call into JAX, whose threads are the ones not copied. Nor do
    # they take a lock the parent's merges may hold.)
    warnings.simplefilter("ignore", RuntimeWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    n = min(workers, len(todo))
    pool = ctx.Pool(n, initializer=_init_worker,
                    initargs=(worker_release_bytes(tuning.release_bytes, n),),
                    maxtasksperchild=1 if fresh else None)
  # (The pool's own thread forks a worker whenever one ends: each of a fresh
  # pool's, or one a failed task took down. The same warnings as at the
  # pool's start, above.)
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", ".*fork", RuntimeWarning)
    warnings.filterwarnings("ignore", ".*fork", DeprecationWarning)
    try:
      yield from in_order(pool.imap(_run_task, todo), runner, first)
    except BaseException:  # (a Ctrl-C, a test's time limit, a failed group)
      abandon(pool)
      raise
    else:
      pool.terminate()
      pool.join()
    finally:
      gc.unfreeze()
      _JOB = None


def abandon(pool):
  """Stops the pool of a run that ended early, never waiting on it for long:
  its workers are killed, and the rest of its shutdown, which can wait
  forever on a worker killed while it wrote a result (CPython's
  Pool.terminate joins a result thread that a torn message leaves blocked:
  seen when a test's time limit struck JAX's suite), is left to a daemon
  thread given a few seconds."""
  def kill_workers():
    procs = list(getattr(pool, "_pool", ()))
    for proc in procs:
      proc.kill()
    for proc in procs:  # (reaped: no zombie left behind)
      proc.join(timeout=1)
  kill_workers()
  stop = threading.Thread(target=pool.terminate, daemon=True, name="pallas-sim pool stop")
  stop.start()
  stop.join(timeout=5)
  # (the pool starts new workers for killed ones until its shutdown begins:
  # a pool of a worker per task does at once)
  kill_workers()


class Visibility:
  """Whether a group run in a worker read only what it would have read in
  one process. A worker sees GMEM as it was at the fork, plus its own
  groups' writes; one process sees every earlier group's. They differ only
  where a group reads an element that another group wrote after the fork (a
  race between blocks on the GPU, whose order is undefined, but a run over
  workers must still equal one in one process): `check` says False, and the
  launch runs again in one process. Conservative: a read of what an earlier
  group of the same worker wrote counts too. Per GMEM buffer, writes are
  only listed until something reads that buffer (outputs rarely are)."""

  def __init__(self):
    self.listed = {}   # buffer id -> [(group + 1, element map)]
    self.writer = {}   # buffer id -> int32 array: the last group to write + 1

  def _writer(self, buf):
    w = self.writer.get(id(buf))
    if w is None:
      w = self.writer[id(buf)] = np.zeros(buf.data.shape, np.int32)
      for me, (off, estrides, shape) in self.listed.pop(id(buf), ()):
        races.element_view(w, off, shape, estrides)[...] = me
    return w

  def check(self, g, result):
    """Group g's reads, then its writes (merged in group order)."""
    me = g + 1
    for ev in result.events:
      if type(ev) is GmemRead:
        buf = ev.buffer.origin
        if id(buf) in self.writer or id(buf) in self.listed:
          seen = races.element_view(self._writer(buf), ev.offset, ev.shape, ev.estrides)
          if ((seen != 0) & (seen != me)).any():
            return False
    for buf, off, estrides, shape, _, _ in result.writes:
      w = self.writer.get(id(buf))
      if w is None:
        self.listed.setdefault(id(buf), []).append((me, (off, estrides, shape)))
      else:
        races.element_view(w, off, shape, estrides)[...] = me
    return True


class GroupFailed(Exception):
  """A group raised in a worker (the executor re-runs the launch serially)."""
