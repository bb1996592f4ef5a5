"""Where a parallel run's memory goes: the quickstart matmul (numerics and
race checks on) over worker processes, with each process's largest mappings
by private memory, from /proc/self/smaps (Linux).

A worker writes its table after each task (its last one is kept); the
parent writes its own at merge 16 and every 250 merges after. Mappings are
labeled where they hold one of the launch's GMEM buffers, their
written-masks or race shadows, or (in the parent) the cross-block summaries.
A diagnosis tool, not a benchmark: it wraps the simulator's internals
(parallel.run_groups, Executor._merge).

    ./dev python -m lab.memory_map 4096 [--workers N] [--per-task K]
        [--no-uninitialized] [--out DIR]     # tables in DIR (default build/memory_map)
"""
import argparse
import os
import sys
import time

import jax.numpy as jnp
import numpy as np

import pallas_sim as ps
from pallas_sim.backends.sim.execute import executor, parallel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from quickstart import matmul  # noqa: E402


def table(names, top=18):
  """(private MiB, PSS MiB, lines): this process's largest mappings, by
  resident size."""
  rows = []
  with open("/proc/self/smaps") as f:
    for line in f:
      p = line.split()
      if "-" in p[0] and ":" not in p[0]:
        lo, hi = (int(x, 16) for x in p[0].split("-"))
        rows.append([lo, hi, 0, 0, " ".join(p[5:])[-30:], 0])
      elif p[0] == "Private_Dirty:":
        rows[-1][2] = int(p[1])
      elif p[0] == "Pss:":
        rows[-1][3] = int(p[1])
      elif p[0] == "Rss:":
        rows[-1][5] = int(p[1])
  lines = ["| private (MiB) | PSS (MiB) | resident (MiB) | mapping (MiB) | what |",
           "|---:|---:|---:|---:|---|"]
  for lo, hi, priv, pss, path, rss in sorted(rows, key=lambda r: -r[5])[:top]:
    what = ", ".join(n for (a, e), n in names.items() if a < hi and lo < e) or path
    lines.append(f"| {priv / 1024:.1f} | {pss / 1024:.1f} | {rss / 1024:.1f} | "
                 f"{(hi - lo) / 2**20:.1f} | {what} |")
  return sum(r[2] for r in rows) / 1024, sum(r[3] for r in rows) / 1024, lines


def _span(a):
  """The bytes an array spans (a mapping may start inside its first page)."""
  lo = a.__array_interface__["data"][0]
  return lo, lo + max(a.nbytes, 1)


def buffer_names(bufs):
  names = {}
  for b in bufs:
    names[_span(b.data)] = f"data of {b.name}"
    if b.written is not None:
      names[_span(b.written)] = f"written-mask of {b.name}"
    for k, v in vars(b.shadow).items() if b.shadow is not None else ():
      if isinstance(v, np.ndarray):
        names[_span(v)] = f"race shadow {k} of {b.name}"
  return names


def main(argv=None):
  ap = argparse.ArgumentParser()
  ap.add_argument("size", type=int)
  ap.add_argument("--workers", type=int, default=None)
  ap.add_argument("--per-task", type=int, default=None, help="groups a worker task runs")
  ap.add_argument("--no-uninitialized", action="store_true")
  ap.add_argument("--out", default="build/memory_map")
  ns = ap.parse_args(argv)
  os.makedirs(ns.out, exist_ok=True)

  run_groups = parallel.run_groups

  def worker(job, task):
    out = run_groups(job, task)
    priv, pss, lines = table(buffer_names(job.runner.io_bufs))
    with open(os.path.join(ns.out, f"worker_{os.getpid()}.md"), "w") as f:
      f.write(f"worker {os.getpid()} after groups {task[0]}..{task[-1]}: private "
              f"{priv:.0f} MiB, PSS {pss:.0f} MiB\n\n" + "\n".join(lines) + "\n")
    return out
  parallel.run_groups = worker
  if ns.per_task:
    run = parallel.run
    parallel.run = lambda *a, **k: run(*a, **{**k, "per_task": ns.per_task})

  merge, merged = executor.Executor._merge, [0]
  bufs, make_buffers = [], executor.Executor._buffers

  def buffers(self, *args, **kw):
    made = make_buffers(self, *args, **kw)
    bufs[:] = made[0] + made[1]
    return made
  executor.Executor._buffers = buffers

  def parent(result, cycles, totals, log, init_log, cross, loads):
    merged[0] += 1
    if merged[0] % 250 == 16:  # (late in a big launch; once in a small one)
      names = {_span(v): f"cross-block {k}" for sm in (cross.summaries.values()
                                                          if cross else ())
               for k, v in vars(sm).items() if isinstance(v, np.ndarray)}
      names.update(buffer_names(bufs))
      priv, pss, lines = table(names)
      with open(os.path.join(ns.out, "parent.md"), "w") as f:
        f.write(f"parent after {merged[0]} merges: private {priv:.0f} MiB, PSS "
                f"{pss:.0f} MiB\n\n" + "\n".join(lines) + "\n")
    return merge(result, cycles, totals, log, init_log, cross, loads)
  executor.Executor._merge = staticmethod(parent)

  n = ns.size
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((n, n)), jnp.float16)
  b = jnp.asarray(rng.standard_normal((n, n)), jnp.float16)
  t0 = time.perf_counter()
  sim = ps.simulate(matmul, a, b, workers=ns.workers,
                    check_uninitialized=not ns.no_uninitialized)
  np.asarray(sim.outputs)
  print(f"{n}^3: simulate {time.perf_counter() - t0:.1f} s; tables in {ns.out}/")


if __name__ == "__main__":
  main()
