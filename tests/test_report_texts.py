"""Whole texts of representative reports and errors, as a user reads them:
every sentence ends, both sides of a race are named (blocks and threads),
nothing trails the last finding."""
import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

F32 = jnp.float32


def _line(marker):
  """`tests/test_report_texts.py:N` for this file's line that ends with
  `# marker`, as reports name it (run from the checkout's root)."""
  with open(__file__) as f:
    [n] = [i for i, t in enumerate(f, 1) if t.rstrip().endswith(f"# {marker}")]
  return f"tests/test_report_texts.py:{n}"


@plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32), grid=(4,), grid_names=("x",))
def every_block_writes_all(o_ref):
  o_ref[...] = jnp.full((128,), 1.0, F32) * lax.axis_index("x").astype(F32)  # the-store


def test_a_race_between_blocks_names_both_blocks():
  sim = ps.simulate(every_block_writes_all, on_race="report")
  [r] = sim.report.races
  store = _line("the-store")
  assert str(r).splitlines() == [
      "write-write race between blocks on o_ref elements (0,)..(127,) (bytes 0..512) "
      "(blocks (0,) and (1,); 3 occurrences):",
      f"    first:  write of o_ref by thread 0 of block (0,) (store at {store})",
      f"    second: write of o_ref by thread 0 of block (1,) (store at {store})",
      "    blocks of one launch are unordered: give each block its own bytes, or use "
      "atomics / separate kernels"]


@plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32),  # the-kernel
              scratch_types=[plgpu.SMEM((128,), F32), plgpu.Barrier()])
def read_before_the_wait(x_ref, o_ref, smem, bar):
  plgpu.copy_gmem_to_smem(x_ref, smem, bar)  # the-load
  o_ref[...] = smem[...]  # the-read
  plgpu.barrier_wait(bar)


def test_a_raised_race_error_ends_with_its_last_finding_and_notes_the_other_error():
  with pytest.raises(ps.RaceError) as e:
    ps.simulate(read_before_the_wait, jnp.ones((128,), F32))
  load, read, kernel = _line("the-load"), _line("the-read"), _line("the-kernel")
  assert str(e.value).splitlines() == [
      f"{kernel}: 1 race(s) in kernel read_before_the_wait:",
      "write-read race on smem elements (0,)..(127,) (bytes 0..512):",
      f"    first:  write of smem by TMA load issued by thread 0 (copy_gmem_to_smem at "
      f"{load})",
      f"    second: read of smem by thread 0 (load at {read})",
      "    timing: overlapped in the simulated timing: the second access began before "
      "the first had finished, so with this timing the values can be wrong on the GPU "
      "now",
      f"    no barrier_wait between this TMA load ({load}) and this read ({read})",
      "The launch also had 1 uninitialized-memory finding(s), in report.uninitialized:",
      f"  uninitialized read of smem at {read} (caused by the write-read race above)"]
  assert e.value.__notes__ == [
      "and 1 more error(s) in this simulation:\n"
      f"  UninitializedError: {kernel}: 1 uninitialized-memory finding(s) in kernel "
      "read_before_the_wait (.errors[1])"]
  assert [type(x) for x in e.value.errors] == [ps.RaceError, ps.UninitializedError]


def test_launches_that_report_alike_read_as_one_and_a_count():
  """A jitted call in a loop: the first launch's summary, then how many more
  reported alike and their time together; the heading gives the total."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32))
  def twice(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32))
  def plus_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1

  def work(x):
    for _ in range(5):
      x = twice(x)
    return plus_one(x)

  report = ps.simulate(work, jnp.ones((128,), F32)).report
  text = report.summary()
  k = report.kernels[0]
  assert text.splitlines()[0] == (
      "pallas-sim report (h100): 6 kernel launch(es), 0 race(s), 0 uninitialized-memory "
      f"finding(s); predicted {report.time_s * 1e6:.1f} us in all")
  assert text.count("  twice (") == 1 and text.count("  plus_one (") == 1, text
  assert (f"    and 4 more launch(es) of it, reported alike ({5 * k.time_s * 1e6:.1f} us "
          "for the 5)") in text, text
