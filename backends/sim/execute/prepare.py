"""What a kernel needs before any block runs, once per trace: SMEM and the
rules' static checks (Prepared), then JAX's real lowering as a check."""
import math

from pallas_sim.backends.sim.blocks import block_classes
from pallas_sim.backends.sim.analysis import resources
from pallas_sim.backends.sim.base import locations
from pallas_sim.backends.sim.frontend import capture
from pallas_sim.backends.sim.interpret import rules  # noqa: F401  (registers all rules)
from pallas_sim.backends.sim.interpret.compiler import Compiler
from pallas_sim.backends.sim.interpret.rules import semaphores
from pallas_sim.backends.sim.machine.state import WARPS_PER_WARPGROUP
from pallas_sim.backends.sim.timing import occupancy
from pallas_sim.errors import LoweringTimeoutError, UnsupportedPrimitiveError


class Prepared:
  """What a kernel needs before it runs, once per trace."""
  __slots__ = ("jaxpr", "program", "smem", "barriers", "warps", "together", "sem_inputs",
               "serial_only", "regs", "variation", "load_axes", "sites", "compiling")


def axis_sizes(launch):
  """Axis name (a grid axis also by its dimension) -> its size: the bounds
  of the indices a kernel reads (block_classes.analyse)."""
  sizes = dict(zip(launch.cluster_names, launch.cluster))
  if launch.thread_name is not None and launch.num_threads:
    sizes[launch.thread_name] = launch.num_threads
  return sizes | dict(zip(launch.grid_names, launch.grid)) | dict(enumerate(launch.grid))


class Preparer:
  """Prepares launches for one Executor, each kernel jaxpr once."""

  def __init__(self, options, gpu, timing, shapes_only=False):
    self.options, self.gpu, self.timing = options, gpu, timing
    self.shapes_only = shapes_only  # ps.estimate was given shapes, not arrays
    self._prepared = {}
    self._lowered = {}

  def prepare(self, launch):
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
          "modelled (jax 0.11.2 cannot lower them for Mosaic GPU either); use "
          "plgpu.kernel with emit_pipeline", where=launch.where)
    jaxpr = launch.jaxpr
    extra = len(jaxpr.invars) - launch.num_inputs - launch.num_outputs
    if extra:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: {extra} kernel-level scratch operands "
          "(pallas_call scratch_shapes) are not modelled", where=launch.where)
    p = Prepared()
    p.jaxpr = jaxpr
    p.smem = resources.smem_bytes(jaxpr)
    if launch.profile is not None:  # (the profiler's buffer is in SMEM too)
      p.smem += launch.profile.smem_bytes(launch.num_threads)
    resources.check_smem(p.smem, self.gpu, where=launch.where)
    # Whether blocks' control flow differs (then estimate runs them all, and
    # the L2 model follows their loads: timing/model.py); per TMA load
    # site, the grid axes its address depends on (L2 reuse).
    found = block_classes.analyse(jaxpr, launch.grid_names, sizes=axis_sizes(launch))
    p.variation, axes = found
    # Control flow that reads data runs on the values the kernel computes:
    # an estimate given arrays computes them for such a kernel (so that it
    # takes the paths the full simulation takes).
    numerics = self.options.numerics or (
        p.variation is not None and p.variation[0] == block_classes.DATA
        and not self.shapes_only)
    # Without numerics, and with no control decision on data nor any
    # decision or address on float math, no value a float operation
    # computes can change a time: estimate skips them.
    p.compiling = dict(numerics=numerics, skip_float_values=(
        not numerics and not found.float_matters and (
            p.variation is None or p.variation[0] != block_classes.DATA)))
    cx = Compiler(self.timing, launch, self.options.max_cycles, **p.compiling)
    p.program = cx.compile(jaxpr)
    p.load_axes = {n: axes.get(k) for k, n in cx.sites.items()}
    p.sites = dict(cx.sites)
    p.barriers = resources.barrier_count(jaxpr)
    p.regs = occupancy.registers(jaxpr, launch.num_threads, self.gpu.register_base)
    names = resources.primitive_names(jaxpr)
    # Warps of a warp_map get clock components of their own.
    p.warps = WARPS_PER_WARPGROUP if "mpmd_map" in names else 0
    # Operands that are semaphores (plgpu.alloc_semaphore): global too.
    p.sem_inputs = frozenset(
        i for i, v in enumerate(jaxpr.invars[:launch.num_inputs])
        if semaphores.holds_semaphores(v.aval))
    # Blocks that can wait for each other (global semaphores) run together.
    p.together = "get_global" in names or bool(p.sem_inputs)
    # What must run in this process, in block order: printing (the order of
    # lines), inline MLIR (built through JAX's MLIR bindings), global
    # semaphores (one group anyway).
    p.serial_only = p.together or bool({"debug_print", "inline_mgpu"} & names)
    if p.together and launch.cluster and math.prod(launch.cluster) > 1:
      raise UnsupportedPrimitiveError(
          f"kernel {launch.name}: global semaphores (pl.get_global, "
          "plgpu.alloc_semaphore) in a kernel with clusters are not modelled",
          where=launch.where)
    self._prepared[key] = p
    return p

  def check_lowering(self, launch, lower, where=None):
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
      # it rejected came from: keep those frames last, as on the GPU.)
      where = where or err[1] or launch.where
      raise resources.lowering_error(err[0], where=where).with_traceback(
          locations.user_tail(err[0].__traceback__))
    self._lowered[key] = launch.jaxpr
