"""JAX's own Mosaic GPU test suite as a measuring stick: which of its tests
pass in the simulator (every kernel inside pallas_sim.backend("sim"), on a
CPU told it is an sm_90a CUDA device), against which pass natively on a
Hopper GPU. The test file is extracted from a jax-ml/jax checkout at run
time and never committed.

    # extract (a git checkout, bare or not; the newest mirrored revision by default)
    ./dev python benchmarks/jax_suite.py extract --jax-repo /path/to/jax [--rev REV]
    # run: in the simulator (default) or natively (--native, on the GPU machine)
    ./dev python benchmarks/jax_suite.py run [--native] [-n 8] [-k EXPR] --out DIR
    # compare the two runs' results.json
    ./dev python benchmarks/jax_suite.py compare NATIVE.json SIM.json

Runs go through pytest (with pytest-xdist's -n where given); races and
uninitialized memory are reported (warnings), not failures, so that a test
passes when its values do; `--strict` makes them fail as `pytest
--pallas-sim` does by default.
"""
import argparse
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORK = os.path.join(ROOT, "build", "jax_suite")  # (ignored by git)
TEST = os.path.join(WORK, "mosaic_gpu_test.py")

# Every run: each result as it comes (a run cut short keeps what it did),
# and a time limit per test (SIGALRM: inside a simulation the exception is
# recorded and raised when the test's kernel call returns).
COMMON = '''
import json, os, signal
import pytest

class SuiteTimeout(Exception):
  pass

def _alarm(signum, frame):
  raise SuiteTimeout("the test ran past the suite's time limit per test")

@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  limit = int(os.environ.get("JAX_SUITE_TEST_TIMEOUT", "0"))
  if limit:
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
  try:
    return (yield)
  finally:
    signal.alarm(0)

def pytest_warning_recorded(warning_message, when, nodeid, location):
  # Race reports (pytest --pallas-sim-races report): one line each, with the
  # test, in races.jsonl beside the results.
  log = os.environ.get("JAX_SUITE_LOG")
  w = warning_message.message
  if log and type(w).__name__ == "RaceWarning":
    with open(os.path.join(os.path.dirname(log), "races.jsonl"), "a") as f:
      f.write(json.dumps([nodeid, str(w)]) + "\\n")


def pytest_runtest_logreport(report):
  log = os.environ.get("JAX_SUITE_LOG")
  if os.environ.get("PYTEST_XDIST_WORKER"):  # (xdist's controller logs each once)
    return
  if log and (report.when == "call" or report.outcome != "passed"):
    msg = ""
    if report.failed:
      msg = getattr(report.longrepr, "reprcrash", None)
      msg = msg.message if msg is not None else str(report.longrepr)[-300:]
    elif report.skipped:
      msg = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else ""
    with open(log, "a") as f:
      f.write(json.dumps([report.nodeid, report.outcome, msg.strip()[:300]]) + "\\n")
'''

# The suite's device checks, told that this CPU is an sm_90a CUDA device
# with the H200 machine's CUDA 13.0 (backends/sim/frontend/device.py).
CONFTEST = '''
from jax._src import test_util as jtu

def _cap(v):
  return tuple(int(x) for x in str(v).split("."))

jtu.test_device_matches = lambda names: any(n in ("cuda", "gpu") for n in names)
jtu.is_cuda_compute_capability_at_least = lambda v: _cap(v) <= (9, 0)
jtu.is_cuda_compute_capability_equal = lambda v: _cap(v) == (9, 0)
jtu.is_cuda_version_at_least = lambda major, minor=0: (major, minor) <= (13, 0)
jtu.device_under_test = lambda: "gpu"
jtu.CudaArchSpecificTest.skip_unless_sm90a = lambda self: None
jtu.CudaArchSpecificTest.skip_unless_tcgen05 = (
    lambda self: self.skipTest("Blackwell (tcgen05) test: not on a Hopper"))
'''


def extract(args):
  os.makedirs(WORK, exist_ok=True)
  git = ["git", "--git-dir", os.path.join(args.jax_repo, ".git")
         if os.path.isdir(os.path.join(args.jax_repo, ".git")) else args.jax_repo]
  text = subprocess.run(git + ["show", f"{args.rev}:tests/pallas/mosaic_gpu_test.py"],
                        check=True, capture_output=True, text=True).stdout
  rev = subprocess.run(git + ["rev-parse", args.rev], check=True, capture_output=True,
                       text=True).stdout.strip()
  with open(TEST, "w") as f:
    f.write(text)
  with open(os.path.join(WORK, "REVISION"), "w") as f:
    f.write(rev + "\n")
  print(f"{TEST}: {len(text.splitlines())} lines, jax-ml/jax {rev}")


def run(args):
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  conftest = os.path.join(WORK, "conftest.py")
  with open(conftest, "w") as f:
    f.write(COMMON + ("" if args.native else CONFTEST))
  log = os.path.join(out, "results.jsonl")
  checks = os.path.join(out, "estimate.jsonl")
  for stale in (log, os.path.join(out, "races.jsonl"), checks):
    if os.path.exists(stale):
      os.remove(stale)
  cmd = [sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider",
         "--rootdir", WORK, "-W", "ignore::DeprecationWarning"]
  if args.n:
    cmd += ["-n", str(args.n)]
  if args.k:
    cmd += ["-k", args.k]
  if not args.native:
    cmd += ["--pallas-sim"]
    if not args.strict:
      cmd += ["--pallas-sim-races", "report", "--pallas-sim-uninitialized", "report"]
  env = dict(os.environ, PALLAS_SIM_PROGRESS="0", JAX_SUITE_LOG=log,
             JAX_SUITE_TEST_TIMEOUT=str(args.timeout))
  if not args.native:
    env["JAX_PLATFORMS"] = "cpu"
    if args.check_estimate:  # (backends/sim/execute/estimate_check.py)
      env["PALLAS_SIM_CHECK_ESTIMATE"] = checks
  elif args.n:  # (workers share the GPU: no worker may take 75% of its memory)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  print(" ".join(cmd), flush=True)
  p = subprocess.run(cmd, env=env, cwd=WORK, capture_output=True, text=True)
  with open(os.path.join(out, "pytest.txt"), "w") as f:
    f.write(p.stdout + p.stderr)
  results = parse_log(log)
  with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(results, f, indent=0, sort_keys=True)
  counts = collections.Counter(r[0] for r in results.values())
  print(f"{'native' if args.native else 'simulated'}: {dict(counts)}")
  if os.path.exists(checks):
    summarize_checks(checks)


def summarize_checks(path, tolerance=0.02):
  """ps.estimate against the full simulation, over the launches of a run
  with --check-estimate: how many agree exactly, within the tolerance, not;
  which raised."""
  lines = [json.loads(x) for x in open(path)]
  raised = [x for x in lines if "raised" in x]
  ran = [x for x in lines if "raised" not in x]
  exact = [x for x in ran if abs(x["error"]) < 1e-9]
  off = [x for x in ran if abs(x["error"]) > tolerance]
  print(f"estimate against simulate: {len(lines)} launches; {len(exact)} equal, "
        f"{len(ran) - len(exact) - len(off)} within {tolerance:.0%} (not equal), "
        f"{len(off)} off by more, {len(raised)} raised")
  for x in sorted(off, key=lambda x: -abs(x["error"]))[:20]:
    print(f"  {x['error']:+.1%} {x['kernel']} ({x['test']}): simulated "
          f"{x['simulated_s'] * 1e6:.2f} us, estimated {x['estimated_s'] * 1e6:.2f}")
  # (an estimate is to report the simulation's tallies too, not only its time)
  tallies = [x for x in ran if x.get("tallies")]
  print(f"  {len(tallies)} launches whose tallies differ")
  for x in tallies[:20]:
    print(f"  {x['kernel']} ({x['test']}): " + ", ".join(
        f"{k} {e:.4g} (simulated {s:.4g})" for k, (e, s) in x["tallies"].items()))
  kinds = collections.Counter(reason(x["raised"]) for x in raised)
  for k, n in kinds.most_common():
    print(f"  raised x{n}: {k}")


def parse_log(path):
  """test id (Class::test) -> (outcome, first line of its message)."""
  out = {}
  if not os.path.exists(path):
    return out
  for line in open(path):
    nodeid, outcome, msg = json.loads(line)
    tid = "::".join(nodeid.split("::")[-2:])
    if out.get(tid, ("passed",))[0] == "passed":  # (a failed teardown counts)
      out[tid] = (outcome, (msg.splitlines() or [""])[0][:200])
  return out


def reason(msg):
  """A failure message, shortened to its kind (file:line and numbers off)."""
  import re
  msg = re.sub(r"\S+\.py:\d+: ", "", msg)
  msg = re.sub(r"\d+", "N", msg)
  return msg[:110]


def compare(args):
  native = json.load(open(args.native_json))
  sim = json.load(open(args.sim_json))
  ok = [t for t, (o, _) in native.items() if o == "passed"]
  passed = [t for t in ok if sim.get(t, ("missing",))[0] == "passed"]
  print(f"pass natively: {len(ok)}; of those, pass in the simulator: {len(passed)} "
        f"({len(ok) - len(passed)} do not)")
  kinds = collections.Counter()
  examples = {}
  for t in ok:
    o, msg = sim.get(t, ("missing", ""))
    if o != "passed":
      k = f"{o}: {reason(msg)}"
      kinds[k] += 1
      examples.setdefault(k, t)
  print("\n| count | what | e.g. |\n|---:|---|---|")
  for k, n in kinds.most_common():
    print(f"| {n} | {k.replace('|', '/')} | {examples[k]} |")


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="cmd", required=True)
  e = sub.add_parser("extract")
  e.add_argument("--jax-repo", required=True)
  e.add_argument("--rev", default="HEAD")
  r = sub.add_parser("run")
  r.add_argument("--native", action="store_true")
  r.add_argument("--strict", action="store_true")
  r.add_argument("-n", type=int, default=0)
  r.add_argument("-k", default=None)
  r.add_argument("--timeout", type=int, default=120, help="seconds per test")
  r.add_argument("--check-estimate", action="store_true",
                 help="estimate every simulated launch again and compare "
                      "(backends/sim/execute/estimate_check.py; out/estimate.jsonl)")
  r.add_argument("--out", required=True)
  c = sub.add_parser("compare")
  c.add_argument("native_json")
  c.add_argument("sim_json")
  k = sub.add_parser("checks", help="sum up a --check-estimate run's estimate.jsonl")
  k.add_argument("jsonl")
  args = ap.parse_args()
  {"extract": extract, "run": run, "compare": compare,
   "checks": lambda a: summarize_checks(a.jsonl)}[args.cmd](args)


if __name__ == "__main__":
  main()
