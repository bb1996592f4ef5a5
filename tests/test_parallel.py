"""A launch's groups over worker processes (backends/sim/execute/parallel.py): the
same outputs bit for bit, the same race reports and uninitialized-memory
findings in the same order, the same predicted times, block cycles and
trace, and the same errors, as one process running them in block order."""
import dataclasses
import inspect
import sys
import multiprocessing.pool
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernels as K
import pallas_sim as ps
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.execute import dispatch, executor as executor_mod, parallel
from pallas_sim.backends.sim.execute.executor import Executor
from pallas_sim.options import Options
from pallas_sim.backends.sim.execute.tuning import Tuning
from test_clusters import multicast_kernel
from test_machine import run_on, writes_twice_and_reads_back
from test_quickstart import matmul_mcs

F32 = jnp.float32
ROWS = 8


def atomic_rows(dtype):
  """Block i stores x[i] in its own row and adds it atomically into the
  shared last row, which nothing initializes (findings; NaN for floats)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((ROWS + 1, 128), dtype),
                grid=(ROWS,), grid_names=("i",))
  def k(x_ref, o_ref):
    i = lax.axis_index("i")
    o_ref[i] = x_ref[i]
    plgpu.atomic_add(o_ref.at[ROWS], x_ref[i])
  return k


def tma_reduction_rows():
  """Blocks 1.. TMA-reduce (add) their tile into row 0 of the output, which
  block 0 stores first (the f32 sum's rounding depends on the order, block
  order in both), and into row 1, which nothing initializes: block 1's
  reduction reads it unwritten (a finding), the later ones do not."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), F32), grid=(ROWS,),
                grid_names=("i",), scratch_types=[plgpu.SMEM((128,), F32)])
  def k(x_ref, o_ref, smem):
    i = lax.axis_index("i")
    smem[...] = x_ref[i]
    plgpu.commit_smem()

    @pl.when(i == 0)
    def _():
      plgpu.copy_smem_to_gmem(smem, o_ref.at[0])

    @pl.when(i != 0)
    def _():
      plgpu.copy_smem_to_gmem(smem, o_ref.at[0], reduction_op="add")
      plgpu.copy_smem_to_gmem(smem, o_ref.at[1], reduction_op="add")
    plgpu.wait_smem_to_gmem(0)
  return k


def reads_the_previous_block():
  """Block i writes row i, then reads row i - 1 (another block's: a race;
  for block 0 the last row, which no block wrote before it: a finding)."""
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct((ROWS, 128), F32),) * 2,
                grid=(ROWS,), grid_names=("i",))
  def k(x_ref, o_ref, p_ref):
    i = lax.axis_index("i")
    o_ref[i] = x_ref[i]
    p_ref[i] = o_ref[(i + ROWS - 1) % ROWS] * 2
  return k


def writes_its_input(row):
  """Block i copies x[i] to its output row; block `row` first doubles x[i]
  in place (an input, not aliased to an output) and copies that."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((ROWS, 128), F32),
                grid=(ROWS,), grid_names=("i",))
  def k(x_ref, o_ref):
    i = lax.axis_index("i")

    @pl.when(i == row)
    def _():
      x_ref[i] = x_ref[i] * 2
    o_ref[i] = x_ref[i]
  return k


def _x(shape=(ROWS, 128), dtype=F32, seed=0):
  r = np.random.default_rng(seed)
  if jnp.issubdtype(dtype, jnp.integer):
    return jnp.asarray(r.integers(-1000, 1000, shape), dtype)
  return jnp.asarray(r.standard_normal(shape) * 2.0 ** r.integers(-20, 20, shape), dtype)


def _ab(delay_release=1):
  a = jnp.asarray(np.random.default_rng(1).standard_normal((384, 512)), jnp.float16)
  return lambda a, b: matmul_mcs(a, b, delay_release=delay_release), (a, a.T)


CASES = [
    ("quickstart matmul", *_ab()),
    ("racy matmul (delay_release=0)", *_ab(0)),
    ("atomic add, int32", atomic_rows(jnp.int32), (_x(dtype=jnp.int32),)),
    ("atomic add, f32", atomic_rows(F32), (_x(),)),
    ("TMA reduction, f32", tma_reduction_rows(), (_x(),)),
    ("reads the previous block's row", reads_the_previous_block(), (_x(),)),
    ("writes twice and reads back", writes_twice_and_reads_back(), (_x(),)),
    ("clusters of (2, 2), multicast", multicast_kernel(cluster=(2, 2), clusters=4),
     (jnp.asarray(np.random.default_rng(2).standard_normal((4, 128, 128)), F32),)),
]
CASES += [(name, fn, make(0)) for name, fn, make, _ in K.EXAMPLES
          if name not in K.NOT_LOWERABLE]
if jx.KERNELS_WRITE_INPUT_ARRAYS:  # (from jax 0.12.1 a kernel writes only a Ref)
  CASES.append(("the last block writes its input", writes_its_input(ROWS - 1), (_x(),)))
# Where JAX refuses it, what needs an input array written in place is not
# reachable; a Ref is an aliased output (test_reads_of_an_input_ref_race...).
WRITES_ARRAYS = pytest.mark.skipif(not jx.KERNELS_WRITE_INPUT_ARRAYS,
                                   reason="from jax 0.12.1 a kernel writes only a Ref")


# Over workers whatever the size; the `fresh` fixture changes it.
TUNING = Tuning(parallel_after_s=0.0)


def _run(fn, args, workers):
  ex = Executor(Options(check_races=True, on_race="report", on_uninitialized="report",
                        workers=workers), tuning=TUNING)
  out = run_on(ex, fn, *args)
  return ex, [np.asarray(x) for x in jax.tree.leaves(out)]


def _kernel_fields(k):
  d = dataclasses.asdict(k)
  for name in ("wall_s", "workers"):
    d.pop(name)
  return d


@pytest.fixture(params=["lasting workers", "a worker per task"])
def fresh(request, monkeypatch):
  """Both ways a pool runs tasks (parallel.run): workers that last the
  launch, and a worker forked for each task (each later fork sees the
  parent's merges so far). Yields the maxtasksperchild of the pools made."""
  made = []
  real = multiprocessing.pool.Pool.__init__

  def init(self, *args, **kw):
    made.append(inspect.signature(real).bind(self, *args, **kw).arguments.get(
        "maxtasksperchild"))
    real(self, *args, **kw)
  monkeypatch.setattr(multiprocessing.pool.Pool, "__init__", init)
  if request.param == "a worker per task":
    monkeypatch.setattr(sys.modules[__name__], "TUNING", dataclasses.replace(
        TUNING, fresh_min_bytes=0, fresh_task_s=0.0))
  return request.param, made


@pytest.mark.parametrize("name,fn,args", CASES, ids=[c[0] for c in CASES])
def test_workers_give_what_one_process_gives(name, fn, args, fresh):
  one, out1 = _run(fn, args, 1)
  two, out2 = _run(fn, args, 2)
  way, made = fresh
  assert set(made) <= {1 if way == "a worker per task" else None}
  assert made or not any(k.workers > 1 for k in two.report.kernels)
  for x, y in zip(out1, out2, strict=True):
    np.testing.assert_array_equal(x, y)
  assert [str(r) for r in one.report.races] == [str(r) for r in two.report.races]
  assert ([str(f) for f in one.report.uninitialized]
          == [str(f) for f in two.report.uninitialized])
  assert len(one.report.kernels) == len(two.report.kernels)
  for k1, k2 in zip(one.report.kernels, two.report.kernels):
    assert k1.workers == 1
    assert _kernel_fields(k1) == _kernel_fields(k2)


def test_the_cases_run_over_workers_and_find_what_they_are_for():
  """(The comparison above is only as good as its cases: they do run over
  two processes, and they do race, read uninitialized memory, reduce.)"""
  by_name = {c[0]: c[1:] for c in CASES}
  for name in ("quickstart matmul", "racy matmul (delay_release=0)",
               "clusters of (2, 2), multicast"):
    two, _ = _run(*by_name[name], 2)
    assert [k.workers for k in two.report.kernels] == [2], name
  assert two.report.kernels[0].num_blocks == 16
  two, _ = _run(*by_name["racy matmul (delay_release=0)"], 2)
  assert two.report.races and not any("between blocks" in r.kind for r in two.report.races)
  two, out = _run(atomic_rows(jnp.int32), (_x(dtype=jnp.int32),), 2)
  assert two.report.kernels[0].workers == 2
  np.testing.assert_array_equal(out[0][:ROWS], np.asarray(_x(dtype=jnp.int32)))
  two, out = _run(writes_twice_and_reads_back(), (_x(),), 2)
  assert two.report.kernels[0].workers == 2
  np.testing.assert_array_equal(out[0], 3 * np.asarray(_x()))
  np.testing.assert_array_equal(out[1], 3 * np.asarray(_x()) + 1)
  two, out = _run(tma_reduction_rows(), (_x(),), 2)
  assert two.report.kernels[0].workers == 2
  want = np.asarray(_x())[0].copy()
  for r in np.asarray(_x())[1:]:
    want = want + r  # (f32 sums in block order)
  np.testing.assert_array_equal(out[0][0], want)
  assert [(f.example[0], f.count) for f in two.report.uninitialized] == [((1,), 1)]


def test_a_block_that_reads_another_s_writes_runs_the_launch_in_one_process(fresh):
  """A worker sees GMEM as it was at the fork: a launch whose blocks read
  what other blocks wrote (a race on the GPU) is run again in one process,
  so that it reads what a one-process run reads."""
  two, out = _run(reads_the_previous_block(), (_x(),), 2)
  assert two.report.kernels[0].workers == 1
  x = np.asarray(_x())
  np.testing.assert_array_equal(out[1][1:], x[:-1] * 2)
  assert [(f.example[0], f.count) for f in two.report.uninitialized] == [((0,), 1)]
  assert any("between blocks" in r.kind for r in two.report.races)


def _lent(monkeypatch):
  """[(copy_inputs, whether each input buffer is the callback's array)] of
  every launch attempt."""
  seen, real = [], executor_mod.gmem_buffers

  def buffers(launch, arrays, prep, options, shapes_only, copy_inputs=False):
    ins, outs = real(launch, arrays, prep, options, shapes_only, copy_inputs)
    seen.append((copy_inputs, [b.data is a for b, a in zip(ins, arrays)]))
    return ins, outs
  monkeypatch.setattr(executor_mod, "gmem_buffers", buffers)
  return seen


@pytest.mark.parametrize("workers", [1, 2])
def test_read_only_inputs_are_lent_uncopied(monkeypatch, workers, fresh):
  """The callback's read-only inputs are the launch's input buffers: a copy
  of each would cost its size again, against benchmarks/memory.py's bound."""
  seen = _lent(monkeypatch)
  x = _x()
  _, out = _run(atomic_rows(F32), (x,), workers)
  assert seen == [(False, [True])]
  np.testing.assert_array_equal(out[0], _run(atomic_rows(F32), (x,), 1)[1][0])


@WRITES_ARRAYS
@pytest.mark.parametrize("workers", [1, 2])
def test_a_kernel_that_writes_a_lent_input_runs_again_with_copies(monkeypatch, workers,
                                                                  fresh):
  """A kernel that writes an input fails that write and runs again with
  copies, with the outputs, findings and times of a run that copied at once,
  and the caller's array unchanged."""
  seen = _lent(monkeypatch)
  x = _x()
  ex, out = _run(writes_its_input(ROWS - 1), (x,), workers)
  want = np.asarray(x).copy()
  want[ROWS - 1] *= 2
  np.testing.assert_array_equal(out[0], want)
  np.testing.assert_array_equal(np.asarray(x)[ROWS - 1], want[ROWS - 1] / 2)
  assert seen[0] == (False, [True]) and seen[-1] == (True, [False])
  assert not ex.errors and not ex.report.races
  assert len(ex.report.kernels) == 1
  real = Executor.run_launch
  monkeypatch.setattr(Executor, "run_launch", lambda self, launch, arrays, copy_inputs=False:
                      real(self, launch, arrays, copy_inputs=True))
  at_once, out2 = _run(writes_its_input(ROWS - 1), (x,), workers)
  assert seen[-1] == (True, [False])
  np.testing.assert_array_equal(out[0], out2[0])
  assert [str(f) for f in ex.report.uninitialized] == [
      str(f) for f in at_once.report.uninitialized]
  assert [_kernel_fields(k) for k in ex.report.kernels] == [
      _kernel_fields(k) for k in at_once.report.kernels]


def _doubles_row_0():
  """Block 0 doubles x[0] in place, every block copies x[0] to its row."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((ROWS, 128), F32),
                grid=(ROWS,), grid_names=("i",))
  def k(x_ref, o_ref):
    i = lax.axis_index("i")

    @pl.when(i == 0)
    def _():
      x_ref[0] = x_ref[0] * 2
    o_ref[i] = x_ref[0]
  return k


@WRITES_ARRAYS
def test_reads_of_an_input_race_with_a_write_to_it_in_another_block():
  """Reads of a lent input are not tracked (nothing can write it while it
  is lent); a kernel that writes an input runs with copies, whose reads
  are: block 0 doubles x[0] in place, the other blocks read it."""
  ex, out = _run(_doubles_row_0(), (_x(),), 1)
  kinds = {r.kind for r in ex.report.races}
  assert kinds == {"write-read race between blocks"}, kinds
  np.testing.assert_array_equal(out[0], np.tile(np.asarray(_x())[0] * 2, (ROWS, 1)))


def test_reads_of_an_input_ref_race_with_a_write_to_it_in_another_block():
  """The same kernel given a Ref, which it updates in place (how jax 0.12.1
  and later let a kernel write an input): the race is found, and the Ref
  holds the write."""
  x = jax.new_ref(_x())
  ex, out = _run(_doubles_row_0(), (x,), 1)
  kinds = {r.kind for r in ex.report.races}
  assert kinds == {"write-read race between blocks"}, kinds
  np.testing.assert_array_equal(out[0], np.tile(np.asarray(_x())[0] * 2, (ROWS, 1)))
  np.testing.assert_array_equal(np.asarray(x[...])[0], np.asarray(_x())[0] * 2)
  np.testing.assert_array_equal(np.asarray(x[...])[1:], np.asarray(_x())[1:])


def deadlocks_in_block(n):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((ROWS, 128), F32), grid=(ROWS,),
                grid_names=("i",), scratch_types=[plgpu.Barrier()])
  def k(x_ref, o_ref, bar):
    i = lax.axis_index("i")
    o_ref[i] = x_ref[i]

    @pl.when(i == n)
    def _():
      plgpu.barrier_wait(bar)  # nothing arrives
  return k


def test_an_error_in_a_worker_is_raised_as_one_process_raises_it(monkeypatch, fresh):
  failed = []
  real = parallel.run

  def run(*args, **kw):
    try:
      yield from real(*args, **kw)
    except parallel.GroupFailed as e:
      failed.append(e.args)
      raise
  monkeypatch.setattr(parallel, "run", run)
  errors = []
  for workers in (1, 2):
    ex = Executor(Options(workers=workers), tuning=TUNING)
    try:
      run_on(ex, deadlocks_in_block(5), _x())
    except Exception:  # noqa: BLE001 (the executor keeps what it raised)
      pass
    [e] = [e for e in ex.errors if isinstance(e, ps.DeadlockError)]
    errors.append((str(e), e.where))
  assert errors[0] == errors[1]
  assert "block (5,)" in errors[0][0], errors[0][0]
  assert [f[0] for f in failed] == [5]  # (group 5 failed in a worker, then here)


def test_tasks_are_runs_of_groups_covering_each_once():
  assert parallel.tasks(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
  assert parallel.tasks(0, 3) == []


def test_workers_option_is_checked():
  with pytest.raises(ValueError, match="workers=0"):
    ps.simulate(atomic_rows(F32), _x(), workers=0)


def test_gmem_unwritten_in_a_workers_copy_but_written_by_an_earlier_group_is_no_finding():
  """A worker's copy of an output knows only its own groups' writes; at the
  merge, elements an earlier group wrote are taken out of its findings."""
  from pallas_sim.backends.sim.checks import initcheck
  from pallas_sim.backends.sim.machine import memory
  buf = memory.Buffer("out", "gmem", np.zeros((4, 8), np.float32))
  initcheck.track(buf)
  initcheck.mark_view(buf, 8, (1,), (8,))  # an earlier group wrote row 1
  mask = np.ones((2, 8), bool)             # the worker saw rows 1-2 unwritten
  assert initcheck.unwritten_of(buf, 8, (8, 1), (2, 8), mask).startswith(
      "elements (2, 0)..(2, 7)")
  initcheck.mark_view(buf, 16, (1,), (8,))
  assert initcheck.unwritten_of(buf, 8, (8, 1), (2, 8), mask) is None


def test_workers_are_taken_once_the_groups_so_far_show_the_rest_is_long():
  """The first group pays for warm-up: alone, it decides only when it is 4 ms
  or more and the rest would take twice parallel_after_s (once, when it is
  long itself); later, groups of a millisecond or more whose rest would
  take parallel_after_s here."""
  after = Tuning().parallel_after_s
  go = lambda g, n, per: dispatch.go_parallel(g, n, per, after)
  assert go(1, 64, 0.016)           # 16 ms x 63 to come
  assert not go(1, 20, 0.016)       # 304 ms: not twice
  assert not go(1, 10**4, 0.003)    # warm-up may be all of it
  assert go(1, 6, after / 4)        # long: once is enough
  assert go(2, 64, 0.012)           # 12 ms x 62 to come
  assert not go(2, 10, 0.012)       # 96 ms to come
  assert not go(2, 10**5, 0.0005)   # groups of 0.5 ms
  # (what the groups so far took: the first alone, then those after it)
  assert 0.012 <= dispatch.group_seconds(1, time.perf_counter() - 0.012) < 0.1
  assert 0.006 <= dispatch.group_seconds(3, time.perf_counter() - 0.012) < 0.05


class SuiteTimeout(Exception):
  """What a test suite's time limit raises from its SIGALRM handler."""


def test_an_interrupted_run_stops_its_workers_and_does_not_wait_on_them(monkeypatch, fresh):
  """A Ctrl-C or a test's time limit (raised by a signal in the parent while
  it waits for results) ends the run at once: the workers are killed, and
  the pool's shutdown, which CPython can leave waiting forever on a worker
  killed mid-message (seen in JAX's suite), is not waited on."""
  workers = []  # (this run's pool's, as abandon found them and as it left them)
  real_abandon = parallel.abandon

  def abandon(pool):
    workers.extend(pool._pool)
    real_abandon(pool)
    workers.extend(pool._pool)

  def restore(*args):
    raise SuiteTimeout("the test's time limit")
  monkeypatch.setattr(parallel, "restore", restore)
  monkeypatch.setattr(parallel, "abandon", abandon)
  hung = threading.Event()
  real_terminate = multiprocessing.pool.Pool.terminate

  def terminate(self):
    if threading.current_thread() is threading.main_thread():
      hung.wait(60)  # (as a shutdown stuck on a torn message would)
    return real_terminate(self)
  monkeypatch.setattr(multiprocessing.pool.Pool, "terminate", terminate)
  ex = Executor(Options(workers=2), tuning=TUNING)
  t0 = time.monotonic()
  run_on(ex, atomic_rows(F32), _x())  # (errors are kept for the API to raise)
  assert time.monotonic() - t0 < 30
  assert [type(e) for e in ex.errors] == [SuiteTimeout]  # (not run again here)
  assert workers and not any(p.is_alive() for p in workers)
