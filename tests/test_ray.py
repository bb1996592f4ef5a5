"""A launch's blocks as Ray tasks (engine="ray", backends/sim/execute/ray_engine.py)
on a local Ray instance this module starts: the same outputs, reports,
times and errors as one process."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ray

import pallas_sim as ps
from pallas_sim.backends.sim.execute import parallel
from test_parallel import (_kernel_fields, _x, atomic_rows, deadlocks_in_block,
                           reads_the_previous_block)
from test_quickstart import matmul_mcs

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
  ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
           runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                                     "PALLAS_SIM_PROGRESS": "0"}})
  yield
  ray.shutdown()


# (Module-level: a Ray task imports them by name, and builds the kernel.)
def quickstart(a, b):
  return matmul_mcs(a, b)


def atomics(x):
  return atomic_rows(jnp.int32)(x)


def previous_row(x):
  return reads_the_previous_block()(x)


def deadlock(x):
  return deadlocks_in_block(5)(x)


def _ab():
  a = jnp.asarray(np.random.default_rng(1).standard_normal((384, 512)), jnp.float16)
  return a, a.T


OPTS = dict(on_race="report", on_uninitialized="report")


@pytest.mark.parametrize("fn,args", [(quickstart, _ab()), (atomics, (_x(dtype=jnp.int32),)),
                                     (previous_row, (_x(),))],
                         ids=["quickstart", "atomics", "reads another block's row"])
def test_ray_tasks_give_what_one_process_gives(fn, args):
  one = ps.simulate(fn, *args, workers=1, **OPTS)
  on_ray = ps.simulate(fn, *args, workers=2, engine="ray", **OPTS)
  for x, y in zip(jax.tree.leaves(one.outputs), jax.tree.leaves(on_ray.outputs), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert [str(r) for r in one.report.races] == [str(r) for r in on_ray.report.races]
  assert ([str(f) for f in one.report.uninitialized]
          == [str(f) for f in on_ray.report.uninitialized])
  [k1], [k2] = one.report.kernels, on_ray.report.kernels
  assert _kernel_fields(k1) == _kernel_fields(k2)
  # (a block that read another's row: run again in this process)
  assert k2.workers == (1 if fn is previous_row else 2)


def test_an_error_in_a_ray_task_is_raised_as_one_process_raises_it():
  errors = []
  for kw in (dict(workers=1), dict(workers=2, engine="ray")):
    with pytest.raises(ps.DeadlockError) as e:
      ps.simulate(deadlock, _x(), **kw)
    errors.append(str(e.value))
  assert errors[0] == errors[1] and "block (5,)" in errors[0]


def test_ray_outside_simulate_says_it_runs_here():
  """ps.backend runs arbitrary code: nothing to send to the cluster."""
  with pytest.warns(RuntimeWarning, match="engine='ray'.*runs in this process"):
    with ps.backend("sim", workers=2, engine="ray") as report:
      np.asarray(quickstart(*_ab()))
  assert report.kernels[0].workers == 1


def test_no_fork_while_ray_runs_in_this_process(monkeypatch):
  """(A fork of a process running Ray's gRPC threads crashed it.)"""
  monkeypatch.setattr(parallel, "WARNED", False)
  with pytest.warns(RuntimeWarning, match="Ray is running in this process"):
    sim = ps.simulate(quickstart, *_ab(), workers=2)
  assert sim.report.kernels[0].workers == 1


def test_engine_option_is_checked():
  with pytest.raises(ValueError, match="engine='dask'"):
    ps.Options(engine="dask")
