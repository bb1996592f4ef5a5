"""Named hardware barriers (bar.sync / bar.arrive in inline_mgpu) and the
async-proxy fence, with our own FA3-style kernel (examples/named_barriers.py):
phases counted in threads across warpgroups and warps, arrive = release,
sync = release + acquire, the fence on either side of a hand-off, misuse
and deadlock named at the user's line, and the timing's waits."""
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.mosaic import gpu as mgpu
from jax.experimental.pallas import mosaic_gpu as plgpu
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import gpu as gpu_dialect
from jaxlib.mlir.dialects import llvm

import named_barriers as nb
import pallas_sim as ps

ARGS = nb.producer_consumer_args(0)
WANT = nb.producer_consumer_reference(*ARGS)


def _sim(fn, *args, **kw):
  return ps.simulate(fn, *args, on_race="report", **kw)


@pytest.mark.parametrize("form", ["ptx", "nvvm"])
@pytest.mark.parametrize("fence", ["producer", "consumer"])
def test_producer_warp_and_two_consumers_hand_slots_back(form, fence):
  sim = _sim(lambda *a: nb.producer_consumer(*a, form=form, fence=fence), *ARGS)
  np.testing.assert_allclose(np.asarray(sim.outputs), WANT, rtol=1e-5, atol=1e-4)
  assert sim.report.races == []
  assert sim.report.uninitialized == []


def test_a_missing_fence_names_both_places_it_may_go():
  sim = _sim(lambda *a: nb.producer_consumer(*a, fence=None), *ARGS)
  assert sorted(r.first.who for r in sim.report.races) == ["thread 0", "thread 1"]
  text = str(sim.report.races[0])
  assert "read of b_ring by thread 0" in text
  assert "write of b_ring by TMA load issued by thread 2 warp 0" in text
  assert ("but only for the generic proxy: async work sees plain SMEM accesses "
          "across an async-proxy fence. Fence in thread 0 after the read and before "
          "its arrival (commit_smem, or nvvm.fence_proxy(async_shared, shared_cta) in "
          "inline_mgpu), or in thread 2 warp 0 after it observed the phase") in text


def test_an_arrival_before_the_read_is_a_race_with_the_cause():
  sim = _sim(lambda *a: nb.producer_consumer(*a, bug="arrive_early"), *ARGS)
  assert len(sim.report.races) == 2
  text = str(sim.report.races[0])
  assert "write of b_ring by TMA load issued by thread 2 warp 0" in text
  assert "observed phase #1, which thread 0 joined" in text
  assert ("an arrival releases only what its thread did before it; arrive after "
          "the read") in text
  with pytest.raises(ps.RaceError):
    ps.run(lambda *a: nb.producer_consumer(*a, bug="arrive_early"), *ARGS, backend="sim")


def test_mismatched_counts_in_a_phase_are_named():
  with pytest.raises(ps.KernelError) as e:
    ps.run(lambda *a: nb.producer_consumer(*a, bug="count"), *ARGS, backend="sim")
  msg = str(e.value)
  assert "named_barriers.py" in msg
  assert "bar.arrive 4, 256 by thread 0: phase #1 of named barrier 4 began with a " \
         "count of 288 (thread 2 warp 0 at" in msg
  assert "every arrival of a phase must give the same count" in msg


def test_a_phase_that_never_completes_is_a_deadlock_naming_who_arrived():
  with pytest.raises(ps.DeadlockError) as e:
    ps.run(lambda *a: nb.producer_consumer(*a, bug="one_consumer"), *ARGS, backend="sim")
  msg = str(e.value)
  assert ("thread 2 warp 0: blocked in bar.sync on named barrier 4 (phase #1: 160 of "
          "288 threads arrived: thread 2 warp 0 (32 at") in msg
  assert "thread 0 (128 at" in msg and "thread 1 (128" not in msg


def test_the_lowerings_own_barrier_ids_are_refused():
  with pytest.raises(ps.KernelError) as e:
    ps.run(lambda *a: nb.producer_consumer(*a, bug="reserved_id"), *ARGS, backend="sim")
  assert ("bar.sync 1, 288 by thread 2 warp 0: the Mosaic GPU lowering uses named "
          "barrier 1 for warpgroup 0's own barrier") in str(e.value)
  assert "use 4..15" in str(e.value)


X = jax.random.normal(jax.random.PRNGKey(1), (4, 64, 128), jnp.float32)


def test_ping_pong_through_two_named_barriers_is_exact():
  sim = _sim(nb.ping_pong, X)
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(X).sum(0))
  assert sim.report.races == []


def test_the_fence_after_a_sync_orders_plain_reads_before_the_next_tma_load():
  sim = _sim(lambda x: nb.ping_pong(x, fence=False), X)
  (race,) = sim.report.races
  assert race.first.who == "thread 1" and race.second.agent == "tma_load"
  assert "Fence in thread 1 after the read and before its arrival" in str(race)


def test_an_arrival_nothing_orders_after_the_last_phase_is_named():
  sim = _sim(lambda x: nb.ping_pong(x, back=False), X)
  kinds = {r.kind: r for r in sim.report.races}
  misuse = kinds["named barrier arrival in an earlier phase"]
  assert ("thread 0's arrival on named barrier 4 (" in str(misuse) and
          "counts towards its phase #2, but nothing orders it after thread 1's "
          "arrival for phase #1" in str(misuse))
  assert "read-write race" in kinds  # (and the tile itself is reused unordered)


def _two_warpgroups(body, out_shape=(128,)):
  def kernel(o_ref, smem):
    body(lax.axis_index("wg"), o_ref, smem)
  return plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct(out_shape, jnp.float32),
                      scratch_types=[plgpu.SMEM(out_shape, jnp.float32)],
                      num_threads=2, thread_name="wg")


def _handoff(op0="arrive", op1="sync", count=256, bid=nb.EMPTY, read_first=False):
  """Warpgroup 0 writes SMEM and arrives; 1 syncs and reads it."""
  def body(wg, o_ref, smem):
    @pl.when(wg == 0)
    def _():
      smem[...] = jnp.full(smem.shape, 7.0, jnp.float32)
      nb.bar(op0, bid, count)

    @pl.when(wg == 1)
    def _():
      if read_first:
        o_ref[...] = smem[...]
      nb.bar(op1, bid, count)
      o_ref[...] = smem[...]
  return _two_warpgroups(body)


def test_an_arrive_releases_and_a_sync_acquires_across_warpgroups():
  sim = _sim(_handoff())
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.full(128, 7.0))
  assert sim.report.races == []
  racy = _sim(_handoff(read_first=True))
  (race,) = racy.report.races
  assert race.kind in ("read-write race", "write-read race")


@pytest.mark.parametrize("count,bid,text", [
    (200, nb.EMPTY, "the thread count must be a positive multiple of the warp size (32)"),
    (384, nb.EMPTY, "the block has 256 threads (2 warpgroups), so the barrier could "
                    "never complete"),
    (256, 16, "a block has named barriers 0..15"),
    (128, 0, "barrier 0 is the block-wide barrier"),
    (160, nb.EMPTY, "128 more threads where phase #1 lacks 32"),
])
def test_bad_counts_and_ids_are_refused_at_the_users_line(count, bid, text):
  with pytest.raises(ps.KernelError) as e:
    ps.run(_handoff(op0="sync", count=count, bid=bid), backend="sim")
  assert text in str(e.value)
  assert "named_barriers.py" in str(e.value)


def test_a_sync_waits_for_the_last_arrival_in_the_timing():
  delay_ns = 20_000

  def body(wg, o_ref, smem):
    @pl.when(wg == 0)
    def _():
      pl.delay(delay_ns)
      smem[...] = jnp.ones(smem.shape, jnp.float32)
      nb.bar("arrive", nb.EMPTY, 256)

    @pl.when(wg == 1)
    def _():
      nb.bar("sync", nb.EMPTY, 256)
      o_ref[...] = smem[...]
  sim = _sim(_two_warpgroups(body), gpu="h200")
  assert sim.report.races == []
  k = sim.report.kernels[0]
  # The sync could not end before warpgroup 0 arrived, 20 us in: warpgroup 1
  # spent that waiting on the barrier.
  assert k.time_s > delay_ns * 1e-9
  assert k.stalls["barrier"] > 0.4


def test_gpu_barrier_in_a_body_is_the_block_wide_barrier():
  @plgpu.inline_mgpu()
  def block_barrier(_):
    gpu_dialect.barrier()

  def body(wg, o_ref, smem):
    @pl.when(wg == 0)
    def _():
      smem[...] = jnp.full(smem.shape, 3.0, jnp.float32)
    block_barrier()

    @pl.when(wg == 1)
    def _():
      o_ref[...] = smem[...]
  sim = _sim(_two_warpgroups(body))
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.full(128, 3.0))
  assert sim.report.races == []

  def one_sided(wg, o_ref, smem):
    @pl.when(wg == 0)
    def _():
      block_barrier()
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
  with pytest.raises(ps.DeadlockError, match="named barrier 0"):
    ps.run(_two_warpgroups(one_sided), backend="sim")


def test_a_cross_warpgroup_barrier_inside_a_bodys_control_flow_is_refused():
  from jaxlib.mlir.dialects import arith, scf

  @plgpu.inline_mgpu()
  def nested(_):
    i1 = ir.IntegerType.get_signless(1)
    cond = arith.constant(i1, 1)
    if_op = scf.IfOp(cond)
    with ir.InsertionPoint(if_op.then_block):
      llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "bar.sync 4, 256;", "",
                      has_side_effects=True)
      scf.yield_([])

  def body(wg, o_ref, smem):
    nested()
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
  with pytest.raises(ps.UnsupportedPrimitiveError,
                     match="inside control flow of the body"):
    ps.run(_two_warpgroups(body), backend="sim")


def test_a_barrier_with_a_reduction_is_refused_by_name():
  @plgpu.inline_mgpu(return_type=plgpu.ShapeDtypeStruct((), jnp.int32,
                                                        plgpu.Layout.WG_SPLAT))
  def red(_):
    i32 = ir.IntegerType.get_signless(32)
    v = llvm.inline_asm(i32, [], "bar.red.popc.u32 $0, 4, 256, 1;", "=r",
                        has_side_effects=True)
    return mgpu.FragmentedArray.splat(v, (), is_signed=True)

  def body(wg, o_ref, smem):
    red()
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)
  with pytest.raises(ps.UnsupportedPrimitiveError, match="bar.red"):
    ps.run(_two_warpgroups(body), backend="sim")


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(rounds=st.integers(1, 5), seed=st.integers(0, 2**16),
                  delays=st.tuples(st.sampled_from([0, 2000, 8000]),
                                   st.sampled_from([0, 2000, 8000])))
def test_ping_pong_is_exact_and_race_free_whatever_the_timing(rounds, seed, delays):
  """Whichever warpgroup runs late, the hand-offs order every access."""
  x = jax.random.normal(jax.random.PRNGKey(seed), (rounds, 64, 128), jnp.float32)
  sim = _sim(lambda x: nb.ping_pong(x, delays=delays), x)
  np.testing.assert_array_equal(np.asarray(sim.outputs), np.asarray(x).sum(0))
  assert sim.report.races == []
