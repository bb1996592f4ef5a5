"""CompilerParams(unsafe_no_auto_barriers=True): the lowering drops the
warpgroup barriers it puts around plain SMEM and GMEM stores, so a thread's
lanes order their accesses with each other only across a barrier. JAX's
contract for the flag is that no region is read and written by one thread; the
race checks hold a thread's own plain accesses to it, and take as ordering
what orders every lane: commit_smem, an arrival of every lane and a wait that
observes it (directly, or through another thread's arrival after its own
wait). A TMA load's completion does not: its issue is one lane's, so a phase
it completes carries to its waiters only what every lane had ordered."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir.dialects import nvvm

import pallas_sim as ps

X = jnp.arange(128 * 128, dtype=jnp.float32).reshape(128, 128) / 7
OUT = jax.ShapeDtypeStruct((128, 128), jnp.float32)
CONTRACT = "JAX's contract for the flag is that no region is read and written by one thread"


def _params(flag):
  return plgpu.CompilerParams(unsafe_no_auto_barriers=flag)


def _races(kernel, *args):
  sim = ps.simulate(kernel, *args, on_race="report")
  return sim, sim.report.races


def _one_thread(body, flag, scratch):
  return plgpu.kernel(body, out_type=OUT, scratch_types=scratch,
                      compiler_params=_params(flag))


def _store_then_load(sync):
  def body(x_ref, o_ref, s_ref, bar):
    s_ref[...] = x_ref[...] * 2
    if sync == "commit_smem":
      plgpu.commit_smem()
    elif sync == "own barrier":  # every lane arrives, then waits for the phase
      plgpu.barrier_arrive(bar)
      plgpu.barrier_wait(bar)
    o_ref[...] = s_ref[...] + 1
  return body


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("sync", [None, "commit_smem", "own barrier"])
def test_a_store_then_a_load_of_the_same_smem(flag, sync):
  kernel = _one_thread(_store_then_load(sync), flag,
                       [plgpu.SMEM((128, 128), jnp.float32), plgpu.Barrier()])
  sim, races = _races(kernel, X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X) * 2 + 1)
  if not flag or sync:
    assert races == []
    return
  (race,) = races
  assert race.kind == "write-read race"
  assert race.first.who == race.second.who == "thread 0"
  text = str(race)
  assert CONTRACT in text
  assert "test_no_auto_barriers.py:" in text
  assert race.first.where.endswith(f":{_line('s_ref[...] = x_ref[...] * 2')}")
  assert race.second.where.endswith(f":{_line('o_ref[...] = s_ref[...] + 1')}")
  # (the simulation runs a thread's lanes as one: it has no timing for them)
  assert "timing:" not in text
  with pytest.raises(ps.RaceError):
    ps.run(kernel, X, backend="sim")


def _line(text):
  """The line of this file that holds `text` alone."""
  src = open(__file__).read().splitlines()
  return next(i for i, s in enumerate(src, 1) if s.strip() == text)


def test_an_async_proxy_fence_alone_orders_no_lane():
  # commit_smem is the fence and a warpgroup barrier; the fence alone (as
  # inline_mgpu emits it) orders each lane's own accesses only.
  @plgpu.inline_mgpu()
  def fence(_):
    nvvm.fence_proxy(nvvm.ProxyKind.async_shared, space=nvvm.SharedSpace.shared_cta)

  def body(x_ref, o_ref, s_ref):
    s_ref[...] = x_ref[...] * 2
    fence()
    o_ref[...] = s_ref[...] + 1
  sim, races = _races(_one_thread(body, True, [plgpu.SMEM((128, 128), jnp.float32)]), X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X) * 2 + 1)
  (race,) = races
  assert race.kind == "write-read race" and CONTRACT in str(race)


def test_an_update_in_place_reads_then_writes():
  def body(x_ref, o_ref, s_ref):
    s_ref[...] = x_ref[...]
    plgpu.commit_smem()
    s_ref[...] = s_ref[...] * 3
    plgpu.commit_smem()
    o_ref[...] = s_ref[...]
  sim, races = _races(_one_thread(body, True, [plgpu.SMEM((128, 128), jnp.float32)]), X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X) * 3)
  (race,) = races
  assert race.kind == "read-write race"
  assert race.first.access == "read" and race.second.access == "write"
  assert CONTRACT in str(race)


def test_gmem_counts_too():
  # (the contract names memory regions, not SMEM alone)
  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1
    o_ref[...] = o_ref[...] * 2
  sim, races = _races(_one_thread(body, True, []), X)
  np.testing.assert_allclose(np.asarray(sim.outputs), (np.asarray(X) + 1) * 2)
  # (the two stores alone may meet unordered: the contract allows that)
  assert sorted(r.kind for r in races) == ["read-write race", "write-read race"]
  assert all(CONTRACT in str(r) for r in races)


def test_only_writes_and_only_reads_keep_the_contract():
  def body(x_ref, o_ref, s_ref):
    for _ in range(3):  # (writes of one thread, no read between)
      s_ref[...] = x_ref[...]
    plgpu.commit_smem()
    a = s_ref[...]
    b = s_ref[...]  # (reads alone never conflict)
    o_ref[...] = a + b
  sim, races = _races(_one_thread(body, True, [plgpu.SMEM((128, 128), jnp.float32)]), X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X) * 2)
  assert races == []


def test_a_tma_loads_completion_does_not_order_the_lanes():
  # One lane issues the copy and arrives with its byte count; the wait for it
  # orders nothing the other lanes stored before.
  def body(x_ref, o_ref, s_ref, t_ref, bar):
    s_ref[...] = x_ref[...] * 2
    plgpu.copy_gmem_to_smem(x_ref, t_ref, bar)
    plgpu.barrier_wait(bar)
    o_ref[...] = s_ref[...] + t_ref[...]
  scratch = [plgpu.SMEM((128, 128), jnp.float32), plgpu.SMEM((128, 128), jnp.float32),
             plgpu.Barrier()]
  sim, races = _races(_one_thread(body, True, scratch), X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X) * 3)
  (race,) = races
  assert race.kind == "write-read race" and CONTRACT in str(race)
  _, none = _races(_one_thread(body, False, scratch), X)
  assert none == []


def _hand_back(flag, chained):
  """Thread 0 writes its tile and arrives, thread 1 hands it back, thread 0
  reads it. `chained`: thread 1 arrives on the hand-back barrier after it
  waited for thread 0's arrival, so the hand-back carries thread 0's stores
  to every lane of it; else it arrives before, and carries nothing."""
  @plgpu.kernel(out_type=OUT, num_threads=2, thread_name="wg",
                scratch_types=[plgpu.SMEM((128, 128), jnp.float32), plgpu.Barrier(),
                               plgpu.Barrier()],
                compiler_params=_params(flag))
  def k(x_ref, o_ref, s_ref, written, handed_back):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      s_ref[...] = x_ref[...] - 1
      plgpu.barrier_arrive(written)
      plgpu.barrier_wait(handed_back)
      o_ref[...] = s_ref[...] + 2

    @pl.when(wg == 1)
    def _():
      if not chained:
        plgpu.barrier_arrive(handed_back)
      plgpu.barrier_wait(written)
      if chained:
        plgpu.barrier_arrive(handed_back)
  return k


@pytest.mark.parametrize("chained", [True, False])
def test_a_barrier_another_thread_passes_back_orders_the_lanes(chained):
  sim, races = _races(_hand_back(True, chained), X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X) - 1 + 2)
  if chained:
    assert races == []
    return
  # thread 1's arrival does not come after thread 0's: it carries nothing of
  # thread 0's lanes, and the read meets the store's lanes unordered (without
  # the flag the store's own barrier orders them)
  (race,) = races
  assert race.kind == "write-read race" and CONTRACT in str(race)
  assert race.first.where.endswith(f":{_line('s_ref[...] = x_ref[...] - 1')}")
  assert race.second.where.endswith(f":{_line('o_ref[...] = s_ref[...] + 2')}")
  _, none = _races(_hand_back(False, chained), X)
  assert none == []


def test_a_phase_both_threads_arrive_in_orders_each_ones_lanes():
  # Two threads meet at a Barrier(num_arrivals=2): each reads back its own
  # tile (and the other's) after the phase it arrived in and observed.
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128, 128), jnp.float32), num_threads=2,
                thread_name="wg",
                scratch_types=[plgpu.SMEM((2, 128, 128), jnp.float32),
                               plgpu.Barrier(num_arrivals=2)],
                compiler_params=_params(True))
  def k(x_ref, o_ref, s_ref, meet):
    wg = lax.axis_index("wg")
    s_ref[wg] = x_ref[...] * (wg + 1).astype(jnp.float32)
    plgpu.barrier_arrive(meet)
    plgpu.barrier_wait(meet)
    o_ref[wg] = s_ref[wg] - s_ref[1 - wg]
  sim, races = _races(k, X)
  x = np.asarray(X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.stack([-x, x]))
  assert races == []


def _into_a_warp(flag, sync):
  """The warpgroup writes a row, then warp 1 of a warp_map reads one element
  of it (another warp's lane may have written it), and after the map the
  warpgroup reads what warp 0 wrote. `sync`: commit_smem before and after
  the map. (Warps load scalars of GMEM only.)"""
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct((128,), jnp.float32),
                          jax.ShapeDtypeStruct((3,), jnp.float32)),
                compiler_params=_params(flag))
  def k(x_ref, o_ref, p_ref):
    o_ref[...] = x_ref[...]
    if sync:
      plgpu.commit_smem()

    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        p_ref[1] = x_ref[0] * 2

      @pl.when(warp == 1)
      def _():
        p_ref[0] = o_ref[5]
    if sync:
      plgpu.commit_smem()
    p_ref[2] = p_ref[1] + 1
  return k


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("sync", [False, True])
def test_a_warp_maps_warps_and_their_warpgroup(flag, sync):
  x = np.asarray(X[0])
  sim, races = _races(_into_a_warp(flag, sync), X[0])
  np.testing.assert_allclose(np.asarray(sim.outputs[1]), [x[5], x[0] * 2, x[0] * 2 + 1])
  if not flag or sync:
    assert races == []
    return
  # (no barrier starts or ends the map without the auto barriers)
  assert sorted((r.first.who, r.second.who) for r in races) == [
      ("thread 0", "thread 0 warp 1"), ("thread 0 warp 0", "thread 0")]
  text = "\n".join(str(r) for r in races)
  assert "thread 0's write" in text and "and thread 0 warp 1's read" in text
  assert all(CONTRACT in str(r) for r in races)


def test_one_warps_barrier_orders_its_own_lanes_only():
  # warp 0 passes a barrier on its own (every lane of it arrives and waits),
  # which leaves the warpgroup's other lanes unordered with its store
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2,), jnp.float32),
                scratch_types=[plgpu.Barrier()], compiler_params=_params(True))
  def k(x_ref, p_ref, bar):
    @plgpu.warp_map
    def _(warp):
      @pl.when(warp == 0)
      def _():
        p_ref[0] = x_ref[0] * 2
        plgpu.barrier_arrive(bar)
        plgpu.barrier_wait(bar)
    p_ref[1] = p_ref[0] + 1
  sim, races = _races(k, X[0])
  x0 = float(X[0, 0])
  np.testing.assert_allclose(np.asarray(sim.outputs), [x0 * 2, x0 * 2 + 1])
  (race,) = races
  assert (race.first.who, race.second.who) == ("thread 0 warp 0", "thread 0")
  assert CONTRACT in str(race)


def _through_a_tma_load(flag, commit):
  """Thread 0 writes a tile and issues a TMA load that completes a barrier;
  thread 1 waits on it and reads the tile."""
  @plgpu.kernel(out_type=OUT, num_threads=2, thread_name="wg",
                scratch_types=[plgpu.SMEM((128, 128), jnp.float32),
                               plgpu.SMEM((8, 128), jnp.float32), plgpu.Barrier()],
                compiler_params=_params(flag))
  def k(x_ref, o_ref, s_ref, t_ref, bar):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      s_ref[...] = x_ref[...] + 1
      if commit:
        plgpu.commit_smem()
      plgpu.copy_gmem_to_smem(x_ref.at[:8], t_ref, bar)

    @pl.when(wg == 1)
    def _():
      plgpu.barrier_wait(bar)
      o_ref[...] = s_ref[...]
  return k


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("commit", [False, True])
def test_a_tma_loads_phase_carries_only_what_every_lane_ordered(flag, commit):
  sim, races = _races(_through_a_tma_load(flag, commit), X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X) + 1)
  if not flag or commit:
    assert races == []
    return
  (race,) = races
  assert race.kind == "write-read race"
  assert (race.first.who, race.second.who) == ("thread 0", "thread 1")
  text = str(race)
  assert "comes before the TMA load (" in text and "that completes the phase of bar" in text
  assert "the phase releases that lane's accesses only" in text
  assert "commit_smem in thread 0 between the write and the load orders every lane's" in text


def test_a_thread_that_waits_then_refills_its_own_barrier_loses_no_completion():
  # The thread observes each TMA load's phase before it issues the next one
  # on the same barrier: its own order, though it never made its lanes
  # agree on anything (no plain access, no commit_smem).
  @plgpu.kernel(out_type=OUT, scratch_types=[plgpu.SMEM((32, 128), jnp.float32),
                                             plgpu.Barrier()],
                compiler_params=_params(True))
  def k(x_ref, o_ref, t_ref, bar):
    for i in range(4):
      plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(32 * i, 32)], t_ref, bar)
      plgpu.barrier_wait(bar)
      plgpu.copy_smem_to_gmem(t_ref, o_ref.at[pl.ds(32 * i, 32)])
      plgpu.wait_smem_to_gmem(0)
  sim, races = _races(k, X)
  np.testing.assert_allclose(np.asarray(sim.outputs), np.asarray(X))
  assert races == []


def _handoff(flag, commit):
  """Block 3 writes a row and signals a global semaphore; blocks 0-2 wait
  for it and read the row."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 128), jnp.int32), grid=(4,),
                grid_names=("x",), compiler_params=_params(flag))
  def k(o_ref):
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    b = lax.axis_index("x")

    @pl.when(b == 3)
    def _():
      o_ref[3] = jnp.full((128,), 7, jnp.int32)
      if commit:
        plgpu.commit_smem()
      pl.semaphore_signal(sem, 3)

    @pl.when(b < 3)
    def _():
      pl.semaphore_wait(sem, 1)
      o_ref[b] = o_ref[3] + b
  return k


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("commit", [False, True])
def test_a_semaphore_signal_releases_one_lane(flag, commit):
  # (one lane signals; without the flag the lowering's barrier comes first)
  sim, races = _races(_handoff(flag, commit))
  np.testing.assert_array_equal(np.asarray(sim.outputs)[:, 0], [7, 8, 9, 7])
  if not flag or commit:
    assert races == []
    return
  assert races and {r.kind for r in races} == {"write-read race"}
  store = f"{__file__.rpartition('/')[2]}:{_line('o_ref[3] = jnp.full((128,), 7, jnp.int32)')}"
  assert all(r.first.where.endswith(store) for r in races)
  text = str(races[0])
  assert "thread 0 of block (3,) signals global semaphore" in text
  assert "the lowering puts no barrier before the signal, which one lane makes" in text


def test_a_semaphore_wait_ends_in_a_barrier_of_every_lane():
  # (one lane spins on the count, then the warpgroup meets: a store before
  # the wait and a load after it are ordered, with or without the flag)
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), jnp.int32),
                compiler_params=_params(True))
  def k(o_ref):
    o_ref[0] = jnp.full((128,), 5, jnp.int32)

    @functools.partial(pl.run_scoped, sem=plgpu.SemaphoreType.REGULAR)
    def _(sem):
      pl.semaphore_signal(sem, 1)
      pl.semaphore_wait(sem, 1)
    o_ref[1] = o_ref[0] + 1
  sim, races = _races(k)
  np.testing.assert_array_equal(np.asarray(sim.outputs)[:, 0], [5, 6])
  assert races == []


def _cluster_exchange(flag, commit):
  """Each block of a cluster of two writes its row, arrives on a
  ClusterBarrier (one lane arrives on each block's copy) and waits; then
  reads the other block's row."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 128), jnp.float32), grid=(1,),
                grid_names=("g",), cluster=(2,), cluster_names=("c",),
                scratch_types=[plgpu.ClusterBarrier(collective_axes=("c",))],
                compiler_params=_params(flag))
  def k(x_ref, o_ref, cbar):
    c = lax.axis_index("c")
    o_ref[c] = x_ref[c] * 2
    if commit:
      plgpu.commit_smem()
    plgpu.barrier_arrive(cbar)
    plgpu.barrier_wait(cbar)
    o_ref[2 + c] = o_ref[1 - c] + 1
  return k


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("commit", [False, True])
def test_a_cluster_barriers_arrival_is_one_lanes(flag, commit):
  x = np.asarray(X[:2])
  sim, races = _races(_cluster_exchange(flag, commit), X[:2])
  np.testing.assert_allclose(np.asarray(sim.outputs),
                             np.concatenate([x * 2, x[::-1] * 2 + 1]))
  if not flag or commit:
    assert races == []
    return
  assert races and {r.kind for r in races} == {"write-read race"}
  text = str(races[0])
  assert "comes before the arrival (" in text and "one lane arrives for each block" in text
  assert "commit_smem in thread 0 of cluster block" in text and "and the arrival" in text


def _refills(flag, back="barrier", commit=True):
  """Thread 0 refills one slot with TMA loads, waiting before each refill for
  thread 1 to have consumed the last: on a second barrier (`back`
  "barrier") or a global semaphore ("semaphore"). Thread 1 waits for each
  load, copies it out, commits (`commit`) and hands the slot back."""
  barrier = back == "barrier"
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((3, 128, 128), jnp.float32),
                num_threads=2, thread_name="t", compiler_params=_params(flag),
                scratch_types=[plgpu.SMEM((128, 128), jnp.float32), plgpu.Barrier()]
                + [plgpu.Barrier()] * barrier)
  def k(x_ref, o_ref, buf, loaded, *consumed):
    t = lax.axis_index("t")
    sem = None if barrier else pl.get_global(plgpu.SemaphoreType.REGULAR)

    @pl.when(t == 0)
    def _():
      for i in range(3):
        if i and barrier:
          plgpu.barrier_wait(consumed[0])
        elif i:
          pl.semaphore_wait(sem, 1)
        plgpu.copy_gmem_to_smem(x_ref.at[i], buf, loaded)

    @pl.when(t == 1)
    def _():
      for i in range(3):
        plgpu.barrier_wait(loaded)
        o_ref[i] = buf[...] + 0
        if commit:
          plgpu.commit_smem()
        if barrier:
          plgpu.barrier_arrive(consumed[0])
        else:
          pl.semaphore_signal(sem, 1)
  return k


@pytest.mark.parametrize("flag", [False, True])
def test_a_wait_before_a_refill_orders_the_next_phase_whatever_the_flag(flag):
  """The consumer's second arrival on `consumed` comes after the load the
  producer issued once it had observed the first: no completion is lost. Under
  the flag the load's phase tells the consumer of the producer's accesses only
  what every lane had ordered; that the producer's wait came before the
  load is still told (it bounds no access: it orders the next phase)."""
  x = jnp.stack([X, X + 1, X + 2])
  sim, races = _races(_refills(flag), x)
  assert races == [], [str(r) for r in races]
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(x))


@pytest.mark.parametrize("flag", [False, True])
@pytest.mark.parametrize("commit", [False, True])
def test_a_semaphore_hand_back_orders_the_refill_whatever_the_flag(flag, commit):
  """The signal comes after thread 1's wait for the load, the refill after
  the wait for the signal: the next load is ordered after the last, and its
  phase after thread 1 observed the last (no lost completion), under the
  flag too, where one lane signals. What the signal releases of thread 1's
  plain reads is as the flag says: with commit_smem before it, all; without,
  the TMA load may overwrite SMEM a lane still reads."""
  x = jnp.stack([X, X + 1, X + 2])
  sim, races = _races(_refills(flag, "semaphore", commit), x)
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(x))
  if commit:
    assert races == [], [str(r) for r in races]
    return
  assert [r.kind for r in races] == ["read-write race"], [str(r) for r in races]
  (race,) = races
  assert race.first.where.endswith(f":{_line('o_ref[i] = buf[...] + 0')}")
  assert race.second.agent == "tma_load"
  text = str(race)
  if flag:
    assert "signals global semaphore 0" in text and "commit_smem in thread 1" in text
  else:
    assert ("commit_smem in thread 1, then a barrier arrival or a semaphore signal "
            "that thread 0 waits for before it issues the TMA load") in text
