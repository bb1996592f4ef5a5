"""The timing model, in one place: every cycle the simulator assigns comes
from here (issue cost of an equation, a TMA transfer, a wgmma group, the
latency after a barrier wait, a kernel's time), on the hardware figures of
pallas_sim/gpus.py. Calibration (benchmarks/) replaces this module whole;
the rules only ask it when things start and end.

Per-SM engines: blocks are placed on SMs by occupancy (SMEM and threads), in
waves, block i on SM i mod num_SMs; the blocks of one SM in one wave share
that SM's TMA engine and tensor cores, so co-resident blocks compete for them
(blocks are simulated one after another: a later one queues behind the work
an earlier one left on the engines)."""
import math

import numpy as np

CUDA_RESERVED_SMEM_PER_BLOCK = 1024


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
  """When one SM's TMA engine and tensor cores are next free (cycles)."""
  __slots__ = ("tma_free", "tc_free")

  def __init__(self):
    self.tma_free = 0.0
    self.tc_free = 0.0


class Timing:
  """The costs of one GPU model (gpus.GPU)."""

  def __init__(self, gpu):
    self.gpu = gpu
    self.barrier_latency = gpu.barrier_latency
    # Each SM's share of HBM bandwidth when all SMs stream (calibrate).
    self.tma_bytes_per_cycle = gpu.hbm_bytes_per_s / gpu.clock_hz / gpu.num_sms

  def issue_cycles(self, eqn):
    """Cycles one warpgroup spends issuing this equation (calibrate)."""
    size = 1
    for v in eqn.outvars:
      size = max(size, math.prod(getattr(v.aval, "shape", ())))
    g = self.gpu
    return g.op_overhead_cycles + g.alu_cycles_per_vector * (-(-size // 128))

  def tma(self, engines, t, nbytes):
    """A transfer issued at t: (start, end of the transfer, completion)."""
    start = max(t, engines.tma_free)
    end = start + nbytes / self.tma_bytes_per_cycle
    engines.tma_free = end
    return start, end, end + self.gpu.tma_latency

  def wgmma(self, engines, t, m, n, k, dtype):
    """A wgmma group issued at t on these tensor cores: (start, completion)."""
    start = max(t, engines.tc_free)
    busy = 2 * m * n * k / self.gpu.tensor_rate(operand_kind(dtype))
    engines.tc_free = start + busy
    return start, start + busy + self.gpu.wgmma_latency

  def launch(self, num_blocks, smem, num_threads):
    return LaunchTiming(self, num_blocks, smem, num_threads)


class LaunchTiming:
  """Placement of one launch's blocks on SMs and its predicted time."""

  def __init__(self, timing, num_blocks, smem, num_threads):
    g = timing.gpu
    self.timing = timing
    by_smem = g.smem_per_sm // (smem + CUDA_RESERVED_SMEM_PER_BLOCK)
    by_threads = g.max_threads_per_sm // (128 * num_threads)
    self.per_sm = max(1, min(by_smem, by_threads, 32))
    self.slots = g.num_sms * self.per_sm     # blocks in one wave
    self.waves = -(-num_blocks // self.slots) if num_blocks else 0
    self._engines = {}

  def place(self, block_index):
    """(SM, wave) of the block_index-th block of the launch."""
    return block_index % self.timing.gpu.num_sms, block_index // self.slots

  def engines(self, block_index):
    """The engines of the SM the block runs on, shared with the blocks
    co-resident with it there in its wave."""
    key = self.place(block_index)
    e = self._engines.get(key)
    if e is None:
      e = self._engines[key] = Engines()
    return e

  def kernel_seconds(self, block_cycles, traffic_bytes):
    """Each SM runs its waves one after another, a wave as long as its
    longest co-resident block; the kernel takes its slowest SM, and cannot
    beat HBM bandwidth for the bytes it moves (calibrate); plus launch
    overhead."""
    g = self.timing.gpu
    wave_time = {}
    for i, c in enumerate(block_cycles):
      key = self.place(i)
      wave_time[key] = max(wave_time.get(key, 0.0), c)
    per_sm = np.zeros(g.num_sms)
    for (sm, _), c in wave_time.items():
      per_sm[sm] += c
    compute_s = per_sm.max(initial=0) / g.clock_hz
    memory_s = traffic_bytes / g.hbm_bytes_per_s
    return max(compute_s, memory_s) + g.launch_overhead_s
