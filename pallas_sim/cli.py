"""`pallas-sim` command: run a Python file with its kernels simulated."""
import argparse
import runpy
import sys


def main(argv=None):
  ap = argparse.ArgumentParser(
      prog="pallas-sim",
      description="Run a Python file with every Mosaic GPU kernel it launches "
                  "simulated, and print the simulator's report.")
  ap.add_argument("file", help="a Python file to run as __main__")
  ap.add_argument("--gpu", default="h100", choices=["h100", "h200"])
  ap.add_argument("--trace", help="write a Chrome trace of the kernels here")
  ap.add_argument("args", nargs=argparse.REMAINDER)
  ns = ap.parse_args(argv)
  import pallas_sim as ps
  sys.argv = [ns.file] + ns.args
  with ps.backend("sim", gpu=ns.gpu) as report:
    runpy.run_path(ns.file, run_name="__main__")
  print(report.summary())
  if ns.trace:
    report.save_trace(ns.trace)
    print(f"trace written to {ns.trace}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
