"""What every entry point (simulate, run, backend, kernel, the CLI, the pytest
plugin) takes, as one value: the GPU model, what is checked, and what a
finding does."""
import dataclasses
import os
from typing import Any

from pallas_sim import gpus

# A block that runs this long (in simulated cycles) is a runaway: 2^32 cycles
# is 2.3 s of one block at the H100's clock, about 30x the longest block of a
# persistent 32768^3 f16 matmul; no real kernel comes near it.
MAX_CYCLES = 2 ** 32

_ON = ("raise", "report")
ENGINES = ("processes", "ray")


# The environment variables two options take their defaults from.
PROGRESS_ENV = "PALLAS_SIM_PROGRESS"
CHECK_ESTIMATE_ENV = "PALLAS_SIM_CHECK_ESTIMATE"


def _env_progress() -> bool | None:
  """Options.progress's default: PALLAS_SIM_PROGRESS=1 on, =0 off, else None."""
  return {"1": True, "0": False}.get(os.environ.get(PROGRESS_ENV, ""))


def _env_check_estimate() -> str | None:
  """Options.check_estimate's default: PALLAS_SIM_CHECK_ESTIMATE's path."""
  return os.environ.get(CHECK_ESTIMATE_ENV) or None


@dataclasses.dataclass(frozen=True)
class Options:
  """gpu: the model ("h100", "h200").
  check_races / on_race: find data races; "raise" ps.RaceError at the end of
    the simulation, or "report" them in report.races only.
  check_lowering: lower each kernel with JAX's real Mosaic GPU lowering first.
  lowering_timeout_s: how long that lowering may take (None: as long as it
    takes). Past it the simulation stops with ps.LoweringTimeoutError, which
    names the kernel: JAX's layout inference can search for minutes on a
    kernel whose layouts it cannot settle (jax 0.12 on a loop whose trip
    count is read from SMEM after a wgmma), where a kernel normally lowers
    in well under a second. 60 s leaves room for JAX's largest kernels on a
    slow CPU.
  check_uninitialized / on_uninitialized: find reads of SMEM or output
    elements nothing wrote, and output elements no block wrote; "raise"
    ps.UninitializedError, or "report" them in report.uninitialized only.
  library_races: races both of whose accesses are made by code inside the
    installed jax package (JAX's own kernels, e.g. jax.experimental.pallas.ops)
    are "report"ed by default: in report.races (race.library is True) and as
    a ps.RaceWarning, never raising, since the user cannot change that code;
    "raise" treats them as any other race. A race with an access in the
    user's code (including JAX helpers such as emit_pipeline called from it,
    which are located at the user's call) is the user's.
  max_cycles: a block still running after this many simulated cycles is a
    runaway: ps.RunawayKernelError at the looping line.
  workers: how many processes simulate the blocks of one launch (None:
    every core this process may use; 1: only this one). A launch goes over
    several when its first block says the rest would take more than a
    quarter second; results are the same as with workers=1, bit for bit
    (backends/sim/execute/parallel.py).
  engine: where those processes are: "processes" (forked on this machine)
    or "ray" (tasks on a Ray cluster, pallas-sim[ray]; only through
    ps.simulate / ps.run, whose function each task runs again:
    backends/sim/execute/ray_engine.py). With "ray", workers is the number of
    tasks' worth of CPUs (None: the cluster's).
  numerics: compute the tensor cores' sums (False: outputs are not
    meaningful; times are the same, as no time depends on a value the
    tensor cores compute unless control flow reads it: ps.estimate).
  clock_mhz: the SM clock the kernel runs at, for the whole launch (None:
    the clock its power allows: the 1980 MHz boost clock unless the model's
    power there passes the board's 700 W limit, else the highest clock on
    the 15 MHz steps within it, 1035-1905 MHz for the large matmuls of
    lab/timing_suite.py on an H200: backends/sim/timing/power.py;
    report.kernels[i].sm_mhz and .power_w). Given, what nvidia-smi shows
    while the kernel runs, the launch is predicted at it (gpus.at_clock).
  block_classes: simulate one block per class of blocks that do the same
    work, and give the others its times (backends/sim/blocks/block_classes.py;
    kernels whose control flow depends on the block's index or on data run
    every block: ps.estimate).
  progress: a progress line on stderr for launches that run longer than a
    few seconds (True, False; None: on a terminal, not under CI). Its
    default comes from the environment: PALLAS_SIM_PROGRESS=1 or 0.
  check_estimate: a developer's check: a path to which every launch
    simulated appends a JSON line comparing ps.estimate with the full
    simulation (execute/estimate_check.py). Its default comes from the
    environment: PALLAS_SIM_CHECK_ESTIMATE=<path>.
  stop_at_error: a launch that fails (a deadlock, a runaway loop, an access
    out of bounds) stops the program where it next uses what JAX computed,
    with the simulator's error, instead of handing it poison outputs and
    raising when the simulation ends (`pallas-sim run` sets it: a script
    would otherwise run on, and simulate on, with NaNs)."""
  gpu: str = "h100"
  check_races: bool = True
  on_race: str = "raise"
  check_lowering: bool = True
  lowering_timeout_s: float | None = 60.0
  check_uninitialized: bool = True
  on_uninitialized: str = "raise"
  library_races: str = "report"
  max_cycles: float = MAX_CYCLES
  workers: int | None = None
  engine: str = "processes"
  numerics: bool = True
  block_classes: bool = False
  clock_mhz: float | None = None
  progress: bool | None = dataclasses.field(default_factory=_env_progress)
  check_estimate: str | None = dataclasses.field(default_factory=_env_check_estimate)
  stop_at_error: bool = False

  def __post_init__(self) -> None:
    gpus.get(self.gpu, self.clock_mhz)  # raises on an unknown model or clock
    for name in ("on_race", "on_uninitialized", "library_races"):
      if getattr(self, name) not in _ON:
        raise ValueError(f"{name}={getattr(self, name)!r}: choose one of {_ON}")
    if self.workers is not None and not (isinstance(self.workers, int)
                                         and self.workers >= 1):
      raise ValueError(f"workers={self.workers!r}: a positive number of processes, "
                       "or None for every core")
    if self.engine not in ENGINES:
      raise ValueError(f"engine={self.engine!r}: choose one of {ENGINES}")
    if self.lowering_timeout_s is not None and not self.lowering_timeout_s > 0:
      raise ValueError(f"lowering_timeout_s={self.lowering_timeout_s!r}: a positive "
                       "number of seconds, or None for no limit")
    if not self.max_cycles > 0:
      raise ValueError(f"max_cycles={self.max_cycles!r}: must be positive")
    if self.block_classes and (self.check_races or self.check_uninitialized):
      raise ValueError("block_classes=True simulates some blocks only: races and "
                       "unwritten outputs cannot be checked; pass check_races=False and "
                       "check_uninitialized=False, or use ps.estimate")


FIELDS = tuple(f.name for f in dataclasses.fields(Options))

# What an estimate changes (ps.estimate, `pallas-sim estimate`, the executor's
# estimate of a launch it ran): times only, one block of each kind, no checks.
ESTIMATING: dict[str, Any] = dict(numerics=False, block_classes=True, check_races=False,
                                  check_uninitialized=False)


def take(kwargs: dict[str, Any], options: Options | None = None) -> Options:
  """Pops Options fields out of `kwargs` (the rest are the user function's)
  and applies them over `options`."""
  named = {k: kwargs.pop(k) for k in FIELDS if k in kwargs}
  base = options or Options()
  return dataclasses.replace(base, **named) if named else base
