"""A developer's check of ps.estimate against the full simulation, on every
launch a program simulates: with Options.check_estimate=<path> (by default the
environment's PALLAS_SIM_CHECK_ESTIMATE), each launch
that ps.simulate (or the pytest plugin) runs is estimated again, as
ps.estimate would (no tensor-core sums, no checks, one block per class), on the
same inputs, and a JSON line is appended to <path>: the kernel, the user's
file:line, pytest's current test, both predicted times, the tallies on
which they differ (`tallies`: bytes, loads, flops, units' busy shares), and
the estimate's error if it raised. Each report's summary and Perfetto trace are made too
(what a user asks of it), and an error there is recorded the same way.
The two must agree within 2% wherever both run, their counts exactly;
`benchmarks/jax_suite.py run --check-estimate` runs JAX's own test suite so,
over every kernel in it, and sums the lines up."""
import json
import os
import tempfile
import traceback

from pallas_sim.options import CHECK_ESTIMATE_ENV

ENV = CHECK_ESTIMATE_ENV  # (Options.check_estimate's default)
# Where an exception the estimate raises may come from (anything else, say a
# test's time limit raised by a signal, passes through)
OURS = ("pallas_sim", "jax", "jaxlib", "numpy", "builtins")


def check(executor, launch, arrays, path):
  """Estimates `launch` (which `executor` has just simulated, its report last
  in executor.report.kernels) and appends the comparison to `path`."""
  sim = executor.report.kernels[-1]
  line = dict(test=os.environ.get("PYTEST_CURRENT_TEST", "").split(" (")[0],
              kernel=launch.name, where=str(launch.where), grid=list(sim.grid),
              simulated_s=sim.time_s, bound=sim.bound)
  try:
    est = executor.estimated(launch, arrays, workers=1)
    if est.errors:
      raise est.errors[0]
    rep = est.report.kernels[-1]
    for r in (executor.report, est.report):
      _use(r)
    line.update(estimated_s=rep.time_s, classes=rep.classes,
                simulated_blocks=rep.simulated_blocks,
                error=rep.time_s / sim.time_s - 1 if sim.time_s else 0.0,
                tallies=tally_differences(rep, sim))
  except Exception as e:  # (what the check is for: record it, go on)
    if type(e).__module__.split(".")[0] not in OURS:
      raise  # (not the estimate's failure: e.g. a test's time limit, by signal)
    line.update(raised=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                at=traceback.format_exc(limit=-3)[-1500:])
  with open(path, "a") as f:
    f.write(json.dumps(line) + "\n")


# A kernel report's counts, which an estimate must reproduce exactly, and
# its shares, which it must within the time's tolerance
COUNTS = ("hbm_bytes", "tma_load_bytes", "tma_store_bytes", "wgmma_flops",
          "tensor_f16_flops")
SHARES = ("utilisation", "stalls")


def tally_differences(est, sim, tolerance=0.02):
  """{tally: (estimated, simulated)} where two KernelReports' counts differ,
  or a unit's busy share (or a stall's) differs by more than `tolerance`
  of the simulation's (absolute below 1%)."""
  out = {}
  for name in COUNTS:
    a, b = getattr(est, name), getattr(sim, name)
    if a != b:
      out[name] = (a, b)
  for name in SHARES:
    a, b = getattr(est, name), getattr(sim, name)
    for k in sorted(set(a) | set(b)):
      x, y = float(a.get(k, 0.0)), float(b.get(k, 0.0))
      if abs(x - y) > tolerance * max(abs(y), 0.01):
        out[f"{name}[{k}]"] = (x, y)
  return out


def _use(report):
  """What a user does with a report: its summary, its trace (valid JSON)."""
  from pallas_sim.backends.sim.report import Report
  one = Report(report.gpu, kernels=report.kernels[-1:], clock_mhz=report.clock_mhz)
  if not one.summary():
    raise ValueError("an empty summary")
  with tempfile.TemporaryDirectory() as d:
    with open(one.save_trace(os.path.join(d, "trace.json"))) as f:
      if not isinstance(json.load(f)["traceEvents"], list):
        raise ValueError("a trace without its events")
