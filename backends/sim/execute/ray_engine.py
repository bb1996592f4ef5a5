"""The groups of one launch over a Ray cluster (`engine="ray"`, the optional
extra `pallas-sim[ray]`).

A launch as the executor prepared it does not pickle (its program holds the
kernel's jaxpr and the rules' closures), so a Ray task does not receive the
launch: it receives what ps.simulate was asked to run, (fn, args, kwargs),
and runs it again under an executor that simulates the launches before
this one as usual, this one's groups of the task only, and nothing after it
(backends/sim/execute/executor.py, _replay). The function must therefore be
deterministic (a traced JAX function is) and importable or picklable where
the task runs (cloudpickle, as Ray ships any task).

The tasks are runs of groups, as on forked workers (parallel.tasks), over
every group of the launch; their
results come back in the portable form of execute/parallel.py and merge here in
block order, with the same visibility check (a task starts from GMEM as it
was before the launch, so a block that reads what another block wrote makes
the launch run again here). Outputs, reports and times are those of one
process.

Where: a running cluster if `ray.init` was called or RAY_ADDRESS is set
(e.g. RAY_ADDRESS=ray://head:10001); else a local Ray instance is started
with this process's import path, so that test modules and examples import
in its workers.
"""
import os
import sys

from pallas_sim.backends.sim.execute import parallel


class Replay:
  """What a Ray task's executor runs of launch number `launch`."""

  def __init__(self, launch, task, trace_blocks):
    self.launch, self.task, self.trace_blocks = launch, task, trace_blocks
    self.results = None


def _ray():
  try:
    import ray
  except ImportError:
    raise ImportError("engine='ray' needs Ray: pip install 'pallas-sim[ray]'") from None
  if not ray.is_initialized():
    address = os.environ.get("RAY_ADDRESS")
    if address:
      ray.init(address=address, log_to_driver=False)
    else:
      path = os.pathsep.join(p for p in sys.path if p)
      ray.init(include_dashboard=False, log_to_driver=False,
               runtime_env={"env_vars": {"PYTHONPATH": path}})
  return ray


def cluster_cpus():
  """How many tasks the cluster runs at once."""
  return max(1, int(_ray().cluster_resources().get("CPU", 1)))


def _task(recipe, options, launch, task, trace_blocks):
  """A Ray task: fn(*args, **kwargs) again, simulating of launch number
  `launch` the groups `task`."""
  import jax
  from pallas_sim.backends.sim.frontend import capture, device
  from pallas_sim.backends.sim.execute.executor import Executor
  fn, args, kwargs = recipe
  ex = Executor(options, replay=Replay(launch, task, trace_blocks))
  capture.push_executor(ex)
  try:
    with capture.force_sim(), device.simulated():
      jax.block_until_ready(fn(*args, **kwargs))
      jax.effects_barrier()
  except Exception:  # noqa: BLE001 (the poison after this launch may fail fn)
    pass
  finally:
    capture.pop_executor(ex)
  if ex.replay.results is None:
    err = ex.errors[0] if ex.errors else None
    return ("error", task[0], f"the task did not reach launch {launch}: {err!r}")
  return ex.replay.results


def run(executor, runner, groups, trace_blocks, workers):
  """Runs every group of the launch as Ray tasks; yields (group index,
  GroupResult with this process's objects, trace or None) in group order.
  Raises parallel.GroupFailed if a group raised in a task."""
  import dataclasses
  ray = _ray()
  remote = ray.remote(_task)
  opts = dataclasses.replace(executor.options, workers=1, engine="processes",
                             progress=False)
  todo = parallel.tasks(len(groups), max(1, -(-len(groups) // (workers * 4))))
  refs = [remote.remote(executor.recipe, opts, executor.launches - 1, task, trace_blocks)
          for task in todo]
  # (After a failed group the tasks left run to their end unwatched: a
  # forced cancel kills their worker processes, and once crashed the
  # driver.)
  yield from parallel.in_order((ray.get(ref) for ref in refs), runner, 0)
