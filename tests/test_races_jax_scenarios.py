"""The scenarios of JAX's tests/pallas/gpu_pallas_interpret_race_detection_test.py
(warpgroup-level ones; warp_map and clusters are not modelled), written
afresh: the detector must reach the same verdicts, including the two that
JAX's own detector skips for lack of a GMEM commit clock. JAX's versions use
scalar refs, whose TMA copies the real lowering rejects (fewer than 128 bits
along the last dimension); here each is a vector of 128 int32."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

I32 = jnp.int32
V = (128,)  # JAX's scalars, as vectors the lowering accepts for TMA


HERE = "test_races_jax_scenarios.py"


def racy(kernel, *args):
  """(the races found, as a set of (kind, first access, second access,
  buffer)), outputs). Each report must name two accesses at lines of this
  file."""
  sim = ps.simulate(kernel, *args, on_race="report", on_uninitialized="report")
  for r in sim.report.races:
    for site in (r.first, r.second):
      assert site is None or HERE in site.where, str(r)
  return {(r.kind, _who(r.first), _who(r.second), r.second.buffer)
          for r in sim.report.races}, sim.outputs


def _who(site):
  return None if site is None else f"{site.agent} {site.access}"


def WW(a, b, buf):
  return {("write-write race", f"{a} write", f"{b} write", buf)}


def RW(a, b, buf):
  return {("read-write race", f"{a} read", f"{b} write", buf)}


def WR(a, b, buf):
  return {("write-read race", f"{a} write", f"{b} read", buf)}


def scalar_kernel(body, gmem=(), **scratch):
  """JAX's tests allocate scratch GMEM, which the real lowering rejects in
  run_scoped ("Unsupported memory space: gmem"): it is an extra output
  here, one per shape in `gmem`; the kernel's first output comes back."""
  outs = [jax.ShapeDtypeStruct(V, I32)] + [jax.ShapeDtypeStruct(g, I32) for g in gmem]
  k = plgpu.kernel(body, out_type=tuple(outs), scratch_types=scratch)
  return lambda *args: k(*args)[0]


@pytest.mark.parametrize("wait", [True, False])
def test_async_gmem_read_not_visible_unless_synchronized(wait):
  def body(out_ref, smem_ref, bar):
    plgpu.copy_gmem_to_smem(out_ref, smem_ref, bar)
    if wait:
      plgpu.barrier_wait(bar)
    plgpu.commit_smem()
    out_ref[...] = jnp.full(V, 42, I32)
    if not wait:
      plgpu.barrier_wait(bar)

  found, out = racy(scalar_kernel(body, smem_ref=plgpu.SMEM(V, I32),
                                  bar=plgpu.Barrier()))
  assert found == (set() if wait else RW("tma_load", "thread", "out_ref"))
  if wait:
    assert (out == 42).all()


@pytest.mark.parametrize("a,b,c,d", list(itertools.product([False, True], repeat=4)))
def test_single_thread_later_gmem_to_smem_copy(a, b, c, d):
  def body(in_ref, out_ref, smem_ref, bar):
    if a: plgpu.commit_smem()
    smem_ref[...] = jnp.full(V, 100, I32)
    if b: plgpu.commit_smem()
    plgpu.copy_gmem_to_smem(in_ref, smem_ref, bar)
    if c: plgpu.commit_smem()
    plgpu.barrier_wait(bar)
    if d: plgpu.commit_smem()
    out_ref[...] = smem_ref[...]

  found, out = racy(scalar_kernel(body, smem_ref=plgpu.SMEM(V, I32),
                                  bar=plgpu.Barrier()), jnp.full(V, 42, I32))
  assert found == (set() if b else WW("thread", "tma_load", "smem_ref"))
  if b:
    assert (out == 42).all()


@pytest.mark.parametrize("wait", [False, True])
def test_single_thread_earlier_gmem_to_smem_copy(wait):
  def body(out_ref, gmem_ref, smem_ref, bar):
    plgpu.copy_gmem_to_smem(gmem_ref, smem_ref, bar)
    if wait:
      plgpu.barrier_wait(bar)
    smem_ref[...] = jnp.full(V, 42, I32)
    out_ref[...] = smem_ref[...]
    if not wait:
      plgpu.barrier_wait(bar)

  found, out = racy(scalar_kernel(body, gmem=[V], smem_ref=plgpu.SMEM(V, I32),
                                  bar=plgpu.Barrier()))
  assert found == (set() if wait else WW("tma_load", "thread", "smem_ref")
                   | WR("tma_load", "thread", "smem_ref"))
  if wait:
    assert (out == 42).all()


def two_thread_kernel(body):
  return plgpu.kernel(
      body, out_type=jax.ShapeDtypeStruct(V, I32),
      scratch_types=dict(smem_ref=plgpu.SMEM(V, I32),
                         thread_barrier=plgpu.Barrier(),
                         copy_barrier=plgpu.Barrier()),
      num_threads=2, thread_name="t")


FLAGS6 = list(itertools.product([False, True], repeat=6))


@pytest.mark.parametrize("a,b,c,d,e,f", FLAGS6)
def test_multi_thread_gmem_to_smem_copy(a, b, c, d, e, f):
  def body(in_ref, out_ref, smem_ref, thread_barrier, copy_barrier):
    t = jax.lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      if a: plgpu.commit_smem()
      smem_ref[...] = jnp.full(V, 100, I32)
      if b: plgpu.commit_smem()
      plgpu.copy_gmem_to_smem(in_ref, smem_ref, copy_barrier)
      if c: plgpu.commit_smem()
      plgpu.barrier_arrive(thread_barrier)

    @pl.when(t == 1)
    def _():
      if d: plgpu.commit_smem()
      plgpu.barrier_wait(thread_barrier)
      if e: plgpu.commit_smem()
      plgpu.barrier_wait(copy_barrier)
      if f: plgpu.commit_smem()
      out_ref[...] = smem_ref[...]

  found, out = racy(two_thread_kernel(body), jnp.full(V, 42, I32))
  assert found == (set() if b else WW("thread", "tma_load", "smem_ref"))
  if b:
    assert (out == 42).all()


@pytest.mark.parametrize("a,b,c,d,e,f", FLAGS6)
def test_cross_thread_gmem_to_smem_copy(a, b, c, d, e, f):
  def body(in_ref, out_ref, smem_ref, thread_barrier, copy_barrier):
    t = jax.lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      if a: plgpu.commit_smem()
      smem_ref[...] = jnp.full(V, 100, I32)
      if b: plgpu.commit_smem()
      plgpu.barrier_arrive(thread_barrier)

    @pl.when(t == 1)
    def _():
      if c: plgpu.commit_smem()
      plgpu.barrier_wait(thread_barrier)
      if d: plgpu.commit_smem()
      plgpu.copy_gmem_to_smem(in_ref, smem_ref, copy_barrier)
      if e: plgpu.commit_smem()
      plgpu.barrier_wait(copy_barrier)
      if f: plgpu.commit_smem()
      out_ref[...] = smem_ref[...]

  found, out = racy(two_thread_kernel(body), jnp.full(V, 42, I32))
  correct = b or d
  assert found == (set() if correct else WW("thread", "tma_load", "smem_ref"))
  if correct:
    assert (out == 42).all()


@pytest.mark.parametrize("a,b,c", list(itertools.product([False, True], repeat=3)))
def test_single_thread_smem_to_gmem_copy(a, b, c):
  def body(out_ref, gmem_ref, smem_ref):
    if a: plgpu.commit_smem()
    smem_ref[...] = jnp.full(V, 42, I32)
    if b: plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)
    if c: plgpu.commit_smem()
    plgpu.wait_smem_to_gmem(0)
    out_ref[...] = gmem_ref[...]

  found, out = racy(scalar_kernel(body, gmem=[V], smem_ref=plgpu.SMEM(V, I32)))
  assert found == (set() if b else WR("thread", "tma_store", "smem_ref"))
  if b:
    assert (out == 42).all()


def test_non_fully_waited_smem_to_gmem_copy():
  def body(out_ref, gmem1, gmem2, smem1, smem2):
    smem1[...] = jnp.full(V, 1, I32)
    smem2[...] = jnp.full(V, 2, I32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem1, gmem1)
    plgpu.copy_smem_to_gmem(smem2, gmem2)
    plgpu.wait_smem_to_gmem(1)
    out_ref[...] = gmem1[...] + gmem2[...]  # gmem2's store may be in flight
    plgpu.wait_smem_to_gmem(0)

  found, _ = racy(scalar_kernel(body, gmem=[V, V], smem1=plgpu.SMEM(V, I32),
                                smem2=plgpu.SMEM(V, I32)))
  assert found == WR("tma_store", "thread", "gmem2")


def test_rewaiting_smem_to_gmem_copies_is_fine():
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct(V, I32),
                          jax.ShapeDtypeStruct((3, *V), I32)),
                scratch_types=dict(smem_ref=plgpu.SMEM((3, *V), I32)))
  def k(in_ref, out_ref, gmem_ref, smem_ref):
    smem_ref[...] = in_ref[...]
    plgpu.commit_smem()
    for i in range(3):
      plgpu.copy_smem_to_gmem(smem_ref.at[i], gmem_ref.at[i])
    plgpu.wait_smem_to_gmem(1)
    plgpu.wait_smem_to_gmem(2)
    out_ref[...] = gmem_ref[0] + gmem_ref[1]
    plgpu.wait_smem_to_gmem(0)
    out_ref[...] = gmem_ref[0] + gmem_ref[1] + gmem_ref[2]

  found, out = racy(k, jnp.broadcast_to(jnp.array([[1], [2], [3]], I32), (3, *V)))
  assert found == set() and (out[0] == 6).all()


@pytest.mark.parametrize("wait_only_once", [False, True])
@pytest.mark.parametrize("location", range(4))
def test_smem_to_gmem_wait_read_only(wait_only_once, location):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, *V), I32),
                scratch_types=dict(smem_ref=plgpu.SMEM((2, *V), I32)))
  def k(in_ref, out_ref, smem_ref):
    smem_ref[...] = in_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem_ref.at[0], out_ref.at[0])
    plgpu.copy_smem_to_gmem(smem_ref.at[1], out_ref.at[1])
    targets = [smem_ref.at[0], out_ref.at[0], smem_ref.at[1], out_ref.at[1]]
    plgpu.wait_smem_to_gmem(1, wait_read_only=True)
    if not wait_only_once:
      plgpu.wait_smem_to_gmem(1)
    targets[location][...] = jnp.full(V, 3, I32)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  found, _ = racy(k, jnp.ones((2, *V), I32))
  # smem[0]'s read is awaited; out[0]'s write only by the full wait; smem[1]
  # and out[1] belong to the copy still in flight.
  want = [set(), set() if not wait_only_once else WW("tma_store", "thread", "out_ref"),
          RW("tma_store", "thread", "smem_ref"), WW("tma_store", "thread", "out_ref")]
  assert found == want[location]


@pytest.mark.parametrize("check_read", [False, True])
def test_wait_smem_to_gmem_is_per_thread(check_read):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(V, I32),
                scratch_types=dict(smem=plgpu.SMEM(V, I32), barrier=plgpu.Barrier(),
                                   cleanup_barrier=plgpu.Barrier()),
                num_threads=2, thread_name="t")
  def k(out_ref, smem, barrier, cleanup_barrier):
    t = jax.lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      plgpu.copy_smem_to_gmem(smem, out_ref)
      plgpu.barrier_arrive(barrier)
      plgpu.barrier_wait(cleanup_barrier)
      plgpu.wait_smem_to_gmem(0)

    @pl.when(t == 1)
    def _():
      plgpu.barrier_wait(barrier)
      plgpu.wait_smem_to_gmem(0)  # waits for thread 1's copies: none
      if check_read:
        smem[...] = jnp.full(V, 43, I32)
      else:
        out_ref[...] = jnp.full(V, 43, I32)
      plgpu.barrier_arrive(cleanup_barrier)

  found, _ = racy(k)
  assert found == (RW("tma_store", "thread", "smem") if check_read
                   else WW("tma_store", "thread", "out_ref"))


def test_properly_waited_smem_to_gmem_is_visible_across_threads():
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct(V, I32), jax.ShapeDtypeStruct(V, I32)),
                scratch_types=dict(smem_ref=plgpu.SMEM(V, I32), barrier=plgpu.Barrier()),
                num_threads=2, thread_name="t")
  def k(out_ref, gmem_ref, smem_ref, barrier):
    t = jax.lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      smem_ref[...] = jnp.full(V, 42, I32)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)
      plgpu.wait_smem_to_gmem(0)
      plgpu.barrier_arrive(barrier)

    @pl.when(t == 1)
    def _():
      plgpu.barrier_wait(barrier)
      out_ref[...] = gmem_ref[...]

  found, out = racy(k)
  assert found == set() and (out[0] == 42).all()


@pytest.mark.parametrize("wait", [False, True])
def test_two_loads_into_one_smem(wait):
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct(V, I32),
                          jax.ShapeDtypeStruct((2, *V), I32)),
                scratch_types=dict(smem_ref=plgpu.SMEM((2, *V), I32),
                                   barrier=plgpu.Barrier(num_arrivals=1 if wait else 2)))
  def k(out_ref, gmem_ref, smem_ref, barrier):
    plgpu.commit_smem()
    plgpu.copy_gmem_to_smem(gmem_ref, smem_ref, barrier)
    if wait:
      plgpu.barrier_wait(barrier)
    plgpu.copy_gmem_to_smem(gmem_ref, smem_ref, barrier)
    plgpu.barrier_wait(barrier)

  found, _ = racy(k)
  assert found == (set() if wait else WW("tma_load", "tma_load", "smem_ref"))


def test_two_stores_from_one_smem_to_one_gmem():
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct(V, I32),
                          jax.ShapeDtypeStruct((2, *V), I32)),
                scratch_types=dict(smem_ref=plgpu.SMEM((2, *V), I32)))
  def k(out_ref, gmem_ref, smem_ref):
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)
    plgpu.copy_smem_to_gmem(smem_ref, gmem_ref)  # two writes of gmem in flight
    plgpu.wait_smem_to_gmem(0)

  found, _ = racy(k)
  assert found == WW("tma_store", "tma_store", "gmem_ref")


def test_unawaited_store_read_side_is_reported():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, *V), I32),
                scratch_types=dict(smem_ref=plgpu.SMEM((2, *V), I32)))
  def k(out_ref, smem_ref):
    plgpu.copy_smem_to_gmem(smem_ref, out_ref)

  sim = ps.simulate(k, on_race="report", on_uninitialized="report")
  assert [r.kind for r in sim.report.races] == ["unawaited TMA store"]


def test_unawaited_store_write_side_is_fine():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, *V), I32),
                scratch_types=dict(smem_ref=plgpu.SMEM((2, *V), I32)))
  def k(in_ref, out_ref, smem_ref):
    smem_ref[...] = in_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem_ref, out_ref)
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

  x = jnp.arange(2 * 128, dtype=I32).reshape(2, *V)
  found, out = racy(k, x)
  assert found == set()
  np.testing.assert_array_equal(out, x)  # the write still lands at the end


def warp_specialized_sum(store):
  """emit_pipeline_warp_specialized with in_specs only: the compute thread
  sums x's blocks into its carry, then writes the sum to out with a plain
  store, or (`store`) through SMEM and a TMA store it never awaits. The
  pipeline commits a store group each step, with no store in it."""
  F32 = jnp.float32

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), F32), num_threads=2,
                thread_name="wg", scratch_types=[plgpu.SMEM((64, 128), F32)])
  def k(x_ref, o_ref, o_smem):
    def compute(pipeline):
      total = pipeline(jnp.zeros((64, 128), F32))
      if store:
        o_smem[...] = total
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem, o_ref)
      else:
        o_ref[...] = total

    def body(_, x_smem, carry):
      carry = carry + x_smem[...]
      plgpu.commit_smem()  # (the plain reads, before the slot's release)
      return carry

    plgpu.emit_pipeline_warp_specialized(
        body, in_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0))], grid=(4,),
        compute_context=compute, max_concurrent_steps=2, num_compute_wgs=1,
        memory_registers=40, memory_thread_idx=1, wg_axis="wg")(x_ref)
  return k


def test_empty_store_groups_of_a_warp_specialized_pipeline_need_no_wait():
  """Commits with no store before them make empty bulk groups (PTX), which
  read no SMEM: a thread may end without awaiting them. A group that holds
  a store still must be awaited."""
  x = jnp.arange(256 * 128, dtype=jnp.float32).reshape(256, 128)
  sim = ps.simulate(warp_specialized_sum(False), x)
  assert sim.report.races == []
  np.testing.assert_array_equal(sim.outputs, np.asarray(x).reshape(4, 64, 128).sum(0))
  sim = ps.simulate(warp_specialized_sum(True), x, on_race="report")
  assert [r.kind for r in sim.report.races] == ["unawaited TMA store"]
  assert str(sim.report.races[0]).endswith(
      "thread 0 ends with TMA stores still reading SMEM: wait_smem_to_gmem(0) before "
      "the kernel ends"), str(sim.report.races[0])


def test_a_race_on_a_pipelines_own_slots_says_whose_they_are():
  """The consumer reads its slot and releases it with no commit_smem: the
  next TMA load into that slot races with the read. The slots and barriers
  are the pipeline's own (JAX's names): the report says whose."""
  F32 = jnp.float32

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 128), F32), num_threads=2,
                thread_name="wg")
  def k(x_ref, o_ref):
    def compute(pipeline):
      o_ref[...] = pipeline(jnp.zeros((64, 128), F32))

    def body(_, x_smem, carry):
      return carry + x_smem[...]  # (released with no commit_smem)

    plgpu.emit_pipeline_warp_specialized(
        body, in_specs=[plgpu.BlockSpec((64, 128), lambda i: (i, 0))], grid=(4,),
        compute_context=compute, max_concurrent_steps=2, num_compute_wgs=1,
        memory_registers=40, memory_thread_idx=1, wg_axis="wg")(x_ref)

  x = jnp.arange(256 * 128, dtype=F32).reshape(256, 128)
  sim = ps.simulate(k, x, on_race="report")
  np.testing.assert_array_equal(sim.outputs, np.asarray(x).reshape(4, 64, 128).sum(0))
  (race,) = sim.report.races
  text = str(race)
  assert text.startswith("read-write race on emit_pipeline_warp_specialized's "
                         "flat_in_smem_refs[0] elements"), text
  assert ("arrives on emit_pipeline_warp_specialized's flat_consumed_barrier_refs[0][0]"
          in text), text
  src = open(__file__).read().splitlines()
  line = next(i for i, t in enumerate(src, 1)
              if t.strip().startswith("return carry + x_smem[...]  # (released"))
  assert race.first.where.endswith(f":{line}"), race.first.where
