"""The machine's shape: block groups merged in order, the happens-before
observer, the timing component, and the fixes that came with them."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import kernels as K
import pallas_sim as ps
from pallas_sim import gpus
from pallas_sim.backends.sim.frontend import capture
from pallas_sim.backends.sim.execute.executor import Executor
from pallas_sim.options import Options
from pallas_sim.backends.sim.execute.tuning import Tuning
from pallas_sim.backends.sim.timing.model import Engines, Timing
from test_quickstart import matmul_mcs

F32 = jnp.float32
X = jnp.arange(2 * 128, dtype=F32).reshape(2, 128) + 1


def run_on(ex, fn, *args):
  """fn(*args) simulated by the executor `ex` (for options the API keeps
  internal)."""
  capture.push_executor(ex)
  try:
    with capture.force_sim():
      out = jax.block_until_ready(fn(*args))
      jax.effects_barrier()
  finally:
    capture.pop_executor(ex)
  return out


def test_barrier_arrival_hands_over_at_the_arrivers_time():
  """A producer that computes for a while before arriving hands over then,
  not at the time its step began (a bug: waiters woke at their own time)."""
  steps = 400

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), F32),
                scratch_types=[plgpu.Barrier()], num_threads=2, thread_name="t")
  def k(x_ref, o_ref, bar):
    t = lax.axis_index("t")

    @pl.when(t == 1)
    def _producer():
      v = lax.fori_loop(0, steps, lambda i, v: v * 1.0001 + 1.0, x_ref[0])
      o_ref[1] = v
      plgpu.barrier_arrive(bar)

    @pl.when(t == 0)
    def _consumer():
      plgpu.barrier_wait(bar)
      o_ref[0] = x_ref[0]

  sim = ps.simulate(k, X)
  [rep] = sim.report.kernels
  [(_, _, who, name, start, end)] = [e for e in rep.trace if e[3].startswith("wait")]
  assert who == "block () thread 0"
  # The producer's loop alone costs at least one issue per step.
  assert end >= steps * gpus.H100.op_overhead_cycles
  assert rep.block_cycles_max >= end


def test_misuse_is_reported_without_race_checking():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), F32),
                scratch_types=[plgpu.Barrier(), plgpu.SMEM((128,), F32)],
                num_threads=2, thread_name="wg")
  def k(x_ref, o_ref, bar, smem):
    wg = lax.axis_index("wg")

    @pl.when(wg == 1)
    def _():
      plgpu.barrier_arrive(bar)
      plgpu.barrier_arrive(bar)  # the waiter has not observed the first

    @pl.when(wg == 0)
    def _():
      plgpu.barrier_wait(bar)
      plgpu.barrier_wait(bar)
      smem[...] = x_ref[0]
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(smem, o_ref.at[0])  # never awaited

  for check_races in (False, True):
    sim = ps.simulate(k, X, check_races=check_races, on_race="report",
                      on_uninitialized="report")
    kinds = [r.kind for r in sim.report.races]
    assert kinds == ["lost barrier completion", "unawaited TMA store"], kinds
    [unset] = sim.report.uninitialized  # (o_ref[1] is never written)
    assert unset.kind == "unwritten output" and "o_ref[1:2, 0:128]" in unset.text
  with pytest.raises(ps.RaceError, match="lost barrier completion"):
    ps.run(k, X, backend="sim", check_races=False)


def test_every_error_of_a_simulation_is_raised():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32),
                scratch_types=[plgpu.Barrier()])
  def stuck(o_ref, bar):
    plgpu.barrier_wait(bar)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((1024,), F32), grid=(8,), grid_names=("i",))
  def overrun(o_ref):
    o_ref[pl.ds(lax.axis_index("i") * 128 + 64, 128)] = jnp.zeros((128,), F32)

  with pytest.raises(ps.DeadlockError) as e:
    with ps.backend("sim"):
      stuck()
      overrun()
  assert [type(x) for x in e.value.errors] == [ps.DeadlockError, ps.OutOfBoundsError]
  assert any("1 more error(s)" in n and "OutOfBoundsError" in n
             for n in e.value.__notes__)


def test_wgmma_rate_depends_on_the_operand_type():
  t = Timing(gpus.H100)
  busy = {}
  for dt in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float8_e4m3fn, jnp.int8):
    start, done, *_ = t.wgmma(Engines(), 0.0, 64, 256, 64, np.dtype(dt))
    busy[np.dtype(dt).name] = (done - start - gpus.H100.wgmma_latency
                               - gpus.H100.wgmma_issue_cycles)
  flops = 2 * 64 * 256 * 64
  for name, kind in (("float16", "f16"), ("bfloat16", "bf16"), ("float32", "tf32"),
                     ("float8_e4m3fn", "fp8"), ("int8", "int8")):
    assert busy[name] == flops / gpus.H100.tensor_rate(kind)
  # (each type's rate measured: tf32 about half f16's, fp8 and int8 twice)
  f16 = busy["float16"]
  assert 0.95 < busy["bfloat16"] / f16 < 1.05 and 1.9 < busy["float32"] / f16 < 2.1
  assert 0.45 < busy["float8_e4m3fn"] / f16 < 0.55 and 0.45 < busy["int8"] / f16 < 0.55


def test_co_resident_blocks_compete_for_their_sms_engines():
  """Two blocks per SM: each sees half its SM's TMA engine, so both take
  longer than a block alone on its SM, by the same amount whatever the
  order they are simulated in."""
  sms = gpus.H100.num_sms
  kernel = lambda nblocks: copy_kernel(nblocks, 20 * 1024)  # 2 blocks per SM

  x = jnp.ones((2 * sms, 64, 128), F32)
  one = ps.simulate(kernel(sms), x[:sms]).report.kernels[0]
  two = ps.simulate(kernel(2 * sms), x).report.kernels[0]
  assert one.blocks_per_sm == two.blocks_per_sm == 2 and two.waves == 1
  assert one.block_cycles_max == one.block_cycles_min
  assert two.block_cycles_max == two.block_cycles_min > one.block_cycles_min
  assert two.time_s > one.time_s
  # (the transfer is what they share: the latency after it is not)
  lat = gpus.H100.tma_latency
  assert two.block_cycles_min - one.block_cycles_min < one.block_cycles_min - lat


def copy_kernel(nblocks, smem_floats):
  """Block b copies x[b] through SMEM into o[b]; `smem_floats` more of SMEM
  set how many blocks fit on an SM."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((nblocks, 64, 128), F32),
                grid=(nblocks,), grid_names=("b",),
                scratch_types=[plgpu.SMEM((64, 128), F32), plgpu.Barrier(),
                               plgpu.SMEM((smem_floats,), F32)])
  def k(x_ref, o_ref, smem, bar, _):
    b = lax.axis_index("b")
    plgpu.copy_gmem_to_smem(x_ref.at[b], smem, bar)
    plgpu.barrier_wait(bar)
    plgpu.copy_smem_to_gmem(smem, o_ref.at[b])
    plgpu.wait_smem_to_gmem(0)
  return k


def test_a_last_wave_that_does_not_fill_the_sms_shares_less():
  from pallas_sim.backends.sim.timing.model import Timing
  sms = gpus.H100.num_sms
  lt = Timing(gpus.H100).launch(2 * sms + 10, 100 * 1024, 1)  # 2 per SM, 2 waves
  assert (lt.per_sm, lt.waves) == (2, 2)
  assert [lt.share(b) for b in (0, sms, 2 * sms - 1)] == [2, 2, 2]
  assert [lt.share(b) for b in (2 * sms, 2 * sms + 9)] == [1, 1]
  assert lt.engines(0).share == 2 and lt.engines(2 * sms).share == 1


def test_clock_components_are_sized_per_kernel_not_capped():
  """300 barriers (ten groups of 30: the lowering takes at most 32 per
  group) and two warpgroups: far over the 255 clocks race detection used to
  allow per block."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), F32),
                scratch_types=[plgpu.SMEM((128,), F32)]
                + [plgpu.Barrier(num_barriers=30)] * 10,
                num_threads=2, thread_name="wg")
  def k(x_ref, o_ref, smem, *bars):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      smem[...] = x_ref[0] * 2
      for group in bars:
        for i in range(30):
          plgpu.barrier_arrive(group.at[i])

    @pl.when(wg == 1)
    def _():
      for group in bars:
        plgpu.barrier_wait(group.at[29])
      o_ref[0] = smem[...]
      o_ref[1] = x_ref[1]

  sim = ps.simulate(k, X)
  assert not sim.report.races
  np.testing.assert_array_equal(np.asarray(sim.outputs)[0], 2 * np.asarray(X)[0])


def writes_twice_and_reads_back(cross=False):
  """Block i writes its row twice (the second value must stay) and reads it
  back into a second output; `cross`: it also copies the previous block's
  row into a third (another group's write: a race between blocks, and a
  launch that then runs in one process)."""
  @plgpu.kernel(out_type=(jax.ShapeDtypeStruct((8, 128), F32),) * (3 if cross else 2),
                grid=(8,), grid_names=("i",))
  def k(x_ref, o_ref, p_ref, *q):
    i = lax.axis_index("i")
    o_ref[i] = x_ref[i]
    o_ref[i] = x_ref[i] * 3
    p_ref[i] = o_ref[i] + 1
    if cross:
      q[0][i] = o_ref[(i + 7) % 8]
  return k


DETACHED_CASES = [
    ("quickstart matmul", lambda a, b: matmul_mcs(a, b), "ab"),
    ("racy matmul (delay_release=0)", lambda a, b: matmul_mcs(a, b, delay_release=0), "ab"),
] + [(name, fn, make) for name, fn, make, _ in K.EXAMPLES if name not in K.NOT_LOWERABLE]
DETACHED_CASES.append(("writes twice and reads back", writes_twice_and_reads_back(True),
                       lambda seed: (jnp.asarray(np.random.default_rng(seed).standard_normal(
                           (8, 128)), F32),)))


@pytest.mark.parametrize("name,fn,args", DETACHED_CASES, ids=[c[0] for c in DETACHED_CASES])
def test_detached_groups_merge_to_the_same_outputs_and_reports(rng, name, fn, args):
  """Groups run on their own copies of GMEM, their writes applied at the
  merge in block order (as a run over several processes would): the same
  outputs, bit for bit, and the same race reports in the same order."""
  if args == "ab":
    a = jnp.asarray(rng.standard_normal((256, 512)), jnp.float16)
    args = (a, a.T)
  else:
    args = args(0)
  results = []
  for detached in (False, True):
    ex = Executor(Options(check_races=True, on_race="report"),
                  tuning=Tuning(detached_groups=detached))
    out = run_on(ex, fn, *args)
    results.append(([np.asarray(x) for x in jax.tree.leaves(out)],
                    [str(r) for r in ex.report.races]))
  (o1, r1), (o2, r2) = results
  for x, y in zip(o1, o2):
    np.testing.assert_array_equal(x, y)
  assert r1 == r2


def test_cross_block_races_are_found_when_groups_merge():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 128), F32), grid=(4,), grid_names=("i",))
  def k(x_ref, o_ref):
    i = lax.axis_index("i")
    o_ref[i] = x_ref[i % 2]
    o_ref[(i + 1) % 4] = x_ref[0]  # the next block's row

  ex = Executor(Options(check_races=True, on_race="report"), tuning=Tuning(detached_groups=True))
  run_on(ex, k, jnp.ones((2, 128), F32))
  # Block i+1's own row was written by block i before it, in block order;
  # block 3's "next" row 0 comes after block 0's own write.
  rows = [(r.kind, r.first.where.rsplit(":")[1], r.second.where.rsplit(":")[1], r.count)
          for r in ex.report.races]
  mine, nxt = (str(_line(test_cross_block_races_are_found_when_groups_merge, s))
               for s in ("o_ref[i] =", "o_ref[(i + 1) % 4]"))
  assert rows == [("write-write race between blocks", nxt, mine, 3),
                  ("write-write race between blocks", mine, nxt, 1)]
  assert all("blocks of one launch are unordered" in r.advice for r in ex.report.races)


def _line(fn, needle):
  import inspect
  src, start = inspect.getsourcelines(fn)
  return start + [i for i, t in enumerate(src) if needle in t][0]


def test_cross_block_records_widen_when_they_pass_16_bits():
  """Per element, one record of a block and a site (CrossBlock.record), in
  16 bits while they fit (a quarter of the memory of a 32-bit block and a
  site, for an 8192^2 output); the record numbered past that widens them,
  and the race still names both sites and the block."""
  from pallas_sim.backends.sim.machine import memory
  from pallas_sim.backends.sim.checks import races
  from pallas_sim.backends.sim.checks.cross_block import CrossBlock
  log = races.RaceLog("k")
  cross = CrossBlock(log)
  buf = memory.Buffer("out", "gmem", np.zeros((4, 8), np.float32))
  first = log.site("thread", "store", "a.py:1", "out", "write", 0)
  late = log.site("thread", "store", "b.py:2", "out", "write", 0)
  cross.access(0, (0,), buf, 0, (8, 1), (1, 8), first, True, False)
  assert cross.summaries[id(buf)].xw.dtype == np.uint16
  for me in range(10, 10 + (1 << 16)):
    cross.record(me, first)
  cross.access(1, (1,), buf, 8, (8, 1), (1, 8), late, True, False)
  assert cross.summaries[id(buf)].xw.dtype == np.int32
  cross.access(2, (2,), buf, 8, (8, 1), (1, 8), first, True, False)
  cross.access(2, (2,), buf, 0, (8, 1), (1, 8), late, False, False)
  [ww, wr] = log.races()
  assert (ww.first, ww.second, ww.kind) == (late, first, "write-write race between blocks")
  assert (wr.first, wr.second, wr.kind) == (first, late, "write-read race between blocks")


@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
def test_released_shadow_elements_read_zero_and_the_rest_is_kept(dtype):
  """races.release: the elements of [lo, hi) read 0 (their whole pages go
  back to the OS on Linux), every other element keeps its value."""
  from pallas_sim.backends.sim.checks.races import release
  arr = np.arange(1, 3_000_001, dtype=np.int64).astype(dtype).reshape(1000, 3000)
  want = arr.copy()
  for lo, hi in [(5, 17), (12_345, 1_234_567), (2_999_000, 3_000_000), (0, 1)]:
    release(arr, lo, hi)
    want.reshape(-1)[lo:hi] = 0
    np.testing.assert_array_equal(arr, want)
  arr[...] = 7  # (pages given back are usable again)
  assert (arr == 7).all()


def _smaps(address, field):
  """The values of `field` (e.g. "AnonHugePages:") in /proc/self/smaps for
  the mapping holding `address` (Linux)."""
  with open("/proc/self/smaps") as f:
    lines = f.read().splitlines()
  for i, line in enumerate(lines):
    head = line.split(" ", 1)[0]
    if "-" in head and all(c in "0123456789abcdef-" for c in head):
      lo, hi = (int(x, 16) for x in head.split("-"))
      if lo <= address < hi:
        return next(r.split()[1:] for r in lines[i + 1:] if r.startswith(field))
  raise AssertionError("no mapping")


def _huge_kb(address):
  """AnonHugePages (kB) of the mapping holding `address` (Linux)."""
  return int(_smaps(address, "AnonHugePages:")[0])


def test_large_shadows_are_zeroed_lazily_in_base_pages():
  """memory.base_pages, as shadows use it: a large flat shadow reads zero,
  is writable, and is mapped in base pages (no transparent huge pages:
  each touch after a release would zero 2 MiB), which release() gives back
  as it does numpy's."""
  from pallas_sim.backends.sim.machine.memory import base_pages
  from pallas_sim.backends.sim.checks.races import release
  arr = base_pages(8 << 20, np.int32)  # 32 MiB
  assert arr.dtype == np.int32 and arr.shape == (8 << 20,) and not arr.any()
  arr[:] = 5  # (every page touched)
  release(arr, 4096, 6 << 20)
  want = np.full(8 << 20, 5, np.int32)
  want[4096:6 << 20] = 0
  np.testing.assert_array_equal(arr, want)
  if sys.platform.startswith("linux"):
    assert _huge_kb(arr.__array_interface__["data"][0]) == 0


def _groups_made(monkeypatch):
  """Weak references to every Group made from now on."""
  import weakref

  from pallas_sim.backends.sim.execute import group as group_mod
  made = []
  init = group_mod.Group.__init__

  def tracked(self, *args, **kw):
    init(self, *args, **kw)
    made.append(weakref.ref(self))
  monkeypatch.setattr(group_mod.Group, "__init__", tracked)
  return made


def test_a_launchs_groups_are_freed_once_it_ends(monkeypatch):
  """A barrier names its buffer, whose object array holds the barrier:
  numpy arrays are invisible to Python's cyclic collector, so unless the
  group breaks that cycle at its end, every group of a launch (its blocks,
  warpgroups, clocks and events) stays in memory for good; a launch that
  deadlocks too."""
  import gc
  made = _groups_made(monkeypatch)
  a = jnp.asarray(np.random.default_rng(0).standard_normal((256, 256)), jnp.float16)
  sim = ps.simulate(lambda x, y: matmul_mcs(x, y), a, a, workers=1)
  assert sim.report.kernels[0].num_blocks == 4 and len(made) >= 4
  del sim

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32),
                scratch_types=[plgpu.SMEM((128,), jnp.float32),
                               plgpu.Barrier(num_arrivals=2)])
  def deadlocks(x_ref, o_ref, smem, bar):
    plgpu.copy_gmem_to_smem(x_ref, smem, bar)  # one arrival of two
    plgpu.barrier_wait(bar)
    o_ref[...] = smem[...]
  before = len(made)
  with pytest.raises(ps.DeadlockError):
    ps.run(deadlocks, jnp.zeros((128,), jnp.float32), backend="sim")
  assert len(made) > before
  gc.collect()
  assert [r for r in made if r() is not None] == []


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_large_gmem_arrays_are_in_base_pages():
  """Outputs (poison), their written-masks and input copies of 2 MiB or more
  are asked for base pages (VmFlags "nh"): a transparent huge page written
  by a worker and by the parent after the fork counts as private to every
  worker, against benchmarks/memory.py's bound; small ones stay numpy's
  own. Their values are as before: NaN poison, a False mask, an equal copy."""
  from pallas_sim.backends.sim.checks import initcheck
  from pallas_sim.backends.sim.machine import memory
  out = memory.poison((1024, 1024), np.float32)
  assert np.isnan(out).all() and out.flags.writeable
  buf = memory.Buffer("o", "gmem", memory.poison((2048, 1024), np.int8))
  assert (buf.data == np.int8(-128 + 0x5A)).all()
  initcheck.track(buf)
  x = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
  x.flags.writeable = False
  dup = memory.copy(x)
  np.testing.assert_array_equal(dup, x)
  assert dup.flags.writeable and not np.shares_memory(dup, x)
  for arr in (out, buf.data, buf.written, dup):
    flags = _smaps(arr.__array_interface__["data"][0], "VmFlags:")
    assert "nh" in flags, flags
  assert not buf.written.any()
