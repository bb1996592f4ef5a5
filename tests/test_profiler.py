"""Mosaic GPU's profiler (plgpu.CompilerParams(profile_space=, profile_dir=))
on the simulator: a Chrome trace of the kernel's named scopes, timed by the
simulated clock, in the profiler's own file name and format."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim import gpus


def scoped_kernel(profile_dir, space=16, per_warp=False, bounds_check=False):
  params = plgpu.CompilerParams(
      profile_space=space, profile_dir=str(profile_dir), profile_bounds_check=bounds_check,
      profile_trace_scope=plgpu.TraceScope.WARP if per_warp else plgpu.TraceScope.WARPGROUP)

  @plgpu.kernel(out_type=jax.ShapeDtypeStruct((2, 256), jnp.float32), grid=(2,),
                grid_names=("b",), compiler_params=params,
                scratch_types=[plgpu.SMEM((256,), jnp.float32), plgpu.Barrier()])
  def k(x_ref, o_ref, smem, bar):
    b = jax.lax.axis_index("b")
    with jax.named_scope("load"):
      plgpu.copy_gmem_to_smem(x_ref.at[b], smem, bar)
      plgpu.barrier_wait(bar)
    with jax.named_scope("compute"):
      with jax.named_scope("square"):
        y = smem[...] * smem[...]
      o_ref[b] = y + 1
  return k


def _trace(directory):
  [name] = os.listdir(directory)
  assert name.startswith("k-") and name.endswith("-trace.json"), name
  with open(os.path.join(directory, name)) as f:
    return json.load(f)["traceEvents"]


def _x():
  return jnp.arange(512, dtype=jnp.float32).reshape(2, 256)


def test_a_profiled_kernel_writes_its_named_scopes_with_simulated_times(tmp_path):
  out = ps.run(scoped_kernel(tmp_path), _x(), backend="sim")
  np.testing.assert_array_equal(out, _x() ** 2 + 1)
  events = _trace(tmp_path)
  by_tid = {}
  for e in events:
    by_tid.setdefault(e["tid"], []).append((e["name"], e["ph"]))
  assert sorted(by_tid) == [1, 2]  # one trace per warpgroup of each block
  assert by_tid[1] == [("Init", "B"), ("Init", "E"),  # (the kernel's prologue)
                       ("load", "B"), ("load", "E"), ("compute", "B"),
                       ("square", "B"), ("square", "E"), ("compute", "E")]
  t = {(e["tid"], e["name"], e["ph"]): e["ts"] for e in events}
  # The load waits for a TMA copy: it takes simulated time; times only grow.
  assert t[(1, "load", "E")] > t[(1, "load", "B")]
  ts = [e["ts"] for e in events if e["tid"] == 1]
  assert ts == sorted(ts)


def test_warp_scope_has_a_trace_per_warp(tmp_path):
  ps.run(scoped_kernel(tmp_path, per_warp=True), _x(), backend="sim")
  events = _trace(tmp_path)
  assert sorted({e["tid"] for e in events}) == list(range(1, 2 * 4 + 1))
  assert sum(e["name"] == "square" for e in events) == 2 * 4 * 2


def test_a_full_buffer_truncates_with_bounds_check_and_is_an_error_without(tmp_path):
  # profile_space=3: 12 entries, 3 of them the header: 4 events per trace.
  ps.run(scoped_kernel(tmp_path / "a", space=3, bounds_check=True), _x(), backend="sim")
  events = [e for e in _trace(tmp_path / "a") if e["tid"] == 1]
  assert [(e["name"], e["ph"]) for e in events] == [
      ("Init", "B"), ("Init", "E"), ("load", "B"), ("load", "E")]
  with pytest.raises(ps.KernelError, match="profile_space=3 holds 4") as e:
    ps.run(scoped_kernel(tmp_path / "b", space=3), _x(), backend="sim")
  # (at the kernel whose compiler_params asked for the buffer)
  assert e.value.where and e.value.where.startswith(f"{os.path.relpath(__file__)}:"), \
      e.value.where


def test_the_profile_buffer_counts_against_shared_memory(tmp_path):
  with pytest.raises(ps.SmemOverflowError) as e:
    ps.run(scoped_kernel(tmp_path, space=100_000), _x(), backend="sim")
  # the kernel's own 1024 bytes (its SMEM scratch, rounded) and barrier,
  # plus 4 bytes per entry
  assert e.value.smem_bytes == 1024 + 8 + 100_000 * 4 * 4


def test_the_estimate_check_writes_no_second_trace(tmp_path, monkeypatch):
  """With PALLAS_SIM_CHECK_ESTIMATE (backends/sim/execute/estimate_check.py) each
  launch runs again as an estimate, which writes no profile of its own."""
  from pallas_sim.backends.sim.execute import estimate_check
  log = tmp_path / "checks.jsonl"
  monkeypatch.setenv(estimate_check.ENV, str(log))
  ps.run(scoped_kernel(tmp_path / "p"), _x(), backend="sim")
  assert len(os.listdir(tmp_path / "p")) == 1 and _trace(tmp_path / "p")
  [line] = [json.loads(x) for x in log.read_text().splitlines()]
  assert line["error"] == 0.0, line  # (the estimate ran: its scopes too)


def test_the_files_times_are_the_sms_cycles_as_on_the_gpu(tmp_path):
  """The GPU's profiler stamps ranges with the SM's cycle counter (%clock),
  written as nanoseconds: a range of SM work (a dependent scalar loop) is as
  long in the file at 1000 MHz as at 1980, its cycles."""
  lengths = []
  for mhz in (1000, 1980):
    d = tmp_path / str(mhz)

    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((128,), jnp.int32),
                  compiler_params=plgpu.CompilerParams(profile_space=16,
                                                       profile_dir=str(d)))
    def k(o_ref):
      with jax.named_scope("spin"):
        v = jax.lax.fori_loop(0, 40, lambda i, v: v * 3 + i, jnp.int32(1))
      o_ref[...] = jnp.full((128,), v, jnp.int32)

    ps.estimate(k, gpu="h200", clock_mhz=mhz)
    t = {e["ph"]: e["ts"] for e in _trace(d) if e["name"] == "spin"}
    lengths.append((t["E"] - t["B"]) * 1e3)
  assert lengths[0] > 40 * 2 * gpus.H200.op_overhead_cycles
  assert lengths[0] == pytest.approx(lengths[1])
