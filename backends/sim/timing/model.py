"""The timing model, in one place: every cycle the simulator assigns comes
from here (issue cost of an equation, a TMA transfer, a wgmma group, the
latency after a barrier wait, a kernel's time), on the hardware figures of
pallas_sim/gpus.py. The rules only ask it when things start and end; the
functional machine (values, races) never reads it.

Per-SM units: blocks are placed on SMs by occupancy (SMEM, threads,
registers), in waves, block i on SM i mod num_SMs. The blocks co-resident
on one SM in one wave (share of them) share its TMA engine and tensor
cores: each takes what the others, taken to be as busy as it has been,
leave (_stretch: at worst 1/share of the rate). So a block's time depends
on its own work and on how crowded its SM is, never on the order in which
blocks are simulated: a launch split over processes, or
estimated from one block per class (backends/sim/blocks/block_classes.py), gets
the same times as one simulated block after block. (Latencies are not
shared: hiding them is what co-residency is for.)"""
import collections
import dataclasses
import enum
import functools
import heapq
import math
from typing import Any

import numpy as np

from pallas_sim.backends.sim.base.loads import Joined
from pallas_sim.backends.sim.machine import memory
from pallas_sim.backends.sim.timing import occupancy

CUDA_RESERVED_SMEM_PER_BLOCK = 1024


@functools.lru_cache(maxsize=None)
def operand_kind(dtype):
  """The tensor-core rate class of a wgmma operand dtype."""
  dtype = np.dtype(dtype)
  if dtype.kind in "iu":
    return "int8"
  if dtype.itemsize == 1:
    return "fp8"
  if dtype == np.float32:
    return "tf32"
  return "bf16" if "bfloat16" in dtype.name else "f16"


class Engines:
  """One block's share of its SM's TMA engine and tensor cores: when each is
  next free for it (cycles), how many blocks share them, and the work it
  gave each (cycles of the unit's own time, for utilisation)."""
  __slots__ = ("share", "tma_free", "tc_free", "tma_work", "tc_work", "spill",
               "l2_rate", "latency", "loads", "byte_cycles", "l2_work", "path", "far",
               "l2_rows", "miss", "hbm_cycles", "hbm_work", "hbm_left", "blocks", "hbm_free",
               "store_reads")

  def __init__(self, share=1, spill=(0.0, 0.0), l2_rate=None, latency=None, loads=False,
               byte_cycles=None, far=1.0, l2_rows=None, miss=None, hbm_cycles=None, blocks=1):
    self.share = share
    # TMA load site -> the share of its bytes that come from HBM (set_loads)
    self.miss = miss or {}
    # cycles a byte read and a byte written take of the SM's share of HBM's
    # bandwidth (None: no queue at HBM, LaunchTiming)
    self.hbm_cycles = hbm_cycles
    self.hbm_work = 0.0  # cycles of it its transfers took
    self.hbm_free = 0.0  # when its part of that share is next free (Timing.tma)
    # Each byte of a load's source comes from HBM at least once a launch, and
    # the launch's `blocks` share that: a block counts at most its share of
    # each source's bytes against HBM, the rest being re-reads the L2 serves
    # (a persistent matmul's tiles). (Load site, buffer) -> bytes left to
    # count: a site that reads the data again (a second pass) counts anew.
    self.hbm_left = {}
    self.blocks = blocks
    # the share of its L2 reads served by the far partition, which queue
    # (LaunchTiming.far)
    self.far = far
    # cycles a warpgroup spends on spilled registers per wgmma: (from the
    # L1, from the L2 with nothing else loading it: Timing.spill)
    self.spill = spill
    self.l2_rate = l2_rate  # bytes per cycle of its SM's share of the L2 (None: alone)
    # requests (rows under 128 bytes) a cycle of that share (None: alone)
    self.l2_rows = l2_rows
    self.latency = latency or {}  # TMA load site -> its latency (cycles)
    # TMA load site -> cycles a byte of it takes of the SM's share of the
    # L2, at a site whose sources the wave's blocks share (set_loads)
    self.byte_cycles = byte_cycles or {}
    self.l2_work = 0.0  # cycles of that share its transfers took
    self.loads: list[Any] | None = [] if loads else None  # its Loads (LaunchTiming.hbm_reads_traced)
    self.path = None  # the control decisions it took, where blocks/paths.py follows them
    self.tma_free = 0.0
    # (issue, end of its SMEM read) of the bulk stores it issued
    # (Timing.store_queue)
    self.store_reads: list[tuple[float, float]] = []
    self.tc_free = 0.0
    self.tma_work = 0.0
    self.tc_work = 0.0


class OpClass(enum.Enum):
  """What an equation costs to issue, as its rule declares it
  (interpret/compiler.py `rule`; the compiler keeps it on the Step)."""
  # Vector work on the ALUs: an overhead, and per 128 elements of its
  # widest output, alu_cycles_per_vector.
  ALU = "alu"
  # A reduction: work per 128 elements of what it reduces, its widest
  # operand (the lanes' partial results), then their exchange across lanes:
  # a max, min or bitwise one on the ALU's half-rate lanes (REDUCE), a sum
  # or product on the FMA pipes (REDUCE_SUM).
  REDUCE = "reduce"
  REDUCE_SUM = "reduce_sum"
  # ALU work on the FMA pipes (float add, sub, mul, neg): what the
  # beside_fma micro-benchmark's v * a + b stream measured beside a wgmma.
  FMA = "fma"
  # Library functions (libdevice): their own rate, or with approx_math one
  # special-function unit op's.
  TRANSCENDENTAL = "transcendental"
  # Which registers hold which elements, no vector instructions (a
  # broadcast of a scalar, a reshape of a row, a layout cast): the overhead.
  SHAPE_ONLY = "shape_only"
  # A dtype conversion: none where only a weak type is made strong; int8
  # to float at its own rate.
  CONVERT = "convert"
  # A TMA copy's issue (a descriptor, an elected thread, a barrier's
  # expect_tx or a bulk group's commit): the warpgroup's own time, no ALU
  # work (issue_split).
  TMA_LOAD = "tma_load"
  TMA_STORE = "tma_store"


# Reductions -> the GPU figure of their cycles per 128 elements reduced.
REDUCTIONS = {OpClass.REDUCE: "reduce_max_cycles_per_vector",
              OpClass.REDUCE_SUM: "reduce_sum_cycles_per_vector"}

# TMA issues -> the GPU figure of what one costs the issuing warpgroup.
TMA_ISSUE = {OpClass.TMA_LOAD: "tma_issue_cycles",
             OpClass.TMA_STORE: "tma_store_issue_cycles"}


def _int8_to_float(eqn):
  src = getattr(eqn.invars[0].aval, "dtype", None) if eqn.invars else None
  dst = eqn.params.get("new_dtype")
  return (src is not None and dst is not None and np.dtype(src).kind in "iu"
          and np.dtype(src).itemsize == 1 and memory.is_float(dst))


def _vectors(op, eqn):
  """The 128-element vectors (one element a lane) of an equation's widest
  output, or for a reduction of its widest operand: what its per-vector
  costs count."""
  size = 1
  for v in (eqn.invars if op in REDUCTIONS else eqn.outvars):
    size = max(size, math.prod(getattr(v.aval, "shape", ())))
  return -(-size // 128)


def tensor_overlap(work, busy, slower):
  """Cycles that `work` cycles of ALU work take when the SM's tensor cores
  stay busy for `busy` more cycles: `slower` times as long while they are
  (the beside_* micro-benchmarks, H200), at full speed after."""
  if busy <= 0 or work <= 0:
    return work
  if work * slower <= busy:
    return work * slower
  return busy + work - busy / slower


def alu_share(wg, t):
  """(stretch, until, owed): how much longer the warpgroup's ALU work takes
  from its clock `t` on beside the others on its SM, until when that holds
  (inf: not before its next wait), and what of each cycle of its work it
  owes. The simulation runs a warpgroup ahead until it blocks, so the
  other warpgroups of its block count by what it has run of them: one that
  got past `t` took, at `t`, its run's share of the ALUs (its work over the
  run's span; none while it waited: a barrier, a wgmma in flight); one
  that has not, and can run, will take what it took the last time it
  resumed from the wait it is at (its average, the first time); one
  blocked on a wait nothing has completed takes none (it sees this one's
  runs when it runs). This one gets what they leave, and at least an even
  share with those busy at `t`, as the SM's warp schedulers give it: what
  that is more than the runs before it left is work they would have lost,
  which this one owes (paid before its next wait: Task.owed). Co-resident
  blocks, simulated apart, are like this block and share alike: each of
  its warpgroups as busy as it has been on average. Read as a program
  starts, after each wait, and where `until` passes."""
  blk = wg.block
  share = blk.engines.share
  base = 1.0
  if share > 1:
    mine = sum(_average(o) for o in blk.warpgroups)
    base = _leftover((share - 1) * mine, share * len(blk.warpgroups))
  ran, expected, until, busy_ones = 0.0, 0.0, math.inf, 1
  for o in blk.warpgroups:
    if o is wg:
      continue
    if o.time > t:
      busy, change = _busy_at(o, t)
      ran += busy
    elif o.done:
      continue
    else:
      busy, change = _expected_at(o, t)
      expected += busy
    busy_ones += busy > 0
    until = min(until, change)
  mine = max(1.0 - ran - expected, 1.0 / busy_ones)
  return base / mine, until, max(0.0, 1.0 - (1.0 - ran) / mine)


def _busy_at(o, t):
  """(the share of the ALUs warpgroup `o`, which ran past `t`, took at
  `t`, when that changes): the run of it that holds t (its work over the
  run's span), none in the gaps between (it waited), its average before
  the runs it keeps."""
  change = o.time
  for start, end, alu in reversed(o.runs):
    if end <= t:
      return 0.0, change
    if start <= t:
      return min(1.0, alu / (end - start)), end
    change = start
  return _average(o), change


def _expected_at(o, t):
  """(the share of the ALUs warpgroup `o`, not yet run to `t`, will take
  at `t`, when that changes): none while blocked on a wait nothing has
  completed; else its last run after the wait it is at, from its clock
  on; its average where it has none."""
  w = o.waiting
  if w is not None and not w.ready():
    return 0.0, math.inf
  last = o.run_after.get(None if w is None else w.where)
  if last is None:
    return _average(o), math.inf
  alu, span = last
  if span <= 0 or t >= o.time + span:
    return 0.0, math.inf
  return min(1.0, alu / span), o.time + span


def _average(o):
  """The share of the ALUs warpgroup `o` has kept busy so far, by its clock."""
  return min(1.0, o.alu / o.time) if o.time > 0 else 0.0


def alu_span(wg, t, work):
  """(cycles, stretch, until, owed): how long `work` cycles of ALU work
  that start at `t` take, across the changes in what the others take
  (alu_share), what it owes, and the stretch where it ends."""
  now, left, owed = t, work, 0.0
  while True:
    stretch, until, owe = alu_share(wg, now)
    if now + left * stretch <= until:
      return now + left * stretch - t, stretch, until, owed + left * owe
    done = (until - now) / stretch
    owed += done * owe
    left -= done
    now = until


def _stretch(share, work, t):
  """How much longer a unit takes for a block sharing it with share - 1
  others: they are like it, so each keeps the unit as busy as this block
  has so far (work / t); what they leave is this block's: 1 / (1 - their
  busy share), up to share (each gets 1/share of a saturated unit); alone,
  or beside blocks that leave it idle, 1."""
  if share == 1:
    return 1.0
  return _leftover((share - 1) * (work / t if t > 0 else 1.0), share)


def _busy(engines, work, t, cap):
  """The share of its SM's share of a unit (the L2, HBM) a block's `work`
  cycles there, and its co-resident blocks' (taken alike), kept busy up to
  t, at most `cap`: what its next request queues behind."""
  return min(cap, engines.share * work / t) if t > 0 else 0.0


def _take(engines, buf, share, nbytes):
  """Counts `nbytes` of a block's reads of source `buf` against what is
  left of `share` bytes of it (Engines.hbm_left): the bytes still within
  it."""
  left = engines.hbm_left.get(buf, share)
  taken = min(nbytes, left)
  engines.hbm_left[buf] = left - taken
  return taken


def _leftover(others, cap):
  """The stretch of a unit the others keep busy `others` of the time: what
  they leave is this one's, 1 / (1 - others), up to `cap` (1/cap of it)."""
  return cap if others >= 1 - 1 / cap else min(cap, 1.0 / (1.0 - others))


def far_share(gpu, footprint):
  """How much of a launch's L2 traffic crosses to the far L2 partition, by
  the bytes its inputs and outputs hold (None: not known, all of it). Each
  partition caches what its own SMs read: a launch that fits in one
  partition's half of the L2 finds all of its data near, a larger one
  thrashes the near copies (gpus.GPU.l2_far_ramp)."""
  if footprint is None:
    return 1.0
  half = gpu.l2_bytes / 2
  return min(1.0, max(0.0, (footprint - half) / (gpu.l2_far_ramp * gpu.l2_bytes)))


class Timing:
  """The costs of one GPU model (gpus.GPU)."""

  def __init__(self, gpu):
    self.gpu = gpu
    self.barrier_latency = gpu.barrier_latency
    self._f16 = {}  # dtype -> f16_equivalent

  def issue_cycles(self, op, eqn, approx_math=False):
    """Cycles one warpgroup, alone on its SM, spends issuing an equation of
    OpClass `op`: an overhead, and per 128 elements of its widest output,
    the ALU's, or for transcendental functions the library's (or with
    approx_math, one special-function unit op's)."""
    g = self.gpu
    if op is OpClass.CONVERT and eqn.invars and getattr(
        eqn.invars[0].aval, "dtype", None) == eqn.params.get("new_dtype"):
      return 0.0  # (a weak type made strong: no instruction at all)
    if op in TMA_ISSUE:
      return getattr(g, TMA_ISSUE[op])
    if op is OpClass.SHAPE_ONLY:  # (no vector work: which registers hold what)
      return g.op_overhead_cycles
    if op is OpClass.CONVERT and _int8_to_float(eqn):
      per = g.convert8_cycles_per_vector
    elif op in REDUCTIONS:
      per = getattr(g, REDUCTIONS[op])
    elif op is not OpClass.TRANSCENDENTAL:
      per = g.alu_cycles_per_vector
    elif approx_math:
      per = g.sfu_cycles_per_vector
    else:
      per = g.transcendental_cycles_per_vector
    exchange = g.reduce_exchange_cycles if op in REDUCTIONS else 0.0
    return g.op_overhead_cycles + exchange + per * _vectors(op, eqn)

  def issue_split(self, op, eqn, approx_math=False):
    """issue_cycles as (latency, ALU work): a warpgroup waits out an
    equation's overhead alone (a dependent chain of scalar equations ran as
    fast at two blocks to an SM as at one: scalar_chain_32_ops_2_per_sm,
    H200), while its vectors' cycles are the SM's ALUs', which the
    warpgroups beside it share (alu_share)."""
    c = self.issue_cycles(op, eqn, approx_math)
    if op in TMA_ISSUE:  # (no ALU work: all the warpgroup's wait)
      return c, 0.0
    g = self.gpu
    lat = min(c, g.op_overhead_cycles)
    if op in REDUCTIONS:  # (its exchange across lanes: a wait, no ALU work)
      lat += g.reduce_exchange_cycles
    elif op is OpClass.TRANSCENDENTAL and not approx_math:
      # (a library function's dependent steps: the warpgroup's own wait)
      lat += g.transcendental_wait_cycles_per_vector * _vectors(op, eqn)
    return lat, c - lat

  def beside_tensor(self, op, eqn):
    """How much slower an equation's ALU work goes while a wgmma is in
    flight on its SM (tensor_overlap): float32 adds and multiplies (FMA)
    most, the rest about twice (gpus.GPU.beside_tensor_*)."""
    g = self.gpu
    if op is OpClass.FMA and all(
        getattr(v.aval, "dtype", None) is not None and memory.is_float(v.aval.dtype)
        and v.aval.dtype.itemsize >= 4 for v in eqn.outvars):
      return g.beside_tensor_fma
    return g.beside_tensor_other

  def tma(self, engines, t, nbytes, site=None, row_bytes=None, shared=True, via_l2=True,
          store=False, hbm_cost=1.0, source=None, own=False):
    """A transfer issued at t (a load from `site`, whose latency and L2 share
    the L2 model set: LaunchTiming.set_loads; its box's rows `row_bytes`
    long): (start, end of the transfer, completion). `shared`: False for a
    load whose bytes the wave's blocks do not re-read (a multicast's part:
    the site's analysis sees the cluster's blocks as one); `via_l2`: False
    for a transfer between SMs' SMEM, which does not load the L2.

    At a site whose sources several blocks of the wave read, the L2 serves
    the re-reads faster than it streams, in boxes of rows of 128 bytes and
    more (byte_cycles); and its latency grows as the SM's share of the L2
    fills: lat / (1 - busy), the share busy so far (taken alike for the
    blocks beside it), a queue's wait (l2_queue_cap bounds it, and sets it
    where the transfers keep the share busy throughout: 10x). The factor
    takes the whole latency, HBM's extra for misses too: a simplification.
    Only the far share of the reads queues (far_share: a launch that fits in
    half the L2 reads near, at the plain latency).
    Boxes of rows under 128 bytes stream, and wait in the queue as well;
    each row is an L2 request: they go at most at the SM's share of the
    L2's requests (l2_requests_per_s) and at its engine's rate
    (tma_narrow_rows_per_clk), and their lookups keep the share busy where
    they take longer than their bytes (32-byte rows: twice as long).

    What comes from HBM (a load's missing share, all of a store: `store`)
    keeps the SM's share of HBM's bandwidth busy, read or write (count_hbm;
    `hbm_cost` a byte, for the runs it comes in: gpus.GPU.hbm_cost; a load's
    `source`: (a key for its site's reads of its buffer, the buffer's bytes)),
    and a miss's latency queues there (Timing._hbm_queue). The block's part
    of that share (1/share of the SM's) delivers its bytes in turn, reads and
    writes alike: a transfer completes no sooner than its latency after its
    end, nor than the share has delivered it and everything the block sent
    HBM before (hbm_free). So a block whose transfers outrun its share waits
    for them, and its ALU work and its HBM traffic overlap only as far as its
    pipeline lets them: a kernel near both limits takes longer than either.
    That holds for a load of the block's `own` data, which no other block
    reads (rules/tma.in_own_part): HBM brings data that blocks share (a
    matmul's tiles) once for all of them, as fast as its bandwidth goes. A
    store is done once the L2 has it; HBM takes it later, from the share."""
    g = self.gpu
    start = max(t, engines.tma_free)
    lat = engines.latency.get(site, g.tma_latency)
    miss = 1.0 if store else engines.miss.get(site, 0.0)
    if miss and not store and source is not None and not engines.hbm_cycles:
      # (a launch that fits in the L2: what a block reads past twice its
      # share of a source it read before, the L2 holds: a hit, at its own
      # latency)
      first = miss * self._first_read(engines, nbytes * miss, source)
      lat -= g.hbm_latency_extra * (miss - first)
      miss = first
    if miss and not store:
      lat += miss * self._hbm_queue(engines, start)
    per = engines.byte_cycles.get(site) if shared else None
    if per is not None:  # (a site whose sources are shared: the far reads queue)
      far = engines.far
      if far:
        lat *= 1 - far + far / self._l2_left(engines, start)
    elif engines.far and not engines.hbm_cycles:
      # (a launch that fits in the L2 but not in its near half: what the
      # L2 holds of the far half comes across the partitions, further)
      lat += engines.far * g.l2_far_latency_extra * (1 - miss)
    narrow = row_bytes is not None and row_bytes < g.l2_shared_min_row_bytes
    if per is None or row_bytes is None or narrow:
      per = 1 / engines.l2_rate if engines.l2_rate else 0.0  # (streamed)
    floor = 1 / g.tma_bytes_per_clk
    l2_per = per
    if narrow:  # (a request a row: the SM's share of the L2's, or its engine's)
      rows = min(g.tma_narrow_rows_per_clk, engines.l2_rows or math.inf)
      floor = max(floor, 1 / (row_bytes * rows))
      if engines.l2_rows:  # (the share is busy with its lookups, where longer)
        l2_per = max(per, 1 / (row_bytes * engines.l2_rows))
    work = nbytes * max(per, floor)
    end = start + work * _stretch(engines.share, engines.tma_work, start)
    engines.tma_work += work
    hbm = 0.0
    if via_l2:
      engines.l2_work += nbytes * l2_per
      if miss:
        hbm = self.count_hbm(engines, nbytes * miss, hbm_cost, store, source)
    engines.tma_free = end
    if hbm:
      engines.hbm_free = max(start, engines.hbm_free) + hbm * engines.share
      if own and not store:  # (bytes no other block reads: its own to fetch)
        return start, end, max(end + lat, engines.hbm_free)
    return start, end, end + lat

  def store_queue(self, engines, t):
    """When a bulk store issued at t may start: the TMA engine takes
    another while fewer than tma_store_queue of its earlier stores are
    still reading SMEM; past that, the issue waits for the oldest read.
    (Stores another warpgroup, simulated ahead, issued after t do not hold
    this one up.)"""
    stores = engines.store_reads
    stores[:] = [(at, end) for at, end in stores if end > t]
    reads = sorted(end for at, end in stores if at <= t)
    depth = self.gpu.tma_store_queue
    if len(reads) < depth:
      return t
    return reads[len(reads) - depth]

  @staticmethod
  def count_hbm(engines, nbytes, cost, write, source=None):
    """Counts `nbytes` that HBM reads (or writes), at `cost` a byte, for the
    block against its SM's share of HBM's bandwidth (each busy SM gets its
    share: LaunchTiming), for the queue they make (_hbm_queue); a load's no
    more than the block's share of its source (Engines.hbm_left), counted
    per load site: a second pass over the same data (RMSnorm's) is a site of
    its own, and counts again. Returns the cycles of the SM's share counted.
    The bandwidth also binds the launch as a whole
    (LaunchTiming.kernel_time)."""
    if not engines.hbm_cycles:
      return 0.0
    if source is not None:
      buf, size = source
      nbytes = _take(engines, buf, size / engines.blocks, nbytes)
    cycles = nbytes * cost * engines.hbm_cycles[1 if write else 0]
    engines.hbm_work += cycles
    return cycles

  @staticmethod
  def _first_read(engines, nbytes, source):
    """The share of `nbytes` of a load from `source` (Timing.tma) that its
    block may read for the first time in a launch that fits in the L2: up to
    twice its share of the source's bytes (Engines.hbm_left, which count_hbm
    counts down once where the launch does not fit): blocks that split a
    source in whole boxes read at most about twice the mean each (n + 1
    boxes over n blocks), so only a block that reads more reads again."""
    buf, size = source
    taken = _take(engines, buf, 2 * size / engines.blocks, nbytes)
    return taken / nbytes if nbytes > 0 else 0.0

  def _hbm_queue(self, engines, t):
    """The wait a miss adds to its latency at t, queued behind the other
    SMs' requests at HBM: hbm_queue_cycles * busy / (1 - busy), busy the
    share of its SM's share of HBM bandwidth the block's transfers (and the
    co-resident blocks', taken alike) kept busy so far, at most
    hbm_queue_cap (gpus.GPU.hbm_queue_cycles)."""
    if not engines.hbm_cycles:
      return 0.0
    g = self.gpu
    busy = _busy(engines, engines.hbm_work, t, g.hbm_queue_cap)
    return g.hbm_queue_cycles * busy / (1 - busy)

  def spill(self, engines, t):
    """What a spilled accumulator costs a warpgroup at t, before its wgmma
    (LaunchTiming.spill_cycles): the L2's part goes at what the block's TMA
    loads (and the co-resident blocks', taken alike) leave of the SM's share
    of the L2 so far, as their latency does in tma()."""
    l1, l2 = engines.spill
    return l1 + l2 / self._l2_left(engines, t)

  def _l2_left(self, engines, t):
    """What is left at t of the SM's share of the L2 for what waits on it
    (a queue's wait is 1 / left as long): 1 - busy, busy the share the
    block's transfers (and the co-resident blocks', taken alike) kept it
    busy so far, at most l2_queue_cap."""
    return 1 - _busy(engines, engines.l2_work, t, self.gpu.l2_queue_cap)

  def f16_equivalent(self, dtype):
    """An f16 FLOP's worth of tensor-core time per FLOP of operands of this
    dtype (an fp8 FLOP: half)."""
    r = self._f16.get(dtype)
    if r is None:
      g = self.gpu
      r = self._f16[dtype] = g.tensor_rate("f16") / g.tensor_rate(operand_kind(dtype))
    return r

  def wgmma(self, engines, t, m, n, k, dtype):
    """A wgmma group issued at t on these tensor cores: (start, completion,
    held: when the issuing warpgroup is free again, issued: when its own
    issue would end). Its instructions (one per 64 rows of A and 32 bytes of
    K: m64nNk16 for 16-bit operands) take wgmma_issue_cycles_base plus
    wgmma_instr_issue_cycles each to issue, and go to the tensor cores'
    queue, which holds wgmma_queue of them ahead of the one executing: the
    warpgroup stays in the issue until its last instruction has a place,
    all but that many of them started (instructions start evenly over the
    group's time; ahead of it, the groups before, taken alike). No
    instruction starts before it is issued."""
    g = self.gpu
    start = max(t, engines.tc_free)
    work = 2 * m * n * k / g.tensor_rate(operand_kind(dtype)) + g.wgmma_issue_cycles
    took = work * _stretch(engines.share, engines.tc_work, start)
    engines.tc_work += work
    instrs = -(-m // 64) * max(1, -(-k * np.dtype(dtype).itemsize // 32))
    per = took / instrs
    issued = t + g.wgmma_issue_cycles_base + instrs * g.wgmma_instr_issue_cycles
    held = max(issued, start + (instrs - g.wgmma_queue) * per)
    engines.tc_free = max(start + took, issued + per)
    return start, engines.tc_free + g.wgmma_latency, held, issued

  def launch(self, num_blocks, smem, num_threads, regs=None, footprint=None, inputs=None):
    return LaunchTiming(self, num_blocks, smem, num_threads, regs, footprint, inputs)


class LaunchTiming:
  """Placement of one launch's blocks on SMs and its predicted time."""

  def __init__(self, timing, num_blocks, smem, num_threads, regs=None, footprint=None,
               inputs=None):
    g = timing.gpu
    self.timing = timing
    # Inputs the L2 holds whole: what one wave read, a later wave finds
    # there (set_loads; hbm_reads counts them read once a launch too).
    self.inputs_held = inputs is not None and inputs <= g.l2_bytes
    self.far = far_share(g, footprint)
    self.regs = regs or occupancy.Registers(g.register_base, occupancy.MAX_PER_THREAD, 0)
    self.per_sm = occupancy.blocks_per_sm(g, smem, num_threads, self.regs,
                                          CUDA_RESERVED_SMEM_PER_BLOCK)
    # An accumulator that does not fit goes out to local memory and comes
    # back around each wgmma (which needs it whole in registers), through
    # the SM's local-memory path, shared like its other units: from the L1
    # while the L1 left beside SMEM holds the blocks' accumulators, the rest
    # from the L2.
    # (The driver sizes the carve-out for the blocks the SM can hold; the
    # blocks it does hold, share of them, fill the L1: spill_cycles.)
    self.acc_bytes = (self.regs.accumulators * 4 * occupancy.LANES
                      if self.regs.spilled else 0)  # (a warpgroup's, spilled)
    self.spilled_bytes = self.acc_bytes * num_threads
    self.l1 = occupancy.l1_bytes(g, self.per_sm * (smem + CUDA_RESERVED_SMEM_PER_BLOCK))
    # Each busy SM's share of the L2's bandwidth (bytes a cycle; a transfer
    # goes at most at what its TMA engine moves; at sites the wave's blocks
    # share, the L2 gives more: set_loads).
    self.active = active = max(1, min(num_blocks, g.num_sms))
    self.l2_rate = g.l2_bytes_per_s / g.clock_hz / active
    self.l2_rows = g.l2_requests_per_s / g.clock_hz / active  # (rows under 128 bytes)
    # ... and of HBM's: cycles a byte read, a byte written (none where the
    # launch's inputs and outputs fit in the L2: its loads hit there once
    # read, and the few first reads make no queue)
    fits = footprint is not None and footprint <= g.l2_bytes
    self.hbm_cycles = None if fits else (g.clock_hz * active / g.hbm_bytes_per_s,
                                         g.clock_hz * active / g.hbm_write_bytes_per_s)
    self.miss = {}  # TMA load site -> the share of its bytes from HBM (set_loads)
    self.latency = {}
    self.byte_cycles = {}
    self.distinct = {}  # TMA load site -> distinct sources per wave (set_loads)
    # Follow each TMA load (hbm_reads_traced): set for kernels whose blocks
    # take different paths, whose addresses the per-site model cannot group.
    self.trace_loads = False
    self.slots = g.num_sms * self.per_sm     # blocks in one wave
    self.waves = -(-num_blocks // self.slots) if num_blocks else 0
    self.num_blocks = num_blocks

  def place(self, block_index):
    """(SM, wave) of the block_index-th block of the launch."""
    return block_index % self.timing.gpu.num_sms, block_index // self.slots

  def share(self, block_index):
    """How many blocks share the SM with this one in its wave: per_sm, or
    fewer in a last wave that does not fill the SMs."""
    sms = self.timing.gpu.num_sms
    sm, wave = self.place(block_index)
    start = wave * self.slots
    end = min(self.num_blocks, start + self.slots)
    first = start + (sm - start) % sms
    return max(1, len(range(first, end, sms)))

  def spill_cycles(self, share):
    """What a spilled accumulator costs a warpgroup per wgmma, its block
    one of share on the SM: out and back, from the L1 while the L1 holds
    the share's accumulators, the rest from the L2; the SM's local-memory
    path is shared by the share. (the L1's part, the L2's part)"""
    if not self.spilled_bytes:
      return 0.0, 0.0
    g = self.timing.gpu
    to_l2 = max(0.0, 1.0 - self.l1 / (share * self.spilled_bytes))
    trip = share * 2 * self.acc_bytes
    return trip * (1 - to_l2) / g.local_bytes_per_clk, trip * to_l2 / g.local_l2_bytes_per_clk

  def engines(self, block_index):
    """The block's share of its SM's units (a fresh Engines)."""
    share = self.share(block_index)
    return Engines(share, self.spill_cycles(share), self.l2_rate, self.latency,
                   self.trace_loads, self.byte_cycles, self.far, self.l2_rows, self.miss,
                   self.hbm_cycles, self.num_blocks or 1)

  def set_loads(self, grid_index, load_axes):
    """Each TMA load site's latency: from the L2, plus HBM's extra for the
    share of its loads that miss: the first of the blocks of a wave that
    read one source (block_classes.analyse), or of the launch where the L2
    holds its inputs whole (a later wave finds there what an earlier one
    read: a matmul's B columns, which every wave reads again), or every
    block where the address comes from data; and where that is not every
    block, the L2's cost a byte (byte_cycles)."""
    g = self.timing.gpu
    n = len(grid_index)
    waves = [grid_index[w * self.slots:(w + 1) * self.slots] for w in range(self.waves)]
    for site, axes in load_axes.items():
      self.distinct[site] = [self._distinct(wave, axes) for wave in waves]
      # (the share that misses: each wave's first reader of a source, or,
      # where the L2 holds the inputs whole, the launch's)
      if self.inputs_held and axes is not None and n:
        first = self._distinct(grid_index, axes) / n
      else:
        first = sum(self.distinct[site]) / n if n else 1.0
      self.latency[site] = g.tma_latency + g.hbm_latency_extra * first
      # (HBM's queue counts no misses where addresses come from data: the
      # analysis takes every such load for a miss, most of which the L2 serves)
      self.miss[site] = first if axes is not None else 0.0
      # Where the wave's blocks share sources (a matmul's A and B tiles), the
      # L2 streams the first read of each (`first` of the bytes) and
      # serves the rest at its shared rate; each busy SM gets its share, up
      # to what its TMA engine moves. Where the analysis sees no sharing
      # (blocks reading apart, or a persistent kernel's loop whose addresses
      # it cannot group), the streaming rate and the unloaded latency: the
      # queue without the credit slowed JAX's persistent matmul 13% where
      # the GPU shows no such loss (benchmarks/HISTORY.md).
      if first < 1:
        per_s = first / g.l2_bytes_per_s + (1 - first) / g.l2_shared_bytes_per_s
        self.byte_cycles[site] = per_s * g.clock_hz * self.active

  def hbm_reads_traced(self, loads):
    """Bytes read from HBM, following every TMA load: the loads of a wave's
    blocks (which start together) in the order of their issue cycles,
    through an L2 of the GPU's size kept least-recently-used by source
    (buffer, offset, box); a load from a source not in it misses. `loads`:
    block number -> its Loads (or tuples that begin like them), or a
    Joined."""
    l2 = self.timing.gpu.l2_bytes
    cache: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    used, reads = 0, 0
    n = self.num_blocks
    for w in range(self.waves):
      cycles: list[float] = []
      wave: list[Any] = []
      for b in range(w * self.slots, min(n, (w + 1) * self.slots)):
        got = loads.get(b, ())
        if isinstance(got, Joined):  # (the cycles beside the Loads)
          cycles += got.cycles
          wave += got.sliced
        else:
          cycles += [ev[0] for ev in got]
          wave += got
      for i in np.argsort(np.asarray(cycles, dtype=np.float64), kind="stable").tolist():
        _, key, nbytes, *_ = wave[i]
        if key in cache:
          cache.move_to_end(key)
          continue
        reads += nbytes
        cache[key] = nbytes
        used += nbytes
        while used > l2 and cache:
          used -= cache.popitem(last=False)[1]
    return reads

  @staticmethod
  def _distinct(wave, axes):
    """How many distinct sources the blocks `wave` (grid indices) read at a
    site whose address depends on grid `axes` (None: on data)."""
    if axes is None:
      return len(wave)
    if not axes:
      return 1
    return len(np.unique(wave[:, list(axes)], axis=0))

  def kernel_time(self, block_cycles, hbm_reads, hbm_writes, read_cost=1.0, write_cost=1.0):
    """The SMs' block slots (per_sm on each) take blocks in launch order as
    they free up, as the GPU's block scheduler hands them out: a launch of
    like blocks runs in waves, and one of unlike blocks (causal attention)
    evens out over the slots. The kernel takes its last block's end, and
    cannot beat HBM bandwidth for the bytes it moves; plus launch
    overhead; read_cost, write_cost: what a byte costs HBM for the runs the
    kernel's boxes read and write in (gpus.GPU.hbm_cost), on average. Returns
    a KernelTime."""
    g = self.timing.gpu
    cycles = np.asarray(block_cycles, dtype=np.float64)
    free = [(0.0, slot) for slot in range(min(self.slots, len(cycles)))]
    heapq.heapify(free)
    end = 0.0
    for c in cycles:
      t, slot = heapq.heappop(free)
      heapq.heappush(free, (t + c, slot))
      end = max(end, t + c)
    # (the tail: from when a slot first has nothing left to run)
    idle = min(t for t, _ in free) if free else 0.0
    compute_s = end / g.clock_hz
    tail_s = (end - idle) / g.clock_hz if self.waves > 1 else 0.0
    memory_s = (hbm_reads * read_cost / g.hbm_bytes_per_s
                + hbm_writes * write_cost / g.hbm_write_bytes_per_s)
    return KernelTime(max(compute_s, memory_s) + g.launch_overhead_s, compute_s,
                      memory_s, g.launch_overhead_s, tail_s,
                      (len(cycles) % self.slots or self.slots) / self.slots)

  def hbm_reads(self, site_bytes, input_bytes):
    """Bytes read from HBM: the blocks of one wave run together,
    so what several of them read at one load site, the L2 serves after the
    first: per wave and site, each distinct source (blocks agreeing on the
    grid axes its address depends on, block_classes.analyse: counted by
    set_loads) is read from HBM once, while what the wave's blocks read at one time fits in the L2
    (a load's bytes at each distinct source, the blocks going through their
    loads together); past that, the excess misses in proportion. Inputs
    that fit in the L2 whole are read once per launch."""
    n = self.num_blocks
    l2 = self.timing.gpu.l2_bytes
    per_block = {s: b / n for s, (b, _) in site_bytes.items()} if n else {}
    per_load = {s: b / loads for s, (b, loads) in site_bytes.items() if loads}
    reads = 0.0
    for w in range(self.waves):
      size = min(self.slots, n - w * self.slots)  # (blocks in the wave)
      unique = traffic = live = 0.0
      for s, b in per_block.items():
        # (a site set_loads does not know: as an address from data)
        distinct = self.distinct[s][w] if s in self.distinct else size
        unique += distinct * b
        traffic += size * b
        live += distinct * per_load.get(s, 0.0)
      reads += unique if live <= l2 else unique + (traffic - unique) * (1 - l2 / live)
    if input_bytes <= l2:
      reads = min(reads, input_bytes)
    return reads


@dataclasses.dataclass(frozen=True)
class KernelTime:
  seconds: float      # the prediction
  compute_s: float    # when the last block ends (block slots, kernel_time)
  memory_s: float     # HBM reads and writes over their bandwidths
  launch_s: float     # launch overhead
  tail_s: float       # of compute_s: from when a slot first has nothing left
  last_wave_fill: float  # how full the last wave is (1: full)
