"""What ptxas and Mosaic made of the timing suite's kernels: for each
case of lab/timing_suite.py, what ptxas said (its warnings, e.g. that
wgmma instructions "are serialized", and its register count), the wgmma waits
of the PTX (wgmma.wait_group N), the transforms Mosaic gave each TMA load's
SMEM side (its own or inferred: tiling and swizzle, hence the box's rows), and,
where the dump has SASS, its wgmma instructions (HGMMA) and their waits
(WARPGROUP.DEPBAR.LE gsb0, N). Whether the compiler kept the wgmma groups in
flight that a kernel's wgmma_wait(1) asks for, and which swizzle an operand
without transforms got, are facts of the compiled kernel that the simulator,
which runs neither, must otherwise guess.

Run on the GPU machine (jax with CUDA; ptxas runs when a kernel compiles):

    python3 -m lab.sass_study --out $OUT [--set suite holdout blind
                                     diagnostic families | all] [--filter S] [--jobs 3]

Each case compiles (and runs once) in a process of its own with Mosaic GPU's
dump switches on (MOSAIC_GPU_DUMP_SASS, _PTX, _PTXAS, _TO), its dump in a
temporary folder; then every dump is read here, and OUT/sass_study.json and a
printed table give the above per case. The dumps go into OUT/sass_dumps.tgz
(`--reread FOLDER` reads an unpacked one again). SASS needs a disassembler
Mosaic finds: on the H200 machine of lab/data/sass_study_h200.json none came
out.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time

from lab import ROOT


def _child(name, out_dir):
  """Compiles and runs one case with the dump switches on (set before jax
  loads, so the C++ side reads them whichever way it does)."""
  os.makedirs(out_dir, exist_ok=True)
  os.environ.update(MOSAIC_GPU_DUMP_SASS="1", MOSAIC_GPU_DUMP_PTXAS="1",
                    MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_TO=out_dir,
                    XLA_PYTHON_CLIENT_PREALLOCATE="false")
  import jax
  from lab import timing_suite
  b = timing_suite.by_name(name).build()
  out = jax.jit(b.fn)(*b.args)
  jax.block_until_ready(out)


# A TMA load's box and the transforms Mosaic gave its SMEM side (its own or
# inferred: after_layout_inference), e.g. slice_lengths 32, 128 with
# tile<[8, 32]>, swizzle<64>.
LOAD = re.compile(r'"mosaic_gpu\.async_load".*?slice_lengths = array<i64: ([0-9, ]+)>.*?'
                  r'in_transforms = \[\[(.*?)\]\]')
WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)")
DEPBAR = re.compile(r"WARPGROUP\.DEPBAR\.LE\s+gsb0\s*,\s*(0x[0-9a-fA-F]+|\d+)")
REGS = re.compile(r"Used (\d+) registers")


def _read(out_dir, log):
  """What the dump of one case says."""
  text = [log]
  for root, _, files in os.walk(out_dir):
    for f in sorted(files):
      try:
        with open(os.path.join(root, f), errors="replace") as fh:
          text.append(fh.read())
      except OSError:
        pass
  text = "\n".join(text)
  sass_lines = text.splitlines()
  depbar = collections.Counter(int(m.group(1), 0) for m in DEPBAR.finditer(text))
  warnings = sorted({ln.strip() for ln in sass_lines
                     if "warning" in ln.lower() and "ptxas" in ln.lower()
                     or "serializ" in ln.lower()})
  loads = sorted({f"{m.group(1)}: {m.group(2)}" for m in LOAD.finditer(text)})
  return {
      "tma_loads": [re.sub(r"#mosaic_gpu\.", "", x) for x in loads],
      "ptx_wgmma_waits": dict(collections.Counter(WAIT.findall(text))),
      "hgmma": sum(1 for ln in sass_lines if "HGMMA" in ln),
      "depbar": {str(k): v for k, v in sorted(depbar.items())},
      "arrive": sum(1 for ln in sass_lines if "WARPGROUP.ARRIVE" in ln),
      "registers": sorted({int(r) for r in REGS.findall(text)}),
      "warnings": warnings[:20],
      "files": sorted(f for _, _, fs in os.walk(out_dir) for f in fs),
  }


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--out", default=os.environ.get("OUT", "."))
  ap.add_argument("--set", nargs="+", default=["suite"],
                  choices=("suite", "holdout", "blind", "diagnostic", "families", "all"))
  ap.add_argument("--filter", default="")
  ap.add_argument("--jobs", type=int, default=3)
  ap.add_argument("--timeout", type=float, default=240.0)
  ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
  ap.add_argument("--reread", default=None,
                  help="read again the dumps of an earlier run (its sass_dumps.tgz "
                       "unpacked: the folder holding sass/) and its sass_study.json")
  a = ap.parse_args(argv)
  if a.child:
    _child(*a.child)
    return 0
  if a.reread:
    with open(os.path.join(a.reread, "sass_study.json")) as fh:
      old = json.load(fh)
    rows = []
    for r in old["rows"]:
      d = os.path.join(a.reread, "sass", r["dir"])
      log = open(os.path.join(d, "log.txt")).read() if os.path.exists(
          os.path.join(d, "log.txt")) else ""
      rows.append({**r, **_read(d, log)})
    _report(a.out, old["command"], rows)
    return 0
  from lab import timing_suite
  sets = (("suite", "holdout", "blind", "diagnostic", "families") if "all" in a.set
          else a.set)
  names = [c.name for s in sets for c in timing_suite.cases(s) if a.filter in c.name]
  os.makedirs(a.out, exist_ok=True)
  root = tempfile.mkdtemp(prefix="sass_study_")  # (OUT takes a few files only)

  def one(i, name):
    d = os.path.join(root, str(i))
    t0 = time.time()
    try:
      p = subprocess.run([sys.executable, "-m", "lab.sass_study", "--child", name, d],
                         capture_output=True, text=True, timeout=a.timeout, cwd=ROOT)
      log, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
      log, rc = f"timeout: {e}", -1
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "log.txt"), "w") as fh:
      fh.write(log)
    r = _read(d, log)
    r.update(name=name, dir=str(i), rc=rc, seconds=round(time.time() - t0, 1))
    if rc:
      r["error"] = log.strip().splitlines()[-3:] if log.strip() else ["?"]
    return r

  with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
    rows = list(ex.map(lambda p: one(*p), enumerate(names)))
  _report(a.out, " ".join(sys.argv), rows)
  with tarfile.open(os.path.join(a.out, "sass_dumps.tgz"), "w:gz") as tf:
    # (MLIR's pass log is large and says nothing of the machine code)
    tf.add(root, arcname="sass",
           filter=lambda ti: None if ti.name.endswith("mlir-passes.log") else ti)
  return 0


def _report(out, command, rows):
  """OUT/sass_study.json and the printed table."""
  with open(os.path.join(out, "sass_study.json"), "w") as fh:
    json.dump({"command": command, "rows": rows}, fh, indent=1)
  print("| case | registers | PTX wgmma waits (N: count) | TMA loads' boxes: SMEM transforms "
        "| ptxas's warnings |")
  print("|---|---|---|---|---|")
  for r in rows:
    warn = "; ".join(w.split(":", 1)[-1].strip()[:110] for w in r["warnings"])
    print(f"| {r['name']} | {r['registers']} | {r.get('ptx_wgmma_waits')} | "
          f"{'; '.join(r.get('tma_loads', []))} | "
          f"{warn or ('rc ' + str(r['rc']) if r['rc'] else '')} |")


if __name__ == "__main__":
  sys.exit(main())
