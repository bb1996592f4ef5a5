"""The SM clock as an input (Options.clock_mhz, gpus.at_clock): what the SM
does per cycle stays, what the memory system does per second stays."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_sim as ps
from pallas_sim import gpus
from test_quickstart import matmul_mcs
from test_timing_model import wgmma_loop

from lab import timing_suite

F16, F32 = jnp.float16, jnp.float32
S = jax.ShapeDtypeStruct
H = gpus.H200

SM_CYCLES = ("wgmma_issue_cycles", "wgmma_issue_cycles_base", "wgmma_instr_issue_cycles",
             "wgmma_latency",
             "barrier_latency", "tma_bytes_per_clk",
             "alu_cycles_per_vector", "transcendental_cycles_per_vector",
             "sfu_cycles_per_vector", "op_overhead_cycles", "local_bytes_per_clk")
PER_SECOND = ("hbm_bytes_per_s", "hbm_write_bytes_per_s", "l2_bytes_per_s",
              "l2_shared_bytes_per_s",
              "launch_overhead_s")


def test_at_clock_keeps_the_sms_cycles_and_the_memory_systems_seconds():
  g = gpus.at_clock(H, 990)
  assert g.clock_hz == 990e6 and g.sm_clock_mhz == 990.0
  assert gpus.at_clock(H, np.int64(990)) == g  # (a sweep's numpy numbers too)
  for f in SM_CYCLES + PER_SECOND:
    assert getattr(g, f) == getattr(H, f), f
  # tensor cores: each rate per cycle of the clock its loop ran at
  assert g.tensor_rate("f16") == pytest.approx(3238 * 1980 / 1665)
  assert g.tensor_rate("tf32") == pytest.approx(1656)
  # latencies in the memory system's time: half the cycles at half the clock
  assert g.tma_latency == pytest.approx(H.tma_latency / 2)
  assert g.hbm_latency_extra == pytest.approx(H.hbm_latency_extra / 2)
  assert g.local_l2_bytes_per_clk == pytest.approx(2 * H.local_l2_bytes_per_clk)
  # a clock from a clock: as from the figures
  twice = gpus.at_clock(gpus.at_clock(H, 1500), 990)
  for f in dataclasses.fields(g):
    assert _same(getattr(twice, f.name), getattr(g, f.name)), f.name


def _same(a, b):
  if isinstance(a, tuple):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return a == pytest.approx(b) if isinstance(a, float) else a == b


@pytest.mark.parametrize("bad", [0, -5, 1981, 5000, "fast", True])
def test_a_clock_that_is_not_one_is_refused_by_name(bad):
  with pytest.raises(ValueError, match="clock_mhz"):
    ps.Options(gpu="h200", clock_mhz=bad)


def _per_wgmma(**opts):
  """Seconds a 128x128x64 wgmma adds to a one-block loop of them."""
  t = lambda steps: wgmma_loop(128, steps, **opts).timing.compute_s
  return (t(40) - t(20)) / 20


def test_tensor_core_work_takes_its_cycles_at_the_clock_given():
  flops = 2 * 128 * 128 * 64
  per_clk = 3238 * 1980 / 1665  # (f16, per cycle of the loop's clock)
  for mhz in (1000, 1500):
    assert _per_wgmma(clock_mhz=mhz) == pytest.approx(
        (flops / per_clk + H.wgmma_issue_cycles) / (mhz * 1e6), rel=1e-6)
  # One block's loop draws far less than the power limit: by default its SMs
  # hold the boost clock.
  assert _per_wgmma() == pytest.approx(_per_wgmma(clock_mhz=1980), rel=1e-9)


def test_an_hbm_bound_kernel_does_not_slow_down_with_the_sm_clock():
  def add(x, y):
    return timing_suite.elementwise_pipeline(x, y, blocks=1024, tile_m=32, tile_n=256)
  args = [S((timing_suite.EW_ROWS, timing_suite.EW_COLS), F32)] * 2
  fast = ps.estimate(add, *args, gpu="h200").kernels[0]
  slow = ps.estimate(add, *args, gpu="h200", clock_mhz=1000).kernels[0]
  assert fast.bound == slow.bound == "HBM"
  assert slow.time_s == pytest.approx(fast.time_s, rel=0.02)


def test_a_matmul_at_the_power_limits_clock_is_slower_and_says_so():
  """The large matmuls of the suite run at 1035-1905 MHz on an H200 at its
  700 W limit (benchmarks/HISTORY.md): given such a clock, the tensor-bound
  part of a matmul takes longer (at 1000 MHz its tensor cores, not its
  share of the L2, bound it); the report names the clock."""
  a, b = S((4096, 4096), F16), S((4096, 4096), F16)
  mm = lambda a, b: matmul_mcs(a, b, tile_n=128, max_concurrent_steps=4)
  default = ps.estimate(mm, a, b, gpu="h200")
  slow = ps.estimate(mm, a, b, gpu="h200", clock_mhz=1000)
  assert slow.time_s > 1.15 * default.time_s
  k = slow.kernels[0]
  assert k.clock_hz == 1000e6 and slow.clock_mhz == 1000
  assert "at 1000 MHz" in slow.summary() and "SMs at 1000 MHz" in k.summary()
  assert "pass clock_mhz=" in default.kernels[0].clock_note
  assert slow.kernels[0].power_w < default.kernels[0].power_w


def test_the_power_model_study_recovers_a_known_power_law():
  """lab/power_model.py (a study of the clock the power limit sets):
  rows drawn from a known power law give it back, and the clock it predicts
  for a kernel is where that law reaches 700 W."""
  from lab import power_model as pm
  beta, coef = 0.5, np.array([300.0, 400.0, 30.0, 200.0])
  rng = np.random.default_rng(0)
  rows = []
  for i in range(12):
    r = dict(mhz=float(rng.uniform(1100, 1980)), seconds=1e-3,
             flops=float(rng.uniform(0, 9e11)), l2_bytes=float(rng.uniform(0, 1e10)),
             hbm_bytes=float(rng.uniform(0, 4e9)))
    r["watts"] = float((pm._design([r], beta) @ coef)[0])
    rows.append(r)
  assert np.allclose(pm._fit(rows, beta), coef)
  # A compute-bound kernel: its time goes as 1/f.
  k = dict(flops=1e12, l2_bytes=1e10, hbm_bytes=1e9,
           model_s={str(c): 1e-3 * 1980 / c for c in pm.CLOCKS})
  mhz, t = pm._predict_clock(k, coef, beta)
  p = lambda f: float((pm._design([k], beta, np.array([f]),
                                  np.array([pm._model_time(k, f)])) @ coef)[0])
  assert p(mhz) <= pm.LIMIT_W < p(mhz + 15)
  assert t == pytest.approx(1e-3 * 1980 / mhz)


def _quickstart(n, **kw):
  a = S((n, n), F16)
  return ps.estimate(lambda a, b: matmul_mcs(a, b, **kw), a, a, gpu="h200").kernels[0]


def test_by_default_a_matmul_runs_at_the_clock_its_power_allows():
  """The quickstart's 4096 128x128x64 mcs=4 held 1350-1365 MHz on the H200
  at its 700 W limit (power_study, the suite's sustained runs): the model
  predicts its clock from the power its work draws (timing/power.py), the
  highest on the 15 MHz steps at which that power is within the limit, and
  its time is the model's at that clock."""
  from pallas_sim.backends.sim.timing import power
  k = _quickstart(4096, tile_n=128, max_concurrent_steps=4)
  assert k.sm_mhz == pytest.approx(1358, rel=0.1)
  assert k.sm_mhz % 15 == 0 and k.power_w <= H.power_limit_w
  at = ps.estimate(lambda a, b: matmul_mcs(a, b, tile_n=128, max_concurrent_steps=4),
                   S((4096, 4096), F16), S((4096, 4096), F16), gpu="h200",
                   clock_mhz=k.sm_mhz).kernels[0]
  assert k.time_s == at.time_s
  up = ps.estimate(lambda a, b: matmul_mcs(a, b, tile_n=128, max_concurrent_steps=4),
                   S((4096, 4096), F16), S((4096, 4096), F16), gpu="h200",
                   clock_mhz=k.sm_mhz + 30).kernels[0]
  assert power.watts(H, up.sm_mhz, up.time_s, *power.work(up)) > H.power_limit_w
  # One that spills keeps the tensor cores idle most of the time: the
  # boost clock (measured: 1980 MHz, 504-514 W).
  k = _quickstart(4096, tile_n=256, max_concurrent_steps=2)
  assert k.sm_mhz == 1980 and 450 < k.power_w < 650


def test_the_power_model_is_the_fitted_law():
  """P = P0 + s(f) (e_tc FLOP/s + e_l2 L2 B/s) + e_hbm HBM B/s, s(f) = (1 -
  beta (1 - f / 1980))^2 (lab/power_model.py fit); an fp8 FLOP is half
  an f16 one (the same loop at twice the FLOP/s drew the same power)."""
  from pallas_sim.backends.sim.timing import power, model as timing
  s = (1 - 0.70 * (1 - 1500 / 1980)) ** 2
  assert power.watts(H, 1500, 1e-3, 1e12, 1e10, 1e9) == pytest.approx(
      468.3 + s * (449.7 * 1.0 + 51.4 * 1.0) + 413.1 * 0.1)
  t = timing.Timing(H)
  assert t.f16_equivalent(np.dtype(jnp.float8_e4m3fn)) == pytest.approx(0.5, rel=0.02)
  assert t.f16_equivalent(np.dtype(F16)) == 1.0
  # The clock search: the highest step within the limit, for a time a + b/f.
  w = (2e12, 2e10, 2e9)
  f = power.next_guess(H, [(1980, 1e-3), (1200, 1.5e-3)], w)
  b = (1e-3 - 1.5e-3) / (1 / 1980 - 1 / 1200)
  t_at = lambda f: 1e-3 + b * (1 / f - 1 / 1980)
  assert f % 15 == 0
  assert power.watts(H, f, t_at(f), *w) <= 700 < power.watts(H, f + 15, t_at(f + 15), *w)
  # A time that does not change with the clock: the lowest clock it can be.
  assert power.first_guess(H, 1e-3, w) <= f


def test_simulate_and_estimate_agree_on_the_clock():
  """ps.simulate times a launch over the limit again as ps.estimate does:
  the same clock, the same time (within 2%)."""
  a = jax.random.normal(jax.random.key(0), (2048, 2048), F16)
  mm = lambda a, b: matmul_mcs(a, b, tile_n=128, max_concurrent_steps=4)
  est = ps.estimate(mm, S(a.shape, F16), S(a.shape, F16), gpu="h200").kernels[0]
  sim = ps.simulate(mm, a, a, gpu="h200", numerics=False, check_races=False,
                    check_uninitialized=False).report.kernels[0]
  assert est.sm_mhz < 1980
  assert sim.sm_mhz == est.sm_mhz and sim.time_s == pytest.approx(est.time_s, rel=0.02)
  assert sim.simulated_blocks == sim.num_blocks  # (the run itself: every block)
