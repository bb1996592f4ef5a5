"""Hardware models: the figures the timing model (backends/sim/machine/
timing.py) and the resource checks read, as data. Figures marked 'calibrate'
are leads to be measured on a real Hopper GPU (benchmarks/), not trusted."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class GPU:
  name: str
  num_sms: int = 132
  clock_hz: float = 1.83e9
  max_smem_per_block: int = 232448      # Mosaic's max_smem_bytes on sm_90
  smem_per_sm: int = 228 * 1024
  max_threads_per_sm: int = 2048
  # Dense tensor-core throughput per SM and clock, by operand type: fp8 and
  # int8 run at twice the f16/bf16 rate, tf32 (f32 operands) at half.
  tensor_flop_per_clk: tuple = (("f16", 4096), ("bf16", 4096), ("tf32", 2048),
                                ("fp8", 8192), ("int8", 8192))
  hbm_bytes_per_s: float = 3.35e12
  l2_bytes: int = 50 * 2 ** 20
  # calibrate: a lane's registers beyond its arrays (addresses, indices,
  # loop counters), for the register estimate (machine/occupancy.py)
  register_base: int = 32
  # calibrate: bytes per cycle an SM moves to and from local memory when a
  # wgmma accumulator spills (the spilled registers go out and come back
  # around each wgmma)
  local_bytes_per_clk: float = 64.0
  # calibrate: latencies in cycles
  tma_latency: int = 600
  wgmma_latency: int = 120
  barrier_latency: int = 20
  launch_overhead_s: float = 4e-6
  # calibrate: instruction issue cost of one warpgroup-wide vector op,
  # per 128 elements (one element per lane) of the widest operand.
  alu_cycles_per_vector: float = 2.0
  op_overhead_cycles: float = 4.0

  def tensor_rate(self, operand_kind):
    """Tensor-core FLOP per clock per SM for operands of this kind."""
    return dict(self.tensor_flop_per_clk)[operand_kind]


H100 = GPU("h100")
# HBM: the datasheet's 4.8 TB/s; a device-to-device copy measured 4.3 TB/s
# (/work/.library/device/KINDS.md, 2026-10-28). L2: 60 MB as PyTorch reads it
# off the device there.
H200 = GPU("h200", hbm_bytes_per_s=4.3e12, l2_bytes=60 * 10 ** 6)

GPUS = {g.name: g for g in (H100, H200)}
NAMES = tuple(sorted(GPUS))


def get(gpu):
  if isinstance(gpu, GPU):
    return gpu
  try:
    return GPUS[str(gpu).lower()]
  except KeyError:
    raise ValueError(
        f"gpu={gpu!r}: unknown GPU model; choose one of {list(NAMES)}") from None
