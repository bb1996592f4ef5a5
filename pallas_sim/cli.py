"""`pallas-sim` command.

    pallas-sim run FILE [ARGS...]   run a script as `python FILE ARGS...` would,
                                    with every kernel simulated; print the
                                    report of the launches it simulated. A
                                    launch that fails (a deadlock, a runaway
                                    loop) stops the script where it next
                                    waits on JAX; exit 1
    pallas-sim estimate FILE [ARGS...]
                                    the same with every kernel estimated as
                                    ps.estimate does: times in seconds, not
                                    minutes, but no values (the tensor cores'
                                    sums are skipped) and no checks
    pallas-sim check TARGET [ARGS...]
                                    run TARGET's declared entry points with
                                    race and uninitialized-memory checks;
                                    exit 1 on any race, uninitialized read,
                                    unwritten output, deadlock or simulator
                                    error (--uninitialized report: print
                                    those findings but pass)

TARGET is a .py file or an importable module. Its entry points, each run on
its own in the simulator, are, in order of precedence:
  1. the zero-argument callables listed in a module-level `PALLAS_SIM_CHECKS`;
  2. otherwise its module-level functions named `check_*` (taking no
     arguments);
  3. otherwise the file itself, run as __main__ (once: a file whose text
     declares neither is not imported first).
A file sees sys.argv as `python FILE ARGS...` gives it, at its import too.
The GPU model is the H100's unless --gpu says otherwise.
"""
import argparse
import importlib
import importlib.util
import inspect
import os
import runpy
import sys
import traceback

from pallas_sim import gpus
from pallas_sim.options import ESTIMATING


def _load(target):
  if target.endswith(".py") or os.path.sep in target:
    path = os.path.abspath(target)
    name = os.path.splitext(os.path.basename(path))[0]
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
      raise ImportError(f"pallas-sim: cannot load {path} as a module (Python "
                        "found no loader for it)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod, path
  mod = importlib.import_module(target)
  return mod, getattr(mod, "__file__", None)


def _source_of(target):
  """TARGET's source file, without running it (None where none is found)."""
  if target.endswith(".py") or os.path.sep in target:
    return os.path.abspath(target)
  try:
    spec = importlib.util.find_spec(target)
  except (ImportError, ValueError):
    return None
  origin = spec.origin if spec else None
  return origin if origin and origin.endswith(".py") else None


def declares_entry_points(path):
  """Whether the file at `path` defines, at its top level, a
  PALLAS_SIM_CHECKS or a check_* function (read from its text: a script
  that declares neither is run once, as __main__, not imported first).
  True where the text cannot be read or parsed (import it and see)."""
  import ast
  try:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read(), path)
  except (OSError, SyntaxError, ValueError):
    return True
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
        node.name.startswith("check_"):
      return True
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
    if any(isinstance(t, ast.Name) and t.id == "PALLAS_SIM_CHECKS" for t in targets):
      return True
    if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
        (a.asname or a.name) in ("PALLAS_SIM_CHECKS", "*") or
        (a.asname or a.name).startswith("check_") for a in node.names):
      return True
  return False


def entry_points(mod):
  """The (name, callable) pairs `check` runs for a module (see __doc__)."""
  declared = getattr(mod, "PALLAS_SIM_CHECKS", None)
  if declared is not None:
    return [(getattr(f, "__name__", repr(f)), f) for f in declared]
  return [(n, f) for n, f in vars(mod).items()
          if n.startswith("check_") and inspect.isfunction(f)
          and f.__module__ == mod.__name__]


class _Argv:
  """sys.argv as `python FILE ARGS...` gives it to FILE, for a while."""

  def __init__(self, path, args):
    self.argv = [path or ""] + list(args)

  def __enter__(self):
    self.saved, sys.argv = sys.argv, self.argv

  def __exit__(self, *exc):
    sys.argv = self.saved


def check(target, gpu="h100", out=sys.stdout, uninitialized="fail", args=(),
          max_cycles=None):
  """Runs TARGET's entry points simulated; returns the number that failed.
  uninitialized="report": uninitialized-memory findings are printed, not
  failures. `args`: the file's own arguments (its sys.argv[1:])."""
  import pallas_sim as ps
  opts = ps.Options(gpu=gpu, on_race="report", on_uninitialized="report",
                    **_cycles(max_cycles))
  strict = uninitialized == "fail"
  argv = _Argv(os.path.abspath(target) if target.endswith(".py") else target, args)
  path = _source_of(target)
  import_failed, points = False, []
  if path is None or declares_entry_points(path):
    try:  # kernels run at import time are checked too
      with ps.backend("sim", options=opts) as report, argv:
        mod, path = _load(target)
    except Exception as e:
      print(f"FAIL import of {target}: {type(e).__name__}: {e}", file=out)
      return 1
    import_failed = _print_findings(f"import of {target}", report, out, strict)
    points = entry_points(mod)
  else:  # a plain script: its run as __main__ is its import
    sys.path.insert(0, os.path.dirname(path))  # as `python FILE` does
  failed = 0
  if not points:
    def as_main():
      try:
        with _Argv(path, args):
          runpy.run_path(path, run_name="__main__")
      except SystemExit as e:  # a script's own exit status counts
        if e.code not in (0, None):
          raise RuntimeError(f"{path} exited with status {e.code}") from None
    points = [("__main__", as_main)]
  for name, fn in points:
    try:
      with ps.backend("sim", options=opts) as report:
        fn()
    except ps.SimError as e:
      failed += 1
      print(f"FAIL {name}: {type(e).__name__}: {e}", file=out)
      continue
    except Exception:
      failed += 1
      print(f"FAIL {name}: raised\n{traceback.format_exc()}", file=out)
      continue
    if _print_findings(name, report, out, strict):
      failed += 1
    else:
      print(f"ok   {name}: {len(report.kernels)} kernel launch(es), no races"
            + ("" if report.uninitialized else ", no uninitialized memory"), file=out)
  print(f"{len(points) - failed} passed, {failed} failed"
        + (", and the import itself failed" if import_failed else ""), file=out)
  return failed + import_failed


def _print_findings(name, report, out, strict):
  """Prints the races and uninitialized-memory findings of `report`; returns
  whether they fail `name`."""
  fails = any(not r.library for r in report.races) or (
      strict and bool(report.uninitialized))
  parts = [f"{n} {what}" for n, what in (
      (len(report.races), "race(s)"),
      (len(report.uninitialized), "uninitialized-memory finding(s)")) if n]
  if parts:
    print(f"{'FAIL' if fails else 'note'} {name}: {', '.join(parts)}", file=out)
  for r in report.races + report.uninitialized:
    kernel = getattr(r, "kernel", "")  # (a race names its lines; an output, its kernel)
    print("  " + (f"in kernel {kernel}: " if kernel else "")
          + str(r).replace("\n", "\n  "), file=out)
  return fails


def _cycles(max_cycles):
  return {} if max_cycles is None else {"max_cycles": max_cycles}


def _add_max_cycles(p):
  p.add_argument("--max-cycles", type=float, default=None,
                 help="stop a block that runs past this many simulated cycles (a loop "
                      "that does not end), with its line (default 2**32)")


def main(argv=None):
  ap = argparse.ArgumentParser(prog="pallas-sim", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  for cmd, what in (("run", "run a script with its kernels simulated"),
                    ("estimate", "run a script with its kernels' times estimated, "
                                 "not their values")):
    r = sub.add_parser(cmd, help=what)
    r.add_argument("file")
    r.add_argument("--gpu", default="h100", choices=gpus.NAMES,
                   help="the GPU model (default h100)")
    r.add_argument("--trace", help="write a Chrome trace of the kernels here")
    r.add_argument("--clock-mhz", type=float, default=None,
                   help="predict times with the SMs at this clock (e.g. what nvidia-smi "
                        "shows at the power limit; default: each unit at its measured one)")
    _add_max_cycles(r)
    r.add_argument("args", nargs=argparse.REMAINDER)
  c = sub.add_parser("check", help="check a file's or module's entry points for races")
  c.add_argument("target")
  c.add_argument("--gpu", default="h100", choices=gpus.NAMES,
                 help="the GPU model (default h100)")
  c.add_argument("--uninitialized", default="fail", choices=("fail", "report"),
                 help="uninitialized reads and unwritten outputs fail the check "
                      "(default) or are only reported")
  _add_max_cycles(c)
  c.add_argument("args", nargs=argparse.REMAINDER,
                 help="the file's own arguments (its sys.argv[1:])")
  ns = ap.parse_args(argv)
  if ns.cmd == "check":
    return 1 if check(ns.target, ns.gpu, uninitialized=ns.uninitialized,
                      args=ns.args, max_cycles=ns.max_cycles) else 0
  return run(ns)


def run(ns):
  """`pallas-sim run` and `pallas-sim estimate` (ns.cmd): the script as
  __main__ under the simulator; the report; what the simulation found."""
  import pallas_sim as ps
  me = f"pallas-sim {ns.cmd}"
  if not os.path.isfile(ns.file):
    print(f"{me}: no such file: {ns.file}", file=sys.stderr)
    return 2
  sys.path.insert(0, os.path.dirname(os.path.abspath(ns.file)))  # as `python FILE` does
  status, found = 0, None
  estimating = ESTIMATING if ns.cmd == "estimate" else {}
  try:
    with ps.backend("sim", gpu=ns.gpu, clock_mhz=ns.clock_mhz, stop_at_error=True,
                    **estimating, **_cycles(ns.max_cycles)) as report, \
        _Argv(ns.file, ns.args):
      try:
        runpy.run_path(ns.file, run_name="__main__")
      except SystemExit as e:  # the script's own exit: report first, then its status
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if isinstance(e.code, str):
          print(e.code, file=sys.stderr)
  except ps.SimError as e:
    # (what the simulation found, raised as the block ends: said as the
    # report says it, after the report, with no traceback of ours)
    found, status = e, 1
  # (a script that runs its own ps.simulate reports those itself: only the
  # launches this backend simulated are ours to report)
  if report.kernels or report.failed:
    print(report.summary())
    if estimating:
      print(f"{me}: the kernels' outputs were not computed (one block of each kind "
            "ran, without the tensor cores' sums): what the script did with them "
            "means nothing; `pallas-sim run` computes them and checks for races",
            file=sys.stderr)
  elif found is None:
    print(f"{me}: no kernel launch outside the script's own simulations",
          file=sys.stderr)
  if ns.trace and report.kernels:
    report.save_trace(ns.trace)
    print(f"trace written to {ns.trace}")
  if found is not None:
    text = str(found)
    if isinstance(found, (ps.RaceError, ps.UninitializedError)) and report.kernels:
      text = text.splitlines()[0].rstrip(":") + " (in the report above)"  # (listed there)
    notes = "".join("\n" + n for n in getattr(found, "__notes__", ()))
    print(f"{me}: {type(found).__name__}: {text}{notes}", file=sys.stderr)
  return status


if __name__ == "__main__":
  sys.exit(main())
