"""Race detection: each racy kernel is reported; its corrected twin is not.
Written as a user would; scenarios also from JAX's
gpu_pallas_interpret_race_detection_test.py."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from test_quickstart import SWEEP, _smem_need, matmul_mcs

F32 = jnp.float32
X = jnp.arange(2 * 128, dtype=F32).reshape(2, 128) + 1


def races(fn, *args):
  sim = ps.simulate(fn, *args, on_race="report", on_uninitialized="report")
  return sim.report.races


def assert_race(fn, *args, kind=None, buffer=None, advice=None):
  found = races(fn, *args)
  assert found, "expected a race report"
  if kind or buffer or advice:
    assert any((kind is None or kind in r.kind)
               and (buffer is None or r.second.buffer == buffer)
               and (advice is None or advice in r.advice) for r in found), (
                   "\n".join(map(str, found)))
  return found


def assert_clean(fn, *args):
  found = races(fn, *args)
  assert not found, "\n".join(map(str, found))


def kern(out_shape=(2, 128), scratch=(), **kw):
  return lambda body: plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct(out_shape, F32),
      scratch_types=list(scratch), **kw)


# --- the quickstart matmul: delay_release=0 is a race at every shape --------

FITTING = [c for c in SWEEP if _smem_need(128, c[3], c[4], c[5]) <= 232448]


@pytest.mark.parametrize("m,k,n,tile_n,tile_k,mcs", FITTING)
@pytest.mark.parametrize("delay_release", [0, 1])
def test_quickstart_matmul_delay_release(rng, m, k, n, tile_n, tile_k, mcs,
                                         delay_release):
  a = jnp.asarray(rng.standard_normal((m, k)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((k, n)), jnp.float16)
  fn = lambda a, b: matmul_mcs(a, b, tile_n=tile_n, tile_k=tile_k,
                               max_concurrent_steps=mcs,
                               delay_release=delay_release)
  if delay_release or k // tile_k <= mcs:
    # No slot is ever refilled when every step has its own buffer.
    assert_clean(fn, a, b)
  else:
    found = assert_race(fn, a, b, kind="read-write",
                        advice="delay_release=1 with wgmma_wait(1)")
    r = found[0]
    assert r.first.agent == "wgmma" and r.second.agent == "tma_load"
    assert "test_quickstart.py" in r.first.where


def test_race_error_is_raised_by_default(rng):
  a = jnp.asarray(rng.standard_normal((256, 256)), jnp.float16)
  with pytest.raises(ps.RaceError) as e:
    ps.run(lambda a, b: matmul_mcs(a, b, delay_release=0), a, a, backend="sim")
  assert e.value.races and "wgmma" in str(e.value)
  # Checks can be turned off (for speed): then nothing is reported.
  ps.run(lambda a, b: matmul_mcs(a, b, delay_release=0), a, a, backend="sim",
         check_races=False)


def test_reports_are_folded_with_a_count(rng):
  a = jnp.asarray(rng.standard_normal((512, 512)), jnp.float16)
  found = races(lambda a, b: matmul_mcs(a, b, delay_release=0), a, a)
  assert len(found) == 2  # A and B operand buffers, each folded over blocks/steps
  assert all(r.count > 1 for r in found)


# --- hand-written double buffering with a wrong wgmma_wait count ------------

def hand_pipelined(a, b, wait_n):
  """Two SMEM slots; step i waits its slot, issues the wgmma, waits for
  wgmma groups down to `wait_n`, then refills that slot for step i+2. Only
  wait_n=0 guarantees the wgmma reading the slot has finished."""
  m, k = a.shape
  n = b.shape[1]
  tk = 64
  steps = k // tk

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((m, n), F32),
                scratch_types=dict(a_s=plgpu.SMEM((2, m, tk), jnp.float16),
                                   b_s=plgpu.SMEM((2, tk, n), jnp.float16),
                                   acc=plgpu.ACC((m, n), F32),
                                   bar=plgpu.Barrier(num_arrivals=2, num_barriers=2)))
  def k_(a_ref, b_ref, o_ref, a_s, b_s, acc, bar):
    def load(i, slot):
      plgpu.copy_gmem_to_smem(a_ref.at[:, pl.ds(i * tk, tk)], a_s.at[slot], bar.at[slot])
      plgpu.copy_gmem_to_smem(b_ref.at[pl.ds(i * tk, tk)], b_s.at[slot], bar.at[slot])

    load(0, 0)
    load(1, 1)

    def step(i, _):
      slot = i % 2
      plgpu.barrier_wait(bar.at[slot])
      plgpu.wgmma(acc, a_s.at[slot], b_s.at[slot])
      plgpu.wgmma_wait(wait_n)

      @pl.when(i + 2 < steps)
      def _():
        load(i + 2, slot)
      return ()

    lax.fori_loop(0, steps, step, ())
    o_ref[...] = acc[...]
  return k_(a, b)


def test_hand_double_buffering_with_wrong_wgmma_wait(rng):
  a = jnp.asarray(rng.standard_normal((128, 512)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((512, 128)), jnp.float16)
  assert_race(lambda a, b: hand_pipelined(a, b, 1), a, b, kind="read-write",
              advice="wgmma_wait")
  assert_clean(lambda a, b: hand_pipelined(a, b, 0), a, b)
  got = ps.run(lambda a, b: hand_pipelined(a, b, 0), a, b, backend="sim")
  np.testing.assert_allclose(got, np.asarray(a, F32) @ np.asarray(b, F32),
                             rtol=1e-4, atol=1e-3)


# --- reading SMEM before barrier_wait saw the TMA land -----------------------

@pytest.mark.parametrize("wait", [False, True])
def test_plain_read_before_barrier_wait(wait):
  @kern(scratch=[plgpu.SMEM((2, 128), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    if wait:
      plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]
    if not wait:
      plgpu.barrier_wait(bar)

  if wait:
    assert_clean(k, X)
  else:
    assert_race(k, X, kind="race", buffer="smem", advice="no barrier_wait")


@pytest.mark.parametrize("wait", [False, True])
def test_wgmma_operand_before_barrier_wait(rng, wait):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), F32),
                scratch_types=dict(a_s=plgpu.SMEM((64, 64), jnp.float16),
                                   b_s=plgpu.SMEM((64, 128), jnp.float16),
                                   acc=plgpu.ACC((64, 128), F32),
                                   bar=plgpu.Barrier(num_arrivals=2)))
  def k(a_ref, b_ref, o_ref, a_s, b_s, acc, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    if wait:
      plgpu.barrier_wait(bar)
    plgpu.wgmma(acc, a_s, b_s)
    o_ref[...] = acc[...]
    if not wait:
      plgpu.barrier_wait(bar)

  a = jnp.asarray(rng.standard_normal((64, 64)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((64, 128)), jnp.float16)
  if wait:
    assert_clean(k, a, b)
  else:
    found = assert_race(k, a, b, advice="no barrier_wait")
    assert {r.second.agent for r in found} | {r.first.agent for r in found} >= {
        "wgmma", "tma_load"}


# --- plain SMEM accesses and the async proxy: commit_smem --------------------

@pytest.mark.parametrize("commit", [False, True])
def test_plain_store_then_tma_store_needs_commit(commit):
  @kern(scratch=[plgpu.SMEM((2, 128), F32)])
  def k(x_ref, o_ref, smem):
    smem[...] = x_ref[...] * 2
    if commit:
      plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)

  if commit:
    assert_clean(k, X)
  else:
    [r] = assert_race(k, X, buffer="smem", advice="no commit_smem")
    assert ") and the TMA store (" in r.advice, r.advice


@pytest.mark.parametrize("commit", [False, True])
def test_plain_store_then_wgmma_needs_commit(rng, commit):
  # Plain stores into wgmma operands (from SMEM staging: the lowering stores
  # only WGMMA-compatible layouts into swizzled SMEM).
  T = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), F32),
                scratch_types=dict(a_s=plgpu.SMEM((64, 64), jnp.float16, transforms=T),
                                   b_s=plgpu.SMEM((64, 128), jnp.float16, transforms=T),
                                   st=plgpu.SMEM((64, 64), jnp.float16, transforms=T),
                                   bar=plgpu.Barrier(),
                                   acc=plgpu.ACC((64, 128), F32)))
  def k(a_ref, b_ref, o_ref, a_s, b_s, st, bar, acc):
    plgpu.copy_gmem_to_smem(a_ref, st, bar)
    plgpu.barrier_wait(bar)
    a_s[...] = st[...]
    b_s[...] = jnp.ones((64, 128), jnp.float16)
    if commit:
      plgpu.commit_smem()
    plgpu.wgmma(acc, a_s, b_s)
    o_ref[...] = acc[...]

  a = jnp.asarray(rng.standard_normal((64, 64)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((64, 128)), jnp.float16)
  if commit:
    assert_clean(k, a, b)
  else:
    assert_race(k, a, b, kind="write-read", advice="no commit_smem")


@pytest.mark.parametrize("commit", [False, True])
def test_plain_load_then_tma_load_overwrite_needs_commit(commit):
  @kern(scratch=[plgpu.SMEM((2, 128), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[0] = smem[0]
    if commit:
      plgpu.commit_smem()
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)  # refill what was just read
    plgpu.barrier_wait(bar)
    o_ref[1] = smem[1]

  if commit:
    assert_clean(k, X)
  else:
    assert_race(k, X, kind="read-write", advice="no commit_smem")


# --- TMA stores: their SMEM reads and GMEM writes are in flight -------------

@pytest.mark.parametrize("wait", [False, True])
def test_smem_overwritten_while_tma_store_reads_it(wait):
  @kern(scratch=[plgpu.SMEM((128,), F32)])
  def k(x_ref, o_ref, smem):
    smem[...] = x_ref[0]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[0])
    if wait:
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    smem[...] = x_ref[1]  # reuse the staging buffer
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[1])
    plgpu.wait_smem_to_gmem(0)

  if wait:
    assert_clean(k, X)
    np.testing.assert_array_equal(ps.run(k, X, backend="sim"), X)
  else:
    assert_race(k, X, kind="read-write", buffer="smem", advice="wait_read_only=True")


@pytest.mark.parametrize("wait", [False, True])
def test_gmem_read_while_tma_store_pending(wait):
  @kern(scratch=[plgpu.SMEM((128,), F32)])
  def k(x_ref, o_ref, smem):
    smem[...] = x_ref[0]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref.at[0])
    if wait:
      plgpu.wait_smem_to_gmem(0)
    o_ref[1] = o_ref[0] + 1
    if not wait:
      plgpu.wait_smem_to_gmem(0)

  if wait:
    assert_clean(k, X)
  else:
    assert_race(k, X, kind="write-read", buffer="o_ref", advice="wait_smem_to_gmem")


# --- two TMA loads into the same SMEM in flight together --------------------

def test_two_tma_loads_into_same_smem_one_after_the_other():
  @kern(scratch=[plgpu.SMEM((128,), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[0], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.commit_smem()
    plgpu.copy_gmem_to_smem(x_ref.at[1], smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[0] = smem[...]

  assert_clean(k, X)


def test_two_tma_loads_in_one_phase_into_same_smem():
  @kern(scratch=[plgpu.SMEM((128,), F32), plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[0], smem, bar)
    plgpu.copy_gmem_to_smem(x_ref.at[1], smem, bar)
    plgpu.barrier_wait(bar)
    o_ref[0] = smem[...]

  assert_race(k, X, kind="write-write", advice="two TMA loads")


# --- warpgroups of one block -------------------------------------------------

@pytest.mark.parametrize("sync", [False, True])
def test_cross_thread_smem(sync):
  @kern(scratch=[plgpu.SMEM((128,), F32), plgpu.Barrier()],
        num_threads=2, thread_name="wg")
  def k(x_ref, o_ref, smem, bar):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      smem[...] = x_ref[0] * 3
      if sync:
        plgpu.barrier_arrive(bar)

    @pl.when(wg == 1)
    def _():
      if sync:
        plgpu.barrier_wait(bar)
      o_ref[1] = smem[...]
      o_ref[0] = x_ref[0]

  if sync:
    assert_clean(k, X)
    np.testing.assert_array_equal(np.asarray(ps.run(k, X, backend="sim"))[1], 3 * X[0])
  else:
    found = assert_race(k, X, buffer="smem", advice="no barrier between thread")
    assert {found[0].first.thread, found[0].second.thread} == {0, 1}


def producer_consumer(x, wait_before_release):
  """Thread 1 loads tiles of x into two slots; thread 0 runs a wgmma on each
  and releases the slot on `consumed`. Releasing before the wgmma finished
  reading the slot lets the producer overwrite it under the tensor core."""
  steps = x.shape[0] // 64

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), F32),
                scratch_types=dict(
                    a_s=plgpu.SMEM((2, 64, 64), jnp.float16),
                    b_s=plgpu.SMEM((64, 128), jnp.float16),
                    produced=plgpu.Barrier(num_barriers=2),
                    consumed=plgpu.Barrier(num_barriers=2),
                    b_bar=plgpu.Barrier()),
                num_threads=2, thread_name="wg")
  def k(x_ref, b_ref, o_ref, a_s, b_s, produced, consumed, b_bar):
    wg = lax.axis_index("wg")

    @pl.when(wg == 1)
    def _producer():
      def body(i, _):
        slot = i % 2

        @pl.when(i >= 2)
        def _():
          plgpu.barrier_wait(consumed.at[slot])
        plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(i * 64, 64)], a_s.at[slot],
                                produced.at[slot])
        return ()
      lax.fori_loop(0, steps, body, ())

    # The lowering allocates accumulators per thread only: inside its branch.
    def consume(acc):
      plgpu.copy_gmem_to_smem(b_ref, b_s, b_bar)
      plgpu.barrier_wait(b_bar)

      def body(i, _):
        slot = i % 2
        plgpu.barrier_wait(produced.at[slot])
        plgpu.wgmma(acc, a_s.at[slot], b_s)
        if wait_before_release:
          plgpu.wgmma_wait(0)
        plgpu.barrier_arrive(consumed.at[slot])
        return ()
      lax.fori_loop(0, steps, body, ())
      o_ref[...] = acc[...]

    @pl.when(wg == 0)
    def _consumer():
      pl.run_scoped(consume, plgpu.ACC((64, 128), F32))
  return k


def test_producer_consumer_releasing_slot_under_wgmma(rng):
  x = jnp.asarray(rng.standard_normal((4 * 64, 64)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((64, 128)), jnp.float16)
  found = assert_race(producer_consumer(x, False), x, b, kind="read-write",
                      buffer="a_s")
  assert found[0].first.agent == "wgmma" and found[0].second.agent == "tma_load"
  assert_clean(producer_consumer(x, True), x, b)


# --- blocks of one launch ----------------------------------------------------

@pytest.mark.parametrize("overlap", [False, True])
def test_two_blocks_write_same_gmem(overlap):
  @kern(out_shape=(4, 128), grid=(2,), grid_names=("i",))
  def k(x_ref, o_ref):
    i = lax.axis_index("i")
    row = 0 if overlap else i
    o_ref[row] = x_ref[i % 2]
    o_ref[2 + i] = x_ref[i % 2]

  if overlap:
    found = assert_race(k, X, kind="write-write race between blocks", buffer="o_ref")
    assert "blocks of one launch are unordered" in found[0].advice
  else:
    assert_clean(k, X)


def test_block_reads_what_another_writes_in_any_order():
  # Block 1 reads what block 0 writes, and block 0 reads what block 1 writes:
  # both orders are caught, whatever order the simulator runs blocks in.
  @kern(out_shape=(2, 128), grid=(2,), grid_names=("i",))
  def k(x_ref, o_ref):
    i = lax.axis_index("i")
    o_ref[i] = x_ref[i]
    o_ref[i] = o_ref[1 - i] + 1.0

  found = races(k, X)
  kinds = {r.kind for r in found}
  assert "write-read race between blocks" in kinds or "read-write race between blocks" in kinds
  assert "write-write race between blocks" not in kinds


# --- kernel end ------------------------------------------------------------

@pytest.mark.parametrize("wait", [False, True])
def test_kernel_ending_with_unawaited_tma_store(wait):
  @kern(scratch=[plgpu.SMEM((2, 128), F32)])
  def k(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    if wait:
      plgpu.wait_smem_to_gmem(0)

  if wait:
    assert_clean(k, X)
  else:
    found = assert_race(k, X, kind="unawaited TMA store")
    assert "wait_smem_to_gmem(0)" in found[0].advice
    # (raised, it is counted as what it is: no two accesses race)
    with pytest.raises(ps.RaceError, match=r": 1 synchronization error\(s\) in kernel"):
      ps.run(k, X, backend="sim")


# --- awaiting another thread's TMA stores -----------------------------------

@pytest.mark.parametrize("owner_waits", [False, True])
def test_waiting_for_another_threads_tma_store(owner_waits):
  @kern(scratch=[plgpu.SMEM((128,), F32), plgpu.Barrier()],
        num_threads=2, thread_name="wg")
  def k(x_ref, o_ref, smem, bar):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      smem[...] = x_ref[0]
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem, o_ref.at[0])
      if owner_waits:
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
      plgpu.barrier_arrive(bar)
      if not owner_waits:
        plgpu.wait_smem_to_gmem(0)

    @pl.when(wg == 1)
    def _():
      plgpu.barrier_wait(bar)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # waits for nothing of wg 0's
      smem[...] = x_ref[1]
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem, o_ref.at[1])
      plgpu.wait_smem_to_gmem(0)

  if owner_waits:
    assert_clean(k, X)
  else:
    assert_race(k, X, buffer="smem",
                advice="copies can only be awaited by the thread that issued them")


# --- barrier misuse ---------------------------------------------------------

def test_barrier_arrival_count_overflow():
  @kern(scratch=[plgpu.SMEM((2, 128), F32), plgpu.Barrier(num_arrivals=1)])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref.at[0], smem.at[0], bar)
    plgpu.copy_gmem_to_smem(x_ref.at[1], smem.at[1], bar)  # 2 arrivals, 1 expected
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  with pytest.raises(ps.KernelError, match="arrival count overflow"):
    ps.run(k, X, backend="sim")


@pytest.mark.parametrize("acked", [False, True])
def test_lost_barrier_completion(acked):
  """Thread 1 completes `bar` twice; thread 0 waits after both: by phase
  parity the hardware would take its first wait for a third completion."""
  @kern(scratch=[plgpu.Barrier(), plgpu.Barrier()], num_threads=2,
        thread_name="wg")
  def k(x_ref, o_ref, bar, ack):
    wg = lax.axis_index("wg")

    @pl.when(wg == 1)
    def _():
      plgpu.barrier_arrive(bar)
      if acked:
        plgpu.barrier_wait(ack)
      plgpu.barrier_arrive(bar)

    @pl.when(wg == 0)
    def _():
      plgpu.barrier_wait(bar)
      if acked:
        plgpu.barrier_arrive(ack)
      plgpu.barrier_wait(bar)
      o_ref[...] = x_ref[...]

  if acked:
    assert_clean(k, X)
  else:
    found = assert_race(k, X, kind="lost barrier completion")
    assert "phase parity" in found[0].advice


def test_second_wait_for_one_completion_deadlocks():
  @kern(scratch=[plgpu.SMEM((2, 128), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.barrier_wait(bar)  # the same completion again: never comes
    o_ref[...] = smem[...]

  with pytest.raises(ps.DeadlockError, match="completion #2"):
    ps.run(k, X, backend="sim")


def test_too_few_arrivals_deadlocks():
  @kern(scratch=[plgpu.SMEM((2, 128), F32), plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)  # one arrival of two
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]

  with pytest.raises(ps.DeadlockError) as e:
    ps.run(k, X, backend="sim")
  assert "bar" in str(e.value) and "test_races.py" in str(e.value)


def late_read_kernel(spin):
  """A TMA load, then `spin` iterations of other work, then a read of its
  SMEM with no barrier_wait before it (the wait comes after)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                scratch_types=[plgpu.SMEM((256,), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    acc = jax.lax.fori_loop(0, spin, lambda i, a: a * 1.0001 + 1.0,
                            jnp.zeros((256,), jnp.float32))
    o_ref[...] = smem[...] + acc * 0
    plgpu.barrier_wait(bar)
  return k


def test_each_race_says_whether_the_timing_overlapped_or_left_slack():
  x = jnp.arange(256, dtype=jnp.float32)
  early = ps.simulate(late_read_kernel(0), x, on_race="report",
                      on_uninitialized="report").report.races
  # (its values are still the stale ones: a read that no wait orders sees
  # memory as of its thread's last wait, whatever the clocks say)
  late = ps.simulate(late_read_kernel(2000), x, on_race="report",
                     on_uninitialized="report").report.races
  assert len(early) == len(late) == 1
  assert early[0].overlapped == 1 and "overlapped in the simulated timing" in str(early[0])
  assert late[0].overlapped == 0 and late[0].min_slack > 0
  assert f"{late[0].min_slack:.0f} cycles of slack" in str(late[0])


def test_a_folded_race_says_in_how_many_occurrences_the_timing_overlapped():
  """The same race in two blocks, one reading at once (overlapped), one
  after a long loop (slack): the folded report counts both ways."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 256), jnp.float32), grid=(2,),
                grid_names=("b",),
                scratch_types=[plgpu.SMEM((256,), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    b = jax.lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[b], smem, bar)
    acc = jax.lax.fori_loop(0, b * 2000, lambda i, a: a * 1.0001 + 1.0,
                            jnp.zeros((256,), jnp.float32))
    o_ref[b] = smem[...] + acc * 0
    plgpu.barrier_wait(bar)

  x = jnp.arange(512, dtype=jnp.float32).reshape(2, 256)
  [race] = ps.simulate(k, x, on_race="report", on_uninitialized="report",
                       check_lowering=False).report.races
  assert (race.count, race.timed, race.overlapped) == (2, 2, 1)
  assert race.min_slack > 0
  assert (f"overlapped in 1 of 2 occurrences in the simulated timing (there the values "
          f"can be wrong on the GPU now); the others had {race.min_slack:.0f} cycles of "
          "slack at least") in str(race)


def three_readers_kernel():
  """Threads 0, 2 and 1 read a tile, in that order in time; thread 0 then
  refills it once threads 0 and 1 are done (a barrier both arrive on):
  thread 2's read is unordered with the refill."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((3, 128), jnp.float32), num_threads=3,
                thread_name="wg",
                scratch_types=[plgpu.SMEM((128,), jnp.float32), plgpu.Barrier(),
                               plgpu.Barrier(num_arrivals=2), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, loaded, consumed, refilled):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      plgpu.copy_gmem_to_smem(x_ref, smem, loaded)
    plgpu.barrier_wait(loaded)
    spin = jnp.where(wg == 0, 0, jnp.where(wg == 2, 100, 300))
    acc = lax.fori_loop(0, spin, lambda i, a: a * 1.0001 + 1.0,
                        jnp.zeros((128,), jnp.float32))
    o_ref[wg] = smem[...] + acc * 0

    @pl.when(wg < 2)
    def _():
      plgpu.commit_smem()
      plgpu.barrier_arrive(consumed)

    @pl.when(wg == 0)
    def _():
      plgpu.barrier_wait(consumed)
      plgpu.copy_gmem_to_smem(x_ref, smem, refilled)
      plgpu.barrier_wait(refilled)
  return k


def test_a_third_concurrent_reader_is_not_forgotten():
  x = jnp.arange(128, dtype=jnp.float32)
  sim = ps.simulate(three_readers_kernel(), x, on_race="report")
  text = "\n".join(map(str, sim.report.races))
  assert len(sim.report.races) == 1, text
  r = sim.report.races[0]
  assert r.first.agent == "thread" and r.first.thread == 2, text
  assert r.second.agent == "tma_load", text


def scopes_kernel(wait_in_scope, later=False):
  """A scope issues a TMA load and leaves (awaiting it inside, or only
  after; `later`: after awaiting a second load issued after it, by which
  time the first has landed); the next scope gets the same SMEM bytes and
  writes them."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((256,), jnp.float32),
                scratch_types=[plgpu.Barrier(), plgpu.Barrier(),
                               plgpu.SMEM((256,), jnp.float32)])
  def k(x_ref, o_ref, bar, bar2, c):
    def first(a):
      plgpu.copy_gmem_to_smem(x_ref, a, bar)
      if later:
        plgpu.copy_gmem_to_smem(x_ref, c, bar2)
        plgpu.barrier_wait(bar2)
      if wait_in_scope:
        plgpu.barrier_wait(bar)
    pl.run_scoped(first, plgpu.SMEM((256,), jnp.float32))

    def second(b):
      b[...] = jnp.ones((256,), jnp.float32)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(b, o_ref)
      plgpu.wait_smem_to_gmem(0)
    pl.run_scoped(second, plgpu.SMEM((256,), jnp.float32))
    if not wait_in_scope:
      plgpu.barrier_wait(bar)
  return k


def test_async_work_that_outlives_its_run_scoped_races_with_the_next_scope():
  x = jnp.arange(256, dtype=jnp.float32)
  ok = ps.simulate(scopes_kernel(True), x)
  assert ok.report.races == []
  bad = ps.simulate(scopes_kernel(False), x, on_race="report").report.races
  assert len(bad) == 1, "\n".join(map(str, bad))
  r = bad[0]
  assert r.kind == "async work outlives its run_scoped"
  assert r.first.agent == "tma_load" and r.second.agent == "thread"
  assert r.overlapped == 1  # (the load was still in flight at the write)


def test_async_work_landed_but_not_awaited_at_its_scopes_end_races_too():
  """The load has landed by the scope's end (the thread awaited a load
  issued after it), but no one awaited it: the bytes are not free yet, as
  the thread has not observed the load."""
  x = jnp.arange(256, dtype=jnp.float32)
  assert ps.simulate(scopes_kernel(True, later=True), x).report.races == []
  bad = ps.simulate(scopes_kernel(False, later=True), x, on_race="report").report.races
  assert len(bad) == 1, "\n".join(map(str, bad))
  r = bad[0]
  assert r.kind == "async work outlives its run_scoped"
  assert r.first.agent == "tma_load" and r.second.agent == "thread"
  assert r.overlapped == 0, r  # (landed before the write: the race is in the order alone)
