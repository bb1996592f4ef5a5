"""The timing model against the H200: predicted (ps.estimate, on this CPU)
beside measured (lab/measure_gpu.py on the GPU machine, committed as
lab/data/h200_measured.json), for every kernel of lab/timing_suite.py.

    ./dev python -m benchmarks.accuracy [--measured FILE] [--filter S] [--small]
        [--no-clock] [--diagnostic | --holdout | --blind] [--predictions FILE]

(a module, run from the repository root: it reads the lab's suite and data,
lab/timing_suite.py and lab/data/.)

Prints one row per kernel (measured, predicted, error, the bound the model
names, estimate's wall time), then per family the Spearman rank correlation
of predicted against measured times (does the model rank configurations of
one kernel right?), and the mean and largest absolute error over the rows
that are not small (rows under ~150 us are launch- and L2-dominated on this
GPU: --small includes them). No constant per kernel, no per-shape correction:
every figure the model uses is in pallas_sim/gpus.py.

The measured time counted (--truth) is by default the sustained one: each
kernel timed after a second of back-to-back calls, when the SM clock has
settled where the 700 W power limit puts it (1035-1905 MHz for the large
matmuls), as it runs in any loop longer than a fraction of a second. The
short-batch time (25 ms batches straight after compiling, whatever the clock
was then: it scatters up to 11% from the sustained one) is printed beside
it.

Small rows are timed 32 calls chained in one program (chain_per_kernel_s),
which hides the host's dispatch (timing_suite.measured_seconds).

The model predicts that clock (timing/power.py). Where the power study measured a
kernel's (power_study_suite in the measured file: its median SM clock over 1.5
s of a sustained run; for a row timed in a chain, the chain's clock), the
kernel is predicted again at it (ps.Options clock_mhz): that column is the
model's error were the clock known, and it says how much of the error is the
clock's (--no-clock: skip it).

--diagnostic: timing_suite.DIAGNOSTIC_CASES instead (the quickstart's pipeline
taken apart: its loads alone, its wgmmas on one tile, each with scalar work in
the wgmma's place), against their sustained times and clocks ("pipeline_study"
in the measured file).

--holdout: timing_suite.HOLDOUT_CASES (kernels, sizes and dtypes never used to
set a figure), against "holdout_study" in the measured file; with
--predictions FILE, every one is predicted and written there, measured or
not (lab/data/holdout_predictions.json was written so, and committed,
before the GPU first ran them).

--blind: timing_suite.BLIND_CASES, against "blind_study" (predicted into
lab/data/blind_predictions_quickstart_attention.json, committed, before they were measured).

--families: lab/families.py's kernels of our own (six families the model was
never fitted to), against "families_study" in the measured file."""
import argparse
import json
import os
import sys

import numpy as np

from lab import DATA, timing_suite
from lab.timing_suite import predict
from pallas_sim.compare import RESOLUTION


def spearman(x, y):
  """Rank correlation (ties get their mean rank)."""
  def ranks(v):
    v = np.asarray(v, dtype=float)
    order = np.argsort(v, kind="stable")
    r = np.empty(len(v))
    r[order] = np.arange(len(v))
    for val in np.unique(v):
      tie = v == val
      r[tie] = r[tie].mean()
    return r
  if len(x) < 2:
    return float("nan")
  rx, ry = ranks(x), ranks(y)
  if rx.std() == 0 or ry.std() == 0:
    return float("nan")
  return float(np.corrcoef(rx, ry)[0, 1])


def noise_of(name, t, again, spread):
  """A row's run-to-run noise, relative: the difference between its two
  sustained runs where it has been measured twice, else its batches' own
  spread; never under compare.RESOLUTION (the H200's run-to-run spread
  over the 673 rows measured before)."""
  other = again.get(name) if again else None
  own = abs(t / other - 1) if other else (spread or {}).get(name, 0.0)
  return max(RESOLUTION, own)


def apart(fr, noise):
  """The pairs of rows (case, measured, predicted, ...) whose measured times
  differ by more than either's noise: (i, j) with row i measured faster."""
  out = []
  for i, a in enumerate(fr):
    for b in fr[i + 1:]:
      lo, hi = (a, b) if a[1] <= b[1] else (b, a)
      if hi[1] / lo[1] - 1 > max(noise[a[0].name], noise[b[0].name]):
        out.append((lo, hi))
  return out


def ordered_share(pairs):
  """Of pairs told apart on the GPU, the share the model orders the same
  way; a pair predicted within compare.RESOLUTION of each other (the model
  cannot tell them apart) counts half."""
  if not pairs:
    return float("nan")
  score = sum(0.5 if abs(hi[2] / lo[2] - 1) <= RESOLUTION else float(hi[2] > lo[2])
              for lo, hi in pairs)
  return score / len(pairs)


def misordered(pairs):
  """Of pairs told apart on the GPU (apart), those the model orders the
  other way by more than compare.RESOLUTION."""
  return [(lo, hi) for lo, hi in pairs if lo[2] / hi[2] - 1 > RESOLUTION]


def _config(case, family):
  """A row's name less its family's (what the configuration is)."""
  return case.name[len(family):].strip() if case.name.startswith(family) else case.name


def noise_ranks(fr, noise):
  """The measured times with configurations within noise of each other made
  equal (fastest first, a group closes at the first row past its fastest's
  noise): what the H200 tells apart, for a Spearman that counts no
  ordering inside the noise."""
  order = sorted(fr, key=lambda r: r[1])
  out, head = {}, None
  for r in order:
    if head is None or r[1] / head[1] - 1 > max(noise[head[0].name], noise[r[0].name]):
      head = r
    out[r[0].name] = head[1]
  return [out[r[0].name] for r in fr]


def summarize(rows, title, small, again=None, spread=None):
  """Per family: Spearman of predicted against measured, mean abs error;
  then the mean and largest over the rows counted. rows: (case, measured,
  predicted, error). again: a second measurement of the rows (name ->
  seconds), where there is one: the GPU's Spearman against itself says
  whether the family's ranking reproduces on the GPU at all (configurations
  within its run-to-run noise of each other do not). spread: name -> a
  row's own batches' spread, the noise where there is no second run.

  Beside the plain Spearman, the ranking where the GPU's differences exceed
  its noise (noise_of): the Spearman with configurations measured within
  noise of each other tied, and of the pairs told apart on the GPU, the
  share the model orders the same way."""
  print(f"\n{title}\n")
  print("| family | rows | Spearman (predicted vs measured) | Spearman, measured within "
        "noise tied | pairs apart past the noise: ordered right | mean abs error | "
        "the GPU against itself (Spearman of two sustained runs) |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  wrong = []  # (family, lo, hi): the pairs the model orders the other way
  for fam in dict.fromkeys(r[0].family for r in rows):
    fr = [r for r in rows if r[0].family == fam]
    rho = spearman([r[1] for r in fr], [r[2] for r in fr])
    noise = {r[0].name: noise_of(r[0].name, r[1], again, spread) for r in fr}
    rho_noise = spearman(noise_ranks(fr, noise), [r[2] for r in fr])
    pairs = apart(fr, noise)
    share = ordered_share(pairs)
    wrong += [(fam, lo, hi) for lo, hi in misordered(pairs)]
    twice = [r for r in fr if again and r[0].name in again]
    self_rho = (f"{spearman([r[1] for r in twice], [again[r[0].name] for r in twice]):.2f}"
                if len(twice) == len(fr) else "")
    print(f"| {fam} | {len(fr)} | {rho:.2f} | {rho_noise:.2f} | "
          f"{share:.0%} of {len(pairs)} | "
          f"{np.mean([abs(r[3]) for r in fr]):.0%} | {self_rho} |")
  if wrong:
    print("\nPairs the H200 tells apart past the noise and the model orders the other "
          "way (a pair within compare.RESOLUTION in the model is not listed: it says "
          "it cannot tell them apart):\n")
    for fam, lo, hi in wrong:
      print(f"* {fam}: `{_config(lo[0], fam)}` {lo[1] * 1e6:.1f} us < "
            f"`{_config(hi[0], fam)}` {hi[1] * 1e6:.1f} us on the H200; the model "
            f"{lo[2] * 1e6:.1f} / {hi[2] * 1e6:.1f}")
  counted = [r for r in rows if small or not r[0].small]
  if counted:
    errs = [abs(r[3]) for r in counted]
    print(f"\nover {len(counted)} rows{'' if small else ' (not small)'}: mean absolute "
          f"error {np.mean(errs):.1%}, largest {max(errs):.1%} "
          f"({max(counted, key=lambda r: abs(r[3]))[0].name}), "
          f"{sum(e > 0.25 for e in errs)} past 25%")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--measured", default=os.path.join(DATA, "h200_measured.json"))
  ap.add_argument("--gpu", default="h200")
  ap.add_argument("--filter", default="")
  ap.add_argument("--small", action="store_true", help="count small rows too")
  ap.add_argument("--truth", choices=("sustained", "short"), default="sustained",
                  help="which measurement the figures count (both are printed)")
  ap.add_argument("--clock", action=argparse.BooleanOptionalAction, default=True,
                  help="also predict each kernel at its measured clock")
  timing_suite.add_kind_args(ap)
  ap.add_argument("--predictions", default=None, metavar="FILE",
                  help="write every case's prediction (at the model's own clock) to "
                       "FILE as JSON, measured or not: the held-out kernels' "
                       "predictions are committed before they are measured")
  ap.add_argument("--from-predictions", default=None, metavar="FILE",
                  help="take each kernel's prediction from FILE (written by "
                       "--predictions) instead of estimating it again: the held-out "
                       "kernels' blind predictions against their measurements")
  ns = ap.parse_args(argv)
  saved_before = (json.load(open(ns.from_predictions))["predictions"]
                  if ns.from_predictions else None)
  if saved_before is not None:
    ns.clock = False
  data = json.load(open(ns.measured))
  power_rows = data.get("power_study_suite", {}).get("rows", [])
  clocks = timing_suite.sustained_clocks(power_rows) if ns.clock else {}
  if ns.clock:  # (a row timed in a chain ran at the chain's clock)
    chained = [r for r in data.get("sustained", {}).get("cases", []) if r.get("chain_clock")]
    clocks.update(timing_suite.sustained_clocks(chained))
  kind = timing_suite.kind_of(ns)
  cases = timing_suite.cases(kind)
  if kind != "suite":  # (measured sustained, each with its clock)
    study = timing_suite.study_rows(data, kind)
    # (a second sustained run of a study's rows, for their noise:
    # "families_again_...")
    again_key = timing_suite.STUDIES[kind].split("_")[0] + "_again"
    repeat = [r for k in sorted(data) if k.startswith(again_key)
              for r in data[k].get("cases", [])]
    data = dict(cases=[], sustained=dict(cases=study))
    clocks = timing_suite.sustained_clocks(study) if ns.clock else {}
  # (small rows: the per-kernel time of 32 chained in one program, which
  # hides host dispatch, where measured (else of two, which hides half);
  # others: the median time per call)
  seconds = lambda cases: {r["name"]: timing_suite.measured_seconds(r)
                           for r in cases if r.get("median_s")}
  short = seconds(data["cases"])
  sustained = seconds(data.get("sustained", {}).get("cases", []))
  measured = sustained if ns.truth == "sustained" else short
  other = short if ns.truth == "sustained" else sustained
  # (a second sustained run of each suite row: the power study's per-call
  # time, 1.5 s of calls; for a small row, which that run timed with host
  # dispatch, the short-batch chain)
  power_runs = ({r["name"]: r["per_call_s"] for r in power_rows if r.get("per_call_s")}
                if kind == "suite" else {})
  again = {c.name: (short if c.small else power_runs).get(c.name) for c in cases}
  again = {k: v for k, v in again.items() if v}
  if kind != "suite":
    again = seconds(repeat)
  spread = {r["name"]: r["spread"] for r in data.get("sustained", {}).get("cases", [])
            if r.get("spread") is not None}
  rows, at_clock = [], []
  print(f"| kernel | measured, {ns.truth} (us) | predicted (us) | error | "
        f"error against the {'short-batch' if ns.truth == 'sustained' else 'sustained'} "
        "time | bound (model) | model's clock (MHz) | estimate (s) | measured clock (MHz) | "
        "predicted there (us) | error |")
  print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|")
  clock_err = []
  saved = {}
  for case in cases:
    if ns.filter not in case.name or (case.name not in measured and not ns.predictions):
      continue
    if saved_before is not None:
      if case.name not in saved_before or case.name not in measured:
        continue
      p = saved_before[case.name]
      t_real = measured[case.name]
      rows.append((case, t_real, p["predicted_s"], p["predicted_s"] / t_real - 1))
      print(f"| {case.name} | {t_real * 1e6:.1f} | {p['predicted_s'] * 1e6:.1f} | "
            f"{rows[-1][3]:+.0%} | | {p['bound']} | | {p['estimate_s']:.2f} | | | |")
      continue
    try:
      report, wall = predict(case, ns.gpu)
    except Exception as e:  # (a kernel the simulator rejects: say so, go on)
      print(f"| {case.name} | {measured.get(case.name, float('nan')) * 1e6:.1f} | "
            f"{type(e).__name__}: {str(e).splitlines()[0][:80]} | | | | |")
      continue
    t_pred = report.time_s
    bounds = ", ".join(sorted({k.bound for k in report.kernels}))
    mhz_model = min(k.sm_mhz for k in report.kernels) if report.kernels else float("nan")
    if ns.predictions:
      saved[case.name] = dict(predicted_s=t_pred, bound=bounds, estimate_s=wall,
                              sm_mhz=mhz_model)
      json.dump(dict(command="./dev python -m benchmarks.accuracy " + " ".join(
          argv if argv is not None else sys.argv[1:]), gpu=ns.gpu,
          predictions=saved), open(ns.predictions, "w"), indent=1)
    if case.name not in measured:
      print(f"| {case.name} | (not measured) | {t_pred * 1e6:.1f} | | | {bounds} | "
            f"{mhz_model:.0f} | {wall:.2f} | | | |")
      continue
    t_real = measured[case.name]
    err = t_pred / t_real - 1
    err2 = f"{t_pred / other[case.name] - 1:+.0%}" if case.name in other else ""
    rows.append((case, t_real, t_pred, err))
    there = "| | |"
    if case.name in clocks:
      mhz = clocks[case.name]
      if not case.small:
        clock_err.append(abs(mhz_model / mhz - 1))
      t_clk = predict(case, ns.gpu, mhz)[0].time_s
      at_clock.append((case, t_real, t_clk, t_clk / t_real - 1))
      there = f"{mhz:.0f} | {t_clk * 1e6:.1f} | {at_clock[-1][3]:+.0%}"
    print(f"| {case.name}{' (small)' if case.small else ''} | {t_real * 1e6:.1f} | "
          f"{t_pred * 1e6:.1f} | {err:+.0%} | {err2} | {bounds} | {mhz_model:.0f} | "
          f"{wall:.2f} | {there} |")
  summarize(rows, "Predicted (the model's own clocks) against measured:", ns.small, again,
            spread)
  if clock_err:
    print(f"\nthe model's clock against the measured one, over {len(clock_err)} rows (not "
          f"small): mean absolute error {np.mean(clock_err):.1%}, largest "
          f"{max(clock_err):.0%}")
  if at_clock:
    summarize(at_clock, "Predicted at each kernel's measured clock against measured:",
              ns.small, again, spread)


if __name__ == "__main__":
  main()
