"""What a simulation found: per-kernel timing, traffic and resources, and
what bounds each kernel; races and uninitialized memory. Traces for
Perfetto, and a plot (matplotlib, the optional extra pallas-sim[plot])."""
import dataclasses
import json
from typing import Any, Protocol


class TimeParts(Protocol):
  """The parts of a kernel's predicted time that a summary shows
  (timing/model.py's KernelTime, a stage above this one)."""

  @property
  def compute_s(self) -> float: ...
  @property
  def memory_s(self) -> float: ...
  @property
  def launch_s(self) -> float: ...
  @property
  def tail_s(self) -> float: ...
  @property
  def last_wave_fill(self) -> float: ...


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
  hbm_bytes: int = 0          # bytes the model sends to HBM (timing.hbm_bytes)
  registers: int = 0          # estimated per lane (timing/occupancy.py)
  register_limit: int = 255
  timing: TimeParts | None = None  # the parts of time_s
  utilisation: dict = dataclasses.field(default_factory=dict)  # unit -> busy share
  clock_note: str = ""  # where the SMs' clock came from (bound.clock_note)
  tensor_f16_flops: float = 0.0  # tensor work as f16 FLOP (timing/power.py)
  power_w: float = 0.0  # the board's predicted power at its clock (timing/power.py)
  stalls: dict = dataclasses.field(default_factory=dict)  # wait kind -> share of thread time
  bound: str = ""             # what limits it, in words (timing/bound.py)
  bound_reason: str = ""
  num_sms: int = 132
  simulated_blocks: int = 0   # blocks simulated (fewer than num_blocks: estimate)
  classes: str = ""           # how an estimate chose them (backends/sim/blocks/block_classes.py)

  @property
  def sm_mhz(self):
    """The SMs' clock the prediction is at (MHz)."""
    return self.clock_hz / 1e6

  @property
  def tflops(self):
    return self.wgmma_flops / self.time_s / 1e12 if self.time_s else 0.0

  @property
  def gbps(self):
    """Achieved HBM bandwidth (GB/s) over the predicted time."""
    return self.hbm_bytes / self.time_s / 1e9 if self.time_s else 0.0

  @property
  def at_floor(self):
    """Whether HBM bandwidth for the bytes it moves, not its SMs, sets the
    predicted time: then configurations that move the same bytes are
    predicted alike (the model does not rank them)."""
    t = self.timing
    return t is not None and t.memory_s >= t.compute_s

  @property
  def spilled_registers(self):
    return max(0, self.registers - self.register_limit)

  def headline(self):
    return (f"{self.name} ({self.where}): grid={self.grid} threads={self.num_threads} "
            f"blocks={self.num_blocks} smem={self.smem_bytes}B "
            f"waves={self.waves} predicted {self.time_s * 1e6:.1f} us"
            + (f" ({self.tflops:.0f} TFLOP/s)" if self.wgmma_flops else "")
            + f"; simulated in {self.wall_s:.2f} s"
            + (f" on {self.workers} processes" if self.workers > 1 else ""))

  def summary(self):
    """The headline, then: what bounds it, throughput, occupancy, unit
    utilisation and where the warpgroups' time went."""
    lines = [self.headline()]
    if self.bound:
      lines.append(f"  bound: {self.bound} ({self.bound_reason})")
    lines.append(f"  achieved: {self.tflops:.1f} TFLOP/s, {self.gbps:.0f} GB/s of HBM "
                 f"({self.hbm_bytes / 1e6:.1f} MB)")
    spill = (f", {self.spilled_registers} spilled" if self.spilled_registers else "")
    # (blocks go one an SM first: a grid of fewer leaves SMs idle, say so)
    idle = (f" ({self.num_blocks} in use, {self.num_sms - self.num_blocks} idle)"
            if self.num_blocks < self.num_sms else "")
    lines.append(f"  occupancy: {self.blocks_per_sm} block(s) per SM, {self.waves} wave(s) "
                 f"over {self.num_sms} SMs{idle}, ~{self.registers} registers per thread "
                 f"(limit {self.register_limit}{spill})")
    if self.spilled_registers and not self.stalls.get("spill"):
      lines.append(f"  spills: the {self.spilled_registers} registers a thread spills cost "
                   "nothing in this prediction (the model charges the spills of a wgmma "
                   "accumulator only): on a GPU they go to local memory, and slower")
    if self.utilisation:
      lines.append("  units busy: " + ", ".join(
          f"{k} {v:.0%}" for k, v in self.utilisation.items()))
    if self.stalls:
      lines.append("  thread time: " + ", ".join(
          f"{k} {v:.0%}" for k, v in sorted(self.stalls.items(), key=lambda kv: -kv[1])
          if v >= 0.005))
    t = self.timing
    if t is not None:
      lines.append(f"  time: SMs {t.compute_s * 1e6:.1f} us, HBM floor {t.memory_s * 1e6:.1f} us, "
                   f"launch {t.launch_s * 1e6:.1f} us"
                   + (f", last wave {t.tail_s * 1e6:.1f} us ({t.last_wave_fill:.0%} full)"
                      if t.tail_s else ""))
      if self.at_floor:
        lines.append("  ranking: the HBM floor sets this time, not the SMs: configurations "
                     "that move the same bytes are predicted alike, and the model does not "
                     "rank them")
    if self.clock_note:
      lines.append(f"  clock: {self.clock_note}")
    if self.classes:
      lines.append(f"  estimate: {self.classes}")
    return "\n".join(lines)


@dataclasses.dataclass
class FailedLaunch:
  """A launch that did not run to its end: its outputs were poison, and its
  error is raised when the simulation ends (or where the program stopped)."""
  name: str
  where: str | None
  error: BaseException

  def summary(self) -> str:
    first = str(self.error).splitlines()[0].rstrip(":") if str(self.error) else ""
    if len(first) > 160:
      first = first[:157] + "..."
    return (f"{self.name} ({self.where}): failed, {type(self.error).__name__}"
            + (f": {first}" if first else ""))


@dataclasses.dataclass
class Report:
  gpu: str
  kernels: list = dataclasses.field(default_factory=list)
  failed: list = dataclasses.field(default_factory=list)  # FailedLaunch, in order
  races: list = dataclasses.field(default_factory=list)
  # machine/initcheck.Uninitialized findings: reads of elements nothing
  # wrote, outputs no block wrote in full
  uninitialized: list = dataclasses.field(default_factory=list)
  clock_mhz: float | None = None  # the SM clock asked for (Options.clock_mhz; None:
  # each kernel at the clock its power allows, KernelReport.sm_mhz)
  # Whether races and uninitialized memory were looked for (ps.estimate does
  # not): the summary says "not checked" rather than count none.
  races_checked: bool = True
  uninitialized_checked: bool = True

  @property
  def time_s(self):
    """Predicted time of all its kernels, one after another."""
    return sum(k.time_s for k in self.kernels)

  def summary(self):
    at = f" at {self.clock_mhz:g} MHz" if self.clock_mhz else ""
    races = f"{len(self.races)} race(s)" if self.races_checked else "races not checked"
    unset = (f"{len(self.uninitialized)} uninitialized-memory finding(s)"
             if self.uninitialized_checked else "uninitialized memory not checked")
    total = ("" if len(self.kernels) < 2 else
             f"; predicted {self.time_s * 1e6:.1f} us in all" if not self.failed else
             f"; predicted {self.time_s * 1e6:.1f} us for the {len(self.kernels)} that ran")
    failed = f" ({len(self.failed)} failed)" if self.failed else ""
    lines = [f"pallas-sim report ({self.gpu}{at}): {len(self.kernels) + len(self.failed)} "
             f"kernel launch(es){failed}, {races}, {unset}{total}"]
    # (launches that report alike, one after another, as the first and a count:
    # a loop of calls reads as one)
    # (alike: the same summary but for how long it took to simulate)
    runs: list[list[Any]] = []
    for k in self.kernels:
      text = k.summary()
      same = text.replace(f"; simulated in {k.wall_s:.2f} s", "")
      if runs and runs[-1][0] == same:
        runs[-1][3] += 1
      else:
        runs.append([same, text, k, 1])
    for _, text, k, n in runs:
      lines.append("  " + text.replace("\n", "\n  "))
      if n > 1:
        lines.append(f"    and {n - 1} more launch(es) of it, reported alike "
                     f"({n * k.time_s * 1e6:.1f} us for the {n})")
    lines += ["  " + f.summary() for f in self.failed]
    for title, items in (("races:", self.races),
                         ("uninitialized memory:", self.uninitialized)):
      if items:
        lines.append(title)
        lines += ["  " + str(r).replace("\n", "\n  ") for r in items]
    return "\n".join(lines)

  def __str__(self):
    return self.summary()

  def save_trace(self, path):
    """A Chrome/Perfetto trace (opens in ui.perfetto.dev): per kernel, a
    process per SM that ran a traced block, a track per warpgroup, and the
    SM's TMA engine and tensor cores as async tracks (their work overlaps);
    kernels one after another; times in simulated microseconds."""
    from pallas_sim.backends.sim.report import trace_file
    with open(path, "w") as f:
      json.dump(trace_file.events(self), f)
    return path

  def plot(self, path):
    """A PNG: the traced blocks' timeline and a roofline placing each kernel
    (needs matplotlib: pip install 'pallas-sim[plot]')."""
    from pallas_sim.backends.sim.report import plot
    return plot.save(self, path)
