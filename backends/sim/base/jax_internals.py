"""Every JAX internal the simulator reads, in one module, and what differs
between the releases of the window (pallas_sim/jax_window.py).

The rest of the simulator imports JAX's private modules from here and
never spells a release: rules, the machine and timing see one API. A new
JAX release is a checklist:

1. Widen the window (jax_window.NEWEST, pyproject's bounds, tox.ini's
   newest environment) and run `tox -e jax-newest` (or `./dev test`).
2. Every name imported below must still exist with the meaning noted; a
   module moved or a class renamed gets a per-release branch here.
3. Primitives renamed since the oldest release: list the old name in
   RENAMED; rules register the newest name only (tests/test_jax_window.py).
4. New primitives: a rule, or a named rejection in interpret/rules/unsupported.py
   (test_jax_window checks that every primitive the installed release's
   Mosaic GPU lowering has a rule for has one or the other), and a test of
   its documented semantics (tests/test_plgpu_012.py for 0.12's).
5. Primitive parameters the rules read through `param` below must still be
   bound under their names (a renamed one raises, naming it).
6. The interpreter hook (frontend/capture.py): `interpret_pallas_call`'s keyword
   arguments, and InterpretGPUParams' fields (interpret_params below).
7. What the real lowering accepts may change (0.12 stores registers to GMEM
   through an optimised path that needs 4 bytes a thread): tests use kernels
   valid on both ends (conftest.store_unoptimized), or name the release they
   expect a rejection from (agreement/families.py STORE_16_BIT_REJECTED).

What each release needs (0.11.2 / 0.12.0.1 / 0.12.1):
- jax._src.core.Jaxpr: one class for open and closed jaxprs (consts
  attached). 0.11.2 also calls it ClosedJaxpr; 0.12 removed that alias.
- Primitive names: 0.12 dropped the "_p" that eight primitives carried in
  0.11.2 (RENAMED), and added plgpu.store ("store"), barrier_arrive_and_wait,
  the reductions mosaic_gpu_reduce_{sum,max,min,prod}, alloc_semaphore (a
  GMEM Ref made outside the kernel) and im2col_ref (a transform of a TMA
  load's source, Im2ColTransform). 0.12.1 adds get_barrier_semaphore (a
  device clique's semaphores: refused by name).
- InterpretGPUParams: 0.12 adds on_race ("raise" by default).
- Effects allowed in custom derivatives' forward functions: 0.12 adds the
  IO callbacks' (kernel_effects_allowed).
- Scratch layouts (SCRATCH_REFS_UNDO_TILING): up to 0.12.0.1 a tiled
  allocation's aval is its tiled layout and its refs carry the Untiling /
  Unswizzle transforms; from 0.12.1 the aval is logical and only
  run_scoped's `ref_transforms` hold its Tiling / Swizzle (a RefUnion's, one
  tuple a member). refview reads both; analysis/given_layouts.py carries
  the allocation's to the static checks.
- TMA's limits (TMA_DROPS_UNIT_DIMS): from 0.12.1 they apply once the
  dimensions where the GMEM array and the box are both 1 are dropped.
- Kernels writing inputs (KERNELS_WRITE_INPUT_ARRAYS): from 0.12.1 an input
  a kernel writes must be a Ref (jax.new_ref); an array is refused by JAX.
- Mosaic GPU's passes after Pallas's lowering (layout inference, the
  dialect's lowering) hold the op they check or lower in a local named `op`
  (mosaic_ops_in_frames): the same in all three.
- No Mosaic GPU lowering of pallas_call_p: pallas_call.py's gpu_lowering
  asserts that one is registered for plgpu.CompilerParams (none is; only
  mpmd_map_p, plgpu.kernel's, lowers) (pallas_call_lowering_missing): the
  same in all three.
- An exception raised in an io_callback is logged with its traceback on
  the logger of jax._src.callback (CALLBACK_LOGGER) before the runtime
  raises it in the program as a JaxRuntimeError: the same in all three.
- JAX's pipelines (pallas/mosaic_gpu/pipeline.py) allocate their SMEM slots
  and barriers in a run_scoped of their own, named by its keywords
  (PIPELINE_ALLOCATIONS, pipeline_allocation), called from a function local
  to emit_pipeline / emit_pipeline_warp_specialized: the same in all three.
- pl.pallas_call reads the interpret mode (force_gpu_interpret_mode's
  config, interpret_mode below) when it builds the kernel's function, not
  when that function is called: the same in all three.
- JAX's traceback filtering notes an exception whose frames it removed
  with traceback_util._simplified_tb_msg (without_filter_notes): the same
  in all three.
- The real lowering's state discharge re-traces a scoped body under
  source_info_util.user_context (jax_user_context): the same in all three.
- Unchanged in all three: interpret_pallas_call's signature; mpmd_map_p's
  and pallas_call_p's params; the Mosaic GPU core classes imported by name
  (transforms, barrier types, WarpMesh, TraceScope, RefType).
"""
import contextlib
import os
from collections.abc import Iterator
from typing import Any
import dataclasses

import jax
import jaxlib
import numpy as np

from pallas_sim import jax_window

jax_window.check()

# pylint: disable=g-import-not-at-top,unused-import
from jax._src import callback  # noqa: E402
from jax._src import config  # noqa: E402
from jax._src import core  # noqa: E402
from jax._src import debugging  # noqa: E402
from jax._src import dtypes  # noqa: E402
from jax._src import effects  # noqa: E402
from jax._src import lib  # noqa: E402
from jax._src import source_info_util  # noqa: E402
from jax._src import traceback_util  # noqa: E402
from jax._src.checkify import FailedCheckError  # noqa: E402
from jax._src.frozen_dict import FrozenDict  # noqa: E402
from jax._src.interpreters import mlir  # noqa: E402
from jax._src.lib.mlir import ir  # noqa: E402
from jax._src.lib.mlir.dialects import arith, func, memref  # noqa: E402
from jax._src.pallas import core as pallas_core  # noqa: E402
from jax._src.pallas import mpmd  # noqa: E402
from jax._src.pallas import pallas_call  # noqa: E402
from jax._src.pallas import primitives as pallas_primitives  # noqa: E402
from jax._src.pallas.mosaic_gpu import core as gpu_core  # noqa: E402
from jax._src.pallas.mosaic_gpu import lowering as gpu_lowering  # noqa: E402
# (the module whose emit_pipeline calls gpu_primitives' waits: what a profiled
# run scopes to time them, lab/rows_trace.py)
from jax._src.pallas.mosaic_gpu import pipeline as gpu_pipeline  # noqa: E402
from jax._src.pallas.mosaic_gpu import primitives as gpu_primitives  # noqa: E402
from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call  # noqa: E402
from jax._src.pallas.mosaic_gpu.interpret import params as interpret_params_module  # noqa: E402
from jax._src.state import indexing  # noqa: E402
from jax._src.state import types as state_types  # noqa: E402

JAX_VERSION = jax_window.parse(jax.__version__)
# Whether plgpu.kernel traces a kernel that writes an input passed as an
# array (the write stays inside the launch). From 0.12.1 JAX refuses it at
# trace time and asks for a Ref (jax.new_ref), which the launch updates in
# place.
KERNELS_WRITE_INPUT_ARRAYS = JAX_VERSION < (0, 12, 1)
# Whether a tiled scratch ref starts as its tiled layout, which the ref's
# own transforms undo (Untiling, Unswizzle), as up to 0.12.0.1; from 0.12.1
# it starts logical, and run_scoped's ref_transforms give the allocation's
# Tiling and Swizzle (GPUMemoryRef.get_ref_transforms).
SCRATCH_REFS_UNDO_TILING = not hasattr(gpu_core.GPUMemoryRef, "get_ref_transforms")
# Whether TMA's limits apply after dropping the dimensions where both the
# GMEM array and the box are 1 (launch_context._prepare_tma, from 0.12.1):
# a box (8, 1) of a (16, 1) array is then a copy of 8 contiguous elements.
TMA_DROPS_UNIT_DIMS = JAX_VERSION >= (0, 12, 1)
JAXLIB_VERSION = jax_window.parse(jaxlib.__version__)
# Where JAX logs an exception an io_callback raised (callback.io_callback_impl).
CALLBACK_LOGGER = "jax._src.callback"

# One class for open and closed jaxprs in every release of the window.
Jaxpr = core.Jaxpr

# plgpu.im2col_ref's transform (0.12; None before).
Im2ColTransform = getattr(gpu_core, "Im2ColTransform", None)

# 0.11.2's name -> the name 0.12 gave the same primitive. The simulator
# speaks the newer names (primitive_name); rules register those alone.
RENAMED = {
    "inline_mgpu_p": "inline_mgpu",
    "set_max_registers_p": "set_max_registers",
    "wgmma_accumulator_deref_p": "wgmma_accumulator_deref",
    "wgmma_accumulator_store_p": "wgmma_accumulator_store",
    "debug_barrier_p": "debug_barrier",
    "elementwise_inline_asm_p": "elementwise_inline_asm",
    "reduced_vary_cast_p": "reduced_vary_cast",
    "vary_unreduced_cast_p": "vary_unreduced_cast",
}


def reads_only(effects_of: Any) -> bool:
  """Whether a jaxpr's effects are all reads of refs (no writes, no other
  effect: it changes no memory and waits on nothing)."""
  return all(isinstance(e, state_types.ReadEffect) for e in effects_of)


def primitive_name(eqn: Any) -> str:
  """The name of an equation's primitive, as the newest release spells it."""
  name: str = eqn.primitive.name
  return RENAMED.get(name, name)


def param(eqn: Any, name: str) -> Any:
  """An equation's parameter that every release of the window binds (a
  default would hide one a new release renames): missing, it is named."""
  try:
    return eqn.params[name]
  except KeyError:
    from pallas_sim.errors import UnsupportedPrimitiveError
    raise UnsupportedPrimitiveError(
        f"{eqn.primitive.name} has no parameter {name!r} in jax {jax.__version__} "
        f"(it has {', '.join(sorted(eqn.params)) or 'none'}): a JAX release that "
        "renamed it, which pallas-sim does not know yet "
        "(backends/sim/base/jax_internals.py)") from None


def lowerable_primitive_names() -> set[str]:
  """The names of every primitive the Mosaic GPU lowering has a rule for,
  in any lowering semantics: what a kernel the GPU accepts may contain."""
  return {p.name for rules in gpu_lowering.mosaic_lowering_rules.values()
          for p in rules}


def _has_field(cls: Any, name: str) -> bool:
  return any(f.name == name for f in dataclasses.fields(cls))


def interpret_params(**kw: Any) -> Any:
  """JAX's own InterpretGPUParams. On releases whose interpreter raises on a
  race by default (on_race, 0.12), races are logged and counted instead,
  as 0.11.2 does: a comparison asks races_found, and a racy kernel is not
  one the interpreter "does not support"."""
  cls = interpret_params_module.InterpretGPUParams
  if _has_field(cls, "on_race"):
    kw.setdefault("on_race", "warn")
  return cls(**kw)


@contextlib.contextmanager
def kernel_effects_allowed() -> Iterator[None]:
  """Inside, simulated kernels pass where GPU kernels do. Traced for the
  simulator, a kernel carries interpret mode's ordered IO effect, which a
  kernel lowered for the GPU lacks, and which some transformations refuse:
  jax.checkpoint (remat_allowed_effects, every release) and, before 0.12, a
  custom_vjp with optimize_remat=True (tokamax's ops; 0.12's callback module
  adds the IO effects to custom_derivatives_allowed_effects). While kernels
  are traced for the simulator they are allowed there, and nowhere else: a
  rematerialized kernel runs again, as it does on the GPU."""
  added = []
  for allowed in (effects.custom_derivatives_allowed_effects,
                  effects.remat_allowed_effects):
    for t in (callback.IOEffect, callback.OrderedIOEffect):
      if not allowed.contains(t()):
        allowed.add_type(t)
        added.append((allowed, t))
  try:
    yield
  finally:
    for allowed, t in added:
      allowed._effect_types.discard(t)  # pylint: disable=protected-access


@contextlib.contextmanager
def real_tracebacks() -> Iterator[None]:
  """Equations traced inside keep the Python stack they were traced at.
  JAX's autodiff traces a backward pass (a custom_vjp's bwd, a transpose)
  under `user_context(<the forward call's traceback>)`, so every equation
  of a kernel traced there is located at the user's jax.grad line, and a
  report on, say, attention's backward kernels would name no line of the
  kernel. The simulator reads locations from these tracebacks (locations.
  eqn_location), so while it traces, user_context keeps its name stack and
  error notes but not its traceback."""
  cls = source_info_util.UserContextManager
  enter = cls.__enter__

  def enter_keeping_the_stack(self: Any) -> None:
    enter(self)
    ctx = source_info_util._source_info_context  # pylint: disable=protected-access
    # (SourceInfo.replace keeps a traceback it is given as None)
    ctx.context = source_info_util.SourceInfo(None, ctx.context.name_stack)

  cls.__enter__ = enter_keeping_the_stack  # type: ignore[method-assign]  # (restored below)
  try:
    yield
  finally:
    cls.__enter__ = enter  # type: ignore[method-assign]


def without_filter_notes(notes: list[str]) -> list[str]:
  """An exception's notes less the one JAX's traceback filtering adds ("...
  removed its internal frames from the traceback of the following
  exception"), which says nothing of a traceback rebuilt after it."""
  return [n for n in notes if traceback_util._simplified_tb_msg not in n]  # pylint: disable=protected-access


_JAX_USER_CONTEXT_ENTER = source_info_util.UserContextManager.__enter__


@contextlib.contextmanager
def jax_user_context() -> Iterator[None]:
  """JAX's own user_context again, inside real_tracebacks: the real
  lowering re-traces a kernel's scoped bodies (run_scoped's state
  discharge) under each equation's user_context, and places the MLIR ops,
  and so its errors, by the tracebacks that gives them."""
  cls = source_info_util.UserContextManager
  now = cls.__enter__
  cls.__enter__ = _JAX_USER_CONTEXT_ENTER  # type: ignore[method-assign]  # (restored below)
  try:
    yield
  finally:
    cls.__enter__ = now  # type: ignore[method-assign]


def checkify_failure(error: Any) -> BaseException | None:
  """A checkify Error (a pl.debug_check's, rebuilt from its leaves): the
  exception it holds if its check failed, else None. Its fields are
  private: one error code each, one check in a kernel's debug_check."""
  [pred] = error._pred.values()  # pylint: disable=protected-access
  if not bool(np.asarray(pred)):  # (check_p's predicate is "failed")
    return None
  [exc_tree] = error._metadata.values()  # pylint: disable=protected-access
  [payload] = error._payload.values()  # pylint: disable=protected-access
  exc: BaseException = jax.tree.unflatten(exc_tree, payload)
  return exc


def mosaic_ops_in_frames(tb: Any) -> list[Any]:
  """The MLIR ops Mosaic GPU's own passes held in the frames of traceback
  `tb` (a local named `op`), outermost first. Its dialect lowering lowers
  each op in `LoweringContext.lower_op`, and its layout inference checks
  them one by one: a rule or check raising there (a reduction's scratch too
  small, an assertion) names no op, and the innermost op's location is the
  user's line."""
  ops = []
  while tb is not None:
    frame = tb.tb_frame
    if _MOSAIC_GPU_DIR in frame.f_code.co_filename:
      op = frame.f_locals.get("op")
      if isinstance(op, (ir.OpView, ir.Operation)):
        ops.append(op)
    tb = tb.tb_next
  return ops


_MOSAIC_GPU_DIR = os.path.join("jax", "experimental", "mosaic", "gpu") + os.sep

# The keywords of the run_scoped in which JAX's pipelines allocate their SMEM
# slots and barriers (emit_pipeline's, then emit_pipeline_warp_specialized's).
PIPELINE_ALLOCATIONS = frozenset((
    "in_smem_refs", "out_smem_refs", "barrier_ref", "flat_in_smem_refs",
    "flat_out_smem_refs", "flat_produced_barrier_refs", "flat_consumed_barrier_refs"))
_PIPELINE_FILE = os.path.join("jax", "_src", "pallas", "mosaic_gpu", "pipeline.py")
_RUN_SCOPED_FILE = os.path.join("jax", "_src", "pallas", "primitives.py")


def pipeline_allocation(eqn: Any, name: str) -> str | None:
  """For an allocation `name` (a keyword with its pytree path, e.g.
  "flat_in_smem_refs[0]") of run_scoped `eqn`: whose it is, when JAX's
  pipeline made the scope ("emit_pipeline_warp_specialized"), else None.
  Reports name such buffers: the user never wrote them."""
  tb = getattr(eqn.source_info, "traceback", None)
  if name.split("[", 1)[0] not in PIPELINE_ALLOCATIONS or tb is None:
    return None
  frames = list(tb.frames)
  for inner, outer in zip(frames, frames[1:]):
    if inner.file_name.endswith(_RUN_SCOPED_FILE) and inner.function_name == "run_scoped":
      if not outer.file_name.endswith(_PIPELINE_FILE):
        return None
      return str(outer.function_name).split(".<locals>", 1)[0]
  return None


def _innermost(exc: BaseException) -> Any:
  """The last entry of an exception's traceback (where it was raised), or None."""
  tb, last = exc.__traceback__, None
  while tb is not None:
    last, tb = tb, tb.tb_next
  return last


def raised_at(exc: BaseException) -> str:
  """Where in JAX an exception was raised: its innermost frame, as
  `path-inside-jax:line (function)`."""
  last = _innermost(exc)
  if last is None:
    return "an unknown place"
  code = last.tb_frame.f_code
  path = code.co_filename
  cut = path.rfind(os.sep + "jax" + os.sep)
  return f"{path[cut + 1:] if cut >= 0 else path}:{last.tb_lineno} ({code.co_name})"


def bare_assertion_note(exc: BaseException) -> str | None:
  """For an assertion with no message that JAX raised (a check of its own
  while it traced a kernel: a tiling that does not divide a block's shape),
  a note naming where and the line that failed; None for any other."""
  last = _innermost(exc)
  if not isinstance(exc, AssertionError) or str(exc) or last is None:
    return None
  path = last.tb_frame.f_code.co_filename
  if os.sep + "jax" + os.sep not in path:
    return None
  import linecache
  line = linecache.getline(path, last.tb_lineno).strip()
  return (f"(JAX's own check failed with no message, at {raised_at(exc)}"
          + (f": `{line}`" if line else "")
          + "; JAX does the same on a GPU)")


def interpret_mode() -> Any:
  """The interpret params force_gpu_interpret_mode set for this thread, or
  None (JAX's config holds them under its TPU name)."""
  return config.pallas_tpu_interpret_mode_context_manager.value


def pallas_call_lowering_missing(exc: BaseException) -> bool:
  """Whether `exc` is the bare assertion pallas_call.py's gpu_lowering
  raises when no lowering is registered for the kernel's compiler params."""
  last = _innermost(exc)
  return (isinstance(exc, AssertionError) and last is not None
          and last.tb_frame.f_code.co_name == "gpu_lowering"
          and last.tb_frame.f_code.co_filename.endswith(
              os.path.join("pallas", "pallas_call.py")))
