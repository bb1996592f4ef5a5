"""Simulator speed of two checkouts, side by side in one run (for a refactor:
the same kernels, alternating between the two, median of the rounds).

    ./dev python benchmarks/compare_versions.py BEFORE_DIR [AFTER_DIR] [--rounds 3]
    ./dev python benchmarks/compare_versions.py BEFORE_DIR --estimate NAME... [--rounds 1]

BEFORE_DIR is another checkout, e.g. `git worktree add /tmp/before <commit>`;
AFTER_DIR defaults to this one. Each round runs every case in a fresh process
per checkout (warm-up call, then the median of --repeat calls), so both see
the same machine load. Prints seconds and after/before per case, races off
and on. With --estimate, the cases are the timing suite's kernels whose
names hold one of the NAMEs (lab/timing_suite.py, any kind), each estimated
as benchmarks/accuracy.py does (ps.estimate from its shapes, the H200, its
own clock) once a round, its prediction printed beside its time.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, statistics, sys, time
import numpy as np, jax, jax.numpy as jnp
sys.path[:0] = [sys.argv[3], sys.argv[1] + "/examples", sys.argv[1] + "/tests"]
import pallas_sim as ps
import pallas_sim.backends.sim as _sim
assert _sim.__file__.startswith(sys.argv[3]), (_sim.__file__, sys.argv[3])
from benchmarks.sim_speed import make_iota  # (the checkout is the working directory)
from test_quickstart import matmul_mcs
import kernels as K
repeat = int(sys.argv[2])
rng = np.random.default_rng(0)
def ab(m, k, n):
  return (jnp.asarray(rng.standard_normal((m, k)), jnp.float16),
          jnp.asarray(rng.standard_normal((k, n)), jnp.float16))
cases = {
  "iota 1M elems (8192 blocks)": (make_iota(8192), ()),
  "matmul 512^3": (matmul_mcs, ab(512, 512, 512)),
  "matmul 1024^3": (matmul_mcs, ab(1024, 1024, 1024)),
  "matmul 256x1024x256 tile_k=32 (32 steps)": (
      lambda a, b: matmul_mcs(a, b, tile_k=32), ab(256, 1024, 256)),
  "two-thread producer/consumer (barriers)": (K.two_thread_copy, K.two_thread_copy_args(0)),
  "warp-specialized matmul": (K.warp_specialized_matmul, K.warp_specialized_matmul_args(0)),
}
out = {}
for name, (fn, args) in cases.items():
  for races in (False, True):
    call = lambda: np.asarray(jax.tree.leaves(ps.run(fn, *args, backend="sim",
                                                     check_races=races))[0])
    call()
    ts = []
    for _ in range(repeat):
      t0 = time.perf_counter(); call(); ts.append(time.perf_counter() - t0)
    out[f"{name}|{races}"] = statistics.median(ts)
print("RESULT " + json.dumps(out))
'''


# (each case estimated once a process: an estimate caches nothing between
# calls that a second would reuse, and the slow ones take tens of seconds)
ESTIMATE_CHILD = r'''
import json, sys, time
sys.path[:0] = [sys.argv[3]]
import pallas_sim.backends.sim as _sim
assert _sim.__file__.startswith(sys.argv[3]), (_sim.__file__, sys.argv[3])
from lab import timing_suite
names = json.loads(sys.argv[2])
out = {}
for kind in ("suite", "families", "holdout", "blind"):
  for case in timing_suite.cases(kind):
    if case.name in out or not any(n in case.name for n in names):
      continue
    t0 = time.perf_counter()
    report, _ = timing_suite.predict(case, "h200")
    out[case.name] = [time.perf_counter() - t0, report.time_s]
print("RESULT " + json.dumps(out))
'''


def _as_installed(tree, tmp):
  """A folder that holds `tree`'s package as it installs: a checkout whose
  backends sit at its root (backends/, installed as pallas_sim.backends)
  imports them from there, not from whichever checkout is installed."""
  if not os.path.isdir(os.path.join(tree, "backends")):
    return tree  # (the backends inside pallas_sim/, as before the move)
  pkg = os.path.join(tmp, "pallas_sim")
  os.makedirs(pkg)
  for name in os.listdir(os.path.join(tree, "pallas_sim")):
    os.symlink(os.path.join(tree, "pallas_sim", name), os.path.join(pkg, name))
  os.symlink(os.path.join(tree, "backends"), os.path.join(pkg, "backends"))
  return tmp


def run(tree, repeat, estimate=None):
  with tempfile.TemporaryDirectory() as tmp:
    return _run(tree, _as_installed(tree, tmp), repeat, estimate)


def _run(tree, package_dir, repeat, estimate=None):
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys([package_dir, tree])),
             CI="true")
  child, arg = (CHILD, str(repeat)) if estimate is None else (ESTIMATE_CHILD,
                                                              json.dumps(estimate))
  p = subprocess.run([sys.executable, "-c", child, tree, arg, package_dir], env=env,
                     capture_output=True, text=True, cwd=tree)
  line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
  if not line:
    raise RuntimeError(f"{tree}: {p.stderr[-2000:]}")
  return json.loads(line[0][7:])


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("before")
  ap.add_argument("after", nargs="?", default=ROOT)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--estimate", nargs="+", default=None, metavar="NAME",
                  help="time ps.estimate of the timing suite's kernels named so instead")
  args = ap.parse_args(argv)
  res: dict = {"before": [], "after": []}
  for r in range(args.rounds):
    for which in (("before", "after") if r % 2 == 0 else ("after", "before")):
      res[which].append(run(os.path.abspath(getattr(args, which)), args.repeat,
                            args.estimate))
      print(f"round {r + 1}: {which} done", file=sys.stderr, flush=True)
  print(f"before: {args.before}\nafter:  {args.after}\n")
  if args.estimate is not None:
    _estimate_table(res)
    return
  med = {w: {k: statistics.median(d[k] for d in runs) for k in runs[0]}
         for w, runs in res.items()}
  print("| kernel | races | before (s) | after (s) | after/before |")
  print("|---|---|---:|---:|---:|")
  for k in med["before"]:
    name, races = k.split("|")
    b, a = med["before"][k], med["after"][k]
    print(f"| {name} | {'on' if races == 'True' else 'off'} | {b:.3f} | {a:.3f} | {a / b:.2f}x |")


def _estimate_table(res):
  both = [k for k in res["before"][0] if k in res["after"][0]]
  med = {w: {k: statistics.median(d[k][0] for d in runs) for k in both}
         for w, runs in res.items()}
  pred = {w: {k: runs[0][k][1] for k in both} for w, runs in res.items()}
  print("| kernel | before (s) | after (s) | after/before | predicted before / after (us) |")
  print("|---|---:|---:|---:|---:|")
  for k in both:
    b, a = med["before"][k], med["after"][k]
    print(f"| {k} | {b:.2f} | {a:.2f} | {a / b:.2f}x | {pred['before'][k] * 1e6:.1f} / "
          f"{pred['after'][k] * 1e6:.1f} |")
  tb, ta = sum(med["before"].values()), sum(med["after"].values())
  print(f"\n{len(both)} kernels: {tb:.1f} s before, {ta:.1f} s after ({ta / tb:.2f}x)")


if __name__ == "__main__":
  main()
