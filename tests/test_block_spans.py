"""lab/pipeline_trace.py --spans: each block's start, cycles, SM and
launch order read from a profiled quickstart matmul, and what they say of its
waves (the H200's are in lab/data/pipeline_trace_h200.json)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_sim as ps

from lab import pipeline_trace as pt


def test_spans_of_a_simulated_matmul_give_each_block_once_in_launch_order(tmp_path, rng):
  """Grid (M, N) = (2, 4): the profiler numbers a block n * M + m, the GPU
  launches it m * N + n-th; each block's cycles run from its start to its
  epilogue's end, and like blocks on an idle GPU take like cycles. The
  matmul with step_scopes=False is still the matmul."""
  a = jnp.asarray(rng.standard_normal((256, 256)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((256, 256)), jnp.float16)
  with ps.backend("sim"):
    out = pt.traced_matmul(a, b, tile_n=64, tile_k=64, mcs=2, profile_dir=str(tmp_path),
                           space=16, truncate=True, step_scopes=False)
  ref = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  assert np.abs(np.asarray(out, np.float32) - ref).max() < 0.25
  sp = pt.block_spans(pt.newest_trace(str(tmp_path)), 2, 4)
  assert sp[:, 0].tolist() == list(range(8))
  assert len(set(sp[:, 1].tolist())) == 8  # (one wave: an SM each)
  assert np.ptp(sp[:, 3]) == 0 and sp[0, 3] > 4 * 400  # (four steps' loads at least)
  s = pt.span_summary(sp, 4, 264)
  assert s["fast_sms"] == [] and s["wave_start_spread_us"] == [0.0]
  assert s["b_gap_us"]["p90"] == 0.0


def test_span_summary_finds_fast_sms_and_the_waves_they_smear():
  """132 SMs, one block a slot in launch order as slots free; 24 SMs run
  their blocks in 0.75 of the others' cycles: they are found, their ratio is
  0.75 in every wave, and each wave's starts spread further than the last."""
  fast = set(range(100, 124))
  cyc = {sm: (750.0 if sm in fast else 1000.0) for sm in range(132)}
  free = {sm: 0.0 for sm in range(132)}
  rows = []
  for i in range(132 * 6):
    sm = min(free, key=lambda s: (free[s], s))
    rows.append((i, sm, free[sm] * 1e3, cyc[sm] * 1e3))  # (start ns, cycles at 1 GHz)
    free[sm] += cyc[sm]
  s = pt.span_summary(np.asarray(rows), 66, 132)
  assert s["fast_sms"] == sorted(fast)
  assert s["fast_over_rest_by_wave"] == [0.75] * 6
  spread = s["wave_start_spread_us"]
  assert spread[0] == 0 and all(b > a for a, b in zip(spread[1:3], spread[2:4]))
  assert s["b_gap_us"]["p90"] > 0


@pytest.mark.gpu
def test_spans_on_the_gpu_give_each_block_its_sm_and_cycles(tmp_path, rng):
  """On a Hopper GPU (the --spans run's kernel): 64 blocks, one wave, each
  found once with its epilogue; the profile leaves the product right."""
  a = jnp.asarray(rng.standard_normal((1024, 1024)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((1024, 1024)), jnp.float16)
  out = jax.jit(lambda a, b: pt.traced_matmul(
      a, b, tile_n=128, tile_k=64, mcs=2, profile_dir=str(tmp_path), space=16,
      truncate=True, step_scopes=False))(a, b)
  jax.block_until_ready(out)
  jax.effects_barrier()
  ref = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
  assert np.abs(np.asarray(out, np.float32) - ref).max() < 0.5
  sp = pt.block_spans(pt.newest_trace(str(tmp_path)), 8, 8)
  assert sp[:, 0].tolist() == list(range(64))
  assert len(set(sp[:, 1].tolist())) == 64
  assert (sp[:, 3] > 16 * 100).all()  # (16 steps of a wgmma group at least)


def test_the_fp8_matmul_traced_gives_its_steps_and_its_values(tmp_path, rng):
  """pipeline_trace --fp8: our fp8 matmul with the quickstart's scopes is
  still the matmul (B given as B^T), and its trace gives each steady step's
  issue, wait and rest, as the quickstart's does."""
  fn, dtype = pt.tracer(True)
  a = jnp.asarray(rng.standard_normal((256, 1024)), jnp.float32).astype(dtype)
  bt = jnp.asarray(rng.standard_normal((256, 1024)), jnp.float32).astype(dtype)
  with ps.backend("sim"):
    out = fn(a, bt, tile_n=128, tile_k=128, mcs=2, profile_dir=str(tmp_path),
             space=pt.profile_space(1024, 128))
  ref = np.asarray(a, np.float32) @ np.asarray(bt, np.float32).T
  assert np.abs(np.asarray(out, np.float32) - ref).max() < 0.05 * np.abs(ref).max()
  m = pt.steps_of(pt.newest_trace(str(tmp_path)), 2)
  assert m["steps"] == 8 and m["blocks"] == 4
  assert m["issue"]["median"] > 0 and m["step"]["median"] >= m["issue"]["median"]
  assert pt.name_of(4096, 128, 128, 3, fp8=True) == "own fp8 4096 128x128x128 mcs=3"


def test_compare_estimates_each_row_at_its_own_shape(tmp_path, capsys):
  """--compare on a trace the simulator wrote (a row of size 256, K 1024, fp8
  and f16): the model's steps are the row's own, so K and the operands'
  layout (fp8's B given as B^T) must be the row's."""
  import json
  rows = []
  for fp8 in (True, False):
    d = tmp_path / ("fp8" if fp8 else "f16")
    fn, dtype = pt.tracer(fp8)
    x = jax.ShapeDtypeStruct((256, 1024), dtype)
    y = jax.ShapeDtypeStruct((256, 1024) if fp8 else (1024, 256), dtype)
    tk = 128 if fp8 else 64
    ps.estimate(lambda a, b: fn(a, b, tile_n=128, tile_k=tk, mcs=2, profile_dir=str(d),
                                space=pt.profile_space(1024, tk)),
                x, y, gpu="h200", clock_mhz=1500)
    rows.append({"name": pt.name_of(256, 128, tk, 2, fp8) + " k=1024", "size": 256,
                 "k": 1024, "m": 256, "tile": [128, 128, tk], "mcs": 2, "fp8": fp8,
                 "mhz": 1500, **pt.steps_of(pt.newest_trace(str(d)), 2)})
  path = tmp_path / "pipeline_trace.json"
  path.write_text(json.dumps({"rows": rows}))
  pt.compare(str(path))
  out = [l for l in capsys.readouterr().out.splitlines() if "k=1024" in l]
  assert len(out) == 2 and all("(+0%)" in l for l in out), out


def test_a_profiled_kernel_keeps_to_the_smem_its_blocks_leave():
  """The fp8 trace the plan asked of the H200 failed there: 6 slots of
  128x128x128 with 192 profiler ranges need 232496 bytes of SMEM, 48 past
  the limit; with 189, at the limit exactly, the H200 refused the launch.
  The step now records as many ranges, in groups of 4, as leave
  PROFILE_SMEM_MARGIN free (the tail of its steps dropped), and leaves a
  kernel with that room as it is."""
  fn, dtype = pt.tracer(True)
  shapes = [jax.ShapeDtypeStruct((4096, 4096), dtype)] * 2
  with pytest.raises(ps.SmemOverflowError) as e:
    ps.estimate(lambda x, y: fn(x, y, tile_n=128, tile_k=128, mcs=6, profile_dir="/tmp",
                                space=192), *shapes, gpu="h200")
  assert (e.value.smem_bytes, e.value.max_smem_bytes) == (232496, 232448)
  space, truncate = pt.fitting_space(fn, shapes, 192, tile_n=128, tile_k=128, mcs=6)
  assert truncate and 8 <= space < 189 and space % 4 == 0
  r = ps.estimate(lambda x, y: fn(x, y, tile_n=128, tile_k=128, mcs=6, profile_dir="/tmp",
                                  space=space, truncate=True), *shapes, gpu="h200")
  assert r.kernels[0].smem_bytes <= 232448 - pt.PROFILE_SMEM_MARGIN
  assert pt.fitting_space(fn, shapes, 192, tile_n=128, tile_k=128, mcs=2) == (192, False)
