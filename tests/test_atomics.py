"""Atomic stores (plgpu.atomic_add and friends) and async_store_smem (a
store of registers into a cluster peer's SMEM, completing its barrier)."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

M, N = 128, 64


def two_thread_atomic(op="add", dtype=jnp.int32, plain_second=False, unsynced_reader=None):
  """Both warpgroups combine their half of the input into one SMEM tile
  (thread 1 with a plain store instead, with `plain_second`); thread 0
  stores the tile after a barrier, or `unsynced_reader` with none."""
  fn = getattr(plgpu, f"atomic_{op}")

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((M, N), dtype), num_threads=2,
                thread_name="wg",
                scratch_types=[plgpu.SMEM((M, N), dtype), plgpu.Barrier(num_arrivals=2)])
  def k(x_ref, o_ref, smem, bar):
    wg = lax.axis_index("wg")

    @pl.when(wg == 0)
    def _():
      smem[...] = x_ref[2 * M:]
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)
    val = x_ref[pl.ds(wg * M, M)]
    if plain_second:
      @pl.when(wg == 0)
      def _():
        fn(smem, val)

      @pl.when(wg == 1)
      def _():
        smem[...] = val
    else:
      fn(smem, val)
    if unsynced_reader is None:
      plgpu.barrier_arrive(bar)
      plgpu.barrier_wait(bar)

    @pl.when(wg == (0 if unsynced_reader is None else unsynced_reader))
    def _():
      o_ref[...] = smem[...]
  return k


def _inputs(dtype):
  rng = np.random.default_rng(0)
  if jnp.issubdtype(dtype, jnp.floating):
    return jnp.asarray(rng.standard_normal((3 * M, N)), dtype)
  return jnp.asarray(rng.integers(-1000, 1000, (3 * M, N)), dtype)


def _unsigned(f):
  return lambda a, b: f(a.view(np.uint32), b.view(np.uint32)).view(a.dtype)


# int32 max/min compare as unsigned: what the lowering emits (measured on an
# H200, lab/atomic_probe.py).
REFERENCE = {"add": np.add, "max": _unsigned(np.maximum), "min": _unsigned(np.minimum),
             "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


@pytest.mark.parametrize("op,dtype", [("add", jnp.int32), ("add", jnp.float32),
                                      ("max", jnp.int32), ("min", jnp.int32),
                                      ("and", jnp.int32), ("or", jnp.int32),
                                      ("xor", jnp.int32)])
def test_atomics_of_two_threads_combine_without_races(op, dtype):
  x = _inputs(dtype)
  sim = ps.simulate(two_thread_atomic(op, dtype), x)
  a, b, init = np.asarray(x[:M]), np.asarray(x[M:2 * M]), np.asarray(x[2 * M:])
  f = REFERENCE[op]
  # (the threads' order is not defined: float sums may round either way)
  out = np.asarray(sim.outputs)
  assert np.all((out == f(f(init, a), b)) | (out == f(f(init, b), a)))
  assert sim.report.races == []


def test_a_plain_store_against_an_atomic_one_races():
  x = _inputs(jnp.int32)
  sim = ps.simulate(two_thread_atomic(plain_second=True), x, on_race="report")
  assert len(sim.report.races) == 1
  r = str(sim.report.races[0])
  assert "write-write race on smem" in r and "atomic_add" in r and "store" in r


def exchange(atomic=None, wait=True):
  """Each block of a cluster of 2 stores its tile into the other's SMEM
  (combined by `atomic` with what is there), then reads its own."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 64, 32), jnp.int32),
                scratch_types=[plgpu.SMEM((64, 32), jnp.int32), plgpu.Barrier(),
                               plgpu.Barrier(), plgpu.ClusterBarrier(collective_axes=("c",))],
                cluster=(2,), cluster_names=("c",))
  def k(x_ref, init_ref, o_ref, smem, init_bar, bar, cbar):
    me = lax.axis_index("c")
    plgpu.copy_gmem_to_smem(init_ref.at[me], smem, init_bar)
    plgpu.barrier_wait(init_bar)
    plgpu.barrier_arrive(cbar)
    plgpu.barrier_wait(cbar)
    x = plgpu.load(x_ref.at[me], layout=plgpu.Layout.WGMMA, optimized=False)
    plgpu.async_store_smem(x, smem, bar, cluster_idx=1 - me, cluster_dim="c",
                           atomic=atomic)
    if wait:
      plgpu.barrier_wait(bar)
    o_ref[me] = plgpu.load(smem, layout=plgpu.Layout.WGMMA)
    if not wait:
      plgpu.barrier_wait(bar)
  return k


def _exchange_args():
  x = jnp.arange(2 * 64 * 32, dtype=jnp.int32).reshape(2, 64, 32)
  return x, jnp.full((2, 64, 32), 10, jnp.int32)


@pytest.mark.parametrize("atomic", [None, "add"])
def test_async_store_smem_lands_in_the_peer_and_completes_its_barrier(atomic):
  x, init = _exchange_args()
  sim = ps.simulate(exchange(atomic), x, init)
  want = x[::-1] + (10 if atomic else 0)
  np.testing.assert_array_equal(sim.outputs, want)
  assert sim.report.races == []


def test_reading_before_the_async_store_lands_races():
  x, init = _exchange_args()
  sim = ps.simulate(exchange(wait=False), x, init, on_race="report")
  text = "\n".join(str(r) for r in sim.report.races)
  assert "race on smem" in text and "async_store_smem" in text, text


def atomic_then_plain_read(plain, reader=1):
  """Two blocks add their rows into out[0] atomically; block `reader` then
  reads out[0] with a plain load (`plain`, a race: the other block's add may
  come later) or adds it once more atomically. (Block 0's accesses are met
  first: reader 0 puts the plain read first, reader 1 the atomic.)"""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, M, N), jnp.int32), grid=(2,),
                grid_names=("b",))
  def k(x_ref, o_ref):
    b = lax.axis_index("b")
    plgpu.atomic_add(o_ref.at[0], x_ref[pl.ds(b * M, M)])  # the-atomic

    @pl.when(b == reader)
    def _():
      if plain:
        o_ref[1] = o_ref[0]  # the-plain-read
      else:
        plgpu.atomic_add(o_ref.at[1], x_ref[pl.ds(0, M)])
  return k


def _line(marker):
  """A pattern for this file's line that ends with `# marker`, as reports
  name it (relative to the working directory)."""
  with open(__file__) as f:
    hits = [i for i, t in enumerate(f, 1) if t.rstrip().endswith(f"# {marker}")]
  return rf"\S*test_atomics\.py:{hits[0]}"


@pytest.mark.parametrize("reader", [0, 1])
def test_a_plain_read_of_what_other_blocks_add_atomically_says_so(reader):
  x = _inputs(jnp.int32)
  sim = ps.simulate(atomic_then_plain_read(False, reader), x, on_uninitialized="report")
  assert sim.report.races == []
  sim = ps.simulate(atomic_then_plain_read(True, reader), x, on_race="report",
                    on_uninitialized="report")
  found = [r for r in sim.report.races if "between blocks" in r.kind]
  assert found, "\n".join(map(str, sim.report.races))
  for r in found:
    assert re.search(rf"atomic updates \(atomic_add at {_line('the-atomic')}\) are "
                     "ordered only with other atomic updates", r.advice), str(r)
    assert re.search(rf"the plain read \({_line('the-plain-read')}\) may come",
                     r.advice), str(r)
    assert "make it atomic too" in r.advice and "or use atomics" not in r.advice, str(r)


@pytest.mark.parametrize("reader", [0, 1])
def test_a_plain_read_after_both_threads_atomics_races_whichever_thread_reads(reader):
  """Both threads add atomically into SMEM, then one reads it with no
  barrier: the other thread's add is unordered with the read, whichever of
  the two added last here (the reader's own add must not hide it)."""
  sim = ps.simulate(two_thread_atomic(unsynced_reader=reader), _inputs(jnp.int32),
                    on_race="report")
  found = [r for r in sim.report.races if r.second.agent == "thread"
           and r.second.prim == "load" or r.first.prim == "load"]
  assert found, "\n".join(map(str, sim.report.races))
  assert all("atomic_add" in str(r) for r in found)
