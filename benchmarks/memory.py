"""Peak memory and wall time of the quickstart matmul in the simulator
(numerics and race checks on), against the simulator's memory bound: four
times the kernel's GMEM data plus 1 GiB.

Each size runs in a fresh Python process; a sampler reads the proportional
set size (PSS: a page shared by n processes counts 1/n in each, so forked
workers' shared pages are counted once) of that process and all its
descendants every 20 ms, from /proc/<pid>/smaps_rollup (Linux).

    ./dev python benchmarks/memory.py 1024 2048 4096 [--workers N]
        [--no-races] [--no-uninitialized]   # what the checks hold
        [--no-fresh]                        # workers that last the launch
        [--no-warm]         # no unmeasured 256^3 run first (numba's compile)
"""
import argparse
import os
import subprocess
import sys
import threading
import time

GIB = 1 << 30

CHILD = r"""
import sys, time
import numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, {examples!r})
import pallas_sim as ps
from pallas_sim.backends.sim.execute import parallel
from quickstart import matmul
n, workers, races, uninit = {n}, {workers}, {races}, {uninit}
if not {fresh}:  # (--no-fresh: workers that last the launch, whatever its size)
  parallel.FRESH_MIN_BYTES = 1 << 62
rng = np.random.default_rng(0)
a = jnp.asarray(rng.standard_normal((n, n)), jnp.float16)
b = jnp.asarray(rng.standard_normal((n, n)), jnp.float16)
t0 = time.perf_counter()
sim = ps.simulate(matmul, a, b, workers=workers, check_races=races,
                  check_uninitialized=uninit)
np.asarray(sim.outputs)
k = sim.report.kernels[0]
print("RESULT", time.perf_counter() - t0, k.workers, k.num_blocks, len(sim.report.races))
"""


def _descendants(pid):
  out, todo = [], [pid]
  while todo:
    p = todo.pop()
    out.append(p)
    try:
      with open(f"/proc/{p}/task/{p}/children") as f:
        todo += [int(c) for c in f.read().split()]
    except OSError:
      pass
  return out


def _pss(pid):
  try:
    with open(f"/proc/{pid}/smaps_rollup") as f:
      for line in f:
        if line.startswith("Pss:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def _top_mappings(pid, n=6):
  """[(private KiB, mapping)] of the process's largest private mappings."""
  maps, cur = [], None
  try:
    with open(f"/proc/{pid}/smaps") as f:
      for line in f:
        if "-" in line.split(" ", 1)[0] and not line[0].isupper():
          cur = [0, line.strip()[:90]]
          maps.append(cur)
        elif line.startswith(("Private_Dirty:", "Private_Clean:")) and cur:
          cur[0] += int(line.split()[1])
  except OSError:
    return []
  return [(sum(m[0] for m in maps), "in all")] + sorted(maps, reverse=True)[:n]


def _private(pid):
  """Bytes of the process's own pages (Private_Clean + Private_Dirty)."""
  maps = _top_mappings(pid, 0)
  return maps[0][0] * 1024 if maps else 0


def measure(n, workers, detail=None, races=True, uninit=True, fresh=True):
  here = os.path.dirname(os.path.abspath(__file__))
  code = CHILD.format(examples=os.path.join(here, "..", "examples"), n=n,
                      workers=workers, races=races, uninit=uninit, fresh=fresh)
  env = dict(os.environ, PALLAS_SIM_PROGRESS="0")
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)
  peak = [0, 0, 0, 0]  # total PSS, the main process's, the largest worker's, its private

  last = [0.0]
  last_private = [0.0]

  def sample():
    while proc.poll() is None:
      pids = _descendants(proc.pid)
      each = [_pss(p) for p in pids]
      if sum(each) > peak[0] and detail is not None and time.time() - last[0] > 1:
        last[0] = time.time()  # (what holds the memory: the largest mappings)
        worst = max(range(1, len(each)), key=each.__getitem__, default=None)
        detail[:] = [("main", _top_mappings(pids[0]))] + (
            [("largest worker", _top_mappings(pids[worst]))] if worst else [])
      peak[0] = max(peak[0], sum(each))
      peak[1] = max(peak[1], each[0] if each else 0)
      peak[2] = max([peak[2]] + each[1:])
      if len(pids) > 1 and time.time() - last_private[0] > 0.25:  # (smaps is slow to read)
        last_private[0] = time.time()
        peak[3] = max([peak[3]] + [_private(p) for p in pids[1:]])
      time.sleep(0.02)
  th = threading.Thread(target=sample, daemon=True)
  th.start()
  out, err = proc.communicate()
  th.join()
  line = [l for l in out.splitlines() if l.startswith("RESULT")]
  if proc.returncode or not line:
    raise SystemExit(f"size {n}: the child failed:\n{err[-3000:]}")
  _, wall, used, blocks, nraces = line[0].split()
  return float(wall), int(used), int(blocks), int(nraces), *peak


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("sizes", type=int, nargs="+")
  ap.add_argument("--workers", type=int, default=None, help="default: every core")
  ap.add_argument("--mappings", action="store_true",
                  help="also print the largest private mappings near the peak")
  ap.add_argument("--races", action=argparse.BooleanOptionalAction, default=True)
  ap.add_argument("--uninitialized", action=argparse.BooleanOptionalAction, default=True)
  ap.add_argument("--fresh", action=argparse.BooleanOptionalAction, default=True,
                  help="a worker per task where parallel.run would (--no-fresh: never)")
  ap.add_argument("--warm", action=argparse.BooleanOptionalAction, default=True,
                  help="first simulate a 256^3 matmul, unmeasured (--no-warm: the "
                       "first size pays for compiling numba's kernels on a fresh machine)")
  ns = ap.parse_args(argv)
  if ns.warm:  # (numba caches its kernels on disk: ~15 s, once per checkout)
    measure(256, 1, None, ns.races, ns.uninitialized, ns.fresh)
  print(f"races checked: {ns.races}, uninitialized reads checked: {ns.uninitialized}, "
        f"a worker per long task: {ns.fresh}\n")
  print("| size | blocks | workers | simulate (s) | GMEM data (MiB) | peak PSS, all "
        "processes (MiB) | main process | largest worker | largest worker, private "
        "| bound 4 x GMEM + 1 GiB (MiB) | within | races |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
  for n in ns.sizes:
    detail = [] if ns.mappings else None
    wall, used, blocks, nraces, peak, main_peak, worker_peak, worker_private = measure(
        n, ns.workers, detail, ns.races, ns.uninitialized, ns.fresh)
    gmem = 3 * n * n * 2  # A, B and the output, f16
    bound = 4 * gmem + GIB
    print(f"| {n}^3 | {blocks} | {used} | {wall:.1f} | {gmem / 2**20:.0f} | "
          f"{peak / 2**20:.0f} | {main_peak / 2**20:.0f} | {worker_peak / 2**20:.0f} | "
          f"{worker_private / 2**20:.0f} | {bound / 2**20:.0f} | {peak <= bound} | "
          f"{nraces} |", flush=True)
    for who, maps in detail or ():
      print(f"  {who}: " + "; ".join(f"{k // 1024} MiB {m}" for k, m in maps))


if __name__ == "__main__":
  main()
