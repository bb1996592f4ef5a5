"""What a simulation found: per-kernel timing, traffic and resources; races."""
import dataclasses
import json


@dataclasses.dataclass
class KernelReport:
  name: str
  where: str
  grid: tuple
  num_threads: int
  num_blocks: int
  smem_bytes: int
  blocks_per_sm: int
  waves: int
  block_cycles_min: float
  block_cycles_mean: float
  block_cycles_max: float
  time_s: float
  tma_load_bytes: int
  tma_store_bytes: int
  wgmma_flops: int
  wall_s: float
  clock_hz: float = 1.83e9
  workers: int = 1  # processes that simulated its blocks
  trace: list = dataclasses.field(default_factory=list, repr=False)

  @property
  def tflops(self):
    return self.wgmma_flops / self.time_s / 1e12 if self.time_s else 0.0

  def summary(self):
    return (f"{self.name} ({self.where}): grid={self.grid} threads={self.num_threads} "
            f"blocks={self.num_blocks} smem={self.smem_bytes}B "
            f"waves={self.waves} predicted {self.time_s * 1e6:.1f} us"
            + (f" ({self.tflops:.0f} TFLOP/s)" if self.wgmma_flops else "")
            + f"; simulated in {self.wall_s:.2f} s"
            + (f" on {self.workers} processes" if self.workers > 1 else ""))


@dataclasses.dataclass
class Report:
  gpu: str
  kernels: list = dataclasses.field(default_factory=list)
  races: list = dataclasses.field(default_factory=list)
  # machine/initcheck.Uninitialized findings: reads of elements nothing
  # wrote, outputs no block wrote in full
  uninitialized: list = dataclasses.field(default_factory=list)

  def summary(self):
    lines = [f"pallas-sim report ({self.gpu}): {len(self.kernels)} kernel "
             f"launch(es), {len(self.races)} race(s), {len(self.uninitialized)} "
             "uninitialized-memory finding(s)"]
    lines += ["  " + k.summary() for k in self.kernels]
    for title, items in (("races:", self.races),
                         ("uninitialized memory:", self.uninitialized)):
      if items:
        lines.append(title)
        lines += ["  " + str(r).replace("\n", "\n  ") for r in items]
    return "\n".join(lines)

  def __str__(self):
    return self.summary()

  def save_trace(self, path):
    """Chrome trace (chrome://tracing, Perfetto) of the traced blocks; times
    in simulated microseconds."""
    events = []
    for pid, k in enumerate(self.kernels):
      events.append({"ph": "M", "pid": pid, "name": "process_name",
                     "args": {"name": f"{k.name} {k.where}"}})
      us_per_cycle = 1e6 / k.clock_hz
      for block, who, name, start, end in k.trace:
        events.append({"ph": "X", "pid": pid, "tid": f"block {block} {who}",
                       "name": name, "ts": start * us_per_cycle,
                       "dur": max(end - start, 0) * us_per_cycle})
    with open(path, "w") as f:
      json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f)
    return path
