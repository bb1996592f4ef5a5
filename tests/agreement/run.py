"""The agreement suite in one command, with a per-family summary.

    python3 tests/agreement/run.py                 # thorough profile, GPU if any
    python3 tests/agreement/run.py --profile ci    # the quick CI profile

Uses this checkout's own code (it puts the repository on PYTHONPATH; nothing is
installed or fetched, so it runs on a GPU machine without network that has
jax/jaxlib 0.11.2 with CUDA, pytest and hypothesis). On a Hopper GPU it
compares the simulator with the real Mosaic GPU lowering; elsewhere with NumPy.
Each family runs in its own pytest processes (`--shards` per family, with
different hypothesis seeds), in parallel. Prints: examples tried per family,
agreements, kernels both sides reject, disagreements with the hypothesis
reproduction. Writes logs and SUMMARY.md to --out (default $OUT or
agreement-results). Exit status 1 on any disagreement.
"""
import argparse
import collections
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, HERE, os.path.dirname(HERE)]
from families import FAMILIES  # noqa: E402  (the test file has one test per family)


def run_shard(family, shard, args):
  log = os.path.join(args.out, f"{family}-{shard}.jsonl")
  out = os.path.join(args.out, f"{family}-{shard}.pytest.txt")
  for p in (log, out):
    if os.path.exists(p):
      os.remove(p)
  env = dict(os.environ, AGREEMENT_LOG=log, HYPOTHESIS_PROFILE=args.profile,
             PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
             XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
  if args.examples:
    env["HYPOTHESIS_MAX_EXAMPLES"] = str(args.examples)
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         os.path.join(HERE, "test_agreement.py") + f"::test_{family}",
         f"--hypothesis-seed={args.seed + shard}", "--hypothesis-show-statistics"]
  t0 = time.time()
  try:
    p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=args.timeout)
    text, rc = p.stdout + p.stderr, p.returncode
  except subprocess.TimeoutExpired as e:
    text = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    text += f"\n[timed out after {args.timeout} s]"
    rc = "timeout"
  with open(out, "w") as f:
    f.write(text)
  recs = []
  if os.path.exists(log):
    with open(log) as f:
      recs = [json.loads(line) for line in f if line.strip()]
  return family, shard, rc, time.time() - t0, recs, text


def _repro(text):
  """The hypothesis reproduction from a failing pytest run."""
  keep = []
  m = re.search(r"Falsifying example:.*?(?=\n\S|\Z)", text, re.S)
  if m:
    keep.append(m.group(0).strip())
  keep += re.findall(r"@reproduce_failure\(.*\)", text)
  keep += re.findall(r"E\s+AssertionError: (\[.*)", text)[:1]
  return "\n".join(keep)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--profile", default="thorough", choices=["ci", "thorough"])
  ap.add_argument("--families", nargs="*", default=list(FAMILIES),
                  choices=list(FAMILIES))
  ap.add_argument("--shards", type=int, default=2,
                  help="pytest processes per family (different seeds)")
  ap.add_argument("--seed", type=int, default=0,
                  help="hypothesis seed of the first shard (the others: the next ones)")
  ap.add_argument("--examples", type=int, default=None,
                  help="examples per shard (default: the profile's)")
  ap.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 2))
  ap.add_argument("--timeout", type=int, default=540, help="seconds per shard")
  ap.add_argument("--out", default=os.environ.get("OUT") or "agreement-results")
  args = ap.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  args.out = os.path.abspath(args.out)

  import jax
  from pallas_sim.backends import mosaic
  dev = mosaic.hopper_device()
  header = (f"pallas-sim agreement suite, {time.strftime('%Y-%m-%d %H:%M')}; "
            f"jax {jax.__version__}; "
            + (f"simulator vs real Mosaic GPU on {dev.device_kind}" if dev
               else "simulator vs NumPy reference (no Hopper GPU; the lowering "
                    "runs on the CPU to say what must be rejected)")
            + f"; profile {args.profile}, {args.shards} shard(s) per family, seeds "
            f"{args.seed}..{args.seed + args.shards - 1}")
  print(header, flush=True)

  jobs = [(f, s) for f in args.families for s in range(args.shards)]
  results = []
  with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
    futs = [pool.submit(run_shard, f, s, args) for f, s in jobs]
    for fut in concurrent.futures.as_completed(futs):
      fam, shard, rc, secs, recs, text = fut.result()
      print(f"  {fam}[{shard}]: {len(recs)} examples, exit {rc}, {secs:.0f} s",
            flush=True)
      results.append((fam, shard, rc, secs, recs, text))

  rows, failures = [], []
  for fam in args.families:
    mine = [r for r in results if r[0] == fam]
    recs = [x for r in mine for x in r[4]]
    rows.append((fam, recs))
    for _, shard, rc, _, shard_recs, text in mine:
      bad = [x for x in shard_recs if x["outcome"] == "disagree"]
      if rc != 0 or bad:
        failures.append((fam, shard, rc, bad, _repro(text)))

  def worst(recs, key):
    vals = [x[key] for x in recs if key in x]
    return f"{max(vals):.2f}" if vals else "-"

  lines = [header, "",
           "| family | examples | agree | both reject | disagree | claimed bit-exact "
           "| bit-equal to GPU | exact reference | worst outside/width vs reference "
           "| model alone rejects | seconds |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
  tot = collections.Counter()
  for fam, recs in rows:
    c = collections.Counter(x["outcome"] for x in recs)
    ran = [x for x in recs if x["outcome"] != "both-rejected" and "ratio_ref" in x]
    claimed = sum(1 for x in ran if x.get("exact"))
    equal = sum(1 for x in ran if x.get("equal_real"))
    exact_ref = sum(1 for x in ran if x.get("exact_ref"))
    rej = [x for x in recs if "model_alone" in x]
    model = sum(1 for x in rej if x["model_alone"] != "runs")
    tot.update(dict(n=len(recs), agree=c["agree"], rej=c["both-rejected"],
                    dis=c["disagree"], claimed=claimed, eq=equal, xref=exact_ref,
                    model=model, rejn=len(rej)))
    lines.append(
        f"| {fam} | {len(recs)} | {c['agree']} | {c['both-rejected']} | "
        f"{c['disagree']} | {claimed} | {equal if dev else '-'} | {exact_ref} | "
        f"{worst(recs, 'ratio_ref')} | {model}/{len(rej)} | "
        f"{sum(x['seconds'] for x in recs):.0f} |")
  lines.append(f"| **all** | {tot['n']} | {tot['agree']} | {tot['rej']} | {tot['dis']} "
               f"| {tot['claimed']} | {tot['eq'] if dev else '-'} | {tot['xref']} | | "
               f"{tot['model']}/{tot['rejn']} | |")
  lines += ["", "Claimed bit-exact: examples whose outputs must be bit-identical to the "
            "GPU's (asserted on a GPU). Exact reference: examples whose reference "
            "(tests/agreement/tolerance.py) is a single value per element. Worst "
            "outside/width: how far outside its range the worst element was (0 = inside). "
            "Model alone rejects: of the kernels the real lowering rejects, how many the "
            "simulator rejects with its own checks only (check_lowering=False); the suite "
            "asserts this for SMEM overflows and the rejected family's kernels."]
  if failures:
    lines += ["", "## Disagreements / failures"]
    for fam, shard, rc, bad, repro in failures:
      lines.append(f"\n### {fam} (shard {shard}, pytest exit {rc})")
      seen = set()
      for x in bad:
        if x["desc"] in seen:
          continue
        seen.add(x["desc"])
        lines.append(f"- {x['desc']}")
        lines += [f"  - {p}" for p in x["problems"]]
      if repro:
        lines += ["", "```", repro, "```"]
  text = "\n".join(lines)
  print("\n" + text)
  with open(os.path.join(args.out, "SUMMARY.md"), "w") as f:
    f.write(text + "\n")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
