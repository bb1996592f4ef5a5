"""Race reports name the root cause: for each shape of bug, the report's text
says what went wrong (which completion a wait observed, how many threads
arrive on a barrier, a read-only TMA wait, ...) and does not advise adding
what the kernel already has. Each buggy kernel has a correct twin that is
clean (no races, no uninitialized findings)."""
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from test_clusters import cluster_ref_kernel

F32, F16, I32 = jnp.float32, jnp.float16, jnp.int32
HERE = os.path.basename(__file__)


def line_of(marker):
  """`test_race_causes.py:N` for the one line of this file that ends with
  the comment `# <marker>` (what a report names as the site's `where`)."""
  with open(__file__) as f:
    hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# {marker}")]
  assert len(hits) == 1, (marker, hits)
  return f"{HERE}:{hits[0]}"


def names_line(text, marker):
  """Whether `text` names the line `marker` marks (not a longer number)."""
  return re.search(re.escape(line_of(marker)) + r"(?!\d)", text) is not None


def check(kernel, *args):
  sim = ps.simulate(kernel, *args, on_race="report", on_uninitialized="report")
  return sim.report


def assert_clean(kernel, *args):
  report = check(kernel, *args)
  assert not report.races, "\n".join(map(str, report.races))
  assert not report.uninitialized, "\n".join(map(str, report.uninitialized))


def text(report):
  return "\n".join(map(str, list(report.races) + list(report.uninitialized)))


def one_race(report, kind):
  found = [r for r in report.races if r.kind.startswith(kind)]
  assert len(found) == 1, text(report)
  return found[0]


def _x(*shape):
  return jnp.arange(int(np.prod(shape)), dtype=F32).reshape(shape)


# --- 1. a wait that observed an earlier completion of its barrier ------------

def barrier_phase(correct):
  """One barrier `bar` tracks two TMA loads in turn (slot 0, then slot 1).
  wg 0 reads slot 0 after completion #1; wg 1 must read slot 1 after
  completion #2 but (BUG) waits once only: its wait passes on completion #1
  (the slot-0 load), so it reads slot 1 while that load is in flight. `ack`
  keeps the producer from reusing `bar` before both consumers saw #1."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64, 32), F32),
                num_threads=3, thread_name="wg",
                scratch_types=[plgpu.SMEM((2, 64, 32), F32), plgpu.Barrier(),
                               plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, slots, bar, ack):
    wg = lax.axis_index("wg")

    @pl.when(wg == 2)
    def _producer():
      plgpu.copy_gmem_to_smem(x_ref.at[0], slots.at[0], bar)  # completes #1
      plgpu.barrier_wait(ack)
      plgpu.copy_gmem_to_smem(x_ref.at[1], slots.at[1], bar)  # completes #2

    @pl.when(wg == 0)
    def _c0():
      plgpu.barrier_wait(bar)
      plgpu.barrier_arrive(ack)
      o_ref[0] = slots[0]

    @pl.when(wg == 1)
    def _c1():
      plgpu.barrier_wait(bar)  # phase-wait-1
      plgpu.barrier_arrive(ack)
      if correct:
        plgpu.barrier_wait(bar)
      o_ref[1] = slots[1]
  return k


def test_wait_on_an_earlier_phase_names_the_completions_it_saw_and_needs():
  x = _x(2, 64, 32)
  assert_clean(barrier_phase(True), x)
  report = check(barrier_phase(False), x)
  r = one_race(report, "read-write")
  assert r.first.access == "read" and r.second.agent == "tma_load"
  assert "observed completion #1" in r.advice, r
  assert "completes #2" in r.advice, r
  assert names_line(r.advice, "phase-wait-1"), r
  # The kernel's threads are already ordered by barriers: not the fix.
  assert "commit_smem in thread" not in r.advice, r


def second_wait_too_few(correct, late):
  """One barrier `bar` tracks three TMA loads in turn; the consumer (wg 0)
  waits for #1 and #2 (each then acked to the producer), but (BUG) reads
  slot 2 without waiting for #3. `late`: the consumer first waits for loads
  of its own, so that the third load lands before its read in the simulated
  order (else the read comes first): the detector's two paths."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((3, 64, 32), F32),
                num_threads=2, thread_name="wg",
                scratch_types=[plgpu.SMEM((3, 64, 32), F32), plgpu.Barrier(),
                               plgpu.Barrier(), plgpu.SMEM((64, 32), F32),
                               plgpu.Barrier()])
  def k(x_ref, o_ref, slots, bar, ack, own, own_bar):
    wg = lax.axis_index("wg")

    @pl.when(wg == 1)
    def _producer():
      for i in range(3):
        if i:
          plgpu.barrier_wait(ack)
        plgpu.copy_gmem_to_smem(x_ref.at[i], slots.at[i], bar)

    @pl.when(wg == 0)
    def _consumer():
      plgpu.barrier_wait(bar)  # two-waits-first
      o_ref[0] = slots[0]
      plgpu.barrier_arrive(ack)
      plgpu.barrier_wait(bar)  # two-waits-second
      o_ref[1] = slots[1]
      plgpu.barrier_arrive(ack)
      if correct:
        plgpu.barrier_wait(bar)
      for _ in range(late):
        plgpu.copy_gmem_to_smem(x_ref.at[0], own, own_bar)
        plgpu.barrier_wait(own_bar)
      o_ref[2] = slots[2]
  return k


@pytest.mark.parametrize("late", [0, 4])
def test_a_report_names_the_wait_that_observed_the_completion(late):
  """The wait named is the one that observed completion #2 (the second),
  not the thread's first wait on the barrier, whichever access the detector
  meets second."""
  x = _x(3, 64, 32)
  assert_clean(second_wait_too_few(True, late), x)
  report = check(second_wait_too_few(False, late), x)
  r = one_race(report, "read-write" if not late else "write-read")
  assert "observed completion #2" in r.advice and "#3" in r.advice, r
  assert names_line(r.advice, "two-waits-second"), r
  assert not names_line(r.advice, "two-waits-first"), r


# --- 2. a release barrier with too small num_arrivals ------------------------

def arrival_count(arrivals):
  """The producer (wg 2) loads x[0] into smem, waits on `empty` for both
  consumers to release it, then refills it with x[1]. BUG: with
  num_arrivals=1 the first consumer's arrival alone completes `empty`, so
  the refill may overwrite smem while the other consumer still reads it."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 2, 64, 32), F32),
                num_threads=3, thread_name="wg",
                scratch_types=[plgpu.SMEM((64, 32), F32),
                               plgpu.Barrier(num_barriers=2),
                               plgpu.Barrier(num_arrivals=arrivals)])
  def k(x_ref, o_ref, smem, full, empty):
    wg = lax.axis_index("wg")

    @pl.when(wg == 2)
    def _producer():
      plgpu.copy_gmem_to_smem(x_ref.at[0], smem, full.at[0])
      plgpu.barrier_wait(empty)
      plgpu.copy_gmem_to_smem(x_ref.at[1], smem, full.at[1])

    @pl.when(wg < 2)
    def _consumer():
      plgpu.barrier_wait(full.at[0])
      o_ref[0, wg] = smem[...] * (wg + 1).astype(F32)
      plgpu.commit_smem()
      plgpu.barrier_arrive(empty)
      plgpu.barrier_wait(full.at[1])
      o_ref[1, wg] = smem[...] * (wg + 1).astype(F32)
  return k


def test_too_few_arrivals_name_num_arrivals_and_how_many_threads_arrive():
  x = _x(2, 64, 32)
  assert_clean(arrival_count(2), x)
  report = check(arrival_count(1), x)
  r = one_race(report, "read-write")
  assert "num_arrivals=2" in r.advice, r
  assert "2 threads arrive on it" in r.advice, r
  # Each consumer already commits and arrives: not the fix.
  assert "commit_smem in thread" not in r.advice, r
  lost = one_race(report, "lost barrier completion")
  assert lost.first is None  # (a misuse: one site, the wait)
  assert "num_arrivals=2" in lost.advice, lost


# --- 3. a completion lost before its waiter saw the previous one -------------

def lost_completion(acked):
  """wg 1 arrives on `bar` (completion #1), waits on its own TMA load only
  (which orders nothing with wg 0), and arrives again (#2). BUG: wg 0 waits
  on `bar` twice, but nothing makes #2 wait for wg 0's first wait: on
  hardware (phase parity) both completions can come first and wg 0's
  second wait then waits for a third. Twin: wg 1 waits for an `ack` from
  wg 0 between its arrivals."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64, 32), F32),
                num_threads=2, thread_name="wg",
                scratch_types=[plgpu.SMEM((2, 64, 32), F32), plgpu.Barrier(),
                               plgpu.Barrier(), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar, tbar, ack):
    wg = lax.axis_index("wg")

    @pl.when(wg == 1)
    def _():
      plgpu.copy_gmem_to_smem(x_ref.at[0], smem.at[0], tbar)
      plgpu.barrier_wait(tbar)
      plgpu.barrier_arrive(bar)  # completion #1: slot 0 ready
      if acked:
        plgpu.barrier_wait(ack)
      plgpu.copy_gmem_to_smem(x_ref.at[1], smem.at[1], tbar)
      plgpu.barrier_wait(tbar)
      plgpu.barrier_arrive(bar)  # completion #2: slot 1 ready

    @pl.when(wg == 0)
    def _():
      plgpu.barrier_wait(bar)
      if acked:
        plgpu.barrier_arrive(ack)
      o_ref[0] = smem[0]
      plgpu.barrier_wait(bar)
      o_ref[1] = smem[1]
  return k


def test_lost_completion_says_nothing_orders_the_wait_before_the_next_arrivals():
  x = _x(2, 64, 32)
  assert_clean(lost_completion(True), x)
  report = check(lost_completion(False), x)
  r = one_race(report, "lost barrier completion")
  assert "observed completion #1" in r.advice, r
  assert "nothing orders that wait before the arrivals that made #2" in r.advice, r
  assert "(it has observed 1)" not in str(r), r
  # One thread arrives, and num_arrivals is 1: the count is not the cause.
  assert "num_arrivals" not in str(r), r


# --- 4. a read-only TMA wait before a cross-block hand-off --------------------

def semaphore_read_only(read_only):
  """Block 0 TMA-stores its SMEM to out[0], waits with
  wait_smem_to_gmem(0, wait_read_only=True), then signals a global
  semaphore; block 1 waits on it and reads out[0]. BUG: a read-only wait
  lets the SMEM be reused, but the GMEM write need not have landed."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64, 32), F32), grid=(2,),
                grid_names=("b",), scratch_types=[plgpu.SMEM((64, 32), F32)])
  def k(x_ref, o_ref, smem):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    b = lax.axis_index("b")

    @pl.when(b == 0)
    def _():
      smem[...] = x_ref[...]
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem, o_ref.at[0])
      plgpu.wait_smem_to_gmem(0, wait_read_only=read_only)  # read-only-wait
      pl.semaphore_signal(sem, 1)

    @pl.when(b == 1)
    def _():
      pl.semaphore_wait(sem, 1)
      o_ref[1] = o_ref[0] * 2.0
  return k


def test_read_only_wait_before_a_semaphore_names_the_wait_and_both_blocks():
  x = _x(64, 32)
  assert_clean(semaphore_read_only(False), x)
  report = check(semaphore_read_only(True), x)
  r = one_race(report, "write-read")
  assert r.first.agent == "tma_store" and r.second.access == "read"
  assert r.first.block == (0,) and r.second.block == (1,), r
  assert "block (0,)" in str(r) and "block (1,)" in str(r), r
  assert "wait_read_only=True" in r.advice, r
  assert names_line(r.advice, "read-only-wait"), r
  assert "wait_read_only=False" in r.advice, r


# --- 5. an uninitialized read that overlaps an in-flight TMA load ------------

def read_during_tma(wait):
  """BUG: reads SMEM while the TMA load into it is still in flight (the
  barrier_wait comes after the read): a race, and the read sees bytes not
  yet written. The uninitialized finding is caused by the race."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 32), F32),
                scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)
    if wait:
      plgpu.barrier_wait(bar)
    o_ref[...] = smem[...] * 2.0
    if not wait:
      plgpu.barrier_wait(bar)
  return k


def test_uninitialized_read_during_a_tma_load_names_the_race_as_its_cause():
  x = _x(64, 32)
  assert_clean(read_during_tma(True), x)
  report = check(read_during_tma(False), x)
  r = one_race(report, "write-read")
  [u] = report.uninitialized
  assert u.kind == "uninitialized read" and u.buffer == "smem"
  assert u.cause is r
  assert "cause:" in str(u), u
  # Each error names the launch's findings of the other kind.
  with pytest.raises(ps.RaceError) as e:
    ps.simulate(read_during_tma(False), x)
  assert "The launch also had 1 uninitialized-memory finding" in str(e.value)
  with pytest.raises(ps.UninitializedError) as e:
    ps.simulate(read_during_tma(False), x, on_race="report")
  assert "The launch also had" in str(e.value)
  assert "race(s), in report.races" in str(e.value)


# --- 6. every warp of a warp_map writes the same element ---------------------

def warps_one_element(own_element):
  """BUG: each of the 4 warps of the warpgroup stores to o_ref[0] (meant:
  o_ref[warp]), so they race and o_ref[1:] is never written."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4,), I32), num_threads=1,
                thread_name="wg")
  def k(o_ref):
    @plgpu.warp_map
    def _(warp):
      o_ref[warp if own_element else 0] = warp * 10 + 1
  return k


def test_warps_writing_one_element_leave_output_unwritten_and_say_give_each_its_own():
  assert_clean(warps_one_element(True))
  report = check(warps_one_element(False))
  assert report.races
  for r in report.races:
    assert r.kind.startswith("write-write"), r
    assert "give each warp its own" in r.advice, r
  [u] = report.uninitialized
  assert u.kind == "unwritten output"
  assert u.cause is not None and u.cause.kind.startswith("write-write"), u
  assert u.cause in report.races


# --- 7. reading the accumulator with wgmma_accumulator_load(wait_n=...) ------

def acc_load(wait_n, groups):
  """Issues `groups` wgmma groups into `acc`, then reads it with
  wgmma_accumulator_load(acc, wait_n=wait_n). BUG: wait_n=1 after two
  groups leaves the last one in flight; wait_n=None waits for nothing."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 64), F32),
                scratch_types=dict(a_s=plgpu.SMEM((64, 64), F16),
                                   b_s=plgpu.SMEM((64, 64), F16),
                                   acc=plgpu.ACC((64, 64), F32),
                                   bar=plgpu.Barrier(num_arrivals=2)))
  def k(a_ref, b_ref, o_ref, a_s, b_s, acc, bar):
    plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    plgpu.copy_gmem_to_smem(b_ref, b_s, bar)
    plgpu.barrier_wait(bar)
    for _ in range(groups):
      plgpu.wgmma(acc, a_s, b_s)
    o_ref[...] = plgpu.wgmma_accumulator_load(acc, wait_n=wait_n)  # acc-load
    plgpu.wgmma_wait(0)
  return k


@pytest.mark.parametrize("wait_n,groups", [(1, 2), (None, 1)])
def test_accumulator_read_is_named_by_its_wgmma_accumulator_load(wait_n, groups):
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((64, 64)), F16)
  b = jnp.asarray(rng.standard_normal((64, 64)), F16)
  assert_clean(acc_load(0, groups), a, b)
  report = check(acc_load(wait_n, groups), a, b)
  r = one_race(report, "write-read")
  assert r.first.agent == "wgmma" and r.second.buffer == "acc"
  assert r.second.prim == f"wgmma_accumulator_load(wait_n={wait_n})", r
  assert r.second.prim != "acc[...]"
  assert r.second.where.endswith(line_of("acc-load")), r
  # The load waits: the advice names how it leaves the wgmma in flight.
  assert "wgmma_wait before this access" not in r.advice, r
  assert ("leaves the newest 1 wgmma groups in flight" if wait_n else
          "waits for no wgmma group") in r.advice, r


# --- 8. a cluster peer's SMEM read with no cluster barrier --------------------

def peer_read(sync):
  """test_clusters.cluster_ref_kernel: each block of a 2-block cluster
  TMA-loads its half of x, waits on its own barrier, and reads its peer's
  SMEM via cluster_ref. BUG: no cluster barrier, so the peer's load need not
  have landed (and a block may end while its peer still reads its SMEM).
  Twin: a cluster barrier after the local wait and one before the end."""
  return cluster_ref_kernel(sync=sync, tiled=False, end_sync=sync)


def test_cluster_peer_race_names_both_blocks_and_a_cluster_barrier():
  x = _x(2, 64, 32)
  assert_clean(peer_read(True), x)
  report = check(peer_read(False), x)
  found = [r for r in report.races if r.kind.startswith("write-read")]
  assert len(found) == 2, text(report)  # (one per block)
  for r in found:
    assert r.first.agent == "tma_load" and r.second.access == "read"
    assert r.first.block is not None and r.second.block is not None, r
    assert r.first.block != r.second.block, r
    assert "ClusterBarrier" in r.advice, r
    # The block did wait on its own load: that is not the fix.
    assert "no barrier_wait between" not in r.advice, r
  assert len({r.second.block for r in found}) == 2


# --- 9. a cluster buffer reused with one barrier where it takes two -----------

def cluster_reuse(second):
  """Two iterations: each block of a 2-block cluster writes its SMEM, both
  arrive on and wait for `full`, and each reads its peer's SMEM. BUG: the
  next iteration overwrites the SMEM while the peer may still read it: one
  barrier orders the write before the read, nothing orders the read before
  the next write. Twin: a second cluster barrier `free` after the read."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 2, 64, 32), F32), cluster=(2,),
                cluster_names=("c",),
                scratch_types=[plgpu.SMEM((64, 32), F32),
                               plgpu.ClusterBarrier(collective_axes=("c",)),
                               plgpu.ClusterBarrier(collective_axes=("c",))])
  def k(x_ref, o_ref, smem, full, free):
    c = lax.axis_index("c")
    for it in range(2):
      smem[...] = x_ref[it, c]  # reuse-write
      plgpu.commit_smem()
      plgpu.barrier_arrive(full)
      plgpu.barrier_wait(full)
      o_ref[it, c] = plgpu.cluster_ref(smem, {"c": 1 - c})[...]  # reuse-read
      if second:
        plgpu.barrier_arrive(free)
        plgpu.barrier_wait(free)
  return k


def test_a_cluster_buffer_reused_under_one_barrier_asks_for_a_second_barrier():
  x = _x(2, 2, 64, 32)
  assert_clean(cluster_reuse(True), x)
  report = check(cluster_reuse(False), x)
  found = [r for r in report.races if r.kind in ("read-write race", "write-read race")]
  assert found, text(report)
  for r in found:
    assert {r.first.block, r.second.block} == {(0,), (1,)}, r
    assert "It takes a second barrier" in r.advice and "or a second buffer" in r.advice, r
    # The read comes first, the overwrite waits for it.
    assert "arrives on after its read" in r.advice, r
    assert names_line(r.advice, "reuse-read") and names_line(r.advice, "reuse-write"), r
    # One barrier is there, and waiting on a later phase would deadlock.
    assert "phase parity" not in r.advice, r


# --- 10. reading a multicast tile before waiting for it ---------------------

def multicast_read(wait_first):
  """Each block of a 2-block cluster issues its half of a multicast TMA load
  (both halves land in both blocks' SMEM). BUG: the read comes before the
  barrier_wait, so the half the peer issued may not have landed. Twin: the
  wait first."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64, 32), F32), cluster=(2,),
                cluster_names=("c",),
                scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.Barrier(),
                               plgpu.ClusterBarrier(collective_axes=("c",))])
  def k(x_ref, o_ref, smem, bar, cbar):
    c = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_ref, smem, bar, collective_axes="c")  # mc-load
    if wait_first:
      plgpu.barrier_wait(bar)
    o_ref[c] = smem[...]  # mc-read
    if not wait_first:
      plgpu.barrier_wait(bar)
    plgpu.barrier_arrive(cbar)
    plgpu.barrier_wait(cbar)
  return k


def test_a_multicast_read_before_its_wait_names_the_reading_block_s_own_barrier():
  x = _x(64, 32)
  assert_clean(multicast_read(True), x)
  report = check(multicast_read(False), x)
  peer = [r for r in report.races if r.first.block != r.second.block]
  assert peer, text(report)
  for r in peer:
    reader = r.first if r.first.agent == "thread" else r.second
    assert "completes on that block's own copy of its barrier" in r.advice, r
    assert f"barrier_wait on it in {reader.who}" in r.advice, r
    assert "ClusterBarrier" not in r.advice, r
    assert names_line(r.advice, "mc-read") and names_line(r.advice, "mc-load"), r


def multicast_refill(fence):
  """JAX's guide's reuse of SMEM for collective copies: each block of a
  2-block cluster reads the multicast tile, the cluster meets at a
  ClusterBarrier, and the next multicast overwrites the tile, half of it
  issued by the peer. BUG: no commit_smem between the read and the arrival,
  so the read is not ordered before the peer's TMA write. Twin: with it."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 2, 64, 32), F32), cluster=(2,),
                cluster_names=("c",),
                scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.Barrier(),
                               plgpu.ClusterBarrier(collective_axes=("c",))])
  def k(x_ref, o_ref, smem, bar, cbar):
    c = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(x_ref.at[0], smem, bar, collective_axes="c")
    plgpu.barrier_wait(bar)
    o_ref[c, 0] = smem[...]  # refill-read
    if fence:
      plgpu.commit_smem()
    plgpu.barrier_arrive(cbar)  # refill-arrive
    plgpu.barrier_wait(cbar)
    plgpu.copy_gmem_to_smem(x_ref.at[1], smem, bar, collective_axes="c")  # refill-load
    plgpu.barrier_wait(bar)
    o_ref[c, 1] = smem[...]
  return k


def test_a_peer_s_multicast_over_a_tile_read_unfenced_asks_for_commit_smem_not_a_wait():
  """The peer's copy overwrites what this block read: the read must reach
  the async proxy before the arrival that lets the peer issue it (a
  commit_smem); a barrier_wait before the read, the advice for a read of a
  multicast, would not order it."""
  x = _x(2, 64, 32)
  assert_clean(multicast_refill(True), x)
  report = check(multicast_refill(False), x)
  peer = [r for r in report.races if r.first.block != r.second.block]
  assert peer, text(report)
  for r in peer:
    assert "own copy of its barrier" not in r.advice, r
    assert "no commit_smem comes between the read and the arrival" in r.advice, r
    assert names_line(r.advice, "refill-read") and names_line(r.advice, "refill-load"), r


# --- 11. a global-semaphore hand-off whose signal does not cover the write ---

def early_signal(how):
  """Block 0 writes out[0] and signals a global semaphore; block 1 waits on
  it and reads out[0]. BUG (`how`): "before": the signal comes before the
  plain store; "unawaited": the write is a TMA store never awaited before
  the signal. Twin ("ok"): a plain store, then the signal."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64, 32), F32), grid=(2,),
                grid_names=("b",), scratch_types=[plgpu.SMEM((64, 32), F32)])
  def k(x_ref, o_ref, smem):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    b = lax.axis_index("b")

    @pl.when(b == 0)
    def _():
      if how == "before":
        pl.semaphore_signal(sem, 1)  # sem-signal-early
      if how == "unawaited":
        smem[...] = x_ref[...]
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(smem, o_ref.at[0])  # sem-store
        pl.semaphore_signal(sem, 1)  # sem-signal-unawaited
        plgpu.wait_smem_to_gmem(0)
      else:
        o_ref[0] = x_ref[...]  # sem-write
      if how == "ok":
        pl.semaphore_signal(sem, 1)

    @pl.when(b == 1)
    def _():
      pl.semaphore_wait(sem, 1)  # sem-wait
      o_ref[1] = o_ref[0] * 2.0
  return k


@pytest.mark.parametrize("how", ["before", "unawaited"])
def test_a_semaphore_signal_that_does_not_cover_the_write_is_named(how):
  x = _x(64, 32)
  assert_clean(early_signal("ok"), x)
  report = check(early_signal(how), x)
  found = [r for r in report.races if r.first.block != r.second.block]
  assert found, text(report)
  r = found[0]
  assert names_line(r.advice, "sem-wait"), r
  if how == "before":
    assert "before its write" in r.advice and names_line(r.advice, "sem-signal-early"), r
    assert "signal after the write" in r.advice, r
  else:
    assert names_line(r.advice, "sem-signal-unawaited"), r
    assert "wait_smem_to_gmem(0)" in r.advice and "then signal" in r.advice, r


def _released_while_the_wgmma_reads(wait_first):
  """Thread 0 issues a wgmma reading `b` and arrives on `free` (the slot's
  release, as a warp-specialized pipeline's consumer does when its body
  returns); thread 1 waits on `free` and loads the next tile into `b`. With
  the wgmma still in flight at the arrival (wgmma_wait(1) and nothing after:
  the bug), the load can overwrite what it reads."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), F32),
                scratch_types=[plgpu.SMEM((64, 64), F16), plgpu.SMEM((64, 128), F16),
                               plgpu.Barrier(num_arrivals=2), plgpu.Barrier(),
                               plgpu.Barrier()],
                num_threads=2, thread_name="t")
  def k(a_ref, b_ref, o_ref, a, b, full, free, again):
    t = lax.axis_index("t")

    def consume(acc):
      plgpu.barrier_wait(full)
      plgpu.wgmma(acc, a, b)  # wgmma-reads-b
      plgpu.wgmma_wait(0 if wait_first else 1)
      plgpu.barrier_arrive(free)  # releases-b
      plgpu.barrier_wait(again)
      plgpu.wgmma_wait(0)
      o_ref[...] = acc[...]

    @pl.when(t == 0)
    def _():
      pl.run_scoped(consume, plgpu.ACC((64, 128), F32))

    @pl.when(t == 1)
    def _():
      plgpu.copy_gmem_to_smem(a_ref, a, full)
      plgpu.copy_gmem_to_smem(b_ref, b, full)
      plgpu.barrier_wait(full)
      plgpu.barrier_wait(free)
      plgpu.copy_gmem_to_smem(b_ref, b, again)  # refills-b
  return k


@pytest.mark.parametrize("wait_first", [False, True])
def test_a_slot_released_while_its_wgmma_reads_says_to_wait_before_the_arrival(wait_first):
  a, b = jnp.ones((64, 64), F16), jnp.ones((64, 128), F16)
  report = check(_released_while_the_wgmma_reads(wait_first), a, b)
  if wait_first:
    assert not report.races, report.races
    return
  [r] = [r for r in report.races if r.kind == "read-write race"]
  assert names_line(str(r), "wgmma-reads-b") and names_line(str(r), "refills-b")
  assert re.search(rf"thread 0's wgmma \(\S*{re.escape(line_of('wgmma-reads-b'))}\) may "
                   "still be reading when thread 0 arrives on free", r.advice), r.advice
  assert "wgmma_wait(0) before that arrival" in r.advice
  assert "a second barrier" not in r.advice  # (not the fix here)
