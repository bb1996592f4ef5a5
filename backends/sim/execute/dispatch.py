"""Where a launch's groups run: in this process, over forked workers
(parallel.py) or Ray tasks (ray_engine.py), decided from the first groups'
times; results merge in block order wherever they ran."""
import sys
import time
import warnings

from pallas_sim.backends.sim.execute import parallel, ray_engine


class Rerun(Exception):
  """A group failed in a worker process: run the launch again, serially."""


def from_the_pool(exc):
  """Whether an exception that ended a run over workers is the pool's own
  failure (a fork, a pipe, a pickle: Python's or ours), which a serial run
  gets past, rather than one a signal handler raised in this process (a
  test's time limit), which must pass: no user code runs here meanwhile."""
  top = type(exc).__module__.split(".")[0]
  return top in sys.stdlib_module_names or top == "pallas_sim"


def worker_count(options, prep, launch, groups):
  """How many processes may run this launch's groups (1: this one)."""
  if len(groups) < 3 or prep.serial_only or launch.profile is not None:
    return 1
  return min(options.workers or parallel.default_workers(), len(groups) - 1)


def workers(options, recipe, prep, launch, groups):
  """(processes for the launch's groups, whether they are Ray tasks)."""
  n = worker_count(options, prep, launch, groups)
  if n > 1:
    if ray_wanted(options, recipe):
      return options.workers or ray_engine.cluster_cpus(), True
    if options.engine == "ray" or not parallel.fork_safe():
      return 1, False
  return n, False


def ray_wanted(options, recipe):
  """Whether the launch's groups go to Ray (Options.engine): only where the
  function that launched it is known (ps.simulate, ps.run)."""
  if options.engine != "ray":
    return False
  if recipe is None:
    warnings.warn("pallas-sim: engine='ray' re-runs the simulated function on "
                  "the cluster, which only ps.simulate and ps.run know; this "
                  "launch runs in this process", RuntimeWarning, stacklevel=3)
    return False
  return True


def group_seconds(g, t1):
  """What a group took here, after g groups ran (t1: the end of the setup
  or, from g = 2, of the first group, which pays for warm-up): the first
  alone, then the mean of those after it."""
  return (time.perf_counter() - t1) / max(1, g - 1)


def go_parallel(g, n, per, after_s):
  """After g groups of n ran here, a group taking `per` seconds
  (group_seconds): whether to run the rest over workers. A group must take
  a millisecond or more (the merge of one costs a fraction of that), and
  the rest after_s (Tuning.parallel_after_s) or more; judged from the
  groups after the first, or from the first alone when its warm-up cannot
  mislead much: 4 ms or more, and the rest worth twice after_s (once, for a
  first group of after_s / 5)."""
  if not after_s:
    return True
  if g < 2:
    need = after_s * (1 if per >= after_s / 5 else 2)
    return per >= 4e-3 and per * (n - 1) >= need
  return per >= 1e-3 and per * (n - g) >= after_s


def run_parallel(executor, runner, groups, first, trace, merge, workers, progress,
                 on_ray=False, group_s=None):
  """Groups first.. over forked workers (execute/parallel.py) or Ray tasks,
  merged in block order as they arrive; a group that raised there makes the
  whole launch re-run here, serially (Rerun)."""
  tuning = executor.tuning
  try:
    seen = parallel.Visibility()
    if on_ray:
      results = ray_engine.run(executor, runner, groups, tuning.trace_blocks, workers)
    else:
      results = parallel.run(runner, groups, first, tuning.trace_blocks, workers,
                             group_s=group_s, tuning=tuning)
    for g, result, group_trace in results:
      if not seen.check(g, result):
        raise Rerun  # (it read what another block wrote: see parallel.py)
      if group_trace:
        trace.extend(group_trace)
      merge(result)
      progress.done = groups[g][-1][0] + 1
  except parallel.GroupFailed as e:
    raise Rerun from e
  except (Rerun, KeyboardInterrupt, SystemExit):
    raise
  except BaseException as e:  # (the pool itself failed: not the kernel's doing)
    if not from_the_pool(e):
      raise  # (a signal handler's: a test's time limit, say)
    warnings.warn(f"pallas-sim: the worker processes failed ({type(e).__name__}: "
                  f"{e}); kernel {runner.launch.name} runs again in this process",
                  RuntimeWarning, stacklevel=2)
    raise Rerun from e
