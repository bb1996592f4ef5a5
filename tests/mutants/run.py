"""Deliberately broken copies of the simulator ("mutants"), one per modelled
behaviour, each run against the CPU tests that cover it: a test suite that
lets a mutant pass cannot see that bug class.

    ./dev mutants                  # every mutant in catalog.py, 2 at a time
    ./dev mutants --only fma-off   # some of them (names, or prefixes)
    ./dev mutants --all-tests      # the whole CPU suite for each mutant
    ./dev mutants --list

Each mutant is applied to a scratch copy of the checkout (its git-tracked and
untracked, not ignored, files), never to the checkout itself; the copy's tests
run with the copy first on PYTHONPATH, on the newest JAX (`.venv`), or on
the oldest (`.venv-oldest`) for a mutant whose path only older releases take
(catalog.Mutant.jax). A mutant is killed when a test fails
(pytest exit 1). Prints `N mutants, K killed` and the survivors; exit 1 if any
survives or cannot be applied.
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from catalog import MUTANTS  # noqa: E402


def checkout_files(root=ROOT):
  out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root,
                       capture_output=True, text=True, check=True).stdout
  return [f for f in out.splitlines() if os.path.isfile(os.path.join(root, f))]


def make_scratch(files, pythons):
  d = tempfile.mkdtemp(prefix="pallas-sim-mutants-")
  for f in files:
    dst = os.path.join(d, f)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(os.path.join(ROOT, f), dst)
  # The backends install as pallas_sim.backends (pyproject.toml package-dir):
  # on PYTHONPATH the copy needs them there too, or the checkout's editable
  # install would answer for them, unmutated.
  os.symlink(os.path.join("..", "backends"), os.path.join(d, "pallas_sim", "backends"))
  for py in pythons:
    got = subprocess.run(
        [py, "-c", "import pallas_sim.backends.sim as s; print(s.__file__)"],
        cwd=d, env=dict(os.environ, PYTHONPATH=d), capture_output=True, text=True,
        check=True).stdout.strip()
    if not got.startswith(d + os.sep):
      raise RuntimeError(f"the scratch copy {d} imports the simulator from {got} "
                         f"under {py}")
  return d


def python_for(m):
  """The interpreter a mutant's tests run under: this one, or the oldest
  JAX's venv for a mutant whose path only older releases take."""
  if m.jax == "newest":
    return sys.executable
  py = os.path.join(ROOT, ".venv-oldest", "bin", "python")
  if not os.path.exists(py):
    raise RuntimeError(f"mutant {m.name} runs its tests on the oldest JAX: "
                       f"{py} is missing (./dev test makes it)")
  return py


def apply(m, text):
  """The mutated file text; raises if the mutant's anchor is not found
  exactly once (the catalog has rotted: fix it)."""
  n = text.count(m.old)
  if n != 1:
    raise ValueError(f"mutant {m.name}: its text occurs {n} times in {m.path}")
  return text.replace(m.old, m.new)


def run_one(m, scratch, all_tests, timeout):
  path = os.path.join(scratch, m.path)
  with open(path) as f:
    original = f.read()
  try:
    with open(path, "w") as f:
      f.write(apply(m, original))
    tests = ["tests"] if all_tests else list(m.tests)
    env = dict(os.environ, PYTHONPATH=scratch, CI="true", PYTHONDONTWRITEBYTECODE="1")
    env.pop("HYPOTHESIS_PROFILE", None)
    cmd = [python_for(m), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "-m", "not gpu", *tests]
    t0 = time.perf_counter()
    try:
      p = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True,
                         timeout=timeout)
      rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
      rc, out = "timeout", ""
    secs = time.perf_counter() - t0
  finally:
    with open(path, "w") as f:
      f.write(original)
  failed = re.findall(r"^FAILED (\S+)", out, re.M)
  return m, rc, secs, failed[:1], out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--only", nargs="*", help="mutant names or name prefixes")
  ap.add_argument("--jobs", type=int, default=2)
  ap.add_argument("--all-tests", action="store_true",
                  help="run the whole CPU suite for each mutant")
  ap.add_argument("--timeout", type=int, default=900)
  ap.add_argument("--list", action="store_true")
  args = ap.parse_args(argv)
  mutants = [m for m in MUTANTS
             if not args.only or any(m.name.startswith(o) for o in args.only)]
  if args.list:
    for m in mutants:
      print(f"{m.name:34s} {m.path}: {m.behaviour}")
    return 0
  # Every anchor must apply to the checkout as it is.
  for m in mutants:
    with open(os.path.join(ROOT, m.path)) as f:
      apply(m, f.read())
  files = checkout_files()
  pythons = sorted({python_for(m) for m in mutants})
  scratches = [make_scratch(files, pythons) for _ in range(max(1, args.jobs))]
  print(f"{len(mutants)} mutants, {len(scratches)} at a time, "
        f"{'the whole CPU suite' if args.all_tests else 'the tests that cover each'}",
        flush=True)
  results = []
  try:
    free = list(scratches)
    with concurrent.futures.ThreadPoolExecutor(len(scratches)) as pool:
      pending = {}
      queue = list(mutants)
      while queue or pending:
        while queue and free:
          scratch = free.pop()
          m = queue.pop(0)
          pending[pool.submit(run_one, m, scratch, args.all_tests, args.timeout)] = scratch
        done, _ = concurrent.futures.wait(pending, return_when="FIRST_COMPLETED")
        for fut in done:
          free.append(pending.pop(fut))
          m, rc, secs, failed, out = fut.result()
          status = ("killed" if rc == 1 else "SURVIVED" if rc == 0 else
                    f"ERROR (pytest exit {rc})")
          results.append((m, status, secs, failed, out))
          print(f"  {status:8s} {m.name:34s} {secs:6.1f} s  {' '.join(failed)}", flush=True)
  finally:
    for d in scratches:
      shutil.rmtree(d, ignore_errors=True)
  killed = sum(1 for _, s, *_ in results if s == "killed")
  print(f"\n{len(results)} mutants, {killed} killed")
  bad = [(m, s, out) for m, s, _, _, out in results if s != "killed"]
  for m, s, out in bad:
    print(f"\n{s}: {m.name} ({m.path}): {m.behaviour}")
    if s.startswith("ERROR"):
      print("\n".join(out.strip().splitlines()[-15:]))
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
