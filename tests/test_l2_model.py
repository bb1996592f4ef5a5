"""The L2 as the TMA loads see it (machine/timing.py): what several blocks of
a wave read at one site it serves again at its shared rate, in boxes of
rows of 128 bytes and more; and its latency grows as an SM's share of it
fills."""
import os
import sys

import numpy as np
import pytest

import pallas_sim as ps
from pallas_sim import gpus
from pallas_sim.backends.sim.machine.timing import Engines, Timing

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import timing_suite  # noqa: E402

H = gpus.H200


def _matmul_launch(gpu=H, m_blocks=32, n_blocks=32):
  """A 32x32 grid of one-block-an-SM matmul tiles: A's site depends on the
  grid's m, B's on its n."""
  lt = Timing(gpu).launch(m_blocks * n_blocks, 160 * 1024, 128)
  grid = np.array([(m, n) for m in range(m_blocks) for n in range(n_blocks)])
  lt.set_loads(grid, {"a": (0,), "b": (1,), "own": (0, 1), "data": None})
  return lt


def test_shared_sources_cost_less_of_the_l2_than_streamed_ones():
  lt = _matmul_launch()
  stream = 1 / lt.l2_rate
  # A: ~5 distinct rows of blocks in a wave of 132, B: 32 distinct columns
  assert lt.byte_cycles["a"] < lt.byte_cycles["b"] < stream
  first = 32 * lt.waves / 1024  # (B: a source per column of blocks, per wave)
  want = (first / H.l2_bytes_per_s + (1 - first) / H.l2_shared_bytes_per_s
          ) * H.clock_hz * lt.active
  assert lt.byte_cycles["b"] == pytest.approx(want, rel=0.05)
  # every block its own source, or an address from data: streamed
  assert "own" not in lt.byte_cycles and "data" not in lt.byte_cycles


def test_only_boxes_of_128_byte_rows_get_the_shared_rate():
  """In 64-byte boxes a tile many SMs read comes at the streaming rate
  (l2_shared_*_swz64 against _swz128, H200)."""
  lt = _matmul_launch()
  t = Timing(H)
  times = {}
  for row in (64, 128, 256):
    e = lt.engines(0)
    s, end, _ = t.tma(e, 0.0, 65536, "a", row_bytes=row)
    times[row] = end - s
  assert times[64] == pytest.approx(65536 / lt.l2_rate)
  assert times[128] == times[256] < 0.6 * times[64]
  # never faster than the SM's TMA engine moves
  assert times[128] >= 65536 / H.tma_bytes_per_clk


def test_a_loaded_l2s_latency_grows_with_how_busy_the_sm_keeps_it():
  lt = _matmul_launch()
  t = Timing(H)
  e = lt.engines(0)
  _, end, done = t.tma(e, 0.0, 16384, "a", row_bytes=128)
  assert done - end == pytest.approx(lt.latency["a"])  # (nothing before it)
  busy = e.l2_work / 1000.0
  _, end, done = t.tma(e, 1000.0, 16384, "a", row_bytes=128)
  assert done - end == pytest.approx(lt.latency["a"] / (1 - busy))
  # kept busy throughout (behind a long transfer): the wait is bounded
  # (l2_queue_cap)
  t.tma(e, end, 1 << 22, "a", row_bytes=128)
  _, end, done = t.tma(e, end, 16384, "a", row_bytes=128)
  assert done - end == pytest.approx(lt.latency["a"] / (1 - H.l2_queue_cap))
  # a site the analysis sees no sharing at keeps the plain latency
  _, end, done = t.tma(e, 2000.0, 16384, "own", row_bytes=128)
  assert done - end == pytest.approx(lt.latency["own"])


def test_a_few_busy_sms_do_not_load_the_l2():
  """Four blocks' loads are the TMA engines' work more than the L2's: kept
  busy at their engines' rate, four SMs fill ~1/7 of the L2's streaming
  rate, and their latency grows by that much."""
  lt = Timing(H).launch(4, 160 * 1024, 128)
  lt.set_loads(np.array([(0, 0), (0, 1), (1, 0), (1, 1)]), {"a": (0,)})
  t = Timing(H)
  e = lt.engines(0)
  t.tma(e, 0.0, 1 << 20, "a", row_bytes=128)
  _, end, done = t.tma(e, 100.0, 16384, "a", row_bytes=128)
  assert lt.latency["a"] < done - end < 1.2 * lt.latency["a"]


def _estimate(name):
  with_shapes = timing_suite.by_name(name)
  built = with_shapes.build()
  return ps.estimate(built.fn, *built.args, gpu="h200").time_s


@pytest.mark.parametrize("deeper,shallower", [
    # 4096: 249.8 and 279.0 us (both one block an SM); 8192: 2023.6, 2311.2
    ("quickstart 4096 128x128x64 mcs=4", "quickstart 4096 128x128x64 mcs=3"),
])
def test_a_deeper_pipeline_hides_the_loaded_l2s_latency(deeper, shallower):
  """The H200 runs the quickstart's 128x128x64 tile 10-12% faster at mcs=4
  than at mcs=3, at the same SMEM, occupancy and bytes: its loads wait
  ~2000 cycles on a loaded L2, which three stages in flight hide better than
  two (benchmarks/RESULTS.md, thirteenth session)."""
  assert _estimate(shallower) > 1.02 * _estimate(deeper)


def test_a_multicast_part_and_an_smem_to_smem_copy_are_not_shared_l2_reads():
  """A multicast's blocks each load their own part (the site's analysis sees
  the cluster's blocks as one reader): streamed, no queue. A copy between
  SMs' SMEM does not load the L2."""
  lt = _matmul_launch()
  t = Timing(H)
  e = lt.engines(0)
  t.tma(e, 0.0, 1 << 20, "a", row_bytes=128)
  s, end, done = t.tma(e, 0.0, 65536, "a", row_bytes=128, shared=False)
  assert end - s == pytest.approx(65536 / lt.l2_rate)
  assert done - end == pytest.approx(lt.latency["a"])
  before = e.l2_work
  t.tma(e, end, 65536, via_l2=False)
  assert e.l2_work == before
