"""Errors raised by pallas-sim. Every one names the primitive (or argument) and,
where it comes from a kernel, the user's own file:line."""
from collections.abc import Iterable
from typing import Any, ClassVar, cast


class SimError(Exception):
  """Base class: something about the kernel prevents simulating it."""

  # Set only on the error a simulation raises: every error it found, in
  # order (this one first).
  errors: list[BaseException]

  def __init__(self, message: str, *, primitive: str | None = None,
               where: str | None = None) -> None:
    self.primitive = primitive
    self.where = where
    parts = []
    if where:
      parts.append(f"{where}: ")
    if primitive:
      parts.append(f"[{primitive}] ")
    parts.append(message)
    # (Exception's own: a LoweringError.of mixes in the lowering's class,
    # whose __init__ may rewrite the message, as JAX's VerificationError
    # prefixes its bug-report line)
    Exception.__init__(self, "".join(parts))

  def __str__(self) -> str:
    """The message, then the user's line of code it points at (as a
    traceback would show it), where the message is one line: a list of
    findings names each finding's lines itself, and a line of code after
    the list would read as part of its last."""
    text = super().__str__()
    if "\n" in text:
      return text
    code = _source_line(self.where)
    return f"{text}\n    {code}" if code and code not in text else text


def _source_line(where: str | None) -> str | None:
  if not where or ":" not in where:
    return None
  path, _, line = where.rpartition(":")
  if not line.isdigit():
    return None
  import linecache
  return linecache.getline(path, int(line)).strip() or None


class SimInternalError(SimError):
  """A bug in pallas-sim itself; the original exception is its __cause__."""


class UnsupportedPrimitiveError(SimError, NotImplementedError):
  """The kernel uses a primitive (or a form of one) the simulator does not model."""

  # True where the refusal is the simulator's own limit, not one the real
  # lowering shares: a kernel the lowering rejects as well then gets the
  # lowering's reason, which says more (the kernel cannot run on a GPU).
  unmodelled: bool = False


def not_modelled(message: str, **kw: Any) -> UnsupportedPrimitiveError:
  """An UnsupportedPrimitiveError for a form of a primitive the simulator
  does not model (see UnsupportedPrimitiveError.unmodelled)."""
  e = UnsupportedPrimitiveError(message, **kw)
  e.unmodelled = True
  return e


class KernelError(SimError):
  """The kernel does something the real hardware or lowering would reject or
  misbehave on: out-of-bounds access, wrong shapes, bad barrier use."""


class OutOfBoundsError(KernelError, IndexError):
  pass


class LoweringError(KernelError):
  """JAX's real Mosaic GPU lowering rejects the kernel (checked on the CPU for
  every kernel before it is simulated); carries the lowering's message. The
  instance raised is also of the lowering's own exception class (ValueError,
  NotImplementedError, jax's LoweringError...), so code that catches what the
  GPU backend raises catches it here too (`LoweringError.of`)."""

  # type(original) -> the LoweringError subclass that is also one
  _kinds: ClassVar[dict[type[BaseException], type["LoweringError"]]] = {}

  @classmethod
  def of(cls, original: BaseException, message: str, **kw: Any) -> "LoweringError":
    """A LoweringError that is also an instance of type(original)."""
    base = type(original)
    kind = cls._kinds.get(base)
    if kind is None:
      try:
        # (type() is typed as returning a plain type; this one subclasses cls)
        kind = cast(type[LoweringError],
                    type(cls.__name__, (cls, base), {"__module__": cls.__module__}))
      except TypeError:  # (a built-in layout that cannot be mixed in)
        kind = cls
      cls._kinds[base] = kind
    err = kind.__new__(kind)
    cls.__init__(err, message, **kw)
    return err


class LoweringTimeoutError(LoweringError, TimeoutError):
  """JAX's real Mosaic GPU lowering did not finish within
  Options.lowering_timeout_s; the message names the kernel, where the
  lowering was, and how to skip the check or wait longer."""


class ResourceError(KernelError):
  """A resource limit the real lowering enforces (shared memory, registers)."""


class SmemOverflowError(ResourceError, ValueError):
  """Shared memory over the limit. Carries the same numbers as the real lowering."""

  def __init__(self, message: str, *, smem_bytes: int, max_smem_bytes: int,
               **kw: Any) -> None:
    self.smem_bytes = smem_bytes
    self.max_smem_bytes = max_smem_bytes
    super().__init__(message, **kw)


class DeadlockError(SimError):
  """No thread can make progress: each blocked one is listed."""

  def __init__(self, message: str, *, blocked: Iterable[tuple[str, object, str]] = (),
               **kw: Any) -> None:
    self.blocked = list(blocked)
    super().__init__(message, **kw)


class RunawayKernelError(SimError):
  """A block ran past `max_cycles` simulated cycles (ps.Options): a loop that
  does not end, most likely; raised at the looping line."""


class RaceError(SimError):
  """Accesses not ordered by happens-before (which events order which
  accesses: backends/sim/checks/observer.py)."""

  # (checks/races.Race objects: this module lies below the backends and
  # cannot name them)
  def __init__(self, message: str, *, races: Iterable[Any] = (),
               **kw: Any) -> None:
    self.races = list(races)
    super().__init__(message, **kw)


class UninitializedError(SimError):
  """Reads of SMEM or output elements that nothing wrote before them, or
  output elements that no block wrote (like compute-sanitizer's initcheck);
  the findings are in `.findings`."""

  # (checks/initcheck.Uninitialized objects, unnamed here as races above)
  def __init__(self, message: str, *, findings: Iterable[Any] = (),
               **kw: Any) -> None:
    self.findings = list(findings)
    super().__init__(message, **kw)


class RaceWarning(UserWarning):
  """A race report, where races are only reported (pytest
  --pallas-sim-races report)."""


class EstimateWarning(UserWarning):
  """ps.estimate lacks values its kernel's control flow reads (inputs given
  as shapes): it names them and the decision's line."""


class OutOfBoundsWarning(UserWarning):
  """A TMA copy whose box lies wholly outside its array: legal (a load reads
  zeros, a store writes nothing), and almost always a wrong index_map or a
  grid longer than the array. Once per copy and kernel, at its line."""


class UninitializedWarning(UserWarning):
  """An uninitialized-memory finding, where findings are only reported
  (pytest --pallas-sim-uninitialized report)."""


class BackendError(RuntimeError):
  """The requested backend cannot run here (e.g. mosaic without a Hopper GPU)."""
