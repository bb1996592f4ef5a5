"""The JAX releases pallas-sim is tested with: the window, and its check.

The simulator reads JAX's internal kernel representation, which moves in
every release, so it supports the releases it is tested on, oldest to
newest (pyproject.toml declares the same bounds; tests/test_jax_window.py
keeps them equal, and tox.ini has an environment for each end). The check
runs before anything imports JAX's internals, so a release outside the
window gets this message instead of an AttributeError from deep inside.
"""
import importlib.metadata
import os
import re
import warnings

OLDEST = "0.11.2"
NEWEST = "0.12.1"
# Set to 1 to import pallas-sim beside an untested JAX anyway (a warning
# instead of the error): for trying a new release against the checklist in
# backends/sim/base/jax_internals.py.
UNTESTED_ENV = "PALLAS_SIM_UNTESTED_JAX"


class UnsupportedJaxError(ImportError):
  """The installed jax or jaxlib lies outside the tested window."""


def parse(version):
  """'0.12.0.1' -> (0, 12, 0, 1); suffixes (rc1, .dev2026...) are dropped."""
  m = re.match(r"\d+(?:\.\d+)*", version)
  if m is None:
    raise ValueError(f"not a version: {version!r}")
  return tuple(int(x) for x in m.group(0).split("."))


def _padded(v, n=4):
  return v + (0,) * (n - len(v))


def in_window(version):
  return _padded(parse(OLDEST)) <= _padded(parse(version)) <= _padded(parse(NEWEST))


def installed() -> dict[str, str | None]:
  """{'jax': version, 'jaxlib': version}, None for one not installed."""
  found: dict[str, str | None] = {}
  for name in ("jax", "jaxlib"):
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  return found


def problem(versions):
  """What is wrong with these versions ({'jax': ..., 'jaxlib': ...}), or None."""
  bad = [f"{name} {v}" if v else f"no {name}" for name, v in versions.items()
         if v is None or not in_window(v)]
  if not bad:
    return None
  return (f"pallas-sim supports jax and jaxlib {OLDEST} to {NEWEST} (each end is "
          f"tested); found {', '.join(bad)}. Install a release in the window: "
          f"pip install 'jax>={OLDEST},<={NEWEST}' 'jaxlib>={OLDEST},<={NEWEST}'. "
          f"(To try an untested release anyway, set {UNTESTED_ENV}=1.)")


def check(versions=None):
  """Raises UnsupportedJaxError for a JAX outside the window (a warning
  instead where UNTESTED_ENV is set and JAX is installed)."""
  versions = installed() if versions is None else versions
  msg = problem(versions)
  if msg is None:
    return
  if os.environ.get(UNTESTED_ENV) == "1" and all(versions.values()):
    warnings.warn(msg, stacklevel=3)
    return
  raise UnsupportedJaxError(msg)
