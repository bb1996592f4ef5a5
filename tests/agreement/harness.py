"""Runs one generated case on both sides and says whether they agree.

Modes (AGREEMENT_BACKEND, default: "mosaic" where there is a Hopper GPU,
else "reference"):
* "mosaic": the simulator against the real Mosaic GPU lowering running on the
  GPU, and both against the NumPy reference. Errors must agree in kind.
* "reference" (CPU, CI): the simulator against the NumPy reference; the real
  lowering (jax.export for "cuda", no GPU needed) says what must be rejected.

Every example is logged as one JSON line to $AGREEMENT_LOG, if set, for the
summary that tests/agreement/run_gpu.py prints.
"""
import dataclasses
import json
import os
import re
import time

import jax
import numpy as np

import pallas_sim as ps
import tolerance


@dataclasses.dataclass
class Case:
  family: str
  desc: str                       # the drawn configuration, for the summary
  fn: object                      # jnp arrays -> outputs
  args: tuple
  # reference(*numpy float64 args) -> list of (want, allowed |error|) per
  # output; allowed against the other backend comes from `allow_backends`.
  reference: object = None
  allow_backends: object = None   # (want_real) -> allowed |sim - real| per output
  must_reject: bool = False       # the family generates only rejected kernels


def mode():
  m = os.environ.get("AGREEMENT_BACKEND")
  if m:
    return m
  from pallas_sim.backends import mosaic
  return "mosaic" if mosaic.hopper_device() is not None else "reference"


# --- error kinds --------------------------------------------------------------

def sim_kind(e):
  if isinstance(e, ps.SmemOverflowError):
    return "smem"
  if isinstance(e, ps.UnsupportedPrimitiveError):
    return "unsupported"
  if isinstance(e, (ps.RaceError, ps.DeadlockError)):
    return "race/deadlock"
  if isinstance(e, ps.KernelError):
    return "rejected"
  if isinstance(e, ps.SimError):
    return "simulator error"
  return _traced(e)


def real_kind(e):
  return "smem" if _SMEM.search(str(e)) else "rejected"


def _traced(e):
  """An exception raised by JAX while tracing the user's code (before either
  backend sees a kernel) is the same on both sides: compare it as it is."""
  return f"{type(e).__name__}: {str(e).strip()[:200]}"


_SMEM = re.compile(r"smem_bytes=(\d+) > max_smem_bytes=(\d+)")


def _smem_numbers(e):
  m = _SMEM.search(str(e))
  return m and m.groups()


def _first_line(e):
  return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}" if str(e) else repr(e)


# --- running ----------------------------------------------------------------

def _outputs(out):
  return [np.asarray(x) for x in jax.tree.leaves(out)]


def run_sim(case, check_lowering=True):
  try:
    return _outputs(ps.run(case.fn, *case.args, backend="sim",
                           check_lowering=check_lowering)), None
  except Exception as e:  # every kind is compared below
    return None, e


def run_mosaic(case):
  try:
    return _outputs(ps.run(case.fn, *case.args, backend="mosaic")), None
  except Exception as e:
    return None, e


def lowering_verdict(case):
  """The real lowering's exception for this kernel, or None if it lowers."""
  try:
    jax.export.export(jax.jit(case.fn), platforms=["cuda"])(*case.args)
  except Exception as e:
    return e
  return None


def _np64(args):
  return [np.asarray(a).astype(np.float64) for a in args]


def _compare(outs, refs, who):
  problems = []
  for i, (got, (want, allow)) in enumerate(zip(outs, refs)):
    problems += [f"{who} output {i}: {p}" for p in tolerance.mismatches(got, want, allow)]
  return problems


def check(case):
  """Runs the case; returns (outcome, details). Outcome: "agree",
  "both-rejected" or "disagree"."""
  m = mode()
  t0 = time.perf_counter()
  sim_out, sim_err = run_sim(case)
  if m == "mosaic":
    real_out, real_err = run_mosaic(case)
  else:
    real_out, real_err = None, lowering_verdict(case)
  problems = []
  detail = {}
  if sim_err is not None:
    detail["sim_error"] = _first_line(sim_err)
    detail["sim_source"] = ("lowering" if isinstance(sim_err, ps.LoweringError)
                            else "model")
  if real_err is not None:
    detail["real_error"] = _first_line(real_err)

  if sim_err is not None or real_err is not None:
    sk = sim_kind(sim_err) if sim_err is not None else None
    rk = real_kind(real_err) if real_err is not None else None
    if rk is not None and sk == _traced(real_err):
      rk = sk
    if sk != rk:
      problems.append(f"errors differ: simulator {sk or 'runs'} "
                      f"({detail.get('sim_error', '')}), real {rk or 'runs'} "
                      f"({detail.get('real_error', '')})")
    elif sk == "smem" and (sim_err.smem_bytes, sim_err.max_smem_bytes) != tuple(
        map(int, _smem_numbers(real_err))):
      problems.append(f"SMEM numbers differ: {detail['sim_error']} vs {detail['real_error']}")
    outcome = "both-rejected" if not problems else "disagree"
    if rk is not None:
      # Would the simulator's own model (without the real lowering as a
      # check) have rejected it too? Recorded, not asserted: see README.
      _, model_err = run_sim(case, check_lowering=False)
      detail["model_alone"] = sim_kind(model_err) if model_err is not None else "runs"
  else:
    if case.must_reject:
      problems.append("the family expects a rejection, but both accept the kernel")
    refs = case.reference(*_np64(case.args)) if case.reference else []
    problems += _compare(sim_out, refs, "simulator vs reference")
    detail["ratio_ref"] = max([tolerance.worst_ratio(g, w, a)
                               for g, (w, a) in zip(sim_out, refs)], default=0.0)
    if real_out is not None:
      problems += _compare(real_out, refs, "real vs reference")
      allow = case.allow_backends(real_out) if case.allow_backends else [
          a for _, a in refs]
      pairs = [(np.asarray(r, np.float64), a) for r, a in zip(real_out, allow)]
      problems += _compare(sim_out, pairs, "simulator vs real")
      detail["ratio_real"] = max([tolerance.worst_ratio(g, w, a)
                                  for g, (w, a) in zip(sim_out, pairs)], default=0.0)
      detail["equal_real"] = all(np.array_equal(np.asarray(g, np.float64), w,
                                                equal_nan=True)
                                 for g, (w, _) in zip(sim_out, pairs))
    outcome = "agree" if not problems else "disagree"
  _log(case, m, outcome, problems, detail, time.perf_counter() - t0)
  return outcome, problems


def _log(case, m, outcome, problems, detail, seconds):
  path = os.environ.get("AGREEMENT_LOG")
  if not path:
    return
  rec = dict(family=case.family, desc=case.desc, mode=m, outcome=outcome,
             problems=problems, seconds=round(seconds, 3), **detail)
  with open(path, "a") as f:
    f.write(json.dumps(rec) + "\n")


def assert_agree(case):
  __tracebackhide__ = True
  outcome, problems = check(case)
  assert outcome != "disagree", (f"[{case.family}] {case.desc}:\n  "
                                 + "\n  ".join(problems))
  return outcome
