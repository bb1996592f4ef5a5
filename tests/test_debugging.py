"""Debugging on a laptop: debug_print from kernels, uninitialized reads and
unwritten outputs, runaway kernels (max_cycles, progress, Ctrl-C)."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as hst
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps

F32 = jnp.float32
HERE = os.path.relpath(__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lines(text):
  return [ln for ln in text.splitlines() if ln.startswith("[block")]


# --- debug_print --------------------------------------------------------------

def test_scalars_print_once_per_thread_with_printf_conversions(capsys):
  """pytest's capture sees the lines; integers print as the lowering's %llu
  of the value zero-extended to 64 bits; floats as %f; '%%' is a '%'."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 128), F32), grid=(2,),
                grid_names=("b",), num_threads=2, thread_name="t")
  def k(x_ref, i_ref, o_ref):
    t = lax.axis_index("t")
    pl.debug_print("t={} i={} u8={} flag={}", t, i_ref[0], i_ref[1].astype(jnp.uint8),
                   i_ref[0] < 0)
    pl.debug_print("f32 {} f16 {} bf16 {} 100%% done", x_ref[0],
                   x_ref[1].astype(jnp.float16), x_ref[1].astype(jnp.bfloat16))
    o_ref[t] = x_ref[...]

  x = jnp.arange(128, dtype=F32) / 3 + 1
  i = jnp.array([-1, 255] + [0] * 126, jnp.int32)
  ps.run(k, x, i, backend="sim", on_race="report")
  lines = _lines(capsys.readouterr().out)
  assert len(lines) == 2 * 2 * 2  # blocks x threads x prints
  for b in range(2):
    for t in range(2):
      tag = f"[block ({b},) thread {t}]"
      mine = [ln for ln in lines if ln.startswith(tag)]
      assert mine == [  # in program order per thread
          f"{tag} t={t} i=4294967295 u8=255 flag=1",
          f"{tag} f32 1.000000 f16 1.333008 bf16 1.335938 100% done"], mine


def test_an_array_prints_one_line_per_element(capsys):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32))
  def k(x_ref, o_ref):
    pl.debug_print("x: {}", x_ref[...])
    o_ref[...] = x_ref[...]

  x = jnp.arange(128, dtype=jnp.int32) - 2
  ps.run(k, x, backend="sim")
  lines = _lines(capsys.readouterr().out)
  assert len(lines) == 128
  assert lines[:3] == ["[block ()] x: [0]: 4294967294",
                       "[block ()] x: [1]: 4294967295", "[block ()] x: [2]: 0"]


def test_prints_come_before_a_later_error(capsys):
  """A kernel that deadlocks after printing still shows its prints."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32),
                scratch_types=[plgpu.Barrier()])
  def k(o_ref, bar):
    pl.debug_print("before the wait")
    plgpu.barrier_wait(bar)

  with pytest.raises(ps.DeadlockError):
    ps.run(k, backend="sim")
  assert _lines(capsys.readouterr().out) == ["[block ()] before the wait"]


# --- uninitialized memory ----------------------------------------------------

def _tail_kernel(m, tm, n=128):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((m, n), F32), grid=(m // tm,),
                grid_names=("i",))
  def k(x_ref, o_ref):
    i = lax.axis_index("i")
    o_ref[pl.ds(i * tm, tm), :] = x_ref[pl.ds(i * tm, tm), :] + 1.0
  return k


@given(tiles=hst.integers(1, 4), tm=hst.sampled_from([8, 16, 64]),
       tail=hst.integers(1, 63))
def test_rows_the_grid_does_not_cover_are_reported(tiles, tm, tail):
  """The most common tiling bug: M not a multiple of the tile."""
  m = tiles * tm + tail % (tm - 1) + 1  # a tail of 1..tm-1 rows
  k = _tail_kernel(m, tm)
  sim = ps.simulate(k, jnp.ones((m, 128), F32), on_uninitialized="report")
  [f] = sim.report.uninitialized
  done = (m // tm) * tm
  assert f.kind == "unwritten output" and f.buffer == "o_ref"
  assert f.text.startswith(
      f"o_ref[{done}:{m}, 0:128] of shape ({m}, 128): {(m - done) * 128} of "
      f"{m * 128} elements were never written; what the grid ({m // tm},) wrote lies "
      f"within [0:{done}, 0:128]"), f.text
  assert np.isnan(np.asarray(sim.outputs)[done:]).all()
  # By default it raises, naming the kernel's line.
  with pytest.raises(ps.UninitializedError, match=r"o_ref\[\d+:\d+, 0:128\]") as e:
    ps.run(k, jnp.ones((m, 128), F32), backend="sim")
  assert e.value.findings[0].text == f.text


def test_a_read_of_smem_nothing_wrote_names_buffer_elements_primitive_and_line():
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128, 128), F32),
                scratch_types=[plgpu.SMEM((128, 128), F32)])
  def k(x_ref, o_ref, smem):
    smem[pl.ds(0, 64), :] = x_ref[pl.ds(0, 64), :]
    o_ref[...] = smem[...] * 2  # <- rows 64.. were never written
  line = _marked_line(test_a_read_of_smem_nothing_wrote_names_buffer_elements_primitive_and_line)
  with pytest.raises(ps.UninitializedError) as e:
    ps.run(k, jnp.ones((128, 128), F32), backend="sim")
  [f] = e.value.findings
  assert f.kind == "uninitialized read" and f.buffer == "smem"
  assert str(f).splitlines() == [
      "uninitialized read of smem elements (64, 0)..(127, 127) (bytes 32768..65536):",
      f"    read of smem by thread 0 (load at {line})",
      "    nothing wrote these elements before this read in this launch (the hardware "
      "would read leftover bytes)",
      "    it reaches the outputs: run again with other bits in the memory nothing "
      "wrote, o_ref[64, 0] came out different"]


def test_a_reduction_store_into_an_output_nothing_wrote_says_it_adds_to_leftovers():
  """A TMA store that adds (reduction_op="add") reads its destination: into
  an output nothing wrote it adds to whatever the memory held, and the
  finding says how to give the output its starting values."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32), grid=(2,), grid_names=("i",),
                scratch_types=[plgpu.SMEM((128,), F32)])
  def k(x_ref, o_ref, smem):
    smem[...] = x_ref[...]
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref, reduction_op="add")  # <-
    plgpu.wait_smem_to_gmem(0)
  line = _marked_line(test_a_reduction_store_into_an_output_nothing_wrote_says_it_adds_to_leftovers)
  with pytest.raises(ps.UninitializedError) as e:
    ps.run(k, jnp.ones((128,), F32), backend="sim")
  [f] = e.value.findings
  assert f.buffer == "o_ref" and f.site.agent == "tma_store" and line in str(f), str(f)
  assert ("it adds to what is there: an output starts with whatever the memory held; "
          "pass its starting values in") in str(f), str(f)

  # (a plain TMA store reads only its SMEM source)
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32),
                scratch_types=[plgpu.SMEM((128,), F32)])
  def plain(o_ref, smem):
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(smem, o_ref)
    plgpu.wait_smem_to_gmem(0)
  with pytest.raises(ps.UninitializedError) as e:
    ps.run(plain, backend="sim")
  [f] = e.value.findings
  assert f.buffer == "smem" and "adds to what is there" not in str(f), str(f)


def _marked_line(fn):
  import inspect
  src, start = inspect.getsourcelines(fn)
  [i] = [i for i, s in enumerate(src) if "# <-" in s]
  return f"{HERE}:{start + i}"


def test_async_readers_of_unwritten_smem_are_reported_per_site_and_folded():
  """A TMA store and a wgmma reading SMEM nothing wrote, in every block:
  one finding per site, counted."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((4, 64, 128), F32), grid=(4,),
                grid_names=("i",),
                scratch_types=[plgpu.SMEM((64, 128), F32), plgpu.SMEM((64, 64), jnp.float16),
                               plgpu.SMEM((64, 128), jnp.float16)])
  def k(o_ref, out_smem, a_smem, b_smem):
    a_smem[...] = jnp.zeros((64, 64), jnp.float16)

    def body(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_smem)  # b_smem: never written
      return acc_ref[...]
    out_smem[pl.ds(0, 32), :] = jnp.zeros((32, 128), F32)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, o_ref.at[lax.axis_index("i")])  # half written
    plgpu.wait_smem_to_gmem(0)
    pl.run_state(body)(plgpu.ACC.init(jnp.zeros((64, 128), F32)))

  sim = ps.simulate(k, on_uninitialized="report", check_lowering=False)
  kinds = sorted((f.site.agent, f.buffer, f.count) for f in sim.report.uninitialized)
  assert kinds == [("tma_store", "out_smem", 4), ("wgmma", "b_smem", 4)], kinds


def test_aliased_outputs_count_as_written_and_tma_loads_write():
  """A kernel over refs (core_map in run_state): its outputs are its inputs'
  buffers, holding their values; half of one is rewritten from SMEM."""
  @jax.jit
  def f(x):
    @pl.run_state
    def stateful(refs):
      x_ref, o_ref = refs

      @pl.core_map(plgpu.Mesh())
      def _():
        def scoped(smem, bar):
          plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(0, 128)], smem, bar)
          plgpu.barrier_wait(bar)
          o_ref[pl.ds(128, 128)] = smem[...] + o_ref[pl.ds(128, 128)]
        pl.run_scoped(scoped, plgpu.SMEM((128,), F32), plgpu.Barrier())
    return stateful((x, x))[1]

  x = jnp.arange(256, dtype=F32)
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "jax.experimental.pallas.core_map is deprecated")
    sim = ps.simulate(f, x)
  assert sim.report.uninitialized == []
  np.testing.assert_array_equal(np.asarray(sim.outputs)[128:], x[:128] + x[128:])


def test_reading_what_an_earlier_block_wrote_is_not_uninitialized():
  """Elements written by any block earlier in this launch count as written
  (the order of blocks is the race detector's business)."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32), grid=(2,), grid_names=("i",))
  def k(o_ref):
    @pl.when(lax.axis_index("i") == 0)
    def _():
      o_ref[...] = jnp.ones((128,), F32)

    @pl.when(lax.axis_index("i") == 1)
    def _():
      o_ref[...] = o_ref[...] + 1

  sim = ps.simulate(k, on_race="report")
  assert sim.report.uninitialized == [] and sim.report.races


def test_detached_groups_find_the_same():
  from pallas_sim.backends.sim.frontend import capture
  from pallas_sim.backends.sim.execute.executor import Executor
  from pallas_sim.options import Options
  from pallas_sim.backends.sim.execute.tuning import Tuning
  k = _tail_kernel(200, 64)
  texts = []
  for detached in (False, True):
    ex = Executor(Options(on_uninitialized="report"), tuning=Tuning(detached_groups=detached))
    capture.push_executor(ex)
    try:
      with capture.force_sim():
        jax.block_until_ready(k(jnp.ones((200, 128), F32)))
    finally:
      capture.pop_executor(ex)
    texts.append([str(f) for f in ex.report.uninitialized])
  assert texts[0] == texts[1] and len(texts[0]) == 1


def test_the_check_can_be_switched_off():
  k = _tail_kernel(72, 64)
  sim = ps.simulate(k, jnp.ones((72, 128), F32), check_uninitialized=False)
  assert sim.report.uninitialized == []


PLUGIN_TEST = '''
import jax, jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

@plgpu.kernel(out_type=jax.ShapeDtypeStruct((72, 128), jnp.float32), grid=(1,),
              grid_names=("i",))
def k(x_ref, o_ref):
  o_ref[pl.ds(0, 64), :] = x_ref[pl.ds(0, 64), :]

def test_tail():
  k(jnp.ones((72, 128), jnp.float32))
'''


def _run(args, cwd, **kw):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True,
                        text=True, env=env, **kw)


def test_pytest_plugin_and_check_command_fail_on_unwritten_outputs(tmp_path):
  (tmp_path / "test_tail.py").write_text(PLUGIN_TEST)
  p = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pallas-sim",
            "test_tail.py"], tmp_path)
  assert p.returncode == 1 and "UninitializedError" in p.stdout, p.stdout + p.stderr
  assert "o_ref[64:72, 0:128] of shape (72, 128)" in p.stdout
  p = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--pallas-sim",
            "--pallas-sim-uninitialized", "report", "test_tail.py"], tmp_path)
  assert p.returncode == 0, p.stdout + p.stderr
  assert "o_ref[64:72, 0:128]" in p.stdout  # a warning in pytest's summary

  (tmp_path / "tail.py").write_text(PLUGIN_TEST.replace("def test_tail", "def check_tail"))
  c = _run(["-m", "pallas_sim.cli", "check", "tail.py"], tmp_path)
  assert c.returncode == 1, c.stdout + c.stderr
  assert "FAIL check_tail: 1 uninitialized-memory finding(s)" in c.stdout
  c = _run(["-m", "pallas_sim.cli", "check", "--uninitialized", "report", "tail.py"],
           tmp_path)
  assert c.returncode == 0, c.stdout + c.stderr
  assert "note check_tail: 1 uninitialized-memory finding(s)" in c.stdout
  assert "  in kernel k (tail.py:7): unwritten output: o_ref[64:72, 0:128]" in c.stdout, \
      c.stdout


HYPOTHESIS_TEST = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental.pallas import mosaic_gpu as plgpu
from hypothesis import given, settings, strategies as st


def copy(x, nblocks):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(nblocks,),
                grid_names=("i",))
  def k(x_ref, o_ref):
    o_ref[...] = x_ref[...]  # (every block writes all of o: a race past one block)
  return k(x)


@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(nblocks=st.integers(1, 6))
def test_copy(nblocks):
  x = jnp.arange(128, dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(copy(x, nblocks)), np.arange(128))


@settings(max_examples=4, deadline=None, derandomize=True, database=None)
@given(n=st.sampled_from([128, 256]))
def test_one_block(n):
  x = jnp.arange(n, dtype=jnp.float32)
  np.testing.assert_array_equal(np.asarray(copy(x, 1)), np.arange(n))
"""


def test_under_the_plugin_each_hypothesis_example_is_a_simulation_of_its_own(tmp_path):
  """A race in some examples fails those examples: hypothesis shrinks to the
  smallest (two blocks) and the error tells that example's findings only."""
  (tmp_path / "test_hyp.py").write_text(HYPOTHESIS_TEST)
  p = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "--pallas-sim", "test_hyp.py"], tmp_path)
  out = p.stdout + p.stderr
  assert p.returncode == 1 and "1 failed, 1 passed" in out, out
  # (hypothesis's words for it: "Falsifying example" before 6.1xx, "Failing test case")
  m = re.search(r"(Falsifying example|Failing test case): test_copy\(", out)
  assert m and "nblocks=2," in out[m.end():m.end() + 40], out
  assert "RaceError: test_hyp.py:8: 1 race(s) in kernel k" in out, out
  assert "more error(s)" not in out, out


def test_the_plugin_takes_max_cycles(tmp_path):
  (tmp_path / "test_long.py").write_text(
      "import jax, jax.numpy as jnp\n"
      "from jax import lax\n"
      "from jax.experimental.pallas import mosaic_gpu as plgpu\n"
      "@plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.float32))\n"
      "def counts(o_ref):\n"
      "  n = lax.while_loop(lambda n: n < 10 ** 9, lambda n: n + 1, jnp.int32(0))\n"
      "  o_ref[...] = jnp.full((128,), n, jnp.float32)\n"
      "def test_counts():\n"
      "  counts()\n")
  p = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
            "--pallas-sim", "--pallas-sim-max-cycles", "20000", "test_long.py"], tmp_path)
  out = p.stdout + p.stderr
  assert p.returncode == 1, out
  assert "RunawayKernelError: test_long.py:6: [while] ran past max_cycles=20000" in out, out


# --- runaway kernels ---------------------------------------------------------

def _spinning_kernel(steps=2 ** 31 - 1):
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), F32),
                scratch_types=[plgpu.Barrier()], num_threads=2, thread_name="t")
  def k(x_ref, o_ref, bar):
    t = lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      plgpu.barrier_wait(bar)
      o_ref[...] = x_ref[...]

    @pl.when(t == 1)
    def _():
      n = lax.while_loop(lambda n: n < steps, lambda n: n + 1, jnp.int32(0))  # <-
      o_ref[0] = n.astype(F32)  # (before the arrive: thread 0 writes after its wait)
      plgpu.barrier_arrive(bar)
  return k


def test_max_cycles_ends_a_runaway_loop_at_its_line():
  k = _spinning_kernel(100_000)  # (ends by itself, later: the limit must stop it)
  line = _marked_line(_spinning_kernel)
  with pytest.raises(ps.RunawayKernelError) as e:
    ps.run(k, jnp.ones((128,), F32), backend="sim", max_cycles=20_000)
  assert e.value.where == line, (e.value.where, line)
  assert "ran past max_cycles=20000 simulated cycles in this loop" in str(e.value)
  assert "(in block () thread 1)" in str(e.value)
  assert ps.Options().max_cycles == 2 ** 32  # the documented default


def test_a_loop_that_gives_back_its_state_never_ends_and_is_said_at_once():
  """A while loop with no effects goes on or stops on its carry alone: an
  iteration that gives the carry back unchanged loops for ever (the default
  max_cycles would take the simulation minutes to reach)."""
  def body(o_ref):
    n = lax.while_loop(lambda i: i < 10, lambda i: i * 1, jnp.int32(0))  # <- stuck
    o_ref[...] = jnp.full((128,), n, F32)
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), F32))
  with pytest.raises(ps.RunawayKernelError) as e:
    ps.run(k, backend="sim", max_cycles=1e7)  # (seconds, were it run to the limit)
  assert "this loop never ends: iteration 1 gave back the state it was given" in str(e.value)
  assert e.value.where == _marked_line(body), e.value.where


def test_a_loop_that_cycles_through_states_never_ends_and_is_said_soon():
  """A loop without effects that comes back to a state it had (here every
  third iteration) loops for ever as surely as one whose state stays put;
  one whose states never repeat (a count to 3000) is left to end."""
  def body(o_ref):
    n = lax.while_loop(lambda c: c[0] < 10,  # <- cycling
                       lambda c: ((c[0] + 1) % 3, c[1] + 0.5 * (c[0] == 2) - 0.5 * (c[0] == 0)),
                       (jnp.int32(0), jnp.float32(0)))
    o_ref[...] = jnp.full((128,), n[1], F32)
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), F32))
  with pytest.raises(ps.RunawayKernelError) as e:
    ps.run(k, backend="sim", check_lowering=False, max_cycles=1e7)
  msg = str(e.value)
  assert "this loop never ends: iteration 6 came back to the state it had after " \
         "iteration 3 (a cycle of 3)" in msg, msg
  assert e.value.where == _marked_line(body), e.value.where

  def counting(o_ref):
    n = lax.while_loop(lambda i: i < 3000, lambda i: i + 1, jnp.int32(0))
    o_ref[...] = jnp.full((128,), n, F32)
  k = plgpu.kernel(counting, out_type=jax.ShapeDtypeStruct((128,), F32))
  np.testing.assert_array_equal(ps.run(k, backend="sim", check_lowering=False),
                                np.full((128,), 3000.0))


def test_a_spin_on_a_flag_nothing_can_set_is_said_at_once():
  """A loop that only reads memory and whose condition ignores its carry
  decides on what it reads; with no other thread to run and nothing in
  flight, nothing can change that: it never ends (its carry counts on, so
  no state of it repeats)."""
  def body(x_ref, o_ref, flag):
    flag[...] = jnp.zeros((128,), jnp.int32)
    lax.while_loop(lambda c: flag[...][0] == 0, lambda c: c + 1, 0)  # <- spin
    o_ref[...] = x_ref[...]
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), F32),
                   scratch_types=[plgpu.SMEM((128,), jnp.int32)])
  with pytest.raises(ps.RunawayKernelError) as e:
    ps.run(k, jnp.ones((128,), F32), backend="sim", max_cycles=1e7)
  assert "this loop never ends: at iteration 1 its condition still holds, and it " \
         "decides on memory alone (it does not look at the loop's carry), which nothing " \
         "else in this simulation can change any more" in str(e.value), str(e.value)
  assert e.value.where == _marked_line(body), e.value.where


def test_a_spin_on_a_flag_another_thread_sets_is_said_to_need_a_barrier():
  """Thread 1 spins on a plain SMEM flag that thread 0 sets after a TMA
  load: the spin never waits, so in the simulation thread 0 never runs
  while it spins; on the GPU the read is unordered with the write and may
  be hoisted out of the loop. Said at once, with what to use instead."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32),
                scratch_types=[plgpu.SMEM((128,), jnp.int32), plgpu.SMEM((128,), jnp.int32),
                               plgpu.Barrier(), plgpu.Barrier()],
                num_threads=2, thread_name="t")
  def k(x_ref, o_ref, flag, buf, loaded, zeroed):
    t = lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      plgpu.barrier_wait(zeroed)
      plgpu.copy_gmem_to_smem(x_ref, buf, loaded)
      plgpu.barrier_wait(loaded)
      flag[...] = buf[...]

    @pl.when(t == 1)
    def _():
      flag[...] = jnp.zeros((128,), jnp.int32)
      plgpu.barrier_arrive(zeroed)
      n = lax.while_loop(lambda c: flag[...][0] == 0, lambda c: c + 1, 0)
      o_ref[...] = jnp.full((128,), n, jnp.int32)

  with pytest.raises(ps.RunawayKernelError) as e:
    ps.run(k, jnp.ones((128,), jnp.int32), backend="sim", max_cycles=1e7,
           check_lowering=False, on_race="report")
  text = str(e.value)
  assert "this loop never ends: at iteration 1" in text, text
  assert "no other thread runs while it spins" in text, text
  assert "wait on a barrier or a semaphore instead" in text, text


def test_a_loop_whose_state_is_in_memory_is_not_taken_for_stuck():
  """The same carry, but the loop reads and writes SMEM: what it reads
  decides whether it goes on, so an unchanged carry says nothing."""
  def body(o_ref, s_ref):
    s_ref[...] = jnp.zeros((128,), jnp.int32)

    def step(c):
      s_ref[...] = s_ref[...] + 1
      return c
    lax.while_loop(lambda c: s_ref[...][0] < 5, step, jnp.int32(7))
    o_ref[...] = s_ref[...].astype(F32)
  k = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((128,), F32),
                   scratch_types=[plgpu.SMEM((128,), jnp.int32)])
  np.testing.assert_array_equal(ps.run(k, backend="sim", check_lowering=False),
                                np.full((128,), 5.0))


def test_progress_line_shows_the_block_cycles_and_line_being_run(monkeypatch):
  from pallas_sim.backends.sim.execute import executor, progress

  class TTY:
    text = ""

    def isatty(self):
      return True

    def write(self, s):
      self.text += s

    def flush(self):
      pass

  assert not progress.Progress("k", 1).on  # pytest's stderr is not a terminal
  monkeypatch.delenv("PALLAS_SIM_PROGRESS", raising=False)
  monkeypatch.setenv("CI", "true")
  assert not progress.Progress("k", 1, stream=TTY()).on  # nor under CI
  monkeypatch.delenv("CI")
  tty = TTY()
  monkeypatch.setattr(executor, "Progress", lambda name, total, on=None: progress.Progress(
      name, total, after_s=0.2, every_s=0.1, stream=tty, on=on))
  with pytest.raises(ps.RunawayKernelError):
    ps.run(_spinning_kernel(1_000_000), jnp.ones((128,), F32), backend="sim",
           max_cycles=2e6)
  line = _marked_line(_spinning_kernel)
  assert re.search(r"\[pallas-sim\] k: \[ *\] 0/1 blocks \d+s; block \(\) thread 1: "
                   rf"cycle [\d.e+]+, [\d,]+ equations, at {re.escape(line)}  while "
                   r"\(iteration \d+\)", tty.text), tty.text


CTRL_C = '''
import signal, sys
# (A shell starts background jobs with SIGINT ignored, and children inherit
# that: restore what a terminal user has.)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
import jax.numpy as jnp
import pallas_sim as ps
from test_debugging import _spinning_kernel
print("started", flush=True)
ps.run(_spinning_kernel(), jnp.ones((128,), jnp.float32), backend="sim")
'''


def test_ctrl_c_stops_at_once_with_every_thread_s_place():
  script = CTRL_C.format(tests=os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT, PALLAS_SIM_PROGRESS="1"))
  assert p.stdout.readline().strip() == "started"
  err = _read_until(p.stderr, "[pallas-sim] k:")  # the progress line: it runs
  t0 = time.time()
  p.send_signal(signal.SIGINT)
  out, rest = p.communicate(timeout=60)
  err += rest
  assert time.time() - t0 < 10, "Ctrl-C did not stop the simulation at once"
  assert p.returncode != 0
  assert "KeyboardInterrupt: pallas-sim: simulation interrupted" in err, err
  tests = os.path.join(os.path.relpath(os.path.dirname(os.path.abspath(__file__)), ROOT),
                       "test_debugging.py")
  where = err[err.index("pallas-sim: interrupted in kernel k"):].splitlines()
  assert where[0].startswith("pallas-sim: interrupted in kernel k (") and where[0].endswith(
      "block () (1 of 1):"), where
  assert re.match(r"  block \(\) thread 0: waiting in barrier_wait on bar \(completion "
                  r"#1; its phase has 0 of its 1 arrival\) "
                  rf"at {re.escape(tests)}:\d+, at cycle \d+", where[1]), where
  t1 = where.index(next(ln for ln in where if ln.startswith("  block () thread 1:")))
  assert where[t1].startswith("  block () thread 1: running, at cycle "), where
  assert any(re.match(rf"      {re.escape(tests)}:\d+  while \(iteration \d+\)", ln)
             for ln in where[t1 + 1:]), where


def _read_until(stream, text, timeout=120):
  """What `stream` printed up to `text` (which must come within `timeout`)."""
  import select
  got, t0 = "", time.time()
  while text not in got:
    assert time.time() - t0 < timeout, got
    ready, _, _ = select.select([stream], [], [], 1.0)
    if ready:
      chunk = os.read(stream.fileno(), 4096).decode()
      assert chunk, got
      got += chunk
  return got


def test_debug_check_stops_the_kernel_with_its_message_when_checks_are_on():
  from jax._src import config

  def make():
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct([256], jnp.int32))
    def k(x_ref, o_ref):
      pl.debug_check(jnp.sum(x_ref[...]) > 0, "x.sum() is negative")
      o_ref[...] = x_ref[...]
    return k
  x = jnp.arange(256, dtype=jnp.int32)
  with config.jax_pallas_enable_debug_checks(True):
    np.testing.assert_array_equal(ps.run(make(), x, backend="sim"), x)
    with pytest.raises(ps.KernelError, match="debug_check failed: x.sum.. is negative"):
      ps.run(make(), -x, backend="sim")
  # Off (the default), the check is not compiled in: nothing happens.
  np.testing.assert_array_equal(ps.run(make(), -x, backend="sim"), -x)


def test_the_estimate_check_prints_nothing_twice(capsys, monkeypatch, tmp_path):
  """With PALLAS_SIM_CHECK_ESTIMATE (backends/sim/execute/estimate_check.py) each
  launch runs again as an estimate: its debug_print lines are not shown
  again."""
  from pallas_sim.backends.sim.execute import estimate_check
  log = tmp_path / "checks.jsonl"
  monkeypatch.setenv(estimate_check.ENV, str(log))
  test_an_array_prints_one_line_per_element(capsys)
  assert len(log.read_text().splitlines()) == 1


def test_a_read_of_smem_nothing_wrote_that_reaches_no_output_warns():
  """tokamax's quantized ragged dot loads only the rows its group needs and
  multiplies the whole tile: the rows nothing wrote reach only output rows
  it does not store. The launch runs again with other bits in that memory;
  where every output element it wrote is the same, the read is reported as
  harmless (a warning), not raised."""
  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128, 128), F32),
                scratch_types=[plgpu.SMEM((128, 128), F32)] * 2)
  def k(x_ref, o_ref, smem, doubled):
    smem[pl.ds(0, 64), :] = x_ref[pl.ds(0, 64), :]
    doubled[...] = smem[...] * 2  # rows 64.. were never written ...
    o_ref[pl.ds(0, 64), :] = doubled[pl.ds(0, 64), :]  # ... and are not stored
    o_ref[pl.ds(64, 64), :] = x_ref[pl.ds(64, 64), :]
  x = jnp.ones((128, 128), F32)
  with pytest.warns(ps.UninitializedWarning, match="harmless in this launch") as got:
    out = ps.run(k, x, backend="sim")
  [w] = [w for w in got if issubclass(w.category, ps.UninitializedWarning)]
  assert w.filename.endswith("test_debugging.py"), w.filename  # (the kernel's line)
  np.testing.assert_array_equal(np.asarray(out)[:64], 2.0)
  sim = ps.simulate(k, x, on_uninitialized="report")
  [f] = sim.report.uninitialized
  assert f.kind == "uninitialized read" and f.harmless
  assert str(f).splitlines()[-1] == (
      "    harmless in this launch: run again with other bits in the memory nothing "
      "wrote, every output element it wrote came out the same")
  assert len(sim.report.kernels) == 1  # (the second run is not a launch of its own)
