"""The L2 as the TMA loads see it (timing/model.py): what several blocks of
a wave read at one site it serves again at its shared rate, in boxes of
rows of 128 bytes and more; and its latency grows as an SM's share of it
fills."""

import numpy as np
import pytest

import pallas_sim as ps
from pallas_sim import gpus
from pallas_sim.backends.sim.timing.model import Engines, Timing

from lab import timing_suite

H = gpus.H200


def _matmul_launch(gpu=H, m_blocks=32, n_blocks=32, inputs=None):
  """A 32x32 grid of one-block-an-SM matmul tiles: A's site depends on the
  grid's m, B's on its n."""
  lt = Timing(gpu).launch(m_blocks * n_blocks, 160 * 1024, 128, inputs=inputs)
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


def test_a_later_wave_finds_in_the_l2_what_an_earlier_read_where_it_holds_the_inputs():
  """B's columns, which every wave of the grid reads again, miss once a
  launch where the inputs fit in the L2 (fp8 4096^3: 32 MiB), and once a
  wave where they do not; A's rows, read within a wave or two, hardly
  change; addresses from data stay misses."""
  small = _matmul_launch(inputs=H.l2_bytes // 2)
  large = _matmul_launch(inputs=2 * H.l2_bytes)
  assert large.waves == small.waves == 8
  assert large.miss["b"] == pytest.approx(32 * 8 / 1024)
  assert small.miss["b"] == pytest.approx(32 / 1024)
  assert small.miss["a"] == pytest.approx(32 / 1024)
  assert 32 / 1024 <= large.miss["a"] < 1.25 * 32 / 1024
  assert small.miss["own"] == large.miss["own"] == 1.0
  assert small.miss["data"] == large.miss["data"] == 0.0
  extra = (large.miss["b"] - small.miss["b"]) * H.hbm_latency_extra
  assert large.latency["b"] - small.latency["b"] == pytest.approx(extra)
  assert small.byte_cycles["b"] < large.byte_cycles["b"]


def _transfer_times(lt, t, nbytes, site, rows):
  """Row bytes -> how long a first transfer of nbytes from site takes."""
  out = {}
  for row in rows:
    s, end, _ = t.tma(lt.engines(0), 0.0, nbytes, site, row_bytes=row)
    out[row] = end - s
  return out


def test_only_boxes_of_128_byte_rows_get_the_shared_rate():
  """In 64-byte boxes a tile many SMs read comes at the streaming rate
  (l2_shared_*_swz64 against _swz128, H200); and at most the SM's share of
  the L2's requests a cycle."""
  import dataclasses
  for gpu in (H, dataclasses.replace(H, l2_requests_per_s=1e15)):
    lt = _matmul_launch(gpu)
    t = Timing(gpu)
    times = _transfer_times(lt, t, 65536, "a", (64, 128, 256))
    assert times[64] == pytest.approx(65536 * max(
        1 / lt.l2_rate, 1 / (64 * min(lt.l2_rows, gpu.tma_narrow_rows_per_clk))))
    assert times[128] == times[256] < 0.6 * times[64]
    # never faster than the SM's TMA engine moves
    assert times[128] >= 65536 / H.tma_bytes_per_clk


def _l2_only(engines):
  """The block's engines with HBM's queue left out (tests/test_hbm_model.py
  has it): what is left of the latency is the L2's."""
  engines.hbm_cycles = None
  return engines


def test_a_loaded_l2s_latency_grows_with_how_busy_the_sm_keeps_it():
  lt = _matmul_launch()
  t = Timing(H)
  e = _l2_only(lt.engines(0))
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
  two (benchmarks/HISTORY.md)."""
  assert _estimate(shallower) > 1.02 * _estimate(deeper)


def test_a_multicast_part_and_an_smem_to_smem_copy_are_not_shared_l2_reads():
  """A multicast's blocks each load their own part (the site's analysis sees
  the cluster's blocks as one reader): streamed, no queue (what the L2 holds
  of it in its far half, the far half's latency: the launch's data not
  known, all far). A copy between SMs' SMEM does not load the L2."""
  lt = _matmul_launch()
  t = Timing(H)
  e = _l2_only(lt.engines(0))
  t.tma(e, 0.0, 1 << 20, "a", row_bytes=128)
  s, end, done = t.tma(e, 0.0, 65536, "a", row_bytes=128, shared=False)
  assert end - s == pytest.approx(65536 / lt.l2_rate)
  hits = 1 - lt.miss["a"]
  assert done - end == pytest.approx(lt.latency["a"] + lt.far * H.l2_far_latency_extra * hits)
  before = e.l2_work
  t.tma(e, end, 65536, via_l2=False)
  assert e.l2_work == before


def test_the_far_share_grows_past_half_the_l2():
  """A launch whose inputs and outputs fit in one L2 partition (half the
  L2) reads all of them near; past the half, the far share ramps to all
  over l2_far_ramp of the L2; an unknown footprint counts as far."""
  from pallas_sim.backends.sim.timing.model import far_share
  half = H.l2_bytes / 2
  ramp = H.l2_far_ramp * H.l2_bytes
  assert far_share(H, None) == 1.0
  assert far_share(H, 0) == far_share(H, half) == 0.0
  assert far_share(H, half + ramp / 2) == pytest.approx(0.5)
  assert far_share(H, half + ramp) == far_share(H, 10 * H.l2_bytes) == 1.0
  # the H100's L2 is smaller: the same footprint is further out
  assert far_share(gpus.H100, half + ramp / 2) > 0.5


def test_near_reads_do_not_queue():
  """A launch that fits in half the L2: its shared loads keep their plain
  latency however busy the SM keeps the L2; half far, half the queue's
  wait."""
  t = Timing(H)
  grid = np.array([(m, n) for m in range(32) for n in range(32)])
  waits = {}
  for footprint in (H.l2_bytes / 4, H.l2_bytes * (0.5 + H.l2_far_ramp / 2), None):
    lt = t.launch(1024, 160 * 1024, 128, footprint=footprint)
    lt.set_loads(grid, {"a": (0,)})
    e = _l2_only(lt.engines(0))
    t.tma(e, 0.0, 1 << 22, "a", row_bytes=128)  # (keeps the share busy)
    _, end, done = t.tma(e, 100.0, 16384, "a", row_bytes=128)
    waits[footprint] = (done - end) / lt.latency["a"]
  near, half, far = waits.values()
  assert near == pytest.approx(1.0)
  assert far == pytest.approx(1 / (1 - H.l2_queue_cap))
  assert half == pytest.approx((near + far) / 2)


def _per_step(m, k, n):
  from test_quickstart import matmul_mcs
  import jax
  import jax.numpy as jnp
  a = jax.ShapeDtypeStruct((m, k), jnp.float16)
  b = jax.ShapeDtypeStruct((k, n), jnp.float16)
  kr = ps.estimate(lambda a, b: matmul_mcs(a, b, tile_n=128, tile_k=64), a, b,
                   gpu="h200", clock_mhz=1575).kernels[0]
  return kr.block_cycles_max / (k // 64)


def test_a_matmul_that_fits_in_half_the_l2_takes_shorter_steps():
  """The H200's 128x128x64 mcs=2 step: 1115-1173 cycles while A, B and C
  fit in 30 MB, 1454-1665 from 41.9 MB on, whatever the strides and waves
  (pipeline_trace.py --m/--k: pipeline_trace_h200.json's
  eighteenth_session.footprint_study). The model's, at 25.2 MB and at
  41.9 MB (A twice as tall: two waves of the same blocks)."""
  near, far = _per_step(2048, 2048, 2048), _per_step(4096, 2048, 2048)
  assert far > 1.15 * near
  # (and A twice as wide is as far: the footprint, not the waves)
  assert _per_step(2048, 4096, 2048) > 1.1 * near


def test_narrow_rows_go_at_the_l2s_request_rate():
  """Each box row under 128 bytes is an L2 request: with every SM busy each
  gets its share of l2_requests_per_s (0.57 rows a cycle at 1980 MHz),
  however fast the L2 would stream their bytes: half the bytes a cycle in
  32-byte rows as in 64; 128-byte rows are not held to it."""
  import dataclasses
  fast_l2 = dataclasses.replace(H, l2_bytes_per_s=100 * H.l2_bytes_per_s)
  lt = _matmul_launch(fast_l2)
  t = Timing(fast_l2)
  share = H.l2_requests_per_s / H.clock_hz / H.num_sms
  assert share < H.tma_narrow_rows_per_clk
  took = _transfer_times(lt, t, 16384, "own", (32, 64, 128))
  assert took[64] == pytest.approx(16384 / 64 / share)
  assert took[32] == pytest.approx(2 * took[64])
  assert took[128] == pytest.approx(16384 / H.tma_bytes_per_clk)


def test_the_request_rate_is_per_second_and_shared_by_the_busy_sms():
  """At 3/4 of the clock an SM's share of the L2's requests is 4/3 the rows
  a cycle; with a few SMs busy each SM's engine sets the rate
  (tma_narrow_rows_per_clk: 16 SMs alone, H200)."""
  import dataclasses
  fast_l2 = dataclasses.replace(H, l2_bytes_per_s=100 * H.l2_bytes_per_s)
  slow = gpus.at_clock(fast_l2, fast_l2.boost_mhz * 0.75)
  lt_full, lt_slow = _matmul_launch(fast_l2), _matmul_launch(slow)
  assert lt_slow.l2_rows == pytest.approx(lt_full.l2_rows / 0.75)
  assert lt_slow.l2_rows < H.tma_narrow_rows_per_clk
  full = _transfer_times(lt_full, Timing(fast_l2), 16384, "own", (64,))[64]
  slower = _transfer_times(lt_slow, Timing(slow), 16384, "own", (64,))[64]
  assert slower == pytest.approx(full * 0.75)
  few = Timing(fast_l2).launch(16, 160 * 1024, 128)
  took = _transfer_times(few, Timing(fast_l2), 16384, None, (64,))[64]
  assert took == pytest.approx(16384 / 64 / H.tma_narrow_rows_per_clk)


def test_narrow_lookups_keep_the_l2_busy_longer_than_their_bytes():
  """An SM's share of the L2 is busy with a narrow load's lookups where they
  take longer than its bytes: 32-byte rows twice the 64-byte rows' share."""
  lt = _matmul_launch()
  busy = {}
  for row in (32, 64):
    e = lt.engines(0)
    Timing(H).tma(e, 0.0, 16384, "own", row_bytes=row)
    busy[row] = e.l2_work
  assert busy[64] == pytest.approx(16384 * max(1 / lt.l2_rate, 1 / (64 * lt.l2_rows)))
  assert busy[32] == pytest.approx(16384 / (32 * lt.l2_rows))
  assert busy[32] > 1.9 * busy[64]


def _apart_launch(footprint, blocks=132):
  """Every block reading tiles of its own (no sharing the analysis sees),
  the launch's data `footprint` bytes."""
  lt = Timing(H).launch(blocks, 32 * 1024, 128, footprint=footprint)
  lt.set_loads(np.array([(b,) for b in range(blocks)]), {"x": (0,)})
  return lt


def test_what_a_block_reads_again_in_a_launch_that_fits_in_the_l2_hits_there():
  """Past twice its share of a source's bytes (blocks splitting a source in
  whole boxes read up to about that), a block's reads are re-reads (a loop
  round a small region): where the launch fits in the L2 they hit, at the
  L2's latency, where before they paid HBM's as well."""
  size = 8 << 20
  lt = _apart_launch(footprint=size)
  assert lt.miss["x"] == 1.0 and lt.hbm_cycles is None
  t, e = Timing(H), lt.engines(0)
  share = 2 * size / 132
  box = 16384
  src = (("x", "buf"), size)
  dones = []
  at = 0.0
  for _ in range(int(share // box) + 3):
    _, end, done = t.tma(e, at, box, "x", row_bytes=512, shared=False, source=src)
    dones.append(done - end)
    at = done
  assert dones[0] == pytest.approx(H.tma_latency + H.hbm_latency_extra)
  assert dones[-1] == pytest.approx(H.tma_latency)  # (read before: a hit)
  # A launch that does not fit keeps HBM's latency (count_hbm's credit is
  # for bandwidth only: what a big launch reads again may have left the L2).
  big = _apart_launch(footprint=4 * H.l2_bytes)
  e2 = big.engines(0)
  for _ in range(int(share // box) + 3):
    _, end, done = t.tma(e2, 0.0, box, "x", row_bytes=512, shared=False, source=src)
  assert done - end >= H.tma_latency + H.hbm_latency_extra


def test_a_hit_in_the_far_half_of_the_l2_takes_longer():
  """A launch that fits in the L2 but not in its near half: a block's hits
  at a site it reads apart come from the far half, l2_far_latency_extra
  later (the near half's: none)."""
  t = Timing(H)
  lat = {}
  for mib in (8, 48):
    lt = _apart_launch(footprint=mib << 20)
    e = lt.engines(0)
    e.hbm_left[("x", "buf")] = 0.0  # (its share read before)
    _, end, done = t.tma(e, 0.0, 16384, "x", row_bytes=512, shared=False,
                         source=(("x", "buf"), mib << 20))
    lat[mib] = done - end
  assert lat[8] == pytest.approx(H.tma_latency)
  assert lat[48] == pytest.approx(H.tma_latency + H.l2_far_latency_extra)
