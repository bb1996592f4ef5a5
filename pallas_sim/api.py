"""Public entry points: run, simulate, backend, kernel."""
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, TypeVar, overload

import jax

from pallas_sim.backends import mosaic
from pallas_sim.backends.sim.base import jax_internals as jx, locations
from pallas_sim.backends.sim.frontend import capture, device, shapes_only
from pallas_sim.backends.sim.execute.executor import Executor
from pallas_sim.backends.sim.report import Report
from pallas_sim.errors import BackendError, SimError, SimInternalError
from pallas_sim.options import ESTIMATING, Options, take

BACKENDS = ("sim", "mosaic", "auto")

_T = TypeVar("_T")


def resolve_backend(backend: str) -> str:
  if backend not in BACKENDS:
    raise ValueError(f"backend={backend!r}: choose one of {BACKENDS}")
  if backend == "auto":
    return "mosaic" if mosaic.hopper_device() is not None else "sim"
  return backend


@dataclasses.dataclass
class Simulation:
  outputs: Any  # what the user's function returned
  report: Report


def _wait(out: _T) -> _T:
  out = jax.block_until_ready(out)
  jax.effects_barrier()
  return out


@contextlib.contextmanager
def _simulating(options: Options, **executor_args: Any) -> Iterator[Executor]:
  """Routes kernels traced inside to a fresh Executor. Static errors (shared
  memory, unsupported primitives) raise while tracing; errors found while
  running (deadlocks, out-of-bounds accesses) are raised when the block ends,
  as the simulator's own exception with the user's file:line."""
  __tracebackhide__ = True  # pytest: show the user's frames, not ours
  ex = Executor(options, **executor_args)
  capture.push_executor(ex)
  try:
    try:
      with capture.force_sim(), device.simulated():
        yield ex
        jax.effects_barrier()
    except SimError as e:  # (a static check's, raised in the block)
      raise _fresh(e).with_traceback(locations.own_frames(e.__traceback__)) from None
    except Exception as e:
      # The user's code failed after a kernel did (e.g. a test's assertion
      # on its poison outputs): the kernel's error is the cause to show.
      if not ex.errors or ex.interrupted is not None:
        note = jx.bare_assertion_note(e)
        if note:
          e.add_note(note)
        raise
      err = _first_with_the_rest(ex.errors)
      if ex.stopped:  # (stop_at_error: the runtime raised the launch's failure here)
        at = locations.innermost_own(e.__traceback__)
        err.add_note("(the program stopped" + (f" at {at}" if at else "")
                     + ", where it next waited on JAX after the failed launch)")
        raise err.with_traceback(None) from None
      err.add_note(f"(the code around the simulated kernels then raised "
                   f"{type(e).__name__}: {str(e).strip()[:200]}; the failed "
                   "kernels' outputs were poison)")
      raise err.with_traceback(None) from e
    if ex.interrupted is not None:  # Ctrl-C while a kernel ran
      raise KeyboardInterrupt("pallas-sim: simulation interrupted; where each "
                              "thread was is printed above")
    if ex.errors:
      err = _first_with_the_rest(ex.errors)
      if isinstance(err, SimInternalError):  # a bug of ours: keep its cause
        raise err.with_traceback(None)
      if isinstance(err, SimError):
        raise err.with_traceback(None) from None
      raise err
  finally:
    capture.pop_executor(ex)


def _fresh(err: BaseException) -> BaseException:
  """The same error as a new object. contextlib gives an exception that a
  generator raises again its first traceback back (JAX's frames and ours,
  down to the static check that raised it); a new one carries only what it
  is given (the user's own frames of the first) and the frames it passes on
  its way out to the user's call."""
  try:
    new = type(err).__new__(type(err))
  except TypeError:  # (a base class whose __new__ wants its arguments: keep it)
    return err.with_traceback(None)
  new.__dict__.update(err.__dict__)
  new.args = err.args
  if getattr(err, "__notes__", None):
    new.__notes__ = jx.without_filter_notes(err.__notes__)
  return new


def _headline(err: BaseException) -> str:
  """An error's first line, as a sentence: a heading that introduces a list
  ("...: 2 findings in kernel k:") loses its colon."""
  return str(err).splitlines()[0].rstrip(":")


def _first_with_the_rest(errors: Sequence[BaseException]) -> BaseException:
  """The first error found while running, carrying the others: in `.errors`
  (all of them, in order) and in a note printed with its traceback."""
  first = errors[0]
  # (setattr: the first may be of any class, not only a SimError, which
  # declares the attribute)
  setattr(first, "errors", list(errors))
  if len(errors) > 1:
    more = "\n".join(f"  {type(e).__name__}: {_headline(e)} (.errors[{i}])"
                     for i, e in enumerate(errors[1:], 1))
    first.add_note(f"and {len(errors) - 1} more error(s) in this simulation:\n{more}")
  return first


def simulate(fn: Callable[..., Any], *args: Any, options: Options | None = None,
             **kwargs: Any) -> Simulation:
  """Runs `fn(*args, **kwargs)` with every Mosaic GPU kernel it launches
  simulated; returns a Simulation with `.outputs` and `.report`.

  Keyword arguments named like ps.Options fields (gpu, check_races,
  on_race, check_lowering, check_uninitialized, on_uninitialized,
  max_cycles) are options, applied over `options`; the rest go to fn. Races
  raise ps.RaceError unless on_race="report" (then they are in
  report.races); uninitialized reads and unwritten outputs likewise
  (ps.UninitializedError, on_uninitialized, report.uninitialized).
  check_lowering=False skips lowering each kernel with the real Mosaic GPU
  lowering first (then only the simulator's own checks reject kernels)."""
  opts = take(kwargs, options)
  with _simulating(opts, recipe=(fn, args, kwargs)) as ex:  # (what a Ray task runs again)
    out = _wait(fn(*args, **kwargs))
  return Simulation(out, ex.report)


def estimate(fn: Callable[..., Any], *args: Any, options: Options | None = None,
             **kwargs: Any) -> Report:
  """The predicted time of every kernel `fn(*args, **kwargs)` launches,
  without computing its values: returns the Report that ps.simulate would
  (report.time_s, report.summary()).

  `args` may be jax.ShapeDtypeStructs (zeros stand in for them) or arrays.
  The tensor cores' sums are skipped, and blocks whose work is the same are
  simulated once (backends/sim/blocks/block_classes.py): a kernel whose control
  flow depends on the block's index or on data runs every block, and its
  report says so (report.kernels[i].classes); where it depends on data and
  arrays were given, the values are computed too, so that blocks take the
  paths they take in ps.simulate. Races and uninitialized reads are not
  looked for; other options as for simulate (gpu="h100"/"h200")."""
  opts = dataclasses.replace(take(kwargs, options), **ESTIMATING)
  is_shape = lambda a: isinstance(a, jax.ShapeDtypeStruct)
  given_shapes = any(map(is_shape, jax.tree.leaves((args, kwargs))))
  with _simulating(opts, shapes_only=given_shapes) as ex:
    if given_shapes:  # (no XLA program: its kernels straight to the executor)
      try:
        _wait(shapes_only.run(fn, args, kwargs))
        return ex.report
      except shapes_only.NotWalked:
        pass  # (it needs values while traced: run on zeros)
    args, kwargs = jax.tree.map(
        lambda a: jax.numpy.zeros(a.shape, a.dtype) if is_shape(a) else a, (args, kwargs))
    _wait(fn(*args, **kwargs))
  return ex.report


def _run_mosaic(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
  dev = mosaic.require_hopper()
  with capture.force_real(), jax.default_device(dev):
    return _wait(fn(*args, **kwargs))


def run(fn: Callable[..., Any], *args: Any, backend: str = "auto",
        options: Options | None = None, **kwargs: Any) -> Any:
  """`fn(*args, **kwargs)` on the chosen backend; returns fn's outputs.
  Options as for simulate (ignored on the real backend)."""
  opts = take(kwargs, options)
  if resolve_backend(backend) == "mosaic":
    return _run_mosaic(fn, *args, **kwargs)
  return simulate(fn, *args, options=opts, **kwargs).outputs


# (the name, where it is written out, says whether a Report is yielded)
@overload
def backend(name: Literal["sim"] = "sim", options: Options | None = None,
            **option_kwargs: Any) -> contextlib.AbstractContextManager[Report]: ...
@overload
def backend(name: Literal["mosaic"], options: Options | None = None,
            **option_kwargs: Any) -> contextlib.AbstractContextManager[None]: ...
@overload
def backend(name: str, options: Options | None = None,
            **option_kwargs: Any) -> contextlib.AbstractContextManager[Report | None]: ...
# mypy compares each overload's context manager with the decorated
# implementation's, a _GeneratorContextManager[Report | None]: neither is a
# subtype of the other, though the body yields the Report for "sim" and None
# for "mosaic" as the overloads say.
@contextlib.contextmanager  # type: ignore[misc]
def backend(name: str = "sim", options: Options | None = None,
            **option_kwargs: Any) -> Iterator[Report | None]:
  """Inside, plain plgpu kernel calls run on the chosen backend. For "sim",
  yields the Report that the launches inside fill. Options as for simulate."""
  __tracebackhide__ = True
  opts = take(option_kwargs, options)
  if option_kwargs:
    raise TypeError(f"ps.backend: unknown option(s) {sorted(option_kwargs)}; "
                    f"options are the fields of ps.Options")
  if resolve_backend(name) == "mosaic":
    dev = mosaic.require_hopper()
    with capture.force_real(), jax.default_device(dev):
      yield None
    return
  with _simulating(opts) as ex:
    yield ex.report


@overload
def kernel(body: None = None, *, backend: str = "auto", options: Options | None = None,
           **kernel_kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
@overload
def kernel(body: Callable[..., Any], *, backend: str = "auto",
           options: Options | None = None, **kernel_kwargs: Any) -> Callable[..., Any]: ...
def kernel(body: Callable[..., Any] | None = None, *, backend: str = "auto",
           options: Options | None = None, **kernel_kwargs: Any) -> Callable[..., Any]:
  """Drop-in for `plgpu.kernel` that runs on the chosen backend; keyword
  arguments named like ps.Options fields are options, the rest plgpu.kernel's."""
  from jax.experimental.pallas import mosaic_gpu as plgpu
  if body is None:
    return functools.partial(kernel, backend=backend, options=options, **kernel_kwargs)
  opts = take(kernel_kwargs, options)
  if resolve_backend(backend) == "mosaic":
    mosaic.require_hopper()
  k = plgpu.kernel(body, **kernel_kwargs)

  @functools.wraps(body)
  def call(*args: Any) -> Any:
    return run(k, *args, backend=backend, options=opts)
  return call


__all__ = ["run", "simulate", "estimate", "backend", "kernel", "Simulation", "Options", "BackendError"]
