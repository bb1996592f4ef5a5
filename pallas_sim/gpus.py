"""Hardware models. Figures marked 'calibrate' are leads to be measured on a
real Hopper GPU (benchmarks/), not trusted."""
import dataclasses


@dataclasses.dataclass(frozen=True)
class GPU:
  name: str
  num_sms: int = 132
  clock_hz: float = 1.83e9
  max_smem_per_block: int = 232448      # Mosaic's max_smem_bytes on sm_90
  smem_per_sm: int = 228 * 1024
  regs_per_sm: int = 65536
  max_regs_per_lane: int = 255
  max_threads_per_sm: int = 2048
  tensor_flop_per_clk_per_sm: int = 4096  # dense f16/bf16
  hbm_bytes_per_s: float = 3.35e12
  l2_bytes: int = 50 * 1024 * 1024
  # calibrate: latencies in cycles
  tma_latency: int = 600
  wgmma_latency: int = 120
  barrier_latency: int = 20
  launch_overhead_s: float = 4e-6
  # calibrate: instruction issue cost of one warpgroup-wide vector op,
  # per 128 elements (one element per lane) of the widest operand.
  alu_cycles_per_vector: float = 2.0
  op_overhead_cycles: float = 4.0

  @property
  def tensor_flop_per_s(self):
    return self.tensor_flop_per_clk_per_sm * self.num_sms * self.clock_hz


H100 = GPU("h100")
H200 = GPU("h200", hbm_bytes_per_s=4.3e12, l2_bytes=60 * 1024 * 1024)

GPUS = {"h100": H100, "h200": H200}


def get(gpu):
  if isinstance(gpu, GPU):
    return gpu
  try:
    return GPUS[str(gpu).lower()]
  except KeyError:
    raise ValueError(
        f"gpu={gpu!r}: unknown GPU model; choose one of {sorted(GPUS)}") from None
