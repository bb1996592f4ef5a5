"""Runs one generated case on both sides and says whether they agree.

Modes (AGREEMENT_BACKEND, default: "mosaic" where there is a Hopper GPU,
else "reference"):
* "mosaic": the simulator against the real Mosaic GPU lowering running on the
  GPU, and both against the reference. Where the case claims exactness
  (`Case.exact`), the two must be bit-identical. Errors must agree in kind.
* "reference" (CPU, CI): the simulator against the reference; the real
  lowering (jax.export for "cuda", no GPU needed) says what must be rejected.

In both modes:
* kernels the lowering rejects for SMEM are rejected by the simulator's own
  model too (check_lowering=False), with the same numbers, and where a case
  says its rejection is one the model implements (`model_rejects`), the
  model alone rejects it, and with the lowering check on, the model's error
  comes first;
* kernels that fit: the simulator's SMEM byte count equals the lowering's.

Every example is logged as one JSON line to $AGREEMENT_LOG, if set, for the
summary that tests/agreement/run.py prints.
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
  # reference(*float64 args) -> a tolerance.Iv (the range of correct
  # results) per output
  reference: object = None
  must_reject: bool = False       # the family generates only rejected kernels
  exact: bool = True              # the GPU's outputs are claimed bit for bit
  config: dict = None             # the drawn axes (families.Picker)
  inferred_transforms: bool = False  # SMEM tiles whose transforms the lowering infers
  model_rejects: bool = False     # the simulator's own checks must reject it


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
  return m and tuple(map(int, m.groups()))


def _first_line(e):
  return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}" if str(e) else repr(e)


# --- running ----------------------------------------------------------------

def _outputs(out):
  return [np.asarray(x) for x in jax.tree.leaves(out)]


def run_sim(case, check_lowering=True):
  """(outputs, SMEM bytes of each launch, error)."""
  try:
    sim = ps.simulate(case.fn, *case.args, check_lowering=check_lowering)
    return _outputs(sim.outputs), [k.smem_bytes for k in sim.report.kernels], None
  except Exception as e:  # every kind is compared below
    return None, None, e


def run_mosaic(case):
  try:
    return _outputs(ps.run(case.fn, *case.args, backend="mosaic")), None
  except Exception as e:
    return None, e


def _export(case):
  # (a fresh function each time: JAX caches lowerings by function, and the
  # SMEM limit below is not part of its cache key)
  fn = lambda *args: case.fn(*args)
  jax.export.export(jax.jit(fn), platforms=["cuda"])(*case.args)


def lowering_verdict(case):
  """The real lowering's exception for this kernel, or None if it lowers."""
  try:
    _export(case)
  except Exception as e:
    return e
  return None


def lowering_smem_bytes(case):
  """The SMEM bytes the real lowering requests for the (first) kernel: it
  says so when its limit is 0 (its own testing hook)."""
  from jax.experimental.mosaic.gpu import core as mgpu_core
  with mgpu_core.artificial_shared_memory_limit(0):
    err = lowering_verdict(case)
  return 0 if err is None else (_smem_numbers(err) or (None,))[0]


def _np64(args):
  return [np.asarray(a).astype(np.float64) for a in args]


def _compare(outs, refs, who):
  problems = []
  for i, (got, want) in enumerate(zip(outs, refs)):
    problems += [f"{who} output {i}: {p}" for p in tolerance.mismatches(got, want)]
  return problems


def _check_rejection(case, sim_err, real_err, detail):
  """Errors: the same kind on both sides; the model's own share."""
  problems = []
  sk = sim_kind(sim_err) if sim_err is not None else None
  rk = real_kind(real_err) if real_err is not None else None
  if rk is not None and sk == _traced(real_err):
    rk = sk
  if sk != rk:
    problems.append(f"errors differ: simulator {sk or 'runs'} "
                    f"({detail.get('sim_error', '')}), real {rk or 'runs'} "
                    f"({detail.get('real_error', '')})")
  elif sk == "smem" and (sim_err.smem_bytes, sim_err.max_smem_bytes) != _smem_numbers(real_err):
    problems.append(f"SMEM numbers differ: {detail['sim_error']} vs {detail['real_error']}")
  if rk is None or rk == sk == _traced(real_err):
    return problems
  # What the simulator's own checks say, without the real lowering.
  _, _, model_err = run_sim(case, check_lowering=False)
  model = sim_kind(model_err) if model_err is not None else "runs"
  detail["model_alone"] = model
  if rk == "smem" and (model != "smem" or (model_err.smem_bytes, model_err.max_smem_bytes)
                       != _smem_numbers(real_err)):
    problems.append(f"the model alone does not reject the SMEM overflow the lowering "
                    f"reports ({detail['real_error']}): {model}")
  if case.model_rejects or rk == "smem":
    if model != rk:
      problems.append(f"the model alone should reject this kernel ({rk}), but: "
                      f"{model} ({_first_line(model_err) if model_err else ''})")
    elif isinstance(sim_err, ps.LoweringError):
      problems.append("the simulator's own check should come before the lowering's, "
                      f"but the first error is the lowering's: {detail['sim_error']}")
  return problems


def check(case):
  """Runs the case; returns (outcome, problems). Outcome: "agree",
  "both-rejected" or "disagree"."""
  m = mode()
  t0 = time.perf_counter()
  sim_out, sim_smem, sim_err = run_sim(case)
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
    problems = _check_rejection(case, sim_err, real_err, detail)
    outcome = "both-rejected" if not problems else "disagree"
  else:
    if case.must_reject:
      problems.append("the family expects a rejection, but both accept the kernel")
    real_smem = lowering_smem_bytes(case)
    if sim_smem[:1] != [real_smem]:
      problems.append(f"SMEM bytes differ: simulator {sim_smem}, lowering {real_smem}")
    refs = case.reference(*_np64(case.args)) if case.reference else []
    problems += _compare(sim_out, refs, "simulator vs reference")
    detail["ratio_ref"] = max([tolerance.ratio(g, w) for g, w in zip(sim_out, refs)],
                              default=0.0)
    detail["exact_ref"] = all(bool((w.lo == w.hi).all()) for w in refs)
    if real_out is not None:
      problems += _compare(real_out, refs, "real vs reference")
      bit = [p for g, r in zip(sim_out, real_out) for p in tolerance.bit_mismatches(g, r)]
      detail["equal_real"] = not bit
      if case.exact:
        problems += [f"simulator vs real (claimed bit-exact): {p}" for p in bit]
    outcome = "agree" if not problems else "disagree"
  _log(case, m, outcome, problems, detail, time.perf_counter() - t0)
  return outcome, problems


def _log(case, m, outcome, problems, detail, seconds):
  path = os.environ.get("AGREEMENT_LOG")
  if not path:
    return
  rec = dict(family=case.family, desc=case.desc, mode=m, outcome=outcome,
             exact=case.exact, problems=problems, seconds=round(seconds, 3), **detail)
  with open(path, "a") as f:
    f.write(json.dumps(rec) + "\n")


def assert_agree(case):
  __tracebackhide__ = True
  outcome, problems = check(case)
  assert outcome != "disagree", (f"[{case.family}] {case.desc}:\n  "
                                 + "\n  ".join(problems))
  return outcome
