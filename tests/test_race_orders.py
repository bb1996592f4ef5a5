"""Each race check in every order the detector handles differently: the
other access made before the async work lands and after it, an atomic
before and after a plain access, a lost barrier completion seen by the
simulated order and only by happens-before. Orders are drawn (hypothesis
over pl.delay) where one kernel can take them all."""
import jax
import jax.numpy as jnp
import numpy as np
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim.backends.sim.checks import races as races_mod

F32 = jnp.float32
X = jnp.arange(64 * 32, dtype=F32).reshape(64, 32)


def _races(fn, *args):
  return ps.simulate(fn, *args, on_race="report", on_uninitialized="report").report


def store_then_write(read_only, rows):
  """A TMA store to out, a wait for it, a TMA load of `rows` rows waited for
  (0: none), then a plain store to the same out. wait_read_only=True waits
  for the store's SMEM reads only: its GMEM write still races with the plain
  one, whether the plain store comes before the TMA store lands (no load, a
  short one) or after (the thread blocks on a long load first, and the
  landing is applied before the plain store is)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((64, 32), F32),
                scratch_types=[plgpu.SMEM((64, 32), F32), plgpu.SMEM((256, 32), F32),
                               plgpu.Barrier()])
  def k(x_ref, y_ref, o_ref, smem, smem2, bar):
    smem[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0, wait_read_only=read_only)
    if rows:
      plgpu.copy_gmem_to_smem(y_ref.at[pl.ds(0, rows)], smem2.at[pl.ds(0, rows)], bar)
      plgpu.barrier_wait(bar)
    o_ref[...] = x_ref[...] * 2.0
    plgpu.wait_smem_to_gmem(0)
  return k


Y = jnp.ones((256, 32), F32)
ROWS = st.sampled_from([0, 8, 32, 64, 128, 256])


@settings(max_examples=6, deadline=None)
@given(ROWS)
def test_a_read_only_wait_leaves_the_store_s_write_racing_in_either_order(rows):
  report = _races(store_then_write(True, rows), X, Y)
  found = [r for r in report.races if r.kind == "write-write race"]
  assert found, "\n".join(map(str, report.races))
  assert {found[0].first.agent, found[0].second.agent} == {"tma_store", "thread"}
  assert _races(store_then_write(False, rows), X, Y).races == []


def _checked_by(fn, *args):
  """The report, and the agent of each access whose check reported a race
  (a landing of async work, or a thread's access), in order."""
  found = []
  orig = races_mod.Tracker.report

  def spy(self, *a):
    found.append(a[8].agent)  # (the access being checked: its site)
    return orig(self, *a)
  races_mod.Tracker.report = spy
  try:
    return _races(fn, *args), found
  finally:
    races_mod.Tracker.report = orig


def _found_by(rows):
  """Which access's check reported the race: the TMA store's landing, or
  the plain store."""
  report, found = _checked_by(store_then_write(True, rows), X, Y)
  assert [r.kind for r in report.races] == ["write-write race"], report.races
  return found


def test_the_draws_take_both_orders_of_the_landing_and_the_plain_store():
  """What the draws above span: no load, and the landing finds the plain
  store; a long load, and the plain store finds the landed write."""
  assert _found_by(0) == ["tma_store"]
  assert _found_by(256) == ["thread"]


M, N = 64, 32


def atomic_and_plain(plain_write, atomic_rows, plain_rows):
  """After a barrier, thread 0 adds into SMEM atomically and thread 1
  stores to (or loads from) it plainly, each first blocking on a TMA load of
  its own of that many rows (0: none), which decides which access the
  simulation makes first: nothing orders the two, whichever it is."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((M, N), jnp.int32), num_threads=2,
                thread_name="wg",
                scratch_types=[plgpu.SMEM((M, N), jnp.int32), plgpu.Barrier(num_arrivals=2),
                               plgpu.SMEM((2, 256, N), jnp.int32), plgpu.Barrier(num_barriers=2)])
  def k(x_ref, y_ref, o_ref, smem, bar, scratch, loaded):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      smem[...] = x_ref[...]
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)

    def first_load(i, rows):
      if rows:
        plgpu.copy_gmem_to_smem(y_ref.at[pl.ds(0, rows)],
                                scratch.at[i, pl.ds(0, rows)], loaded.at[i])
        plgpu.barrier_wait(loaded.at[i])

    @pl.when(wg == 0)
    def _():
      first_load(0, atomic_rows)
      plgpu.atomic_add(smem, x_ref[...])

    @pl.when(wg == 1)
    def _():
      first_load(1, plain_rows)
      if plain_write:
        smem[...] = x_ref[...]
      else:
        o_ref[...] = smem[...]
  return k


XI = jnp.arange(M * N, dtype=jnp.int32).reshape(M, N)
YI = jnp.ones((256, N), jnp.int32)
LOAD_ROWS = st.sampled_from([0, 64, 256])


@settings(max_examples=12, deadline=None)
@given(st.booleans(), LOAD_ROWS, LOAD_ROWS)
def test_an_atomic_and_a_plain_access_race_in_either_order(plain_write, ra, rp):
  report = _races(atomic_and_plain(plain_write, ra, rp), XI, YI)
  found = [r for r in report.races if {r.first.prim, r.second.prim} ==
           {"atomic_add", "store" if plain_write else "load"}]
  assert found, "\n".join(map(str, report.races))


def _order(plain_write, ra, rp):
  seen = []
  orig = races_mod.Tracker.access

  def spy(self, buf, *args, **kw):
    if buf.name == "smem":
      seen.append(args[4].prim)  # (its site)
    return orig(self, buf, *args, **kw)
  races_mod.Tracker.access = spy
  try:
    _races(atomic_and_plain(plain_write, ra, rp), XI, YI)
  finally:
    races_mod.Tracker.access = orig
  return seen[-2:]  # (after the first store, which fills the buffer)


@pytest.mark.parametrize("plain_write", [False, True])
def test_the_draws_take_the_atomic_first_and_the_plain_access_first(plain_write):
  plain = "store" if plain_write else "load"
  assert _order(plain_write, 0, 256) == ["atomic_add", plain]
  assert _order(plain_write, 256, 0) == [plain, "atomic_add"]


def async_then_plain(kind, rows):
  """Async work, then (after blocking on a TMA load of `rows` rows, 0: not)
  a plain access it races with, the work unawaited: `kind` "tma_load" (a
  load into smem, then a plain read of it), "tma_store" (a store from smem,
  then a plain write of it), "wgmma" (a wgmma reading a_s, then a plain
  write of a_s)."""
  T = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(
      (64, 64), jnp.float16 if kind == "tma_store" else F32),
                scratch_types=[plgpu.SMEM((64, 64), jnp.float16, transforms=T),
                               plgpu.SMEM((64, 64), jnp.float16, transforms=T),
                               plgpu.SMEM((256, 32), F32), plgpu.Barrier(),
                               plgpu.Barrier(), plgpu.ACC((64, 64), F32)])
  def k(a_ref, y_ref, o_ref, a_s, b_s, other, bar, bar2, acc):
    plgpu.copy_gmem_to_smem(a_ref, b_s, bar2)
    plgpu.barrier_wait(bar2)
    if kind == "tma_load":
      plgpu.copy_gmem_to_smem(a_ref, a_s, bar)
    else:
      a_s[...] = b_s[...]
      plgpu.commit_smem()
      if kind == "tma_store":
        plgpu.copy_smem_to_gmem(a_s, o_ref)
      else:
        plgpu.wgmma(acc, a_s, b_s)
    if rows:
      plgpu.copy_gmem_to_smem(y_ref.at[pl.ds(0, rows)], other.at[pl.ds(0, rows)], bar2)
      plgpu.barrier_wait(bar2)
    if kind == "tma_load":
      o_ref[...] = a_s[...].astype(F32)  # (the race: the load may not have landed)
      plgpu.barrier_wait(bar)
    else:
      a_s[...] = jnp.zeros((64, 64), jnp.float16)  # (the race: still being read)
      if kind == "tma_store":
        plgpu.wait_smem_to_gmem(0)
      else:
        plgpu.wgmma_wait(0)
        o_ref[...] = acc[...]
  return k


A16 = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)), jnp.float16)


@pytest.mark.parametrize("kind", ["tma_load", "tma_store", "wgmma"])
@pytest.mark.parametrize("rows,landing_finds_it", [(0, True), (256, False)])
def test_async_work_and_a_later_plain_access_race_landing_before_or_after(
    kind, rows, landing_finds_it):
  """Both of the detector's paths: the work lands after the plain access
  (its landing finds the access) or before it (the access finds the landed
  work); which one happens is what `rows` decides."""
  report, found = _checked_by(async_then_plain(kind, rows), A16, Y)
  pairs = [{r.first.agent, r.second.agent} for r in report.races]
  assert {kind, "thread"} in pairs, "\n".join(map(str, report.races))
  assert found[0] == (kind if landing_finds_it else "thread"), found
