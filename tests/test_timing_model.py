"""The timing model's verdicts: registers and occupancy, the bound in words,
register spills, and the per-unit tallies behind report.summary."""
import dataclasses
import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import hypothesis
import pytest
from hypothesis import strategies as st
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

import pallas_sim as ps
from pallas_sim import gpus
from pallas_sim.backends.sim.timing import bound, occupancy
from pallas_sim.backends.sim.machine.state import BlockStats
from pallas_sim.backends.sim.timing.model import Engines, KernelTime, OpClass, Timing
from test_quickstart import matmul_mcs

from lab import calibrate

F16, F32 = jnp.float16, jnp.float32
S = jax.ShapeDtypeStruct


def _est(m, n, k, **kw):
  return ps.estimate(lambda a, b: matmul_mcs(a, b, **kw), S((m, k), F16),
                     S((k, n), F16)).kernels[0]


def test_registers_count_the_accumulator_once_and_spill_past_255():
  base = gpus.H100.register_base
  k128 = _est(256, 256, 256, tile_n=128)
  k256 = _est(256, 256, 256, tile_n=256, max_concurrent_steps=2)
  assert k128.registers == base + 128 and k128.spilled_registers == 0
  assert k256.registers == base + 256 and k256.register_limit == 255
  assert k256.spilled_registers == base + 1
  assert "spilled" in k256.summary()


def test_set_max_registers_sets_the_limit():
  @plgpu.kernel(out_type=S((128,), F32), num_threads=2, thread_name="t")
  def k(o_ref):
    t = lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      plgpu.set_max_registers(232, action="increase")
      o_ref[...] = jnp.zeros((128,), F32)

    @pl.when(t == 1)
    def _():
      plgpu.set_max_registers(40, action="decrease")
  rep = ps.estimate(k).kernels[0]
  assert rep.register_limit == 232
  # (without it: the register file's share of each warpgroup, in eights)
  nothing = jax.make_jaxpr(lambda: None)().jaxpr
  assert occupancy.registers(nothing, 2, 32).limit == 255
  r = occupancy.registers(nothing, 3, 32)
  assert r.limit == 168 and r.per_thread == 32


def _raising_kernel(raise_to, blocks=264):
  """Two warpgroups with little to hold: one raises its registers to
  `raise_to` (None: neither asks), the other lowers its to 40."""
  @plgpu.kernel(out_type=S((blocks, 128), F32), num_threads=2, thread_name="t",
                grid=(blocks,), grid_names=("b",))
  def k(o_ref):
    t = lax.axis_index("t")

    @pl.when(t == 0)
    def _():
      if raise_to:
        plgpu.set_max_registers(raise_to, action="increase")
      o_ref[lax.axis_index("b")] = jnp.zeros((128,), F32)

    @pl.when(t == 1)
    def _():
      if raise_to:
        plgpu.set_max_registers(40, action="decrease")
  return ps.estimate(k).kernels[0]


def test_a_block_that_raises_its_registers_holds_them_from_launch():
  """setmaxnreg.inc draws on the block's own registers, allocated at launch,
  and its lanes count at the raised count (a bound: which warpgroup raises
  is not read off the kernel): raised to 232, one block an SM, where its few
  registers alone would let 8 share it (attention_mgpu's d64 kernel: 31%
  slower with 64-column KV blocks than with 128 on the H200, where more
  blocks an SM would have made it faster)."""
  assert _raising_kernel(None).blocks_per_sm == 8
  assert _raising_kernel(232).blocks_per_sm == 1
  assert _raising_kernel(104).blocks_per_sm == 2


def test_a_spilling_accumulator_costs_more_per_flop():
  """The 128x256 f32 accumulator does not fit a lane's 255 registers: each
  wgmma moves the spilled registers out and back, which no tile that fits
  pays (the H200 runs it ~4x slower, benchmarks/HISTORY.md)."""
  fits = _est(2048, 2048, 2048, tile_n=128, max_concurrent_steps=3)
  spills = _est(2048, 2048, 2048, tile_n=256, max_concurrent_steps=3)
  assert spills.stalls["spill"] > 0 and fits.stalls["spill"] == 0
  per_flop = lambda k: k.timing.compute_s / k.wgmma_flops
  assert per_flop(spills) > 1.2 * per_flop(fits)


def test_the_l1_is_what_the_smem_carveout_leaves():
  """The driver takes the smallest SMEM carve-out that holds the blocks an
  SM runs at once; the L1 gets the rest of the 256 KiB."""
  g = gpus.H200
  assert occupancy.l1_bytes(g, 49 * 1024) == 192 * 1024   # 64 KiB carve-out
  assert occupancy.l1_bytes(g, 100 * 1024) == 156 * 1024  # exactly 100
  assert occupancy.l1_bytes(g, 161 * 1024) == 92 * 1024   # 164
  assert occupancy.l1_bytes(g, 226 * 1024) == 28 * 1024   # 228
  assert occupancy.l1_bytes(g, 0) == 256 * 1024


def wgmma_loop(n, steps, pad_kib=0, **opts):
  """One block: a 128xn f32 accumulator, wgmma 128xnx64 `steps` times, with
  pad_kib of SMEM beside its operands, unused: its report (ps.estimate on
  the H200 model, with opts)."""
  def body(a_ref, b_ref, o_ref, a_s, b_s, acc, bar, *pad):
    calibrate.wgmma_steps(a_ref, b_ref, a_s, b_s, bar, acc, steps)
    o_ref[...] = acc[...]
  T = dict(transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))
  k = plgpu.kernel(body, out_type=S((128, n), F32), scratch_types=[
      plgpu.SMEM((128, 64), F16, **T), plgpu.SMEM((64, n), F16, **T),
      plgpu.ACC((128, n), F32), plgpu.Barrier(num_arrivals=2)]
      + ([plgpu.SMEM((pad_kib * 8, 64), F16)] if pad_kib else []))
  return ps.estimate(k, S((128, 64), F16), S((64, n), F16), gpu="h200", **opts).kernels[0]


def _spilling_loop(pad_kib, steps):
  """A 128x256 f32 accumulator (spills) in the loop: the kernel's cycles."""
  return wgmma_loop(256, steps, pad_kib).timing.compute_s * gpus.H200.clock_hz


def _per_wgmma(pad_kib):
  return (_spilling_loop(pad_kib, 16) - _spilling_loop(pad_kib, 8)) / 8


def test_spills_slow_down_when_smem_leaves_the_l1_too_small_for_them():
  """What of the spilled accumulator the L1 beside SMEM cannot hold goes to
  the L2 (the H200: 5999 cycles a wgmma with 156 KiB of L1, 6287 with 92,
  6884 with 28, benchmarks/HISTORY.md)."""
  g = gpus.at_clock(gpus.H200, 1980)  # (one block: the boost clock)
  roomy, tight, none = (_per_wgmma(p) for p in (0, 112, 160))
  tensor = 2 * 128 * 256 * 64 / g.tensor_rate("f16") + g.wgmma_issue_cycles
  round_trip = 2 * 128 * 256 * 4
  assert roomy == pytest.approx(tensor + round_trip / g.local_bytes_per_clk, rel=0.01)
  assert roomy < tight < none
  to_l2 = 1 - 28 / 128
  assert none == pytest.approx(tensor + round_trip * (
      (1 - to_l2) / g.local_bytes_per_clk + to_l2 / g.local_l2_bytes_per_clk), rel=0.01)


def test_a_spills_l2_part_goes_at_what_the_tma_loads_leave_of_the_l2():
  """The part of a spilled accumulator's round trip the L1 cannot hold goes
  through the SM's share of the L2, which its block's TMA loads (and the
  co-resident blocks', alike) keep busy part of the time: that part goes
  at what they leave, as their latency does (the quickstart's 128x256 rows:
  -19 / -15% to -12 / -8% at mcs=3, benchmarks/HISTORY.md)."""
  t = Timing(gpus.H200)
  alone = Engines(share=1, spill=(100.0, 400.0))
  assert t.spill(alone, 1000.0) == 500.0  # (nothing else loads the L2: the study's loop)
  loaded = Engines(share=2, spill=(100.0, 400.0))
  loaded.l2_work = 250.0  # (two blocks, each keeping the share busy a quarter of the time)
  assert t.spill(loaded, 1000.0) == pytest.approx(100.0 + 400.0 / 0.5)
  loaded.l2_work = 5000.0  # (the queue's bound, as a load's latency has)
  assert t.spill(loaded, 1000.0) == pytest.approx(100.0 + 400.0 / (1 - t.gpu.l2_queue_cap))


def _kt(seconds=1.0, compute=1.0, memory=0.1, launch=4e-6, tail=0.0, fill=1.0):
  return KernelTime(seconds, compute, memory, launch, tail, fill)


def _totals(thread=100.0, **stalls):
  t = BlockStats()
  t.thread_cycles = thread
  t.stalls.update(stalls)
  return t


@pytest.mark.parametrize("kt, totals, util, words", [
    (_kt(seconds=5e-6, compute=1e-6), _totals(), {}, "launch overhead"),
    (_kt(memory=1.0, compute=0.5), _totals(), {"HBM": 0.9}, "HBM"),
    (_kt(tail=0.4, fill=0.1), _totals(), {}, "tail wave"),
    (_kt(), _totals(spill=60.0), {}, "register spills"),
    (_kt(), _totals(), {"tensor core": 0.8, "TMA": 0.1}, "tensor core"),
    (_kt(), _totals(), {"tensor core": 0.1, "TMA": 0.7}, "TMA bandwidth"),
    (_kt(), _totals(), {"tensor core": 0.88, "TMA": 0.94}, "TMA bandwidth"),
    (_kt(), _totals(TMA=70.0), {"tensor core": 0.1, "TMA": 0.1}, "TMA latency"),
    (_kt(), _totals(barrier=50.0, TMA=10.0), {"tensor core": 0.1, "TMA": 0.1},
     "barrier stalls"),
    (_kt(), _totals(), {"tensor core": 0.1, "TMA": 0.1}, "ALU"),
])
def test_the_bound_is_named_by_what_limits_the_kernel(kt, totals, util, words):
  util = {"tensor core": 0.0, "TMA": 0.0, "HBM": 0.0, **util}
  regs = occupancy.Registers(300, 255, 256)
  got, why = bound.name(kt, totals, util, regs)
  assert got == words and why


def test_summary_reports_bound_units_and_time():
  k = _est(1024, 1024, 1024)
  text = k.summary()
  assert f"bound: {k.bound} (" in text
  assert "occupancy: 2 block(s) per SM, 1 wave(s) over 132 SMs (64 in use, 68 idle)" in text
  assert "units busy: tensor core" in text and "thread time:" in text
  assert sum(k.stalls.values()) == pytest.approx(1.0)
  assert 0 < k.utilisation["tensor core"] < 1 and k.gbps > 0
  assert k.timing.seconds == k.time_s


def test_co_residents_take_the_unit_as_busy_as_this_block_keeps_it():
  """Blocks sharing an SM are alike: a block that keeps the TMA engine busy
  gets 1/share of it, one that rarely uses it has it nearly alone."""
  from pallas_sim.backends.sim.timing.model import Engines, Timing
  t = Timing(gpus.H200)
  busy, idle = Engines(share=2, l2_rate=100.0), Engines(share=2, l2_rate=100.0)
  s, e, _ = t.tma(busy, 0.0, 10_000)     # (first: all blocks load at once)
  assert e - s == 200.0
  s, e, _ = t.tma(busy, 100.0, 10_000)   # kept it busy so far: half the rate
  assert e - s == 200.0
  t.tma(idle, 0.0, 100)                  # 1 cycle of work in 10000
  s, e, _ = t.tma(idle, 10_000.0, 10_000)
  assert e - s == pytest.approx(100.0 * (1 + 1 / 10_000))
  alone = Engines(share=1, l2_rate=100.0)
  s, e, _ = t.tma(alone, 0.0, 10_000)
  assert e - s == 100.0


def _alu_kernel(blocks, n=50):
  @plgpu.kernel(out_type=S((blocks, 128, 128), F32), grid=(blocks,), grid_names=("b",))
  def k(x_ref, o_ref):
    v = lax.fori_loop(0, n, lambda i, v: v * 0.999 + 0.001, x_ref[...])
    o_ref[lax.axis_index("b")] = v
  return k


def test_warpgroups_on_an_sm_share_its_alus():
  """The H200 ran an FMA loop at 123 cycles per 128x128 tile with one block
  per SM and 277 with two (benchmarks/HISTORY.md): co-resident blocks share
  the SM's ALUs, and one warpgroup alone has them all."""
  sms = gpus.H200.num_sms
  one = ps.estimate(_alu_kernel(sms), S((128, 128), F32), gpu="h200").kernels[0]
  two = ps.estimate(_alu_kernel(2 * sms), S((128, 128), F32), gpu="h200").kernels[0]
  assert two.blocks_per_sm >= 2 and two.waves == one.waves == 1
  assert 1.7 < two.block_cycles_max / one.block_cycles_max <= 2.0
  per_tile = one.block_cycles_max / 50
  assert 100 < per_tile < 150  # (the FMA: one vector op, its product folded in)


def test_block_slots_take_blocks_as_they_free_up():
  """As the GPU's block scheduler: long blocks on half the SMs, and the
  short ones run on the others meanwhile (static waves would queue them
  behind the long ones: 1200 cycles)."""
  from pallas_sim.backends.sim.timing.model import Timing
  sms = gpus.H200.num_sms
  lt = Timing(gpus.H200).launch(3 * sms, 200 * 1024, 1)  # one block per SM
  cycles = [1000.0] * (sms // 2) + [100.0] * (sms // 2 + 2 * sms)
  kt = lt.kernel_time(cycles, 0, 0)
  assert kt.compute_s * gpus.H200.clock_hz == pytest.approx(1000.0)
  # like blocks: waves; the last, a third full, is the tail
  kt = lt.kernel_time([100.0] * (2 * sms + 44), 0, 0)
  assert kt.compute_s * gpus.H200.clock_hz == pytest.approx(300.0)
  assert kt.tail_s * gpus.H200.clock_hz == pytest.approx(100.0)


def _exp2_loop_cycles(approx, steps):
  def body(x_ref, o_ref):
    o_ref[...] = lax.fori_loop(0, steps, lambda i, v: jnp.exp2(-v), x_ref[...])
  k = plgpu.kernel(body, out_type=S((128, 128), F32),
                   compiler_params=plgpu.CompilerParams(approx_math=approx))
  return ps.estimate(k, S((128, 128), F32), gpu="h200").kernels[0].block_cycles_max


def test_approx_math_puts_exp2_on_the_special_function_units():
  """exp2 under approx_math is one SFU op an element (the H200: 16 a clock
  per SM, 1054 cycles an iteration of exp2(-v) on 128x128 f32); without it,
  the library's sequence."""
  g = gpus.H200
  per = {a: (_exp2_loop_cycles(a, 12) - _exp2_loop_cycles(a, 4)) / 8 for a in (True, False)}
  neg = g.op_overhead_cycles + 128 * g.alu_cycles_per_vector
  assert per[True] == pytest.approx(neg + g.op_overhead_cycles + 128 * g.sfu_cycles_per_vector,
                                    rel=0.05)
  assert per[False] == pytest.approx(
      neg + g.op_overhead_cycles + 128 * g.transcendental_cycles_per_vector, rel=0.05)


def test_summary_says_where_the_clock_came_from():
  """A matmul that keeps the tensor cores and the L2 busy meets the 700 W
  limit below the boost clock, and its summary says so; one that spills
  does not, and runs at the boost clock."""
  busy = _est(4096, 4096, 4096, tile_n=128, max_concurrent_steps=4)
  assert busy.sm_mhz < 1980 and busy.power_w <= 700
  assert "clock: SMs at" in busy.summary() and "700 W limit's clock" in busy.clock_note
  idle = _est(4096, 4096, 4096, tile_n=256, max_concurrent_steps=2)  # (spills)
  assert idle.sm_mhz == 1980 and "boost clock" in idle.clock_note and idle.power_w < 700


def test_a_scalar_equation_costs_what_the_h200_measured():
  """calibrate.py's scalar_chain micro-benchmarks, simulated: a loop of 4 or
  32 dependent scalar int32 equations (each round a mul, an add of the loop
  index, a shift, an xor; the index's weak-type convert emits nothing). On
  the H200: 12.2 and 132.2 cycles an iteration, 4.29 a real equation."""
  per = {}
  for rounds in (1, 8):
    times = []
    for n in (20, 120):
      b = calibrate._build_scalar(n, rounds=rounds, blocks=1)
      sim = ps.simulate(b.fn, *b.args)
      times.append(sim.report.kernels[0].block_cycles_max)
    per[rounds] = (times[1] - times[0]) / 100
  g = gpus.H200
  op = g.op_overhead_cycles + g.alu_cycles_per_vector
  assert per[8] - per[1] == pytest.approx(28 * op)  # (the converts: free)
  assert (per[8] - per[1]) / 28 == pytest.approx(4.29, rel=0.02)


def test_warpgroups_beside_each_other_overlap_an_equations_latency():
  """The same scalar chain (32 dependent equations an iteration) with 2 and
  4 blocks to an SM: on the H200 133.2, 132.1 and 169.2 cycles an iteration
  at 1, 2 and 4 (micros_2026_12_02_tenth): an equation's issue latency is
  each warpgroup's own; only its vector work shares the SM's ALUs (and
  v + 1 on a 128x128 tile, all vector work, takes twice as long at 2)."""
  g = gpus.H200

  def per_iteration(bps):
    cyc = []
    for n in (20, 120):
      b = calibrate._build_scalar(n, rounds=8, blocks=bps * g.num_sms)
      k = ps.estimate(b.fn, *b.args, gpu="h200").kernels[0]
      assert k.blocks_per_sm >= bps
      cyc.append(k.block_cycles_max)
    return (cyc[1] - cyc[0]) / 100
  one, two, four = per_iteration(1), per_iteration(2), per_iteration(4)
  assert two == pytest.approx(one, rel=0.1)      # (H200: -1%)
  assert 1.1 * one < four < 1.5 * one            # (H200: +27%)


def _micro_cycles(name, build, **kw):
  """One of calibrate.py's micro-benchmarks estimated at the clock the H200
  ran it at: cycles an iteration. (At the predicted clock the two loop
  lengths may run at different clocks, and a difference of their cycles
  means nothing.)"""
  measured = json.load(open(os.path.join(os.path.dirname(__file__), "..", "lab", "data",
                                         "h200_measured.json")))
  mhz = {m["name"]: m["clock_hz"] / 1e6
         for m in measured["micros_2026_12_02_eleventh"]["micros"]}[name]
  cyc = []
  for n in (4, 12):
    b = build(n, **kw)
    cyc.append(ps.estimate(b.fn, *b.args, gpu="h200",
                           clock_mhz=mhz).kernels[0].block_cycles_max)
  return (cyc[1] - cyc[0]) / 8


def _rega_cycles(mode, wgs):
  """calibrate.py's rega_* micro-benchmark (a wgmma whose A is loaded from
  SMEM into registers, int8 converted to bf16, as a mixed-type matmul does)."""
  return _micro_cycles(f"rega_{mode}_{wgs}_wg", calibrate._build_rega, mode=mode, wgs=wgs)


def test_int8_to_bf16_conversion_costs_what_the_h200_measured():
  """An int8 128x64 tile loaded, converted to bf16 and max-reduced: 383
  cycles an iteration in one warpgroup on the H200, 94 for a bf16 tile
  loaded and max-reduced (micros_2026_12_02_eleventh); the conversion is
  ~4.5x an ALU op a vector, not one."""
  conv, load = _rega_cycles("int8_convert", 1), _rega_cycles("bf16_load", 1)
  assert conv == pytest.approx(383, rel=0.1)
  assert conv - load > 3 * 64 * gpus.H200.alu_cycles_per_vector


def test_alu_work_beside_another_warpgroups_wgmma_is_slower():
  """Two warpgroups, each loading and converting its int8 A, then a wgmma
  from registers and wgmma_wait(0): on the H200 1509 cycles an iteration,
  where two wgmmas from SMEM take 1270 and one warpgroup 1019 (its
  conversion is not hidden behind the other's wgmma: it goes ~2x slower
  beside it). With A in bf16 (a load, no conversion) it is hidden: 1247.
  (The two-warpgroup micro ran at 1980 MHz; at that clock's cycles the
  model's tensor cores take 1/1.19 of the cycles the per-second rate gave
  at 1980. The model comes out 12% fast: at beside_tensor_other (2.0) the
  conversion just hides behind the other warpgroup's wgmma, where the
  H200's 1509 says it goes 2.3x or more slower; the beside_*_convert
  micros are 5-6% fast.)"""
  int8_2, bf16_2, smem_2 = (_rega_cycles(m, 2) for m in ("int8", "bf16", "smem"))
  int8_1 = _rega_cycles("int8", 1)
  assert int8_2 == pytest.approx(1509, rel=0.15)
  assert int8_1 == pytest.approx(1019, rel=0.08)
  assert int8_2 > 1.05 * smem_2              # (H200: +19%)
  assert bf16_2 == pytest.approx(smem_2, rel=0.03)


@pytest.mark.parametrize("work, measured", [("fma", 586), ("convert", 291)])
def test_a_loop_that_never_waits_sees_the_wgmmas_the_other_warpgroup_issues_later(
    work, measured):
  """calibrate.py's beside_* micros: one warpgroup loops over wgmma +
  wgmma_wait(0), the other over ALU work that never waits. The simulation
  would run the ALU loop to its end ahead of the wgmmas issued after the
  first (it runs a warpgroup until it blocks); a loop lets it catch up each
  iteration, and the ALU loop is slowed beside each of them. On the H200 an
  iteration takes 586 cycles more beside the wgmmas (fma) and 291
  (conversions) than beside none (micros_2026_12_02_eleventh)."""
  none, smem = (_micro_cycles(f"beside_{w}_{work}", calibrate._build_beside,
                              wgmma=w, work=work) for w in ("none", "smem"))
  assert smem - none == pytest.approx(measured, rel=0.25)


def test_tensor_overlap_slows_what_runs_beside_busy_tensor_cores():
  from pallas_sim.backends.sim.timing.model import tensor_overlap
  assert tensor_overlap(100, 0, 2.0) == 100          # (idle tensor cores)
  assert tensor_overlap(100, 500, 2.0) == 200        # (busy throughout)
  assert tensor_overlap(100, 50, 2.0) == 50 + 75     # (busy for 50 cycles)


def _hold(m, n, k, dtype=F16, tc_free=0.0):
  """(held, start, took, issued) of a wgmma group issued at 0 on idle (or
  busy until tc_free) tensor cores, the H200's model at 1890 MHz (the SM's
  cycles: a cycle's tensor work is the same at any clock)."""
  t = Timing(gpus.at_clock(gpus.H200, 1890))
  e = Engines()
  e.tc_free = tc_free
  start, done, held, issued = t.wgmma(e, 0.0, m, n, k, jnp.dtype(dtype))
  assert held <= done
  return held, start, e.tc_free - start, issued


G = gpus.at_clock(gpus.H200, 1890)
ISSUE = lambda instrs: G.wgmma_issue_cycles_base + instrs * G.wgmma_instr_issue_cycles


def test_a_wgmma_issue_holds_its_warpgroup_until_the_queue_takes_the_rest():
  """The quickstart's body traced on the H200 (lab/pipeline_trace.py,
  pipeline_trace_h200.json), the tensor cores idle before the issue: 16
  m64n128k16 instructions (128x128x128) held the warpgroup 634 cycles, 16
  m64n64k16 (128x64x128) 354, 8 m64n128k16 109-122, 8 m64n64k16 91, 4
  m64n128k16 65-76. The model: all but six instructions started, or the
  issue's own cost; its misses (its tensor rate is not the datasheet's)
  are the gpus.py comment's."""
  for (m, n, k), instrs, gpu in (((128, 128, 128), 16, 634), ((128, 64, 128), 16, 354),
                                 ((128, 128, 64), 8, 122), ((128, 64, 64), 8, 91),
                                 ((128, 128, 32), 4, 70)):
    held, start, took, issued = _hold(m, n, k)
    assert start == 0.0 and issued == ISSUE(instrs)
    assert held == pytest.approx(max(issued, took * (instrs - G.wgmma_queue) / instrs))
    assert held == pytest.approx(gpu, rel=0.2)
  assert _hold(128, 128, 128)[0] == pytest.approx(634, rel=0.11)
  assert _hold(128, 64, 128)[0] == pytest.approx(354, rel=0.02)
  # Behind a busy tensor core its last instruction waits for a place in
  # the queue: the groups ahead taken as long an instruction as its own.
  for (m, n, k), instrs in (((128, 128, 128), 16), ((128, 128, 32), 4)):
    held, start, took, _ = _hold(m, n, k, tc_free=1000.0)
    assert start == 1000.0
    assert held == pytest.approx(1000.0 + took * (instrs - G.wgmma_queue) / instrs)
  # An instruction takes 32 bytes of K: 2 of them for K=16 of f32 (tf32)
  # and for K=64 of fp8; one per 64 rows of A.
  assert _hold(64, 128, 16, F32)[3] == ISSUE(2)
  assert _hold(64, 128, 64, jnp.float8_e4m3fn)[3] == ISSUE(2)
  assert _hold(192, 128, 16)[3] == ISSUE(3)


def test_no_wgmma_instruction_starts_before_it_is_issued():
  """Narrow instructions (m64n8k16: ~4 cycles of tensor work) go as fast as
  the warpgroup issues them: the group ends after its last issue."""
  held, start, took, issued = _hold(64, 8, 256)
  work = 2 * 64 * 8 * 256 / G.tensor_rate("f16") + G.wgmma_issue_cycles
  assert start == 0.0 and issued > work
  assert took == pytest.approx(issued + work / 16)  # (its last instruction's)


def _issue_order_kernel(load_first):
  """One block: a 128x128x128 wgmma from SMEM and a 64 KiB TMA load, the
  load issued before the wgmma or after it."""
  @plgpu.kernel(out_type=S((128, 256), F16),
                scratch_types=dict(a=plgpu.SMEM((128, 128), F16),
                                   b=plgpu.SMEM((128, 128), F16),
                                   buf=plgpu.SMEM((128, 256), F16),
                                   acc=plgpu.ACC((128, 128), F32),
                                   bar=plgpu.Barrier()))
  def k(x_ref, o_ref, a, b, buf, acc, bar):
    a[...] = jnp.zeros((128, 128), F16)
    b[...] = jnp.zeros((128, 128), F16)
    plgpu.commit_smem()
    if load_first:
      plgpu.copy_gmem_to_smem(x_ref, buf, bar)
    plgpu.wgmma(acc, a, b)
    if not load_first:
      plgpu.copy_gmem_to_smem(x_ref, buf, bar)
    plgpu.barrier_wait(bar)
    plgpu.wgmma_wait(0)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(buf, o_ref)
    plgpu.wait_smem_to_gmem(0)
  return k


def test_a_load_issued_after_a_long_wgmma_group_waits_out_its_issue():
  """A TMA load issued after 16 wgmma instructions leaves when the issue
  returns, ten instructions' time later (pipeline_trace: a 128x128x128
  quickstart step is the issue's 634 cycles plus the load); issued first, it
  overlaps the group whole."""
  x = S((128, 256), F16)
  first, after = (ps.estimate(_issue_order_kernel(f), x, gpu="h200", clock_mhz=1890)
                  .kernels[0].block_cycles_max for f in (True, False))
  # (the 64 KiB load outlasts the group: the order moves the kernel's end by
  # the issue's hold)
  held = _hold(128, 128, 128)[0]
  assert after - first == pytest.approx(held, rel=0.1)


@hypothesis.given(m=st.sampled_from([64, 128, 192, 256]), n=st.integers(1, 32).map(lambda v: 8 * v),
                  k=st.integers(1, 16).map(lambda v: 16 * v),
                  dtype=st.sampled_from([F16, jnp.bfloat16, F32, jnp.float8_e4m3fn]),
                  t=st.floats(0, 5000), busy=st.floats(0, 5000), share=st.integers(1, 3))
@hypothesis.example(m=64, n=8, k=256, dtype=F16, t=0.0, busy=0.0, share=1)  # (narrow)
def test_a_wgmma_group_is_issued_then_held_then_done(m, n, k, dtype, t, busy, share):
  """Whatever the group and the tensor cores' state: the warpgroup is free
  no sooner than its own issue ends and no later than the group is done; the
  group starts behind the ones before and ends after its last issue."""
  tm = Timing(G)
  e = Engines(share=share)
  e.tc_free = busy
  e.tc_work = busy / 2
  start, done, held, issued = tm.wgmma(e, t, m, n, k, jnp.dtype(dtype))
  assert start == max(t, busy)
  assert t < issued <= held <= done
  assert e.tc_free >= issued and done == e.tc_free + G.wgmma_latency


def _tma_issue_kernel(copies, profile_dir, blocks=1):
  """Each of `blocks` blocks: `copies` TMA loads of a 64x64 f16 tile back to
  back in a named scope, then as many stores of them."""
  params = plgpu.CompilerParams(profile_space=16, profile_dir=str(profile_dir))

  @plgpu.kernel(out_type=S((blocks * copies, 64, 64), F16), grid=(blocks,),
                grid_names=("b",), compiler_params=params,
                scratch_types=[plgpu.SMEM((copies, 64, 64), F16),
                               plgpu.Barrier(num_barriers=copies)])
  def k(x_ref, o_ref, buf, bar):
    b = jax.lax.axis_index("b")
    at = [b * copies + i for i in range(copies)]  # (outside the timed scopes)
    with jax.named_scope("issue"):
      for i in range(copies):
        plgpu.copy_gmem_to_smem(x_ref.at[at[i]], buf.at[i], bar.at[i])
    for i in range(copies):
      plgpu.barrier_wait(bar.at[i])
    plgpu.commit_smem()
    with jax.named_scope("store"):
      for i in range(copies):
        plgpu.copy_smem_to_gmem(buf.at[i], o_ref.at[at[i]])
    plgpu.wait_smem_to_gmem(0)
  return k


def _scope_cycles(copies, profile_dir, gpu="h200", blocks=1):
  """The issue and store scopes of _tma_issue_kernel, estimated: SM cycles
  (the profiler's file holds them as ns), block 0's."""
  ps.estimate(_tma_issue_kernel(copies, profile_dir, blocks),
              S((blocks * copies, 64, 64), F16), gpu=gpu, clock_mhz=1500)
  [name] = os.listdir(profile_dir)
  events = json.load(open(os.path.join(profile_dir, name)))["traceEvents"]
  spans = {}
  for scope in ("issue", "store"):
    t = {}
    for e in events:
      if e["name"] == scope:
        t.setdefault(e["ph"], e["ts"])
    spans[scope] = (t["E"] - t["B"]) * 1e3
  return spans


@pytest.mark.parametrize("copies", [1, 2, 8])
def test_a_tma_issue_costs_its_warpgroup_the_measured_cycles(tmp_path, copies):
  """Issuing a TMA load holds the warpgroup tma_issue_cycles, a store
  tma_store_issue_cycles (H200: two loads back to back took 86 cycles, two
  stores 118: pipeline_trace --tma-issue), whatever else is running: a
  pipeline step that issues two loads pays it where its loads are ready.
  (Eight stores, the engine's queue left unbounded: the next test.)"""
  g = dataclasses.replace(gpus.H200, tma_store_queue=copies)
  spans = _scope_cycles(copies, tmp_path, g)
  for scope, per in (("issue", gpus.H200.tma_issue_cycles),
                     ("store", gpus.H200.tma_store_issue_cycles)):
    assert spans[scope] == pytest.approx(copies * per, abs=2), scope


def test_a_third_bulk_store_waits_for_the_first_to_read_its_smem(tmp_path):
  """The TMA engine holds two bulk stores still reading SMEM: a third's
  issue waits for the first's read (H200, a block on every SM: 2 stores
  issued in 118 cycles, 4 in 1346, 8 in 4776). With every SM storing, a
  store reads at its SM's share of the L2, slower than its issue: from the
  third on, each issue waits. Alone on the GPU a 64x64 tile reads in 51
  cycles at the TMA engine's rate, within the next store's issue: none
  waits."""
  issue = gpus.H200.tma_store_issue_cycles
  busy = _scope_cycles(8, tmp_path / "a", blocks=gpus.H200.num_sms)["store"]
  read = 64 * 64 * 2 / (gpus.H200.l2_bytes_per_s / 1.5e9 / gpus.H200.num_sms)
  assert read > issue
  # (issue and read in turn, two stores at a time: six reads waited for)
  assert busy == pytest.approx(2 * issue + 6 * read, rel=0.15)
  assert _scope_cycles(2, tmp_path / "b", blocks=gpus.H200.num_sms)["store"] == (
      pytest.approx(2 * issue, abs=2))
  assert _scope_cycles(8, tmp_path / "c")["store"] == pytest.approx(8 * issue, abs=2)
  wide = dataclasses.replace(gpus.H200, tma_store_queue=8)
  assert _scope_cycles(8, tmp_path / "d", wide, blocks=gpus.H200.num_sms)["store"] == (
      pytest.approx(8 * issue, abs=2))


def test_a_tma_copy_leaves_as_its_issue_ends(tmp_path):
  """A load's landing and a store's completion come after their issue:
  tma_latency is what the measured round trip leaves once the issue is
  paid. One load then one store, alone on the GPU: the block's time moves
  by both issues' extra cost."""
  x = S((1, 64, 64), F16)
  base = ps.estimate(_tma_issue_kernel(1, tmp_path / "a"), x, gpu="h200",
                     clock_mhz=1500).kernels[0].block_cycles_max
  dear = dataclasses.replace(gpus.H200, tma_issue_cycles=gpus.H200.tma_issue_cycles + 100,
                             tma_store_issue_cycles=gpus.H200.tma_store_issue_cycles + 100)
  more = ps.estimate(_tma_issue_kernel(1, tmp_path / "b"), x, gpu=dear,
                     clock_mhz=1500).kernels[0].block_cycles_max
  # (each copy starts 100 later; the warpgroup's own wait for the issue lies
  # under the copy's latency. Were the copies to leave as their issue began,
  # nothing would move)
  assert more - base == pytest.approx(200, abs=2)


@pytest.mark.parametrize("tile_k, mcs, ncu_gb", [(64, 4, 4.492), (64, 2, 2.442), (128, 2, 4.492)])
def test_the_quickstarts_hbm_bytes_at_8192_are_ncus_where_its_waves_stay_sharp(
    tile_k, mcs, ncu_gb):
  """The model's HBM bytes (reads and writes) against Nsight Compute's on the
  H200 (lab/data/ncu_dram_h200.json; lab/hbm_bytes.py for all of
  them): one operand a wave, as the wave's blocks read each tile together.
  (Where the waves smear, as at tile_k=32 with mcs=4, the GPU reads up to 3x
  that: not modelled, benchmarks/RESULTS.md.)"""
  x = S((8192, 8192), F16)
  r = ps.estimate(lambda a, b: matmul_mcs(a, b, tile_k=tile_k, max_concurrent_steps=mcs),
                  x, x, gpu="h200")
  assert r.kernels[0].hbm_bytes / 1e9 == pytest.approx(ncu_gb, rel=0.03)


def _state_loop(steps):
  """One warpgroup carrying a 128x128 f32 accumulator through `steps`
  run_states with empty bodies."""
  def body(o_ref):
    def step(_, acc):
      return pl.run_state(lambda acc_ref: None)(plgpu.ACC.init(acc))
    acc = lax.fori_loop(0, steps, step, plgpu.layout_cast(
        jnp.zeros((128, 128), F32), plgpu.Layout.WGMMA))
    o_ref[...] = acc
  return plgpu.kernel(body, out_type=S((128, 128), F32), grid=(1,), grid_names=("x",))


def test_run_state_costs_its_body_not_a_copy_of_its_accumulator():
  """The lowering wraps run_state's operand registers as the accumulator
  (WGMMAAccumulator.from_registers) and hands them back: no instruction a
  register. 32 more steps of an empty body cost the loop's own equations,
  not 32 copies of 128 vectors."""
  cycles = [ps.estimate(_state_loop(n)).kernels[0].block_cycles_max for n in (16, 48)]
  per_step = (cycles[1] - cycles[0]) / 32
  assert 0 < per_step < 0.25 * 128 * gpus.H100.alu_cycles_per_vector * 2


def test_a_reduction_costs_the_elements_it_reduces():
  """A row sum of a 128x128 tile does work on its 16384 elements (each
  lane's partial sums), not on the 128 it returns, at a reduction's rate: a
  sum twice an elementwise op's a vector, a max (half-rate lanes) three
  times; both pay the exchange across lanes as the warpgroup's own wait."""
  x = S((128, 128), F32)
  g = gpus.H100
  t = Timing(g)
  sum_eqn = jax.make_jaxpr(lambda v: jnp.sum(v, axis=1))(x).jaxpr.eqns[0]
  max_eqn = jax.make_jaxpr(lambda v: jnp.max(v, axis=1))(x).jaxpr.eqns[0]
  square_eqn = jax.make_jaxpr(lambda v: v * v)(x).jaxpr.eqns[0]
  vectors = 128 * 128 // 128
  for op, eqn, per in ((OpClass.REDUCE_SUM, sum_eqn, g.reduce_sum_cycles_per_vector),
                       (OpClass.REDUCE, max_eqn, g.reduce_max_cycles_per_vector)):
    wait, work = t.issue_split(op, eqn)
    assert wait == g.op_overhead_cycles + g.reduce_exchange_cycles
    assert work == pytest.approx(per * vectors)
  assert (t.issue_cycles(OpClass.ALU, square_eqn)
          < t.issue_cycles(OpClass.REDUCE_SUM, sum_eqn) < t.issue_cycles(OpClass.REDUCE, max_eqn))


def _warpgroups(n, turns=False, together=False):
  """n warpgroups of one block each run 8 rounds of ALU work on a 128x128
  tile in registers: with `turns` (two), one after the other (each waits on
  a barrier the other arrives at once its round is done); with `together`,
  side by side, each round ending on a barrier all arrive at; else side by
  side."""
  def k(x_ref, o_ref, bars, every):
    w = lax.axis_index("wg")
    v = x_ref[...]

    def round_(i, v):
      if turns:
        @pl.when(jnp.logical_or(w == 1, i > 0))
        def _():
          plgpu.barrier_wait(bars.at[w])
      for _ in range(4):
        v = v * v + 1.0
      if turns:
        plgpu.barrier_arrive(bars.at[1 - w])
      if together:
        plgpu.barrier_arrive(every)
        plgpu.barrier_wait(every)
      return v
    o_ref[w] = lax.fori_loop(0, 8, round_, v)
  return plgpu.kernel(k, out_type=S((n, 128, 128), jnp.float32), num_threads=n,
                      thread_name="wg", scratch_types=[plgpu.Barrier(num_barriers=2),
                                                       plgpu.Barrier(num_arrivals=n)])


def test_a_warpgroup_blocked_on_a_wait_leaves_the_alus_to_the_other():
  """Warpgroups that take turns (each blocked on a barrier while the other
  works: attention's schedule) each have the SM's ALUs to themselves: twice
  one's time and a barrier's hand-off a round. Side by side they share
  them: nearly twice one's time as well, in half the rounds."""
  x = S((128, 128), jnp.float32)
  cycles = lambda fn: ps.estimate(fn, x).kernels[0].block_cycles_max
  one = cycles(_warpgroups(1))
  turns = cycles(_warpgroups(2, turns=True))
  side = cycles(_warpgroups(2))
  assert turns == pytest.approx(2 * one + 16 * gpus.H100.barrier_latency, rel=0.06)
  assert 1.7 * one < side < 2.1 * one


def test_warpgroups_side_by_side_round_after_round_share_the_alus_evenly():
  """Two warpgroups that meet at a barrier after each round of ALU work run
  their rounds side by side: each round takes twice one's, whichever the
  simulation runs first (it counts the other at what it did after the same
  wait the round before): twice one warpgroup's rounds without the barrier
  (its hand-off beside the other's work)."""
  x = S((128, 128), jnp.float32)
  cycles = lambda fn: ps.estimate(fn, x).kernels[0].block_cycles_max
  one = cycles(_warpgroups(1))
  two = cycles(_warpgroups(2, together=True))
  assert two == pytest.approx(2 * one, rel=0.06)


def _late_arrival(delay_ns):
  """Warpgroup 0 waits delay_ns, then arrives at a barrier of two arrivals;
  warpgroup 1 arrives at once, waits on it, then waits delay_ns itself."""
  def k(o_ref, bar):
    w = lax.axis_index("wg")

    @pl.when(w == 0)
    def _():
      pl.delay(delay_ns)
    plgpu.barrier_arrive(bar)
    plgpu.barrier_wait(bar)

    @pl.when(w == 1)
    def _():
      pl.delay(delay_ns)
    o_ref[w] = jnp.zeros((128,), jnp.float32)
  return plgpu.kernel(k, out_type=S((2, 128), jnp.float32), num_threads=2,
                      thread_name="wg", scratch_types=[plgpu.Barrier(num_arrivals=2)])


def test_a_barrier_phase_completes_at_its_latest_arrival():
  """The simulation runs warpgroup 0 ahead through its wait and its
  arrival before warpgroup 1 arrives at its own, earlier clock: the phase
  still completes at warpgroup 0's clock, so warpgroup 1 starts its own
  wait after it (twice the delay), not at its arrival."""
  delay_ns = 10_000
  k = ps.estimate(_late_arrival(delay_ns)).kernels[0]
  assert k.time_s > 2 * delay_ns * 1e-9


def _long_beside_short(short_rounds):
  """Warpgroup 0 runs 32 rounds of ALU work, warpgroup 1 `short_rounds`
  of the same, then waits 10 us: side by side, with no wait between."""
  def k(x_ref, o_ref):
    w = lax.axis_index("wg")
    v = x_ref[...]
    n = jnp.where(w == 0, 32, short_rounds)
    v = lax.fori_loop(0, n, lambda i, v: v * v + 1.0, v)

    @pl.when(w == 1)
    def _():
      pl.delay(10_000)
    o_ref[w] = v
  return plgpu.kernel(k, out_type=S((2, 128, 128), jnp.float32), num_threads=2,
                      thread_name="wg")


def test_short_alu_work_beside_a_long_run_takes_an_even_share():
  """Warpgroup 1's two rounds beside warpgroup 0's 32, which the
  simulation ran first: the SM's schedulers give each an even share, so
  warpgroup 1's work takes about twice its time and it owes warpgroup 0
  what that took from it; it does not wait for warpgroup 0's whole run to
  end (then its 10 us would start only after 32 rounds)."""
  x = S((128, 128), jnp.float32)
  g = gpus.H100
  # (the long run alone: 32 rounds of the op, as _warpgroups' 8 of 4)
  long_alone = ps.estimate(_warpgroups(1), x).kernels[0].block_cycles_max
  k = ps.estimate(_long_beside_short(2), x).kernels[0]
  delay = 10_000e-9 * g.clock_hz
  assert delay < k.block_cycles_max < delay + long_alone / 2


def test_a_grid_that_leaves_sms_idle_is_named_by_what_bounds_the_sms_in_use():
  """A 1024^3 matmul in 64 blocks keeps the tensor cores of the 64 SMs it
  uses busy most of the time, though over the whole chip they are busy
  under a third of it: the bound is the tensor cores', said of the SMs in
  use (not the warpgroups' issue, the largest share of their time left)."""
  a = jax.ShapeDtypeStruct((1024, 1024), F16)
  [k] = ps.estimate(functools.partial(matmul_mcs, max_concurrent_steps=4), a, a,
                    gpu="h100").kernels
  assert k.num_blocks == 64 and k.utilisation["tensor core"] < 0.4
  assert k.bound == "tensor core", (k.bound, k.bound_reason)
  assert re.fullmatch(r"tensor cores busy \d+% of the time on the SMs in use",
                      k.bound_reason), k.bound_reason
  busy = int(k.bound_reason.split("busy ")[1].split("%")[0])
  assert busy >= 60


def test_spills_the_model_does_not_charge_are_said_to_cost_nothing():
  """A 1-D block of 65536 f32 a thread holds far past the register limit:
  the report counts the spilled registers and says the prediction charges
  them nothing (only a wgmma accumulator's spills are modelled)."""
  n, block = 1 << 20, 65536

  def scale_add(x, y):
    @plgpu.kernel(out_type=jax.ShapeDtypeStruct((n,), F32), grid=(n // block,),
                  grid_names=("i",))
    def k(x_ref, y_ref, o_ref):
      s = pl.ds(lax.axis_index("i") * block, block)
      o_ref[s] = 2 * x_ref[s] + y_ref[s]
    return k(x, y)

  x = jax.ShapeDtypeStruct((n,), F32)
  [k] = ps.estimate(scale_add, x, x).kernels
  assert k.spilled_registers > 0 and not k.stalls.get("spill")
  assert (f"\n  spills: the {k.spilled_registers} registers a thread spills cost nothing in "
          "this prediction (the model charges the spills of a wgmma accumulator only)"
          ) in k.summary(), k.summary()
