"""Which signals a semaphore wait is ordered after (checks/semaphore_order.py):
on the hardware a wait for n is ordered after *some* signals adding up to n,
so it acquires a signal only when it could not complete without it. The
properties vary the signals (how many, by how much, from which blocks or
threads, the waiter's own among them), the waits (how many, for how much,
decrementing or not) and the simulated order (each agent waits for a few
TMA loads first), and assert that exactly the rows a wait need not be ordered
after are reported, for global and for block semaphores."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

F32 = jnp.float32


def _pick(i, values):
  """values[i] for a traced index i and static values (kernels take no
  array constants)."""
  out = jnp.int32(values[0])
  for j, v in enumerate(values[1:], 1):
    out = jnp.where(i == j, jnp.int32(v), out)
  return out


def _late(n, x_ref, smem, barriers, i):
  """Has agent i wait for n TMA loads, one after another, before it goes on:
  a thread runs until it waits, so this moves it in the simulated order."""
  def load(j, _):
    plgpu.copy_gmem_to_smem(x_ref, smem.at[i], barriers.at[i])
    plgpu.barrier_wait(barriers.at[i])
    return 0
  lax.fori_loop(0, n, load, 0)


def _waits(sem, waits):
  for want, decrement in waits:
    plgpu.semaphore_wait(sem, want, decrement=decrement)


def exchange(incs, delays, waits, scope):
  """Agent i (a block of the grid for a global semaphore, a thread of one
  block for a block semaphore) writes row i, is busy for delays[i] steps,
  then signals incs[i] (none for 0). Agent 0 then waits `waits` ((value,
  decrement) in order) and reads every other agent's row."""
  n = len(incs)
  out = jax.ShapeDtypeStruct((n, 128), F32)
  scratch = [plgpu.SMEM((n, 128), F32), plgpu.Barrier(num_barriers=n)]

  def body(x_ref, o_ref, sem, smem, barriers, i):
    o_ref[i] = jnp.full((128,), 1.0, F32) + i.astype(F32)
    _late(_pick(i, delays), x_ref, smem, barriers, i)
    for v in sorted(set(incs) - {0}):  # (the lowering takes constant increments)
      @pl.when(_pick(i, incs) == v)
      def _():
        pl.semaphore_signal(sem, v)

    @pl.when(i == 0)
    def _():
      _waits(sem, waits)
      total = o_ref[0]
      for j in range(1, n):
        total = total + o_ref[j]
      o_ref[0] = total

  if scope == "global":
    @plgpu.kernel(out_type=out, grid=(n,), grid_names=("x",), scratch_types=scratch)
    def k(x_ref, o_ref, smem, barriers):
      body(x_ref, o_ref, pl.get_global(plgpu.SemaphoreType.REGULAR), smem, barriers,
           lax.axis_index("x"))
  else:
    @plgpu.kernel(out_type=out, num_threads=n, thread_name="t",
                  scratch_types=[plgpu.SemaphoreType.REGULAR] + scratch)
    def k(x_ref, o_ref, sem, smem, barriers):
      body(x_ref, o_ref, sem, smem, barriers, lax.axis_index("t"))
  return k


def run(incs, delays, waits, scope="global", **options):
  return ps.simulate(exchange(incs, delays, waits, scope), X, **options)


X = jnp.ones((128,), F32)


def unordered_rows(incs, waits):
  """The rows agent 0 may read before they are written: agent i's signal
  is needed by no wait (each could complete with the others' signals, less
  what the decrementing waits before it took)."""
  total = sum(incs)
  rows = set()
  for i in range(1, len(incs)):
    taken, needed = 0, False
    for want, decrement in waits:
      needed |= total - incs[i] - taken < want
      taken += want if decrement else 0
    if not needed:
      rows.add(i)
  return rows


def reported_rows(sim, scope):
  rows = set()
  for r in sim.report.races:
    assert "o_ref" in str(r) or "ws_ref" in str(r), r
    for site in (r.first, r.second):
      who = site.block[0] if scope == "global" else site.thread
      if who != 0:
        rows.add(who)
  return rows


@st.composite
def exchanges(draw):
  n = draw(st.integers(2, 4))
  incs = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
  delays = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
  total = sum(incs)
  waits, taken = [], 0
  for _ in range(draw(st.integers(1, 3))):
    if total - taken < 1:
      break
    want = draw(st.integers(1, total - taken))
    decrement = draw(st.booleans())
    waits.append((want, decrement))
    taken += want if decrement else 0
  if not waits:  # (nothing signals: a wait would never end)
    incs[-1] = 1
    waits = [(1, True)]
  return incs, delays, waits


@pytest.mark.parametrize("scope", ["global", "block"])
@settings(max_examples=30, deadline=None)
@given(case=exchanges())
def test_a_wait_is_ordered_after_exactly_the_signals_it_needs(scope, case):
  incs, delays, waits = case
  sim = run(incs, delays, waits, scope, on_race="report", on_uninitialized="report")
  assert reported_rows(sim, scope) == unordered_rows(incs, waits), (incs, waits)


@pytest.mark.parametrize("delays", [(0, 0, 0, 0), (0, 0, 0, 3), (3, 0, 1, 2), (0, 3, 2, 1)])
def test_the_order_the_signals_come_in_changes_nothing(delays):
  """Waiting for 3 of 4 unit signals, the waiter's own among them: rows 1..3
  race whichever signals the simulation makes first, and the report names
  the wait, the count and the waiter's own signal."""
  sim = run((1, 1, 1, 1), delays, [(3, True)], on_race="report")
  assert reported_rows(sim, "global") == {1, 2, 3}
  for r in sim.report.races:
    assert ("thread 0 of block (0,) waits for 3 of the 4 signals that can precede it "
            "on global semaphore 0") in r.advice, r
    assert "its own signal" in r.advice and "wait for all 4" in r.advice, r


def test_waiting_for_every_signal_is_clean_in_any_order():
  for delays in ((0, 0, 0), (3, 0, 2), (0, 3, 2), (0, 0, 3)):
    sim = run((0, 1, 1), delays, [(2, True)])
    assert sim.report.races == []


def test_unit_waits_in_a_loop_order_only_the_last_after_every_signal():
  """Three waits for 1 each, three signals: any signal can end the first two
  waits, so only after the third is every row ordered."""
  assert unordered_rows((0, 1, 1, 1), [(1, True)] * 3) == set()
  assert unordered_rows((0, 1, 1, 1), [(1, True)] * 2) == {1, 2, 3}
  for waits, rows in (([(1, True)] * 3, set()), ([(1, True)] * 2, {1, 2, 3})):
    sim = run((0, 1, 1, 1), (1, 0, 3, 2), waits, on_race="report",
              on_uninitialized="report")
    assert reported_rows(sim, "global") == rows, waits


def test_a_value_wait_takes_nothing_away_from_the_waits_after_it():
  """A wait for 2 without decrement, then one for 2 with: two signals of 1
  are both needed by both."""
  sim = run((0, 1, 1), (0, 2, 0), [(2, False), (2, True)])
  assert sim.report.races == []
  assert unordered_rows((0, 1, 1), [(2, True), (2, True)]) == set()


def test_a_block_semaphore_wait_for_some_of_its_threads_signals_is_named():
  sim = run((0, 1, 1, 1), (0, 0, 0, 2), [(2, True)], "block", on_race="report")
  assert reported_rows(sim, "block") == {1, 2, 3}
  r = sim.report.races[0]
  assert "thread 0 waits for 2 of the 3 signals that can precede it on " in r.advice, r
  assert "any 2 of them complete it" in r.advice and "wait for all 3" in r.advice, r


def split_k(own_signal, blocks=8):
  """Split-K: block b stores its partial product (elementwise here: the
  shape of the hand-off is what matters) to a GMEM workspace and signals one
  global semaphore; block 0 waits for the other blocks' signals and sums the
  partials. BUG (`own_signal`): block 0 signals too, so one of the 7
  signals its wait counts can be its own."""
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct((blocks, 64, 64), F32),
                          jax.ShapeDtypeStruct((64, 64), F32)),
                grid=(blocks,), grid_names=("k",))
  def k(a_ref, b_ref, ws_ref, o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    i = lax.axis_index("k")
    ws_ref[i] = a_ref[i] * b_ref[i]

    @pl.when((i != 0) | own_signal)
    def _():
      pl.semaphore_signal(sem)

    @pl.when(i == 0)
    def _():
      pl.semaphore_wait(sem, blocks - 1)
      total = ws_ref[0]
      for j in range(1, blocks):
        total = total + ws_ref[j]
      o_ref[...] = total
  return k


def test_split_k_whose_waiting_block_signals_too_races_on_every_partial():
  rng = np.random.default_rng(0)
  a, b = (jnp.asarray(rng.standard_normal((8, 64, 64)), F32) for _ in range(2))
  sim = ps.simulate(split_k(False), a, b)
  assert sim.report.races == []
  np.testing.assert_allclose(sim.outputs[1], (np.asarray(a) * np.asarray(b)).sum(0),
                             rtol=1e-5, atol=1e-5)
  sim = ps.simulate(split_k(True), a, b, on_race="report", on_uninitialized="report")
  assert reported_rows(sim, "global") == set(range(1, 8))
  for r in sim.report.races:
    assert r.kind.endswith("race") and "ws_ref" in str(r), r
    assert ("waits for 7 of the 8 signals that can precede it on global semaphore 0"
            in r.advice and "its own signal" in r.advice), r


def test_block_semaphores_over_worker_processes_report_what_one_process_does(monkeypatch):
  """Blocks with block semaphores may run in forked workers; the run that
  orders each wait after what it needs is this process's, whatever ran the
  first: the same reports, the same outputs."""
  import multiprocessing.pool
  from pallas_sim.backends.sim.execute.executor import Executor
  from pallas_sim.options import Options
  from pallas_sim.backends.sim.execute.tuning import Tuning
  from test_machine import run_on
  pools = []
  real = multiprocessing.pool.Pool.__init__

  def counted(self, *args, **kw):
    pools.append(1)
    real(self, *args, **kw)
  monkeypatch.setattr(multiprocessing.pool.Pool, "__init__", counted)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 3, 128), F32), grid=(4,),
                grid_names=("b",), num_threads=3, thread_name="t",
                scratch_types=[plgpu.SemaphoreType.REGULAR])
  def k(o_ref, sem):
    b, t = lax.axis_index("b"), lax.axis_index("t")
    o_ref[b, t] = jnp.full((128,), 1.0, F32) + t.astype(F32)
    pl.semaphore_signal(sem)  # (thread 0's own signal counts too: a race)

    @pl.when(t == 0)
    def _():
      pl.semaphore_wait(sem, 2)
      o_ref[b, 0] = o_ref[b, 1] + o_ref[b, 2]

  texts = []
  for workers in (1, 2):
    ex = Executor(Options(check_races=True, on_race="report", on_uninitialized="report",
                          workers=workers), tuning=Tuning(parallel_after_s=0.0))
    run_on(ex, k)
    texts.append(sorted(str(r) for r in ex.report.races))
  assert pools == [1]  # (the first run of workers=2 went over a pool)
  assert texts[0] == texts[1] and len(texts[0]) == 2, texts
  assert all("waits for 2 of the 3 signals" in t and "its own signal" in t
             for t in texts[0])


def test_acquires_of_a_semaphore_nothing_signals():
  """A read of a semaphore no thread signals: nothing to order it after, no
  error (its log has acquires and no signal)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32))
  def k(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    o_ref[...] = jnp.full((128,), pl.semaphore_read(sem), jnp.int32)
  sim = ps.simulate(k)
  assert sim.report.races == [] and int(sim.outputs[0]) == 0
