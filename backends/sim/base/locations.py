"""Where things are in the user's code: the file:line of a jaxpr equation,
of an exception from the real lowering, of a kernel's body and its call, and
which files are the user's own (not JAX's, pallas-sim's, an installed
library's or the standard library's)."""
import ast
import linecache
import os
import re
import site
import sys
import sysconfig
import traceback
import types
import warnings
from typing import Any

import jaxlib

import pallas_sim.backends as _backends
import pallas_sim.errors as _errors
from pallas_sim.backends.sim.base import jax_internals as jx

# Frames inside pallas-sim itself are never "the user's": the API's package
# and the backends' (a folder of their own in a checkout, pallas_sim/backends
# in a wheel).
_OUR_DIRS = tuple(sorted({os.path.dirname(os.path.abspath(str(m.__file__))) + os.sep
                          for m in (_errors, _backends)}))


_JAXLIB_DIR = os.path.dirname(os.path.abspath(jaxlib.__file__)) + os.sep


def eqn_location(eqn: Any) -> str | None:
  """The user's file:line that created a jaxpr equation, or None when its
  recorded traceback stops inside JAX (equations traced by JAX helpers such
  as emit_pipeline): the caller then uses the enclosing equation's."""
  tb = getattr(eqn.source_info, "traceback", None)
  for fr in jx.source_info_util.user_frames(tb):
    if not fr.file_name.startswith(_OUR_DIRS):
      return place(fr.file_name, fr.start_line)
  return None


def lowering_location(exc: BaseException) -> str | None:
  """The user's file:line an exception from the real lowering points at, or
  None: an MLIR verifier's error names the op it rejected, with that op's
  location (the equation being lowered when the verifier ran can be a later
  one); otherwise the cause carries the failing equation's traceback."""
  at = mlir_location(exc)
  if at:
    return at
  for e in (exc.__cause__, exc):
    frames = [f for f in traceback.extract_tb(getattr(e, "__traceback__", None))
              if jx.source_info_util.is_user_filename(f.filename)
              and not f.filename.startswith(_OUR_DIRS + (_JAXLIB_DIR,))]
    if frames:
      return place(frames[-1].filename, frames[-1].lineno)
  return None


def mlir_location(exc: BaseException) -> str | None:
  """The user's file:line of the MLIR op the lowering rejected, or None: an
  MLIR verifier's error names each op with its location; Mosaic GPU's
  passes after Pallas's raise while holding the op they check or lower,
  the innermost one of the traceback."""
  if isinstance(exc, jx.ir.MLIRError):
    return _user_location(str(exc))
  for op in reversed(jx.mosaic_ops_in_frames(exc.__traceback__)):
    at = _user_location(_location_text(op))
    if at:
      return at
  return None


def _location_text(op: Any) -> str:
  """An MLIR op's location as text ("" for an op already erased)."""
  try:
    return str(op.operation.location)
  except Exception:  # pylint: disable=broad-except
    return ""


def mosaic_op_name(exc: BaseException) -> str | None:
  """The primitive whose MLIR op a Mosaic GPU pass held when it raised
  `exc` (its location's name: "copy_gmem_to_smem", ...), or None."""
  ops = jx.mosaic_ops_in_frames(exc.__traceback__)
  m = _LOCATION_NAME.search(_location_text(ops[-1])) if ops else None
  return m.group(1) if m else None


# A name location's name: loc("copy_gmem_to_smem:"(...)) or loc("name"(...))
_LOCATION_NAME = re.compile(r'loc\("([A-Za-z_][\w.]*)')


def _user_location(text: str) -> str | None:
  """The first user file:line of the MLIR locations in `text`."""
  for path, line in _MLIR_LOCATION.findall(text):
    if _users(path):
      return place(path, line)
  return None


# An op's location in an MLIR diagnostic: ... "file.py":line:column ...
_MLIR_LOCATION = re.compile(r'"([^"]+\.py)":(\d+):\d+')


def _users(path: str) -> bool:
  return (jx.source_info_util.is_user_filename(path)
          and not path.startswith(_OUR_DIRS + (_JAXLIB_DIR,)))


def user_tail(tb: types.TracebackType | None) -> types.TracebackType | None:
  """The trailing frames of traceback `tb` outside JAX, jaxlib and
  pallas-sim (where the lowering's error points into the user's kernel:
  MLIR locations of the op it rejected) as a new traceback chain, or None."""
  tail: list[types.TracebackType] = []
  while tb is not None:
    name = tb.tb_frame.f_code.co_filename
    user = (jx.source_info_util.is_user_filename(name)
            and not name.startswith(_OUR_DIRS + (_JAXLIB_DIR,)))
    tail = tail + [tb] if user else []
    tb = tb.tb_next
  chain = None
  for t in reversed(tail):
    chain = types.TracebackType(chain, t.tb_frame, t.tb_lasti, t.tb_lineno)
  return chain


def _kernel_source(jaxpr: Any) -> tuple[str, int] | None:
  """(path, line) where the user's kernel body is defined, from the jaxpr's
  debug info (plgpu.kernel wraps the body; its scratch run_scoped traces the
  user's function), or None."""
  candidates = [jaxpr] + [e.params["jaxpr"] for e in jaxpr.eqns[:1]
                          if e.primitive.name == "run_scoped"]
  for j in candidates:
    src = getattr(getattr(j, "debug_info", None), "func_src_info", None) or ""
    _, _, loc = src.rpartition(" at ")
    path, _, line = loc.rpartition(":")
    if path and line.isdigit() and jx.source_info_util.is_user_filename(path) and (
        not path.startswith(_OUR_DIRS)):
      return path, int(line)
  return None


_LIBRARY_DIRS = tuple({
    os.path.abspath(p) + os.sep for p in
    site.getsitepackages() + [site.getusersitepackages(), sysconfig.get_path("purelib"),
                              sysconfig.get_path("platlib")] if p})


def is_own_file(path: str) -> bool:
  """Whether `path` is the user's own code: not JAX's, not pallas-sim's, not
  an installed library's (site-packages), not the standard library's."""
  path = os.path.abspath(path)
  return (jx.source_info_util.is_user_filename(path) and not path.startswith(_OUR_DIRS)
          and not path.startswith(_LIBRARY_DIRS))


def call_site(jaxpr: Any) -> str:
  """For a kernel whose body lies outside the user's own files: the user's
  innermost frame on the stack now (the kernel is traced from their call),
  as file:line; else ""."""
  src = _kernel_source(jaxpr)
  if src is None or is_own_file(src[0]):
    return ""
  f: types.FrameType | None = sys._getframe(1)  # pylint: disable=protected-access
  while f is not None:
    if is_own_file(f.f_code.co_filename):
      return place(f.f_code.co_filename, f.f_lineno)
    f = f.f_back
  return ""


def kernel_location(jaxpr: Any) -> str:
  src = _kernel_source(jaxpr)
  return f"{_short(src[0])}:{src[1]}" if src else "<unknown location>"


def kernel_arg_names(jaxpr: Any) -> tuple[str, ...]:
  """The kernel body's parameter names (a_gmem, o_ref, ...), read from its
  source, so that reports name buffers as the user does; () if unknown."""
  src = _kernel_source(jaxpr)
  return () if src is None else parameter_names_at(*src)


def parameter_names_at(path: str, line: int) -> tuple[str, ...]:
  """The parameter names of the function defined (or decorated) at
  path:line, as the file's text has them now; () if none is."""
  text = "".join(linecache.getlines(path))
  known = _ARG_NAMES.get(path)
  if known is None or known[0] != text:  # (parsed once per file's text: ~4 ms)
    known = _ARG_NAMES[path] = (text, _parameter_names(text))
  return known[1].get(line, ())


_ARG_NAMES: dict[str, tuple[str, dict[int, tuple[str, ...]]]] = {}  # source path -> (its text, {def or decorator line: parameter names})


def _parameter_names(text: str) -> dict[int, tuple[str, ...]]:
  try:
    tree = ast.parse(text)
  except SyntaxError:
    return {}
  names: dict[int, tuple[str, ...]] = {}
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      args = node.args
      for line in [node.lineno] + [d.lineno for d in node.decorator_list]:
        names.setdefault(line, tuple(a.arg for a in args.posonlyargs + args.args))
  return names


def place(path: str, line: int | None) -> str:
  """`file:line` as reports name a place: the path relative to the working
  directory where it lies below it."""
  return f"{_short(path)}:{line}"


def _short(path: str) -> str:
  try:
    rel = os.path.relpath(path)
  except ValueError:
    return path
  return rel if not rel.startswith("..") else path


_WARNED: dict[str, dict[Any, Any]] = {}  # (per file, as the warnings module keeps a module's)


def warn_at(warning: Warning, where: str | None) -> None:
  """Issues `warning` at the user's file:line `where` (a kernel's, or the
  line a finding names), not at the simulator's frame that found it: a
  simulation runs inside an XLA host callback, whose stack may not hold the
  user's code at all. Shown once per line and text, as warnings are."""
  m = re.match(r"(.+?):(\d+)(?::|$)", where or "")  # ("path:line", or "path:line: what")
  if m is None:
    warnings.warn(warning, stacklevel=2)
    return
  warnings.warn_explicit(warning, type(warning), m[1], int(m[2]),
                         registry=_WARNED.setdefault(m[1], {}))


def own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
  """Traceback `tb` with only the user's own frames (is_own_file) left, as a
  new chain, or None: what a test runner shows of an error the simulation
  raised, without the frames of JAX, pallas-sim and the context managers it
  came out of."""
  keep: list[types.TracebackType] = []
  while tb is not None:
    if is_own_file(tb.tb_frame.f_code.co_filename):
      keep.append(tb)
    tb = tb.tb_next
  chain = None
  for t in reversed(keep):
    chain = types.TracebackType(chain, t.tb_frame, t.tb_lasti, t.tb_lineno)
  return chain


def innermost_own(tb: types.TracebackType | None) -> str | None:
  """The file:line of the innermost of the user's own frames in `tb` (where
  their program was when the exception reached it), or None."""
  at = None
  while tb is not None:
    if is_own_file(tb.tb_frame.f_code.co_filename):
      at = place(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    tb = tb.tb_next
  return at
