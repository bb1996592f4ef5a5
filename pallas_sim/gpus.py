"""Hardware models: the figures the timing model (backends/sim/timing/
model.py) and the resource checks read, as data. Figures marked 'calibrate'
are leads to be measured on a real Hopper GPU (lab/), not trusted."""
import dataclasses
import numbers


# Figures marked (H200) were measured on an H200 by lab/calibrate.py's
# micro-benchmarks, run through lab/measure_gpu.py: their data is in
# lab/data/h200_measured.json ("figures", "micros" and the keys named
# below), and tests/test_timing_pins.py holds most of them to it. How each
# was measured and refined: benchmarks/HISTORY.md. The H100 SXM has the
# same SM: it takes the SM's figures, with its own HBM and L2.
@dataclasses.dataclass(frozen=True)
class GPU:
  name: str
  # What jax's Device.device_kind says on one (the H200 machine's nvidia-smi
  # and jax say "NVIDIA H200"; an H100 SXM says "NVIDIA H100 80GB HBM3").
  device_kind: str = "NVIDIA H100 80GB HBM3"
  num_sms: int = 132
  # The SM's boost clock, at which the TMA, L2, ALU, barrier and latency
  # micro-benchmarks ran (H200; the H100 SXM's is the same 1980 MHz). Under
  # sustained tensor load the clock falls (1650-1830 MHz for a wgmma loop, to
  # 1035-1470 at the power limit: clock_study_micros and clock_study in
  # lab/data/h200_measured.json); the tensor rates below are per second for
  # that reason.
  clock_hz: float = 1.98e9
  max_smem_per_block: int = 232448      # Mosaic's max_smem_bytes on sm_90
  smem_per_sm: int = 228 * 1024
  max_threads_per_sm: int = 2048
  # Dense tensor-core throughput per SM, in cycles of clock_hz, sustained:
  # a loop of wgmma 128xNx64 + wgmma_wait(1) on every SM ran 794 (N=64) and
  # 828 (N=128) TFLOP/s of f16 (H200), which at 1980 MHz is 345 and 662
  # cycles a group: 3312 FLOP/clk and 28 cycles a group. (The datasheet's
  # 4096 FLOP/clk at the boost clock is 989 TFLOP/s; the SM clock falls under
  # sustained tensor load, seen at 1650-1980 MHz there, so the figures are
  # per second: cuBLAS gets 788 TFLOP/s of bf16 on this GPU, by the GPU
  # machine's own notes, which are not in this repository.)
  # fp8 and int8 run at twice the f16/bf16 rate (fp8: 1679 TFLOP/s measured
  # at N=128), tf32 (f32 operands) at half (480). Those loops multiplied
  # small integers; on random normal operands, whose bits toggle as real
  # data's do, the same loops drew 688-698 W against 468-616 and ran 2.2%
  # (f16), 3.3% (bf16) and 1.2% (fp8) slower, sustained side by side for 3 s
  # (H200, power_study_random in lab/data/h200_measured.json): the figures
  # are those of random data. (tf32 and int8: not measured on such data.)
  tensor_flop_per_clk: tuple = (("f16", 3238), ("bf16", 3203), ("tf32", 1656),
                                ("fp8", 6544), ("int8", 6624))
  # The SM clock (MHz) each of those loops ran at: the median of nvidia-smi's
  # readings over the sustained loop (random operands: power_study_random in
  # lab/data/h200_measured.json; tf32's small-integer loop held 1965-1980;
  # int8's rate is twice f16's small-integer one, whose loop held 1725).
  # at_clock() divides the rates by these to get FLOP per cycle.
  tensor_rate_mhz: tuple = (("f16", 1665), ("bf16", 1755), ("tf32", 1980),
                            ("fp8", 1710), ("int8", 1725))
  wgmma_issue_cycles: float = 28.0
  # A warpgroup issuing a wgmma group stays in the issue until all but
  # wgmma_queue of its instructions have started (timing.Timing.wgmma), and
  # an issue takes wgmma_issue_cycles_base + wgmma_instr_issue_cycles an
  # instruction. The quickstart's body traced by Mosaic GPU's profiler
  # (lab/pipeline_trace.py, lab/data/pipeline_trace_h200.json, H200), median
  # cycles of the issue: 634 for 16 m64n128k16 instructions (128x128x128),
  # 354 for 16 m64n64k16 (128x64x128), the tensor cores idle before both;
  # 109 and 122 for 8 m64n128k16 (151 and 122 behind a busy group), 91 for
  # 8 m64n64k16, 65-76 for 4. The base and per-instruction cost are fitted
  # to the 4 and 8 (N=64) rows; the queue to the 16-instruction ones. At
  # the model's tensor rate (3850 FLOP a cycle, not the datasheet's 4096)
  # that gives 698 (+10%), 358 (+1%), 143 (+17..31%), 92 and 66. Only one
  # block an SM was traced with a queue-bound issue; with two, the group's
  # time and so the hold are stretched by the sharing (not measured).
  wgmma_queue: int = 6
  wgmma_issue_cycles_base: float = 40.0
  wgmma_instr_issue_cycles: float = 6.5
  hbm_bytes_per_s: float = 3.35e12        # reads
  hbm_write_bytes_per_s: float = 2.44e12  # writes (H100: the H200's ratio)
  l2_bytes: int = 50 * 2 ** 20
  # L2 to SMs when every SM re-reads one 8 MiB region: 9.36 TB/s (H200).
  l2_bytes_per_s: float = 9.36e12
  # What the L2 serves a tile that several SMs read at once: 132 blocks in
  # groups of 4, 12, 33 and 132 readers, each group loading a new 16 KiB tile
  # of an 8 MiB region, 4 in flight: 21.6, 18.5, 19.4 and 18.5 TB/s (their
  # mean; the 4-reader run was the noisiest, its calls launch-bound) in
  # boxes of 128-byte rows; in 64-byte boxes the streaming rate (l2_shared_*
  # in lab/data/h200_measured.json, H200).
  l2_shared_bytes_per_s: float = 19.5e12
  l2_shared_min_row_bytes: int = 128
  # A loaded L2's latency, lat / (1 - busy): the busy share at most this
  # (timing.Timing.tma). Not calibrated: 0.8 to 0.95 move the quickstart's
  # mean error by under 0.3 points. Where loads keep the SM's share busy
  # throughout it sets the latency (10x: ~4200 cycles, where the loads-only
  # diagnostics imply 1700-2100: they come out ~13% slow).
  l2_queue_cap: float = 0.9
  # The L2 is two partitions, each caching what its own GPCs' SMs read
  # (NVIDIA's A100 and H100 whitepapers). A launch whose inputs and outputs
  # fit in half the L2 has them near every SM, and its loads do not queue
  # (the quickstart's 128x128x64 mcs=2 step, M, K and N varied: 1115-1173
  # cycles up to 29.4 MB, 1390 at 33.6, 1454-1665 from 41.9 on, H200,
  # pipeline_trace_h200.json footprint_study). Past the half, the far reads
  # grow over this share of the L2 (6 MB on the H200: 33.6 MB gives the
  # model's step 0.65 of the way from near to far, as measured), and they
  # queue (timing.far_share, Timing.tma).
  l2_far_ramp: float = 0.1
  # What a hit in the far half costs beyond a near one, at a site whose
  # blocks read apart (where they share, the far reads queue instead): one
  # block's chain of dependent 32 KiB loads round a 48 MiB region took 1033
  # cycles a load, round an 8 MiB one 721 (l2_half_chain_48mib and _8mib,
  # micros_2026_12_05 of lab/data/h200_measured.json, H200).
  l2_far_latency_extra: float = 312.0
  # What one SM's TMA engine moves: every SM loading one and the same 16 KiB
  # tile of 128-byte rows, again and again, 4 in flight, got 160 B/clk each
  # (41.9 TB/s in all; a tile that stays the same is served faster again
  # than the changing tiles of l2_shared_bytes_per_s). One SM alone from HBM
  # got 87-104 B/clk: latency-bound. With many SMs busy each gets its share
  # of the L2's bandwidth, and never more than this (H200).
  tma_bytes_per_clk: float = 160.0
  # The L2 looks up one tag a request, and a TMA box's row under 128 bytes
  # is a request of its own (whole sectors: 32-byte rows one sector, 64-byte
  # two). Nsight Compute put its peak at 160.8 G lookups a second (H200:
  # lts__t_requests over lts__t_tag_requests' share of peak, the same in
  # eight kernels), with the L2 at 1.71 GHz whatever the SMs' clock. Every
  # SM streaming tiles of 32-byte rows reached 94.6% of it (152 G a second:
  # 0.58 rows a cycle an SM at 1980 MHz), of 64-byte rows 90.9% (146 G), and
  # the quickstart matmuls with tile_k 16 and 32, whose A and B tiles load
  # in 32- and 64-byte rows (analysis/smem_swizzle.py), 82-89% over the whole kernel,
  # tail included; 128-byte rows that blocks share at once merge, and stay
  # with l2_shared_bytes_per_s. Rows under 128 bytes share this rate among
  # the busy SMs, per second: at a lower SM clock each gets more a cycle
  # (lab/pipeline_trace.py --stream-spans, lab/ncu_sections.py with
  # breakdown:lts__throughput, lab/data/ncu_l2_h200.json; benchmarks/HISTORY.md).
  # With narrow rows the 24 SMs of the GPCs' 2-TPC CPCs got 1.32-1.42x the
  # others' share (lab/gpc_probe.py); the model gives every SM the same.
  l2_requests_per_s: float = 149e9
  # What one SM's TMA engine moves of rows under 128 bytes, the L2 all but
  # idle: 16 blocks on 16 SMs, boxes of 128 rows from an L2-resident panel, 8
  # in flight: 0.84, 0.88 and 0.89 rows a cycle in 16-, 32- and 64-byte rows
  # (lab/calibrate.py tma_rows_alone_*, in micros_2026_12_03_twentieth of
  # lab/data/h200_measured.json, H200).
  tma_narrow_rows_per_clk: float = 0.88
  # What issuing a TMA load costs its warpgroup, which goes on after it: each
  # block issuing loads of a 16 KiB tile back to back, in a profiled named
  # scope, took 56 cycles for 1, 86 for 2 (43 a load), 171 for 4 (43) and
  # 424 for 8 (53) (`lab/pipeline_trace.py --tma-issue`, H200,
  # lab/data/pipeline_trace_h200.json's tma_issue rows). The copy starts as its
  # issue ends: tma_latency was measured from before the issue.
  tma_issue_cycles: float = 43.0
  # A TMA store's issue, the same way: 94 cycles for 1, 118 for 2 (59 a
  # store).
  tma_store_issue_cycles: float = 59.0
  # A third store's issue waits for the first's SMEM read, and so on: 4
  # took 1346 cycles, 8 took 4776, and what was left to drain after the
  # last issue stayed about two stores' worth (the same rows): the engine
  # holds two bulk stores still reading (Timing.store_queue). The model's
  # stores read at the SM's share of the L2 (l2_bytes_per_s), faster than
  # these did (4 and 8 in 1033 and 2863 cycles): what rate a store reads
  # at under load is the copy_own_* micros' question.
  tma_store_queue: int = 2
  # A TMA load's latency, issue to barrier completion, of a 4 KiB tile:
  # 440 cycles from L2, 968 from HBM (H200, a chain of dependent loads:
  # tma_latency_l2_4k and tma_latency_hbm_4k in lab/data/h200_measured.json
  # "micros"); what it moves beyond that is charged at the SM's rate. The
  # chain timed each load from before its issue, which the model charges
  # apart (tma_issue_cycles): the figure is 400 (the chain's fit with a
  # 4-cycle issue) less 39 (the measured issue's 43 less those 4).
  tma_latency: int = 361
  hbm_latency_extra: int = 530
  # A plain load of GMEM (a get or plgpu.load of a GMEM ref, no TMA), from
  # its issue to its value: the warpgroup goes on issuing and waits where the
  # value is first used. A dependent chain of scalar loads (plain_load_chain_*
  # in micros_2026_12_07_plain_load of lab/data/h200_measured.json,
  # lab/calibrate.py, H200) took 134.4 cycles a load from the L1, 266.7 from
  # the L2 and 687.5 from HBM; the model's loop around each load costs 8.6
  # (the L1 row with no latency), which leaves 126, 258 and 258 + 421. A
  # buffer of more than half the L2 misses (its loads pay the HBM part); a
  # block's re-read of a buffer that fits in the L1 beside the largest SMEM
  # carve-out (256 KiB of L1 and SMEM an SM, at most 228 KiB of it SMEM:
  # datasheet) hits the L1.
  gmem_load_latency: float = 258.0
  gmem_l1_latency: float = 126.0
  gmem_hbm_latency_extra: float = 421.0
  gmem_l1_bytes: int = 28 * 1024
  # What a byte costs HBM, read and written, when a TMA box's rows are runs
  # of at most this many bytes in GMEM (pieces of longer rows), against the
  # contiguous rates above: 256 blocks streaming their own 64 rows of 32 KiB
  # rows in boxes of 64 rows, enough in flight to keep HBM busy, read at 3.73
  # TB/s in 64-byte runs and 4.33 in 128; box by box copies wrote at 2.52 and
  # 2.89 TB/s, with the reads at those rates (hbm_rows_* and hbm_rows_copy_*
  # in micros_2026_12_05 of lab/data/h200_measured.json, lab/calibrate.py,
  # H200; two runs' mean). Runs of 256 bytes and more:
  # the contiguous rates (those copies wrote at 3.34 TB/s; the streams read at
  # 4.2-4.33, where elementwise kernels reading 256- and 512-byte runs of 8-16
  # KiB rows ran as fast as in 1 KiB runs: not modelled).
  hbm_runs: tuple = ((64, 4.57 / 3.73, 3.33 / 2.52), (128, 4.57 / 4.33, 3.33 / 2.89))
  # A miss's wait at HBM while the other SMs keep it busy: busy / (1 - busy)
  # times this, busy the share of its SM's share of HBM bandwidth (the
  # contiguous rates; more in short runs: hbm_cost) that its blocks keep busy,
  # at most hbm_queue_cap (timing.Timing._hbm_queue). The same streams with
  # 8 to 128 KiB in flight an SM (one, two or four blocks an SM, 1 to 16
  # boxes each) went at 33% of HBM's rate with 8 KiB, 58% with 16, 84-88%
  # with 32 and all of it from 64 on (micros_2026_12_05, H200). With 100
  # cycles the model is within 4.3% of those 26 streams and copies on
  # average, 13.4% at most (the 8 KiB boxes at one block an SM, short);
  # without the queue 7.5% and 25%; 150 and 200 cycles give 3.7% and 4.0%
  # (benchmarks/hbm_streams.py --queue-cycles). 100 stays because the second
  # blind set of lab/families.py was predicted with it. With a block's own
  # data held to its part of the SM's share of HBM as well (timing.Timing.tma):
  # 3.6%, 13.3% at most. How it was found: benchmarks/HISTORY.md.
  hbm_queue_cycles: float = 100.0
  hbm_queue_cap: float = 0.95
  # wgmma then wgmma_wait(0), one block: 195 cycles at m64n64k64 and 657 at
  # m64n256k64, 7 and 85 over their FLOPs and issue cycles (H200,
  # wgmma_latency_f16_m64n64 and _m64n256 in "micros").
  wgmma_latency: int = 45
  # Two warpgroups handing a barrier back and forth: 115 cycles a round
  # trip, two hand-offs (H200, barrier_pingpong in "micros").
  barrier_latency: int = 57
  # Two blocks on two SMs handing a token back and forth through two global
  # semaphores (pl.semaphore_signal / semaphore_wait: a red.release.sys add,
  # and a loop of atom.cas polls then fence.acquire.sys, Mosaic GPU's
  # SemaphoreRef): 3950 cycles a round trip, two hand-offs (H200,
  # sem_pingpong in micros_2026_12_07_sem of lab/data/h200_measured.json).
  # The model's loop around them costs 8 cycles a hand-off: a waiter returns
  # this long after the signal it needed. Where the cost lies (the release
  # fence, the atomic, the polls) is not measured apart; the signalling thread
  # is not held (the ping-pong cannot tell). memory_scope="gpu" is charged
  # the same (not measured).
  semaphore_latency: float = 1967.0
  # Tiny kernels chained in one jitted program: 1.34-1.64 us a launch, 1.49
  # their mean (H200, launch_1_blocks and launch_132_blocks in "micros";
  # host-bound, so an upper bound on the device's own gap), less the tiny
  # kernel's own 0.23 us in the model (its block's plain GMEM load's latency).
  launch_overhead_s: float = 1.26e-6
  # A warpgroup's elementwise op, per 128 elements (one per lane) of its
  # widest operand: v + 1 on a 128x128 f32 tile in registers took 113 cycles
  # (and v * a + b, one FMA, 123); exp(-v) 1851 (H200, alu_* in "micros").
  # One warpgroup has the SM's ALUs to itself: with two blocks per SM each
  # op took 2.25x (1.73x for exp), so warpgroups on an SM share them
  # (machine/state.py).
  # Only exp was measured of the transcendental functions.
  alu_cycles_per_vector: float = 0.85
  # A reduction, per 128 elements of what it reduces: a row of 64xW f32 in
  # the WGMMA layout, reduced, scaled and subtracted from the tile, n times
  # over (each reduction waiting on the last), took per iteration at W = 64 /
  # 128 / 256, one block an SM: max 140 / 266 / 472 cycles, sum 115 / 229 /
  # 361; two blocks an SM, per block: max 122 / 232 / 444, sum 91 / 183 / 306
  # (H200, row_max_* and row_sum_* in micros_2026_12_05). Past the
  # elementwise 0.85 of the subtraction, a max (FMNMX, half the lanes of an
  # add) costs 2.6 a vector and a sum 1.7; what stays at every width is the
  # exchange of the partial results across the four lanes that hold a row
  # (two shuffle rounds), the warpgroup's own wait.
  reduce_max_cycles_per_vector: float = 2.6
  reduce_sum_cycles_per_vector: float = 1.7
  reduce_exchange_cycles: float = 13.0
  transcendental_cycles_per_vector: float = 14.4
  # Of those, the cycles a warpgroup waits on its own (the library's
  # dependent steps), which another warpgroup's work fills: exp(-v) at two
  # blocks an SM took 1.73x, 1.78x and 1.76x one block's time in three runs
  # (alu_exp_2_per_sm / alu_exp_1_per_sm: 3210 / 1851, 3192 / 1798 and
  # 3206 / 1818 cycles, H200: "micros", alu_study, micros_2026_12_02_tenth),
  # where work all shared would take 2x. With the 14.4 above and the
  # negation's vector, 1.76x leaves 3.6 of a vector's cycles waiting.
  transcendental_wait_cycles_per_vector: float = 3.6
  # With CompilerParams(approx_math=True) a transcendental function is one
  # special-function-unit op (ex2.approx...): exp2(-v) on the 128x128 tile
  # took 1054 cycles, 7.3 a vector after the negation's ALU op (the SM's
  # 16 results per clock; two blocks per SM took twice as long: H200,
  # alu_study in lab/data/h200_measured.json).
  sfu_cycles_per_vector: float = 7.3
  # An equation's cost beyond its vectors: a loop of dependent scalar int32
  # equations (mul, add, shift, xor) took 4.29 cycles each, 3.44 over the
  # 0.85 of its one vector (H200, scalar_chain_4_ops / _32_ops: 12.2 and
  # 132.2 cycles an iteration). Dependent: independent ones could issue
  # faster. A convert that only drops a weak type emits nothing (free).
  # The overhead is each warpgroup's own (latency), the vectors' cycles the
  # SM's ALUs' (shared): the 32-equation chain took 133.2, 132.1 and 169.2
  # cycles an iteration at 1, 2 and 4 blocks to an SM (H200,
  # micros_2026_12_02_tenth; timing.Timing.issue_split).
  op_overhead_cycles: float = 3.44
  # Converting 8-bit integers to floats (int8 -> bf16, as a mixed-type
  # matmul dequantizes its weights: Mosaic emits prmt, two ands and a
  # sub.bf16x2 a pair), per 128 elements: an int8 128x64 tile loaded from
  # SMEM, converted and max-reduced took 383 cycles in one warpgroup against
  # 94 for a bf16 tile loaded and max-reduced (rega_int8_convert_1_wg,
  # rega_bf16_load_1_wg: (383 - 94) / 64 = 4.5), 721 and 247 with two
  # warpgroups a block ((721 - 247) / 128 = 3.7: the SM's ALUs, shared);
  # 4.1 between them (H200, micros_2026_12_02_eleventh).
  convert8_cycles_per_vector: float = 4.1
  # ALU work beside a wgmma in flight on its SM goes slower: a warpgroup's
  # loop of it took this much longer for the cycles it overlapped another
  # warpgroup's wgmma loop (A from SMEM, or from registers): float
  # adds/multiplies (a v * 0.999 + 0.001 stream) all but stop, 10.8 and 12
  # times; transcendental functions (exp) 1.9 and 2.1; conversions and the
  # rest (int8 -> bf16 and a max) 1.8 and 2.0 (H200, beside_* micro-
  # benchmarks; timing/model.py tensor_overlap). The mechanism is not
  # measured (the register file's ports, which the tensor cores' operands
  # and accumulators share, is a lead).
  beside_tensor_fma: float = 11.0
  beside_tensor_other: float = 2.0
  # A lane's registers beyond its arrays (addresses, indices, loop counters),
  # for the register estimate (timing/occupancy.py): the spill cliff lies
  # between 128x224 f32 accumulators (224 registers: no cliff) and 128x256
  # (H200), so it is at most 31; 24 is a lead within that.
  register_base: int = 24
  # Local memory to and from an SM, when a wgmma accumulator spills: the
  # accumulator goes out and comes back around each wgmma. A 128x256 f32
  # accumulator (256 registers a lane, over the 255) ran its wgmma loop at
  # 747 FLOP/clk against 3669 for 128x128: ~4530 extra cycles for its 256 KiB
  # round trip, 58 B/clk, from the L1 (H200).
  local_bytes_per_clk: float = 58.0
  # Spills live in the L1, which is what SMEM leaves of the SM's 256 KiB:
  # the SMEM carve-out is one of these sizes (KiB; the CUDA programming
  # guide, compute capability 9.0), the smallest that holds the blocks the
  # SM runs at once. What of a spilled accumulator the L1 cannot hold goes
  # to the L2, slower: the same loop with 160 KiB more SMEM, unused (L1 28
  # KiB), took 6884 cycles a wgmma against 5999 without (L1 156 KiB): with
  # 78% of the round trip from the L2, 44.5 B/clk there. The model's other
  # cases of that study (112 and 64 KiB pads: 92 KiB of L1, and 28 KiB over
  # two blocks; two blocks per SM without a pad) come within 3% (H200,
  # spill_study in lab/data/h200_measured.json).
  l1_smem_bytes: int = 256 * 1024
  smem_carveouts_kib: tuple = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)
  local_l2_bytes_per_clk: float = 44.5
  # The board's power, which sets the SM clock (timing/power.py): fitted
  # by lab/power_model.py to 66 kernels of lab/timing_suite.py
  # (the suite and the held-out kernels) whose sustained clock and power were
  # measured (H200: power_study_suite, power_study_holdout in
  # lab/data/h200_measured.json), each family of kernels left out of the
  # fit that predicts it: clock error 5.7% on the 56 not small; 4.9% on 56
  # kernels it never saw (the quickstart's pipeline taken apart). Tensor
  # FLOP/s are f16's (an fp8 FLOP counts half: the same loop at twice the
  # FLOP/s drew the same 690 W). Its weak spot: tensor-core loops without L2
  # traffic are predicted ~1515 MHz where they hold 1665-1755 (~10% slow).
  # The H100 SXM (700 W too) takes the H200's figures: not measured.
  power_limit_w: int = 700
  power_base_w: float = 468.3
  power_w_per_pflops: float = 449.7
  power_l2_w_per_10tbs: float = 51.4
  power_hbm_w_per_10tbs: float = 413.1
  power_voltage_beta: float = 0.70
  clock_step_mhz: float = 15.0  # (nvidia-smi's clocks: multiples of 15 MHz)
  # The SMs' highest clock, and the one at_clock() set (None: the figures as
  # measured, each unit at its own loop's clock).
  boost_mhz: float = 1980.0
  sm_clock_mhz: float | None = None

  def hbm_cost(self, run_bytes):
    """(read, write): what a byte costs HBM against the contiguous rates
    (hbm_bytes_per_s, hbm_write_bytes_per_s) in runs of `run_bytes`."""
    for most, read, write in self.hbm_runs:
      if run_bytes <= most:
        return read, write
    return 1.0, 1.0

  def tensor_rate(self, operand_kind):
    """Tensor-core FLOP per clock per SM for operands of this kind."""
    return dict(self.tensor_flop_per_clk)[operand_kind]


# H100 SXM: HBM3 3.35 TB/s and 50 MiB of L2 (datasheet).
H100 = GPU("h100")
# H200: HBM read by every SM's TMA streaming a 1 GiB array: 4.57 TB/s (the
# datasheet says 4.8; a copy, read plus write, 3.85). L2: 60 MB as PyTorch
# reads it off the device (torch.cuda.get_device_properties(0).L2_cache_size).
# Writes: a copy through SMEM (half read, half written) moved 3.85 TB/s:
# 1/3.85 = (1/4.57 + 1/w) / 2 gives w = 3.33 TB/s for the writes.
H200 = GPU("h200", device_kind="NVIDIA H200", hbm_bytes_per_s=4.57e12, hbm_write_bytes_per_s=3.33e12,
           l2_bytes=60 * 10 ** 6)

GPUS = {g.name: g for g in (H100, H200)}
NAMES = tuple(sorted(GPUS))


def get(gpu, clock_mhz=None):
  """The model named `gpu` (or gpu itself), at_clock(clock_mhz) if given."""
  if not isinstance(gpu, GPU):
    try:
      gpu = GPUS[str(gpu).lower()]
    except KeyError:
      raise ValueError(
          f"gpu={gpu!r}: unknown GPU model; choose one of {list(NAMES)}") from None
  return gpu if clock_mhz is None else at_clock(gpu, clock_mhz)


def at_clock(gpu, mhz):
  """The model with its SMs at `mhz` for the whole kernel: the clock an
  H100/H200 holds at the board's power limit (1035-1905 MHz for the large
  matmuls of lab/timing_suite.py on an H200, which the executor
  predicts: backends/sim/timing/power.py), or any clock to ask "what if".

  What the SM does, per cycle of its clock, stays: issue, ALU, barrier and
  wgmma latencies, its TMA engine's and L1's bytes a cycle, and the tensor
  cores' FLOP a cycle (the rates divided by their loops' clocks). What the
  memory system does, per second, stays: HBM and L2 bandwidth (so a busy SM's
  share of the L2 is more bytes a cycle at a lower clock), spills' round
  trips to the L2, and the TMA and HBM latencies (taken to be in the memory
  system's time: they were measured at 1980 MHz), launch overhead."""
  # (compared as the float it is then used as: numbers.Real's stubs declare
  # no comparison that `0 < mhz` could use)
  if isinstance(mhz, bool) or not isinstance(mhz, numbers.Real) or not (
      0 < float(mhz) <= gpu.boost_mhz):
    raise ValueError(f"clock_mhz={mhz!r}: the SM clock in MHz, above 0 and at most "
                     f"the {gpu.name}'s boost clock, {gpu.boost_mhz:g}")
  mhz = float(mhz)
  was = gpu.clock_hz / 1e6  # (the clock of the cycle figures)
  r = mhz / was
  measured = dict(gpu.tensor_rate_mhz)
  return dataclasses.replace(
      gpu, clock_hz=mhz * 1e6, sm_clock_mhz=mhz,
      tensor_flop_per_clk=tuple((k, v * was / measured[k])
                                for k, v in gpu.tensor_flop_per_clk),
      tensor_rate_mhz=tuple((k, mhz) for k, _ in gpu.tensor_rate_mhz),
      tma_latency=gpu.tma_latency * r, hbm_latency_extra=gpu.hbm_latency_extra * r,
      gmem_load_latency=gpu.gmem_load_latency * r,
      gmem_hbm_latency_extra=gpu.gmem_hbm_latency_extra * r,
      semaphore_latency=gpu.semaphore_latency * r,
      l2_far_latency_extra=gpu.l2_far_latency_extra * r,
      hbm_queue_cycles=gpu.hbm_queue_cycles * r,
      local_l2_bytes_per_clk=gpu.local_l2_bytes_per_clk / r)
