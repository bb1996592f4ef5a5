"""pallas-sim: write a Pallas Mosaic GPU kernel once; simulate it on a CPU
(catching resource overflows and predicting its speed) or run it on a Hopper
GPU through the real lowering, with the same code."""
# Before anything reads JAX's internals: a JAX outside the tested window
# gets one clear message (jax_window.UnsupportedJaxError, an ImportError).
from pallas_sim import jax_window  # noqa: E402
jax_window.check()

from pallas_sim import gpus  # noqa: E402
from pallas_sim.api import Simulation, backend, estimate, kernel, run, simulate  # noqa: E402
from pallas_sim.options import Options  # noqa: E402
from pallas_sim.present import present_gpu  # noqa: E402
from pallas_sim.unwritten import leave_unwritten  # noqa: E402
from pallas_sim.compare import Comparison, compare  # noqa: E402
from pallas_sim.backends.sim.report import KernelReport, Report  # noqa: E402
from pallas_sim.errors import (  # noqa: E402
    BackendError, DeadlockError, KernelError, LoweringError, LoweringTimeoutError,
    OutOfBoundsError, RaceError,
    ResourceError, RunawayKernelError, SimError, SmemOverflowError, UninitializedError,
    UninitializedWarning, RaceWarning, EstimateWarning, OutOfBoundsWarning,
    UnsupportedPrimitiveError)

__version__ = "0.1.0"
__all__ = [
    "run", "simulate", "estimate", "compare", "Comparison", "backend", "kernel",
    "present_gpu", "leave_unwritten",
    "Simulation", "Options", "Report",
    "KernelReport", "gpus", "SimError", "UnsupportedPrimitiveError",
    "KernelError", "LoweringError", "LoweringTimeoutError", "OutOfBoundsError", "ResourceError", "SmemOverflowError",
    "DeadlockError", "RaceError", "RaceWarning", "UninitializedError",
    "UninitializedWarning", "EstimateWarning", "OutOfBoundsWarning",
    "RunawayKernelError",
    "BackendError",
]
