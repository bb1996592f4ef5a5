"""User function -> kernel launches. The one module that hooks into JAX.

How kernels reach the simulator (every release of the window): kernels traced while
`config.pallas_tpu_interpret_mode_context_manager` holds an InterpretGPUParams
carry `interpret=params`. Off a real Mosaic lowering, `_pallas_call_lowering`
then calls `interpret_pallas_call.interpret_pallas_call(*args, jaxpr=...,
grid_mapping=..., mesh=..., interpret_params=...)`, looked up at lowering time.
We wrap that function: for our own `SimParams` it lowers to one ordered
`io_callback` into the simulator, so plain `plgpu` code runs simulated under
`jax.jit` too; any other params go to JAX's own interpreter unchanged.
"""
import collections
import contextlib
import ctypes
import ctypes.util
import dataclasses
import logging
import os
import threading
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

import pallas_sim.errors as _errors
from pallas_sim.errors import SimError
from pallas_sim.backends.sim.base import jax_internals as jx
from pallas_sim.backends.sim.base.locations import (
    call_site, kernel_arg_names, kernel_location, lowering_location)
from pallas_sim.backends.sim.report import profiler
from pallas_sim.backends.sim.analysis import smem_swizzle, walker
from pallas_sim.backends.sim.machine import memory


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimParams(jx.interpret_params_module.InterpretGPUParams):
  """Marks kernels traced for the simulator. The interpret params are part of
  the jit cache key, so a function traced for one backend is re-traced for
  the other."""


SIM_PARAMS = SimParams()


@contextlib.contextmanager
def force_sim() -> Iterator[None]:
  """Context manager: kernels traced inside are routed to the simulator,
  their equations located where they are traced (jx.real_tracebacks)."""
  with jx.interpret_params_module.force_gpu_interpret_mode(SIM_PARAMS), \
      jx.real_tracebacks(), jx.kernel_effects_allowed():
    yield


@dataclasses.dataclass
class KernelLaunch:
  """Everything the simulator needs about one kernel launch."""
  name: str
  jaxpr: Any                    # the kernel body (jax.core.Jaxpr)
  grid: tuple[int, ...]
  grid_names: tuple[Any, ...]
  cluster: tuple[int, ...]
  cluster_names: tuple[Any, ...]
  num_threads: int
  thread_name: Any             # the axis name of the kernel's threads, or None
  num_inputs: int
  num_outputs: int
  out_avals: tuple[Any, ...]
  aliases: tuple[tuple[int, int], ...]  # (input index, output index) pairs
  block_mappings: tuple[Any, ...] = ()  # pallas_call BlockSpecs (grid_mapping), if any
  where: str = ""              # user file:line of the kernel body
  # Where the user's own code (not a library's) launched it, when the kernel
  # body lies outside the user's files (JAX's ops/gpu, an installed library)
  call_site: str = ""
  arg_names: tuple[str, ...] = ()  # the body's parameter names, where recoverable
  profile: profiler.Spec | None = None  # when compiler_params ask for a profile
  approx_math: bool = False     # CompilerParams(approx_math=True), for the timing model
  # CompilerParams(unsafe_no_auto_barriers=True), for the race checks
  no_auto_barriers: bool = False
  # allocation var -> the swizzle the lowering infers for an untransformed
  # wgmma operand (analysis/smem_swizzle.py): the rows its TMA loads move
  smem_swizzle: dict[Any, int] = dataclasses.field(default_factory=dict)
  # the layouts allocations are given where their refs do not carry them, by
  # equation and operand (analysis/given_layouts.py)
  given_layouts: dict[int, tuple] = dataclasses.field(default_factory=dict)
  # ps.estimate given shapes and walking the function (frontend/
  # shapes_only.py): the positions of inputs whose values it does not have
  # (given as shapes, or computed from them); zeros stand in for them. Every
  # other input holds its values (constants the function captured, arrays
  # given). None: not known (a launch traced through XLA).
  unknown_inputs: frozenset[int] | None = None
  # the real lowering's check of this kernel (prepare.check_lowering's
  # `lower`), when it was traced inside a simulation: a later simulation
  # that runs it from JAX's jit cache, untraced, checks it under its own options
  lower: Any = dataclasses.field(default=None, repr=False, compare=False)


# --- executing launches: the active executor receives them ----------------
# io_callbacks may run on an XLA runtime thread, so the active executor is
# process-wide (a stack), not thread-local: one simulation at a time.

_active: list[Any] = []  # executors (execute/executor.Executor), innermost last


def push_executor(ex: Any) -> None:
  _active.append(ex)


def pop_executor(ex: Any) -> None:
  _active.remove(ex)


def active_gpu() -> Any:
  """The GPU model of the simulation running now (an H100 outside one)."""
  from pallas_sim import gpus
  return _active[-1].gpu if _active else gpus.get("h100")


def _active_executor(launch: KernelLaunch) -> Any:
  if not _active:
    raise SimError(f"kernel {launch.name} was traced for the simulator but runs "
                   "outside ps.simulate / ps.backend('sim'): re-trace it there "
                   "(a jitted function keeps the backend it was traced for)",
                   where=launch.where)
  return _active[-1]


class LaunchFailed(Exception):
  """Raised out of the io_callback of a launch that failed, under
  Options.stop_at_error: the runtime raises it in the program (as a
  JaxRuntimeError) where the program next waits on JAX, and the API raises
  the launch's own error in its place (api._simulating)."""


class _QuietStop:
  """Drops JAX's log of a LaunchFailed (its traceback is ours, not news:
  the launch's error is raised in the program)."""

  @staticmethod
  def filter(record: Any) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, LaunchFailed)


logging.getLogger(jx.CALLBACK_LOGGER).addFilter(_QuietStop())


def execute(launch: KernelLaunch, *arrays: Any) -> tuple[np.ndarray, ...]:
  """Runs in the io_callback (or, for ps.estimate given shapes, straight
  from frontend/shapes_only.py). Errors are recorded for the API to raise;
  outputs are poison. Raises only under Options.stop_at_error (LaunchFailed),
  where the program is to stop: otherwise an exception escaping a callback
  leaves the runtime's ordered-effects token in error on a GPU, failing
  every later kernel."""
  poisoned = lambda: tuple(memory.poison(a.shape, a.dtype) for a in launch.out_avals)
  try:
    ex = _active_executor(launch)
  except SimError as e:
    warnings.warn(f"{e} Its outputs are poison (NaN / sentinel).", stacklevel=2)
    return poisoned()
  known = len(ex.errors)
  try:
    with _ieee_subnormals():
      out = tuple(ex.execute(launch, [np.asarray(a) for a in arrays]))
  except Exception as e:
    if launch.call_site and isinstance(e, SimError):  # (located in a library)
      e.add_note(f"kernel {launch.name} ({launch.where}) was called from "
                 f"{launch.call_site}")
    ex.record_error(e, launch)
    out = poisoned()
  if len(ex.errors) > known and ex.options.stop_at_error and ex.interrupted is None:
    ex.stopped = True
    raise LaunchFailed(f"kernel {launch.name} ({launch.where}) failed")
  return out


# XLA:CPU runs host callbacks on threads that flush subnormals to zero (x86's
# FTZ and DAZ bits): numpy there would too. A Hopper GPU keeps f32 subnormals
# (PTX without .ftz), so the simulation runs in the floating-point
# environment the main thread had when pallas-sim was imported.
_libm: ctypes.CDLL | None
try:
  _libm = ctypes.CDLL(ctypes.util.find_library("m"))
  _MAIN_FENV = ctypes.create_string_buffer(1024)  # (larger than any fenv_t)
  if _libm.fegetenv(_MAIN_FENV) != 0:
    _libm = None
except (OSError, AttributeError, TypeError):
  _libm = None


@contextlib.contextmanager
def _ieee_subnormals() -> Iterator[None]:
  if _libm is None:
    yield
    return
  saved = ctypes.create_string_buffer(1024)
  if _libm.fegetenv(saved) != 0 or _libm.fesetenv(_MAIN_FENV) != 0:
    yield  # (left as it is: restoring an unread environment would be worse)
    return
  try:
    yield
  finally:
    _libm.fesetenv(saved)


@contextlib.contextmanager
def force_real() -> Iterator[None]:
  """Context manager: kernels traced inside use the real lowering, with
  JAX's own tracebacks (inside force_sim too: jx.jax_user_context)."""
  # (None: no interpret mode, as JAX's own callers pass it)
  real = jx.interpret_params_module.force_gpu_interpret_mode(None)  # type: ignore[arg-type]
  with real, jx.jax_user_context():
    yield


def _mesh_info(mesh: Any, grid_mapping: Any) -> tuple[Any, ...]:
  if mesh is not None:
    nt = mesh.num_threads or 1
    return (tuple(mesh.grid), tuple(mesh.grid_names), tuple(mesh.cluster),
            tuple(mesh.cluster_names), nt, mesh.thread_name)
  grid = tuple(grid_mapping.grid)
  names = tuple(grid_mapping.grid_names or ())
  return grid, names, (), (), 1, None


def _mosaic_params(kw: dict[str, Any]) -> Any:
  """The kernel's plgpu.CompilerParams (passed alone or under "mosaic_gpu")."""
  params = kw.get("compiler_params")
  return params.get("mosaic_gpu") if isinstance(params, dict) else params


def lane_semantics(kw: dict[str, Any]) -> bool:
  """Whether the kernel asks for Lane lowering semantics, which infers no
  SMEM transforms (the default, Warpgroup, does: analysis/smem_swizzle.py)."""
  sem = getattr(_mosaic_params(kw), "lowering_semantics", None)
  return getattr(sem, "name", str(sem)).lower() == "lane"


def kernel_launch(args: Sequence[Any], *, jaxpr: Any, grid_mapping: Any, mesh: Any,
                  input_output_aliases: Any, out_avals: Sequence[Any],
                  name: str | None = None, unknown_inputs: frozenset[int] | None = None,
                  **kw: Any) -> KernelLaunch:
  """The KernelLaunch of one kernel given its operands (arrays, tracers or
  avals), checked as it is lowered: the static checks (shared memory,
  unsupported primitives) raise here, where an exception reaches the caller
  as it is. Ours first (they name the primitive and line), then the real
  lowering's, which has the final say. `grid_mapping` may be None for a
  kernel on a mesh (plgpu.kernel), whose operands are its inputs."""
  grid, grid_names, cluster, cluster_names, nt, thread_name = _mesh_info(
      mesh, grid_mapping)
  block_mappings = ()
  if mesh is None:
    block_mappings = tuple(grid_mapping.block_mappings)
  swizzles, given = smem_swizzle.infer(jaxpr, lane_semantics(kw))
  launch = KernelLaunch(
      name=name or "kernel", jaxpr=jaxpr, grid=grid, grid_names=grid_names,
      cluster=cluster, cluster_names=cluster_names, num_threads=nt,
      thread_name=thread_name,
      num_inputs=len(args) if grid_mapping is None else grid_mapping.num_inputs,
      num_outputs=len(out_avals) if grid_mapping is None else grid_mapping.num_outputs,
      out_avals=tuple(out_avals),
      aliases=tuple(input_output_aliases), block_mappings=block_mappings,
      where=kernel_location(jaxpr), arg_names=kernel_arg_names(jaxpr),
      call_site=call_site(jaxpr),
      profile=profiler.spec_of(kw.get("compiler_params")),
      approx_math=bool(getattr(_mosaic_params(kw), "approx_math", False)),
      no_auto_barriers=bool(getattr(_mosaic_params(kw), "unsafe_no_auto_barriers",
                                    False)),
      smem_swizzle=swizzles, given_layouts=given,
      unknown_inputs=unknown_inputs)
  if _active:
    lower = lambda timeout=None: lowering_error_once(
        args, timeout=timeout, jaxpr=jaxpr, grid_mapping=grid_mapping, mesh=mesh,
        input_output_aliases=input_output_aliases, out_avals=out_avals,
        name=name, **kw)
    launch.lower = lower
    try:
      _active[-1].prepare(launch)
    except _errors.UnsupportedPrimitiveError as e:
      # A primitive we have no rule for, in a kernel the GPU rejects too: the
      # GPU's reason (its lowering's error) says more than ours.
      if e.unmodelled:  # (at the equation's line: ours is exact)
        _active[-1].check_lowering(launch, lower, where=e.where)
      raise
    _active[-1].check_lowering(launch, lower)
  return launch


def is_sim_kernel(eqn: Any) -> bool:
  """Whether a jaxpr equation is a kernel traced for the simulator that
  equation_launch can launch: a pallas_call, or plgpu.kernel's mpmd_map on
  one mesh (several meshes, or external ones, the lowering refuses)."""
  if not isinstance(eqn.params.get("interpret"), SimParams):
    return False
  if eqn.primitive is jx.pallas_call.pallas_call_p:
    return True
  return (eqn.primitive is jx.mpmd.mpmd_map_p and len(eqn.params["jaxprs"]) == 1
          and not eqn.params["external_meshes"])


def equation_launch(eqn: Any, operands: Sequence[Any],
                    unknown_inputs: frozenset[int] = frozenset()) -> KernelLaunch:
  """kernel_launch for a kernel equation (is_sim_kernel) and its operands
  (`unknown_inputs`: KernelLaunch.unknown_inputs)."""
  p = dict(eqn.params)
  del p["interpret"]
  if eqn.primitive is jx.mpmd.mpmd_map_p:  # (as its lowering turns it into a
    # pallas_call on the mesh, whose operands are its inputs)
    [p["jaxpr"]], [p["mesh"]] = p.pop("jaxprs"), p.pop("meshes")
    p["input_output_aliases"] = tuple(p.pop("input_output_aliases").items())
    p["grid_mapping"] = None
    del p["external_meshes"]
  return kernel_launch(operands, unknown_inputs=unknown_inputs, **p)


def _sim_interpret_pallas_call(*args: Any, out_avals: Sequence[Any], **params: Any
                               ) -> list[Any]:
  launch = kernel_launch(args, out_avals=out_avals, **params)
  shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals)
  outs = jx.callback.io_callback(
      lambda *xs: execute(launch, *xs), shapes, *args, ordered=True)
  return list(outs)


# Kernels the real lowering accepted in this process, by a text of all it
# was given (lowering_key): a kernel run again (a debugging loop, or a
# property test's examples) is lowered once, not at every call (~80 ms).
# Only acceptances are kept: a rejection is raised afresh, at its own lines.
_LOWERED: collections.OrderedDict[Any, Any] = collections.OrderedDict()
_LOWERED_MAX = 512


def lowering_error_once(args: Sequence[Any], timeout: float | None = None, **params: Any
                        ) -> tuple[BaseException, str | None] | None:
  """real_lowering_error, or None at once for a kernel accepted before."""
  key = lowering_key(args, **params)
  if key in _LOWERED:
    _LOWERED.move_to_end(key)
    return None
  err = real_lowering_error(args, timeout=timeout, **params)
  if err is None:
    _LOWERED[key] = True
    if len(_LOWERED) > _LOWERED_MAX:
      _LOWERED.popitem(last=False)
  return err


def lowering_key(args: Sequence[Any], **params: Any) -> str:
  """Everything the real lowering sees, as text: the kernel's jaxprs (their
  printed form names every equation, its params and avals), the operands'
  shapes and dtypes, and every other parameter, field by field (a
  GridMapping's repr leaves out its index maps). A value printed with its
  address (a function) makes the key new at every call: a miss, never a
  false hit."""
  ops = tuple((tuple(a.shape), str(a.dtype)) for a in args)
  # and what outside the kernel steers the lowering: its flags, and the
  # SMEM bound that JAX's tests lower (jax.experimental.mosaic.gpu.core)
  from jax.experimental.mosaic.gpu import core as mgpu_core
  flags = sorted((k, v) for k, v in jax.config.values.items() if "mosaic" in k or "pallas" in k)
  env = repr((flags, getattr(mgpu_core, "_SMEM_SIZE_BOUND", None)))
  return (repr(ops) + "|" + env + "|"
          + "|".join(f"{k}={_as_text(v)}" for k, v in sorted(params.items())))


def _as_text(v: Any) -> str:
  if isinstance(v, jx.Jaxpr):
    return str(v)
  if dataclasses.is_dataclass(v) and not isinstance(v, type):
    fields = ",".join(f"{f.name}={_as_text(getattr(v, f.name))}"
                      for f in dataclasses.fields(v))
    return f"{type(v).__name__}({fields})"
  if isinstance(v, (tuple, list)):
    return "(" + ",".join(map(_as_text, v)) + ")"
  if isinstance(v, (dict, jx.FrozenDict)):
    return "{" + ",".join(f"{k!r}:{_as_text(x)}" for k, x in sorted(v.items(), key=repr)) + "}"
  return repr(v)


def real_lowering_error(args: Sequence[Any], *, jaxpr: Any, grid_mapping: Any, mesh: Any,
                        input_output_aliases: Any, out_avals: Sequence[Any], name: str,
                        timeout: float | None = None, **kw: Any
                        ) -> tuple[BaseException, str | None] | None:
  """Lowers the kernel with JAX's own Mosaic GPU lowering (the one a Hopper
  GPU runs; it needs no GPU: `jax.export` for platform "cuda"). Returns
  (the exception it raises, the user's file:line), or None when it lowers;
  past `timeout` seconds, (LoweringTimedOut, None). Lowering-time checks
  only: what fails later, in ptxas or at run time, shows only on a GPU."""
  if mesh is not None:  # plgpu.kernel / core_map: an mpmd_map
    fn = lambda *xs: jx.mpmd.mpmd_map_p.bind(
        *xs, meshes=(mesh,), jaxprs=(jaxpr,), external_meshes=(),
        out_avals=tuple(out_avals),
        input_output_aliases=jx.FrozenDict(dict(input_output_aliases)),
        interpret=False, name=name, **kw)
  else:
    fn = lambda *xs: jx.pallas_call.pallas_call_p.bind(
        *xs, jaxpr=jaxpr, grid_mapping=grid_mapping, mesh=None,
        input_output_aliases=input_output_aliases, out_avals=tuple(out_avals),
        interpret=False, name=name, **kw)
  jaxpr = _uninterpreted(jaxpr)
  if "compiler_params" in kw:
    kw["compiler_params"] = profiler.without_profiler(kw["compiler_params"])
  avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args]
  try:
    with _time_limit(timeout), force_real():
      jax.export.export(jax.jit(fn), platforms=["cuda"])(*avals)
  except LoweringTimedOut as e:
    return e, None
  except Exception as e:  # the lowering raises ValueError, NotImplementedError...
    if mesh is None and jx.pallas_call_lowering_missing(e):
      return NotImplementedError(
          f"{NO_PALLAS_CALL_LOWERING}, or pass check_lowering=False to simulate it "
          "anyway"), None
    return e, lowering_location(e)
  return None


# What a GPU would say of pl.pallas_call, in words: no release of the window
# registers a Mosaic GPU lowering for it.
NO_PALLAS_CALL_LOWERING = (
    f"pl.pallas_call has no Mosaic GPU lowering in jax {jax.__version__} (on a GPU it "
    "stops at a bare assertion in pallas_call.py's gpu_lowering): write the kernel with "
    "plgpu.kernel (grid= and grid_names= for its blocks, plgpu.emit_pipeline for what "
    "BlockSpecs did)")


class LoweringTimedOut(BaseException):
  """Raised inside the lowering when its time is up. A BaseException, so
  that the lowering's own `except Exception` blocks let it through."""

  def where(self) -> str | None:
    """Which pass of the lowering it was in: the outermost frame in Mosaic
    GPU's own passes (layout inference...), else the innermost in JAX."""
    jax_dir = os.sep + "jax" + os.sep
    frames = [f for f in traceback.extract_tb(self.__traceback__) if jax_dir in f.filename]
    passes = [f for f in frames if f"mosaic{os.sep}gpu{os.sep}" in f.filename
              and not f.filename.endswith(f"gpu{os.sep}core.py")]
    found = passes or frames[-1:]
    if not found:
      return None
    return f"{found[0].filename.rpartition(jax_dir)[2]}, {found[0].name}"


@contextlib.contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
  """Interrupts the Python code run inside after `seconds`: a timer thread
  raises LoweringTimedOut in this thread (CPython's asynchronous exception,
  delivered at its next bytecode). JAX's layout inference is Python, so
  its searches end there; a call stuck in C ends at its return."""
  if seconds is None:
    yield
    return
  ident = ctypes.c_ulong(threading.get_ident())
  lock, state = threading.Lock(), {"done": False, "fired": False}

  def fire() -> None:
    with lock:
      if not state["done"]:
        state["fired"] = True
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, ctypes.py_object(LoweringTimedOut))

  timer = threading.Timer(seconds, fire)
  timer.daemon = True
  timer.start()
  try:
    yield
  finally:
    with lock:
      state["done"] = True
    timer.cancel()
    if state["fired"]:  # (raised but not yet delivered: withdraw it)
      ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, None)


def _uninterpreted(jaxpr: Any) -> Any:
  """The kernel body as the GPU backend sees it: an mpmd_map nested in it
  (plgpu.warp_map) traced under the simulator carries our interpret params
  and their IO effect, which the real lowering would refuse."""
  ours = jx.pallas_core.get_interpret_effects(SIM_PARAMS)
  changed = False
  eqns = []
  for eqn in jaxpr.eqns:
    params = walker.replace_bodies(eqn.params, _uninterpreted)
    if isinstance(params.get("interpret"), SimParams):
      params = dict(params, interpret=False)
    if params is not eqn.params:
      changed = True
      eqn = eqn.replace(params=params, effects=eqn.effects - ours)
    eqns.append(eqn)
  return jaxpr.replace(eqns=eqns, effects=jaxpr.effects - ours) if changed else jaxpr


_orig_interpret = jx.interpret_pallas_call.interpret_pallas_call


def _dispatch(*args: Any, interpret_params: Any, **kw: Any) -> Any:
  if isinstance(interpret_params, SimParams):
    return _sim_interpret_pallas_call(*args, **kw)
  return _orig_interpret(*args, interpret_params=interpret_params, **kw)


jx.interpret_pallas_call.interpret_pallas_call = _dispatch


_orig_bind = jx.pallas_call.pallas_call_p.bind


def _bind_in_sim(*args: Any, **params: Any) -> Any:
  """pl.pallas_call takes its interpret mode when it builds the kernel's
  function, so one built before `ps.backend("sim")` was entered would run
  on a GPU, or fail on a CPU ("Only interpret mode is supported on CPU
  backend"), though called inside. It runs in the simulator, as one built
  inside does. (The real lowering's check binds under force_real.)"""
  if not params.get("interpret") and isinstance(jx.interpret_mode(), SimParams):
    params["interpret"] = SIM_PARAMS
  return _orig_bind(*args, **params)


jx.pallas_call.pallas_call_p.bind = _bind_in_sim  # type: ignore[method-assign]
