"""lab/ws_trace.py's device step: every case's profiled kernel records each
step of its K loop and keeps SMEM to spare for the profiler's buffer."""
import tempfile

import stand_in_smi

import pallas_sim as ps
from lab import pipeline_trace as pt
from lab import ws_trace as wt
from pallas_sim import gpus


def test_each_case_records_every_step_with_smem_to_spare():
  limit = gpus.H200.max_smem_per_block - pt.PROFILE_SMEM_MARGIN
  for case in wt.CASES:
    with tempfile.TemporaryDirectory() as d:
      r = ps.estimate(wt.kernel_of(*case, profile_dir=d), *wt._operands(True), gpu="h200")
      got = wt.parts(pt.newest_trace(d), case[3])
    assert max(k.smem_bytes for k in r.kernels) <= limit, case
    assert got["steps"] == wt.SIZE // wt.TILE_K, case
    assert got["step"]["mean"] > 0 and got["span"]["median"] > 0


def test_the_device_step_runs_end_to_end_in_the_simulator(tmp_path, monkeypatch):
  import json
  stand_in_smi.install(tmp_path, monkeypatch, 1440)
  monkeypatch.setattr(wt, "SIZE", 512)  # (8 blocks of 8 steps)
  monkeypatch.setattr(wt, "SPACE", 2 * 512 // wt.TILE_K + 16)
  monkeypatch.setattr(wt, "CASES", wt.CASES[:2])
  with ps.backend("sim"):
    wt.gpu(str(tmp_path), warm_s=0.05)
  rows = json.load(open(tmp_path / "ws_trace.json"))["rows"]
  assert [r["name"] for r in rows] == [wt.name_of(*c) for c in wt.CASES[:2]]
  assert all(r["mhz"] == 1440.0 and r["steps"] == 8 and r["step"]["mean"] > 0 for r in rows)


def test_block_clock_reads_the_sm_clock_from_consecutive_blocks():
  # Two warpgroups a block, two blocks one after the other on SM 1 (the
  # second 50 us after the first), each 60000 cycles: 1200 MHz at least.
  def track(tid, sm, start_ns, cycles):
    return [{"name": "block", "ph": "B", "ts": start_ns / 1e3, "pid": sm, "tid": tid},
            {"name": "acc", "ph": "B", "ts": (start_ns + 100) / 1e3, "pid": sm, "tid": tid},
            {"name": "acc", "ph": "E", "ts": (start_ns + 900) / 1e3, "pid": sm, "tid": tid},
            {"name": "block", "ph": "E", "ts": (start_ns + cycles) / 1e3, "pid": sm, "tid": tid}]
  events = (track(1, 1, 1e6, 60000) + track(2, 1, 1e6 + 40, 59000)
            + track(4, 1, 1e6 + 50000, 61000) + track(5, 1, 1e6 + 50030, 61000)
            + track(7, 2, 1e6, 60000))
  got = pt.block_clock(*pt.ranges({"traceEvents": events}))
  assert got["block_us"]["median"] == 50.0
  assert got["mhz_at_least"]["median"] == 1200.0
  # Two blocks an SM at once: one that starts before the other could have
  # ended (60000 cycles in 20 us: 3 GHz) ran beside it, not after.
  side = (track(1, 3, 1e6, 60000) + track(2, 3, 1e6 + 20000, 60000)
          + track(3, 3, 1e6 + 60000, 60000))
  got = pt.block_clock(*pt.ranges({"traceEvents": side}))
  assert got["block_us"]["median"] == 40.0 and got["mhz_at_least"]["median"] == 1500.0
  # The simulator counts each block from 0: no interval, no clock.
  assert pt.block_clock(*pt.ranges({"traceEvents": track(1, 1, 0, 60000)
                                              + track(4, 1, 0, 60000)})) == {
      "block_us": None, "mhz_at_least": None}
