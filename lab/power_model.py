"""The SM clock that the 700 W limit sets: the fit whose figures
gpus.GPU.power_* hold (backends/sim/timing/power.py predicts the clock with
them), and its checks.

    ./dev python -m lab.power_model dump [--out build/power_features.json]
    ./dev python -m lab.power_model fit [--features build/power_features.json]
    ./dev python -m lab.power_model dump --diagnostic --out build/power_diagnostic.json
    ./dev python -m lab.power_model check   # that fit on the diagnostic kernels
    ./dev python -m lab.power_model dump --micros --out build/power_micros.json
    ./dev python -m lab.power_model check --others build/power_micros.json

`dump` estimates every suite and held-out kernel whose sustained clock and power
were measured (power_study_suite, power_study_holdout in h200_measured.json)
at two SM clocks (ps.Options clock_mhz) and its default (the model's own
predicted clock, since that became the default): its work (tensor FLOP, bytes through
the L2 and to HBM: the same at every clock) and its predicted time at each.

`fit` fits, on the measured rows, a power model of the usual form

    P = P0 + s(f) * (e_tc * FLOP/s + e_l2 * L2 bytes/s) + e_hbm * HBM bytes/s
    s(f) = (1 - beta * (1 - f / 1980))^2     (the voltage falls with the clock)

(rates from the measured time at the measured clock), by least squares for each
beta on a grid, with each family of kernels left out in turn; then predicts
each kernel's clock as the highest at which the model's power, with the
model's own times at that clock (a + b / f through the two dumped clocks), is
within 700 W, and prints predicted against measured clocks and the time
predicted there against the measured time.
"""
import argparse
import dataclasses
import json
import os

import numpy as np

from pallas_sim import gpus
from pallas_sim.backends.sim.timing import power

from lab import DATA

CLOCKS = (1980, 1200)
LIMIT_W = 700.0


STUDIES = ("power_study_suite", "power_study_holdout")
# Tensor-core loops on random normal operands (power_study_random): kernels of
# the tensor cores alone, at the power limit (688-698 W).
MICROS = ("wgmma_f16_m128n128_1per_sm_normal", "wgmma_f16_m128n128_2per_sm_normal",
          "wgmma_bf16_m128n128_1per_sm_normal", "wgmma_fp8_m128n128_1per_sm_normal")


def _measured(studies=STUDIES):
  d = json.load(open(os.path.join(DATA, "h200_measured.json")))
  rows = {}
  for key in studies:
    for r in d.get(key, {}).get("rows", []):
      if r.get("kind") == "suite" and r.get("clock") and r.get("per_call_s"):
        rows[r["name"]] = dict(mhz=r["clock"]["sm_mhz"], watts=r["clock"]["power_w"],
                               seconds=r["per_call_s"])
  return rows


def _micro_rows():
  d = json.load(open(os.path.join(DATA, "h200_measured.json")))
  return {r["name"]: dict(mhz=r["clock"]["sm_mhz"], watts=r["clock"]["power_w"],
                          seconds=r["per_call_s"])
          for r in d["power_study_random"]["rows"] if r["name"] in MICROS}


def _estimate_micro(name, mhz=None):
  """A micro-benchmark at the n its power was measured at (power_study.py:
  n2), estimated."""
  import pallas_sim as ps
  from lab import calibrate
  m = calibrate.by_name(name)
  b = m.build(m.n2)
  return ps.estimate(b.fn, *b.args, gpu="h200", clock_mhz=mhz)


def dump(out, studies=STUDIES, micros=False):
  from lab import timing_suite
  rows = _micro_rows() if micros else _measured(studies)
  res = {}
  for name, m in rows.items():
    if micros:
      est = lambda mhz=None: _estimate_micro(name, mhz)
      family = "tensor-core loops"
    else:
      case = timing_suite.by_name(name)
      if name.startswith("hopper_matmul 8192 f16"):  # (a minute an estimate: left out)
        continue
      est = lambda mhz=None: timing_suite.predict(case, "h200", mhz)[0]
      family = case.family
    times = {"default": est().time_s}
    for mhz in CLOCKS:
      report = est(mhz)
      times[mhz] = report.time_s
    flops, l2, hbm = (sum(x) for x in zip(*(power.work(k) for k in report.kernels)))
    res[name] = dict(m, family=family, model_s=times, flops=flops, l2_bytes=l2,
                     hbm_bytes=hbm)
    print(f"{name}: {times}", flush=True)
    json.dump(res, open(out, "w"), indent=1)


def _design(rows, beta, mhz=None, seconds=None):
  f = np.array([r["mhz"] for r in rows]) if mhz is None else mhz
  t = np.array([r["seconds"] for r in rows]) if seconds is None else seconds
  s = (1 - beta * (1 - f / 1980.0)) ** 2
  flops = np.array([r["flops"] for r in rows]) / t
  l2 = np.array([r["l2_bytes"] for r in rows]) / t
  hbm = np.array([r["hbm_bytes"] for r in rows]) / t
  return np.stack([np.ones_like(f, dtype=float), s * flops / 1e15, s * l2 / 1e13,
                   hbm / 1e13], axis=1)


def _fit(rows, beta):
  X = _design(rows, beta)
  y = np.array([r["watts"] for r in rows])
  coef, *_ = np.linalg.lstsq(X, y, rcond=None)
  return coef


def _model_time(r, mhz):
  """The model's time at mhz: a + b / f through the two dumped clocks (the SMs'
  work scales as 1/f, the memory system's not)."""
  return power.time_through([(c, r["model_s"][str(c)]) for c in CLOCKS])(mhz)


def _gpu(coef, beta):
  """The H200 model with this fit's power law."""
  return dataclasses.replace(gpus.H200, power_base_w=coef[0], power_w_per_pflops=coef[1],
                             power_l2_w_per_10tbs=coef[2], power_hbm_w_per_10tbs=coef[3],
                             power_voltage_beta=beta, power_limit_w=LIMIT_W)


def _predict_clock(r, coef, beta):
  """The clock the model would predict with this fit (timing/power.py's
  search), and the model's time there."""
  mhz = power.next_guess(_gpu(coef, beta), [(c, r["model_s"][str(c)]) for c in CLOCKS],
                         (r["flops"], r["l2_bytes"], r["hbm_bytes"]))
  return mhz, _model_time(r, mhz)


def check(features, others):
  """The fit on `features` (every kernel), predicting the kernels of `others`."""
  rows = [dict(r, name=n) for n, r in json.load(open(features)).items()]
  test = [dict(r, name=n) for n, r in json.load(open(others)).items()]
  _, beta = _best_beta(rows)
  coef = _fit(rows, beta)
  print("| kernel | measured MHz | W | predicted MHz | power the fit gives at the measured "
        "clock and time (W) |")
  print("|---|---:|---:|---:|---:|")
  cerr = []
  for r in test:
    mhz, _ = _predict_clock(r, coef, beta)
    p = float((_design([r], beta) @ coef)[0])
    cerr.append(abs(mhz / r["mhz"] - 1))
    print(f"| {r['name']} | {r['mhz']:.0f} | {r['watts']:.0f} | {mhz:.0f} | {p:.0f} |")
  print(f"\n{len(test)} kernels: clock error {np.mean(cerr):.1%} (largest {max(cerr):.0%})")


def _best_beta(rows):
  """(the clock error, beta) of the beta on a grid whose fits, each family
  left out of the one that predicts it, predict the clocks best."""
  fams = sorted({r["family"] for r in rows})
  best = None
  for beta in np.arange(0.0, 0.95, 0.05):
    err = []
    for fam in fams:
      coef = _fit([r for r in rows if r["family"] != fam], beta)
      err += [abs(_predict_clock(r, coef, beta)[0] / r["mhz"] - 1)
              for r in rows if r["family"] == fam]
    if best is None or np.mean(err) < best[0]:
      best = (float(np.mean(err)), beta)
  return best


def fit(features):
  data = json.load(open(features))
  rows = [dict(r, name=n) for n, r in data.items()]
  fams = sorted({r["family"] for r in rows})
  score, beta = _best_beta(rows)
  coef = _fit(rows, beta)
  print(f"beta {beta:.2f}: P = {coef[0]:.0f} W + s(f) * ({coef[1]:.0f} W per PFLOP/s + "
        f"{coef[2]:.1f} W per 10 TB/s of L2) + {coef[3]:.1f} W per 10 TB/s of HBM; "
        f"clock error, each family left out: {score:.1%}")
  print("\n| kernel | measured MHz | predicted MHz (family left out) | measured us | "
        "model at predicted clock (us) | error | model's default (us) | error |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|")
  from lab import timing_suite
  small = {r["name"]: r["name"] not in MICROS and timing_suite.by_name(r["name"]).small
           for r in rows}
  terr, derr, cerr, big = [], [], [], []
  for fam in fams:
    train = [r for r in rows if r["family"] != fam]
    coef = _fit(train, beta)
    for r in rows:
      if r["family"] != fam:
        continue
      mhz, t = _predict_clock(r, coef, beta)
      t_def = r["model_s"]["default"]
      m = r["seconds"]
      terr.append(abs(t / m - 1))
      derr.append(abs(t_def / m - 1))
      cerr.append(abs(mhz / r["mhz"] - 1))
      big.append(not small[r["name"]])
      print(f"| {r['name']} | {r['mhz']:.0f} | {mhz:.0f} | {m * 1e6:.1f} | {t * 1e6:.1f} | "
            f"{t / m - 1:+.0%} | {t_def * 1e6:.1f} | {t_def / m - 1:+.0%} |")
  for label, keep in (("", [True] * len(big)), (" not small", big)):
    pick = lambda v: [x for x, k in zip(v, keep) if k]
    print(f"\n{sum(keep)} kernels{label}: clock error {np.mean(pick(cerr)):.1%}; time "
          f"error at the predicted clock {np.mean(pick(terr)):.1%} (largest "
          f"{max(pick(terr)):.0%}), the model's default {np.mean(pick(derr)):.1%} "
          f"(largest {max(pick(derr)):.0%})")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("what", choices=("dump", "fit", "check"))
  ap.add_argument("--out", default=os.path.join("build", "power_features.json"))
  ap.add_argument("--features", default=os.path.join("build", "power_features.json"))
  ap.add_argument("--diagnostic", action="store_true",
                  help="dump: the quickstart's pipeline taken apart "
                       "(power_study_diagnostic) instead")
  ap.add_argument("--micros", action="store_true",
                  help="dump: the tensor-core loops on random data (power_study_random)")
  ap.add_argument("--others", default=os.path.join("build", "power_diagnostic.json"),
                  help="check: the kernels to predict with the fit on --features")
  ns = ap.parse_args(argv)
  if ns.what == "dump":
    dump(ns.out, ("power_study_diagnostic",) if ns.diagnostic else STUDIES, ns.micros)
  elif ns.what == "check":
    check(ns.features, ns.others)
  else:
    fit(ns.features)


if __name__ == "__main__":
  main()
