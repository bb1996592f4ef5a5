"""What a refactor of the simulator must not change: runs test files with
every ps.simulate and ps.estimate call recorded (outputs, as a hash of their
bytes; race reports, in order, as text; uninitialized-memory findings;
each kernel's report without its wall time, predicted times included;
errors) and writes them as JSON, or compares them with an earlier run.

    ./dev python -m lab.snapshot --out before.json
    ./dev python -m lab.snapshot --compare before.json   # after the change
        [--moved OLD.py=NEW.py ...] [--lines-moved-in tests/x.py ...]

Default files: the race tests, the agreement suite's CI profile, the examples,
the semantics, quickstart, estimate, timing-model and production-kernel tests.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ["tests/test_races.py", "tests/test_races_jax_scenarios.py",
         "tests/agreement/test_agreement.py", "tests/test_examples.py",
         "tests/test_semantics.py", "tests/test_quickstart.py", "tests/test_estimate.py",
         "tests/test_timing_model.py", "tests/test_production_kernels.py"]


def kernels(report):
  """Each kernel's summary with the wall time (which varies) left out."""
  return [re.sub(r"; simulated in [0-9.]+ s( on \d+ processes)?", "", k.summary())
          for k in report.kernels]


class Recorder:
  """A pytest plugin: wraps pallas_sim.simulate for each test."""

  def __init__(self):
    self.calls = {}
    self.current = None

  @pytest.hookimpl(wrapper=True)
  def pytest_runtest_call(self, item):
    import pallas_sim as ps
    from pallas_sim import api
    self.current = item.nodeid
    orig, orig_estimate = api.simulate, api.estimate
    rec = self

    def recorded(call, *args, **kwargs):
      entry = {}
      rec.calls.setdefault(rec.current, []).append(entry)
      try:
        return call(entry, *args, **kwargs)
      except Exception as e:
        entry["error"] = f"{type(e).__name__}: {e}"
        raise

    def simulate_into(entry, *args, **kwargs):
      sim = orig(*args, **kwargs)
      import jax
      entry["outputs"] = [hashlib.sha1(np.ascontiguousarray(np.asarray(x)).tobytes()).hexdigest()
                          for x in jax.tree.leaves(sim.outputs)]
      entry["races"] = [str(r) for r in sim.report.races]
      entry["uninitialized"] = [str(u) for u in sim.report.uninitialized]
      entry["kernels"] = kernels(sim.report)
      return sim

    def estimate_into(entry, *args, **kwargs):
      report = orig_estimate(*args, **kwargs)
      entry["estimate"] = kernels(report)
      return report

    api.simulate = ps.simulate = lambda *a, **k: recorded(simulate_into, *a, **k)
    api.estimate = ps.estimate = lambda *a, **k: recorded(estimate_into, *a, **k)
    try:
      return (yield)
    finally:
      api.simulate = ps.simulate = orig
      api.estimate = ps.estimate = orig_estimate


def _normaliser(moved, shifted):
  """A test's recorded calls as text, with moved files named by their new
  path and the line numbers of files whose lines shifted left out."""
  moves = [m.split("=", 1) for m in moved]
  pat = re.compile("(" + "|".join(re.escape(f) for f in shifted) + r"):\d+") if shifted else None

  def same(calls):
    text = json.dumps(calls, sort_keys=True)
    for old, new in moves:
      text = text.replace(old, new)
    return pat.sub(r"\1:N", text) if pat else text
  return same


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out")
  ap.add_argument("--compare")
  ap.add_argument("--moved", nargs="*", default=[], metavar="OLD=NEW",
                  help="with --compare: a source file that moved (reports name it)")
  ap.add_argument("--lines-moved-in", nargs="*", default=[], metavar="FILE",
                  help="with --compare: files whose lines shifted (comments, imports): "
                       "their file:line in reports compares without the line")
  ap.add_argument("files", nargs="*", default=FILES)
  ap.add_argument("--one", help=argparse.SUPPRESS)  # (one file, in this process)
  args = ap.parse_args(argv)
  os.chdir(ROOT)
  if args.one:
    rec = Recorder()
    rc = pytest.main(["-q", "-p", "no:cacheprovider", args.one], plugins=[rec])
    with open(args.out, "w") as f:
      json.dump(dict(calls=rec.calls, rc=int(rc)), f)
    return 0
  # Each file in a process of its own: hypothesis draws its examples alike
  # only when the tests before it in the session are the same.
  calls, rcs = {}, []
  with tempfile.TemporaryDirectory() as tmp:
    for i, path in enumerate(args.files):
      out = os.path.join(tmp, f"{i}.json")
      subprocess.run([sys.executable, "-m", "lab.snapshot", "--one", path, "--out", out],
                     check=True)
      with open(out) as f:
        got = json.load(f)
      calls.update(got["calls"])
      rcs.append(got["rc"])
  rc = max(rcs)
  n = sum(len(v) for v in calls.values())
  print(f"{len(calls)} tests, {n} simulations recorded (pytest exit {rc})")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(calls, f, indent=1, sort_keys=True)
  if args.compare:
    with open(args.compare) as f:
      before = json.load(f)
    keys = sorted(set(before) | set(calls))
    exact = [k for k in keys if before.get(k) != calls.get(k)]
    same = _normaliser(args.moved, args.lines_moved_in)
    diffs = [k for k in exact if same(before.get(k)) != same(calls.get(k))]
    if len(exact) > len(diffs):
      print(f"{len(exact) - len(diffs)} tests differ only by moved files or shifted lines "
            f"({', '.join(args.moved + args.lines_moved_in)})")
    for k in diffs[:20]:
      print(f"DIFFERS: {k}\n  before: {json.dumps(before.get(k))[:600]}\n  after:  "
            f"{json.dumps(calls.get(k))[:600]}")
    races = sum(len(e.get("races", [])) for v in calls.values() for e in v)
    print(f"{len(diffs)} of {len(set(before) | set(calls))} tests differ "
          f"(outputs, race reports in order, errors); {races} race reports compared")
    return 1 if diffs or rc else 0
  return rc


if __name__ == "__main__":
  sys.exit(main())
