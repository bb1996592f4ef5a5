"""A timing plan's measurements read back on the CPU: each step's
h200_measured.json (lab/timing_plan.sh writes one a step) merged into
lab/data/h200_measured.json under a key that says what it holds, with its
provenance (the command, when, on what, at which commit).

    ./dev python -m lab.read_back PLAN_DIR --date 2026_12_05 [--summary PLAN.txt ...]

PLAN_DIR holds `timing_plan/<step>/` as the plan's .tgz unpacks. Steps and
their keys: rows, l2, l2half, copyown, smemrw, smemscale, gmem, sem and hbmrows
(micros) -> micros_<date>_rows, _l2_lag, _l2_half, _own_streams, _smem_rw,
_smem_rw_scale, _plain_load, _sem, _hbm_rows_narrow; blind3 to blind6 (the third
to sixth blind sets) -> families_study_3 to _6, and blocks (the matmuls at three K
each, and their loads alone) -> families_study_blocks, which benchmarks/accuracy.py --families scores against their committed
predictions; again (every family a second time)
-> families_again_<date>, each row's noise for accuracy.py; again5 (the fifth
blind set a second time) -> families_again_<date>_blind5, and the rows its first
run missed -> families_study_5_late. A key already there is left alone unless
--replace.
"""
import argparse
import json
import os
import re

MEASURED = os.path.join(os.path.dirname(__file__), "data", "h200_measured.json")

# step -> (key pattern, which list of the step's file, what it is)
STEPS = {
    "rows": ("micros_{date}_rows", "micros",
             "row max/sum micros (calibrate row_*): the exchange across a row's lanes"),
    "l2": ("micros_{date}_l2_lag", "micros",
           "L2 streams whose readers share tiles out of step (calibrate l2_lag*)"),
    "l2half": ("micros_{date}_l2_half", "micros",
               "L2 streams whose readers share tiles in step (calibrate l2_half*)"),
    "blind3": ("families_study_3", "cases",
               "our own families' third set (lab/families.py, names ending "
               "'(blind 3)'), measured after their blind predictions "
               "(lab/data/blind_predictions_own_families_3.json) were committed"),
    "blind4": ("families_study_4", "cases",
               "our own families' fourth set (lab/families.py, names ending "
               "'(blind 4)'), measured after their blind predictions "
               "(lab/data/blind_predictions_own_families_4.json) were committed"),
    "blind5": ("families_study_5", "cases",
               "our own families' fifth set (lab/families.py, names ending "
               "'(blind 5)'), measured after their blind predictions "
               "(lab/data/blind_predictions_own_families_5.json) were committed"),
    "blind6": ("families_study_6", "cases",
               "our own families' sixth set, kinds none of the others has: column "
               "sums, a matmul with a fused bias and SiLU, and GELU by plain GMEM "
               "loads and stores (lab/families.py, names "
               "ending '(blind 6)'), measured after their blind predictions "
               "(lab/data/blind_predictions_own_families_6.json) were committed"),
    "hbmrows": ("micros_{date}_hbm_rows_narrow", "micros",
                "HBM read in boxes of 16- and 32-byte rows of long rows (calibrate "
                "hbm_rows_16b_*, _32b_*), measured after their predictions "
                "(lab/data/blind_predictions_micros_hbm_rows_narrow.json) were committed"),
    "blocks": ("families_study_blocks", "cases",
               "where a matmul block's time goes (lab/families.py, names ending "
               "'(block study)'): the warp-specialized and fp8 matmuls at three K "
               "each, and their loads alone, measured after their blind predictions "
               "(lab/data/blind_predictions_own_families_blocks.json) were committed"),
    "copyown": ("micros_{date}_own_streams", "micros",
                "one block an SM reading its own tiles with two slots, and copying them "
                "back by TMA store (calibrate stream_own_*, copy_own_*)"),
    "smemrw": ("micros_{date}_smem_rw", "micros",
               "a warpgroup's tile loaded from SMEM, negated and stored back, or only "
               "loaded or stored: the row kernels' body alone (calibrate smem_rw_*), "
               "measured after their predictions (lab/data/"
               "blind_predictions_micros_smem_rw.json) were committed"),
    "smemscale": ("micros_{date}_smem_rw_scale", "micros",
                  "RMSnorm's second body alone, no TMA beside it: a tile and a row "
                  "vector loaded from SMEM, scaled by both and stored back "
                  "(calibrate smem_rw_scale_*), measured after their predictions "
                  "(lab/data/blind_predictions_micros_smem_rw_scale.json) were committed"),
    "gmem": ("micros_{date}_plain_load", "micros",
             "plain GMEM loads, one block: a dependent scalar chain and a loop of row "
             "loads, from the L1, the L2 and HBM (calibrate plain_load_*), measured after "
             "their predictions (lab/data/blind_predictions_micros_plain_load.json) were "
             "committed"),
    "sem": ("micros_{date}_sem", "micros",
            "global semaphores: two blocks handing a token back and forth "
            "(calibrate sem_pingpong) and one block's signals in a row "
            "(sem_signals), measured after their predictions "
            "(lab/data/blind_predictions_micros_sem.json, _sem_signals.json) were "
            "committed"),
    "again": ("families_again_{date}", "cases",
              "every family of lab/families.py a second time, sustained: each row's "
              "noise for benchmarks/accuracy.py"),
    "again5": ("families_again_{date}_blind5", "cases",
               "the fifth blind set a second time, sustained: its rows' noise for "
               "benchmarks/accuracy.py (rows its first run did not reach go to "
               "families_study_5_late)"),
}
# A second run's rows that no study holds yet are that study's, late.
LATE = {"again5": ("families_study_5_late",
                   "rows of the fifth blind set (lab/timing_suite.py families, names "
                   "ending '(blind 5)') its first run (families_study_5) did not reach, "
                   "measured after their blind predictions "
                   "(lab/data/blind_predictions_own_families_5.json) were committed")}


def _command(log_text, step):
  """The step's command line, from its log's '== step: ...: CMD' line."""
  m = re.search(rf"^== {step}: .*?\): (.*)$", log_text, re.M)
  return m.group(1).strip() if m else None


def _commit(summaries):
  for path in summaries:
    # (the plan prints "commit", the measurements' notes "project commit")
    m = re.search(r"^(?:project )?commit ([0-9a-f]{7,40})", open(path).read(), re.M)
    if m:
      return m.group(1)
  return None


def read_back(plan_dir, date, summaries=(), replace=False, measured=MEASURED):
  """Merges the plan's steps into `measured`; returns {key: rows merged}."""
  data = json.load(open(measured))
  commit = _commit(summaries)
  done = {}
  for step, (pattern, field, what) in STEPS.items():
    folder = os.path.join(plan_dir, "timing_plan", step)
    path = os.path.join(folder, "h200_measured.json")
    if not os.path.exists(path):
      continue
    got = json.load(open(path))
    rows = got.get(field) or []
    if not rows:
      raise SystemExit(f"{path}: no {field} measured: nothing to read back for {step}")
    key = pattern.format(date=date)
    if key in data and not replace:
      raise SystemExit(f"{key} is in {measured} already (--replace to overwrite)")
    log = os.path.join(folder, "log.txt")
    command = _command(open(log).read(), step) if os.path.exists(log) else None
    for name in summaries:  # (the step's line is in its call's summary too)
      command = command or _command(open(name).read(), step)
    entry = {"command": command, "time": date.replace("_", "-"), "env": got.get("env"),
             "note": f"{what}; lab/timing_plan.sh at commit {commit or '?'}",
             field: rows}
    if got.get("micro_raw"):
      entry["micro_raw"] = got["micro_raw"]
    data[key] = entry
    done[key] = len(rows)
    if step in LATE:
      late_key, late_what = LATE[step]
      have = {r["name"] for k, v in data.items() if k.startswith("families_study")
              for r in v.get("cases", [])}
      late = [r for r in rows if r["name"] not in have and r.get("median_s")]
      if late:
        data[late_key] = {**entry, "note": f"{late_what}; lab/timing_plan.sh at commit "
                                           f"{commit or '?'}", field: late}
        done[late_key] = len(late)
  with open(measured, "w") as f:  # (as the file is written: indent 1, no last newline)
    json.dump(data, f, indent=1)
  return done


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("plan_dir")
  ap.add_argument("--date", required=True, help="YYYY_MM_DD, as keys name it")
  ap.add_argument("--summary", nargs="*", default=[],
                  help="the plan's .txt summaries (the commit it ran at)")
  ap.add_argument("--replace", action="store_true")
  ns = ap.parse_args(argv)
  for key, n in read_back(ns.plan_dir, ns.date, ns.summary, ns.replace).items():
    print(f"{key}: {n} rows")


if __name__ == "__main__":
  main()
