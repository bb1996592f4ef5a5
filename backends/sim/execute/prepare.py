"""What a kernel needs before any block runs, once per trace: SMEM and the
rules' static checks (Prepared), then JAX's real lowering as a check."""
import dataclasses
import math
from collections.abc import Callable
from typing import Any

from pallas_sim.backends.sim.blocks import block_classes
from pallas_sim.backends.sim.analysis import resources
from pallas_sim.backends.sim.base import locations
from pallas_sim.backends.sim.frontend import capture
from pallas_sim.backends.sim.frontend.capture import KernelLaunch
from pallas_sim.backends.sim.interpret import rules  # noqa: F401  (registers all rules)
from pallas_sim.backends.sim.interpret.compiler import Compiler, Program
from pallas_sim.backends.sim.interpret.rules import semaphores
from pallas_sim.backends.sim.machine.state import WARPS_PER_WARPGROUP
from pallas_sim.backends.sim.timing import occupancy
from pallas_sim.backends.sim.timing.model import Timing
from pallas_sim.errors import LoweringTimeoutError, UnsupportedPrimitiveError
from pallas_sim.gpus import GPU
from pallas_sim.options import Options


@dataclasses.dataclass(slots=True)
class Prepared:
  """What a kernel needs before it runs, once per trace."""
  jaxpr: Any
  program: Program              # the compiled kernel body
  smem: int                     # bytes a block requests, the profiler's included
  barriers: int                 # mbarriers (and named barriers) a block can have
  warps: int                    # clock components of a warp_map's warps, or 0
  together: bool                # blocks wait for each other: they run as one group
  sem_inputs: frozenset[int]    # operands that are semaphores
  serial_only: bool             # must run in this process, in block order
  regs: occupancy.Registers
  variation: Any                # block_classes.analyse: how blocks' control differs
  load_axes: dict[int, Any]     # TMA load site -> the grid axes its address reads
  sites: dict[int, int]         # id(eqn) -> its site number
  numerics: bool                # compiled with the tensor cores' sums
  skip_float_values: bool       # compiled without float values (nothing reads them)


def axis_sizes(launch: KernelLaunch) -> dict[Any, int]:
  """Axis name (a grid axis also by its dimension) -> its size: the bounds
  of the indices a kernel reads (block_classes.analyse)."""
  sizes: dict[Any, int] = dict(zip(launch.cluster_names, launch.cluster))
  if launch.thread_name is not None and launch.num_threads:
    sizes[launch.thread_name] = launch.num_threads
  return sizes | dict(zip(launch.grid_names, launch.grid)) | dict(enumerate(launch.grid))


class Preparer:
  """Prepares launches for one Executor, each kernel jaxpr once."""

  def __init__(self, options: Options, gpu: GPU, timing: Timing,
               shapes_only: bool = False) -> None:
    self.options, self.gpu, self.timing = options, gpu, timing
    self.shapes_only = shapes_only  # ps.estimate was given shapes, not arrays
    self._prepared: dict[int, Prepared] = {}
    self._lowered: dict[int, Any] = {}

  def prepare(self, launch: KernelLaunch) -> Prepared:
    """Checks that need no data, before anything runs: shared memory against
    the limit, and every primitive modelled (with the rules' own static
    checks). Returns a Prepared."""
    key = id(launch.jaxpr)
    hit = self._prepared.get(key)
    if hit is not None and hit.jaxpr is launch.jaxpr:
      return hit
    if any(not bm.has_trivial_window() for bm in launch.block_mappings):
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: pallas_call BlockSpecs with index maps are not "
          f"modelled, and {capture.NO_PALLAS_CALL_LOWERING}", where=launch.where)
    jaxpr = launch.jaxpr
    extra = len(jaxpr.invars) - launch.num_inputs - launch.num_outputs
    if extra:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: {extra} kernel-level scratch operands "
          "(pallas_call scratch_shapes) are not modelled", where=launch.where)
    res = resources.of(jaxpr)
    smem = res.smem
    if launch.profile is not None:  # (the profiler's buffer is in SMEM too)
      smem += launch.profile.smem_bytes(launch.num_threads)
    resources.check_smem(smem, self.gpu, where=launch.where, parts=res.smem_parts)
    # Whether blocks' control flow differs (then estimate runs them all, and
    # the L2 model follows their loads: timing/model.py); per TMA load
    # site, the grid axes its address depends on (L2 reuse).
    found = block_classes.analyse(jaxpr, launch.grid_names, sizes=axis_sizes(launch))
    variation, axes = found
    # Control flow that reads data runs on the values the kernel computes:
    # an estimate given arrays computes them for such a kernel (so that it
    # takes the paths the full simulation takes).
    numerics = self.options.numerics or (
        variation is not None and variation[0] == block_classes.DATA
        and not self.shapes_only)
    # Without numerics, and with no control decision on data nor any
    # decision or address on float math, no value a float operation
    # computes can change a time: estimate skips them.
    skip_float_values = not numerics and not found.float_matters and (
        variation is None or variation[0] != block_classes.DATA)
    cx = Compiler(self.timing, launch, self.options.max_cycles, numerics,
                  skip_float_values=skip_float_values)
    program = cx.compile(jaxpr)
    names = res.primitives
    # Operands that are semaphores (plgpu.alloc_semaphore): global too.
    sem_inputs = frozenset(
        i for i, v in enumerate(jaxpr.invars[:launch.num_inputs])
        if semaphores.holds_semaphores(v.aval))
    # Blocks that can wait for each other (global semaphores) run together.
    together = "get_global" in names or bool(sem_inputs)
    p = Prepared(
        jaxpr=jaxpr, program=program, smem=smem,
        barriers=res.barriers,
        # Warps of a warp_map get clock components of their own.
        warps=WARPS_PER_WARPGROUP if "mpmd_map" in names else 0,
        together=together, sem_inputs=sem_inputs,
        # What must run in this process, in block order: printing (the order
        # of lines), inline MLIR (built through JAX's MLIR bindings), global
        # semaphores (one group anyway).
        serial_only=together or bool({"debug_print", "inline_mgpu"} & names),
        regs=occupancy.registers(jaxpr, launch.num_threads, self.gpu.register_base),
        variation=variation, load_axes={n: axes.get(k) for k, n in cx.sites.items()},
        sites=dict(cx.sites), numerics=numerics, skip_float_values=skip_float_values)
    if p.together and launch.cluster and math.prod(launch.cluster) > 1:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: global semaphores (pl.get_global, "
          "plgpu.alloc_semaphore) in a kernel with clusters are not modelled",
          where=launch.where)
    self._prepared[key] = p
    return p

  def check_lowering(self, launch: KernelLaunch,
                     lower: Callable[[float | None], tuple[BaseException, str | None] | None],
                     where: str | None = None) -> None:
    """Raises what JAX's real Mosaic GPU lowering raises for this kernel, as
    our own error class, so that nothing the hardware backend rejects runs
    here. Once per kernel."""
    if not self.options.check_lowering:
      return
    key = id(launch.jaxpr)
    if self._lowered.get(key) is launch.jaxpr:  # (ids are reused: compare)
      return
    timeout = self.options.lowering_timeout_s
    err = lower(timeout)  # (exception, its user file:line or None) or None
    if err is not None and isinstance(err[0], capture.LoweringTimedOut):
      inside = err[0].where()
      raise LoweringTimeoutError(
          f"kernel {launch.name}: JAX's Mosaic GPU lowering did not finish in "
          f"{timeout:g} s (lowering_timeout_s)"
          + (f"; it was in {inside}" if inside else "") + ". A kernel normally "
          "lowers in under a second: JAX's layout inference may be searching for "
          "layouts it cannot settle (layout annotations, plgpu.load(..., layout=...) "
          "or plgpu.layout_cast, help it). Pass check_lowering=False to simulate "
          "without the real lowering's check, or lowering_timeout_s=None to wait "
          "for it.", where=launch.where)
    if err is not None:
      # (The lowering's traceback ends in the user's code where the MLIR op
      # it rejected came from: keep those frames last, as on the GPU. An MLIR
      # verifier's error names that op's own line: it comes first.)
      where = locations.mlir_location(err[0]) or where or err[1] or launch.where
      raise resources.lowering_error(err[0], where=where, kernel_jaxpr=launch.jaxpr,
                                     kernel_where=launch.where).with_traceback(
          locations.user_tail(err[0].__traceback__))
    self._lowered[key] = launch.jaxpr
