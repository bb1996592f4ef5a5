"""The quickstart's pipeline taken apart (lab/timing_suite.py
DIAGNOSTIC_CASES, measured on the H200 as "pipeline_study"): each variant
simulates without findings and gives its reference's values, as the GPU's
run checks it there."""
import json
import os

import numpy as np
import pytest

import pallas_sim as ps

from lab import timing_suite

MODES = ("loads", "one_tile", "delay", "delay_one_tile")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tile_n,tile_k,mcs", [(128, 64, 2), (64, 128, 4)])
def test_each_diagnostic_variant_runs_clean_and_right(mode, tile_n, tile_k, mcs):
  built = timing_suite._make_pipeline(256, tile_n, tile_k, mcs, mode)
  sim = ps.simulate(built.fn, *built.args, workers=1)  # (races, uninitialized: raise)
  out = np.asarray(sim.outputs, np.float32)
  ref = np.asarray(built.reference(*built.args), np.float32)
  np.testing.assert_allclose(out, ref, rtol=5e-3, atol=1e-2)
  [k] = sim.report.kernels
  assert (k.wgmma_flops > 0) == (mode == "one_tile")
  steps = (256 // 128) * (256 // tile_n) * (256 // tile_k)  # (block steps)
  assert k.tma_load_bytes == steps * 2 * (128 * tile_k + tile_k * tile_n)


def test_the_delay_is_the_scalar_work_it_stands_for():
  """A delay step's scalar rounds take about as long as its wgmma (on the
  GPU's measured 4.29 cycles an equation): the one-tile-and-delay kernel's
  blocks take about as long as the one-tile kernel's, each at the clock
  the H200 ran it at (4096 128x128x64 mcs=3: 1560 MHz with the wgmmas,
  1980 with the delay; 210 and 211 us)."""
  def seconds(mode, mhz):
    built = timing_suite._make_pipeline(256, 128, 64, 3, mode)
    k = ps.estimate(built.fn, *built.args, gpu="h200", clock_mhz=mhz).kernels[0]
    return k.block_cycles_max / k.clock_hz
  assert seconds("delay_one_tile", 1980) == pytest.approx(seconds("one_tile", 1560),
                                                          rel=0.25)
  assert seconds("delay_one_tile", 1980) > 1.5 * seconds("loads", 1980)


def test_diagnostics_and_held_out_kernels_are_apart_from_the_suite():
  names = {c.name for c in timing_suite.CASES}
  assert not names & {c.name for c in timing_suite.DIAGNOSTIC_CASES}
  held = {c.name for c in timing_suite.HOLDOUT_CASES}
  assert held and not held & names
  assert not {c.family for c in timing_suite.HOLDOUT_CASES} & {c.family for c in timing_suite.CASES}
  # (their predictions were committed before they were measured)
  saved = json.load(open(os.path.join(os.path.dirname(__file__), "..", "lab", "data",
                                      "holdout_predictions.json")))["predictions"]
  assert set(saved) == held
  assert {c.params["mode"] for c in timing_suite.DIAGNOSTIC_CASES} == set(MODES)
  # the blind kernels: new configurations, each predicted before it was measured
  blind = {c.name for c in timing_suite.BLIND_CASES}
  assert blind and not blind & (names | held)
  # (not a configuration measured before under another name or dtype)
  key = lambda c: (c.make.__name__, tuple(sorted(
      (k, v) for k, v in c.params.items() if k not in ("dtype",))))
  seen = {key(c) for c in timing_suite.CASES + timing_suite.HOLDOUT_CASES
          + timing_suite.DIAGNOSTIC_CASES}
  assert not {key(c) for c in timing_suite.BLIND_CASES} & seen
  saved = {}  # (one file a blind set, each committed before its rows were
  # measured)
  for f in ("blind_predictions_quickstart_attention.json",
            "blind_predictions_quickstart_8192.json", "blind_predictions_near_l2_half.json",
            "blind_predictions_narrow_rows.json", "blind_predictions_swizzle.json",
            "blind_predictions_broad.json"):
    saved.update(json.load(open(os.path.join(os.path.dirname(__file__), "..", "lab", "data",
                                             f)))["predictions"])
  assert set(saved) == blind
  assert timing_suite.by_name("quickstart one tile 4096 128x128x64 mcs=2").params[
      "mode"] == "one_tile"


@pytest.mark.parametrize("mode", ("wgmma", "loads", "both"))
def test_the_smem_micro_benchmark_runs_clean_and_right(mode):
  """lab/calibrate.py's smem_* micro-benchmarks (a wgmma loop beside
  TMA loads, in two warpgroups): no finding, the reference's values."""
  from lab import calibrate
  built = calibrate._build_smem(6, mode=mode, per=2, cpu=True)
  out = np.asarray(ps.simulate(built.fn, *built.args, workers=1).outputs, np.float64)
  ref = np.asarray(built.reference(*built.args), np.float64)
  # (the tensor cores' sums against an f32 dot: the micro's own check, by norm)
  assert np.linalg.norm(out - ref) <= built.tol * np.linalg.norm(ref)
  assert (mode == "wgmma") == (not out[:, 128:].any())  # (the ring's tile)
