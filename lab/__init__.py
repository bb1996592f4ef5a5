"""pallas-sim's laboratory: how the simulator's hardware figures were found
and are checked, apart from the benchmarks a user runs (benchmarks/).

* calibration of the timing model against an H200: the kernel suite
  (timing_suite), its micro-benchmarks (calibrate), the GPU measurements
  (measure_gpu, power_study, pipeline_trace, ncu_sections, sass_study) and
  the CPU-side studies of them (hbm_bytes, power_model);
* GPU diagnostics run on the GPU machine (gpu_suite.sh, gpu_probes,
  gpu_timing, cpu_scaling.sh);
* one-off hardware probes, each a question asked of a Hopper GPU
  (*_probe, wgmma_numerics_fit);
* development tools (snapshot: what a refactor must not change; memory_map:
  where a parallel run's memory goes);
* data/: what was measured on the H200, and the predictions committed before
  measuring, which the tests and the benchmarks read.

A package, so that its modules import each other (`from lab import
timing_suite`) and tests import them the same way (pytest runs from the
repository root, pyproject's pythonpath). Its scripts run from the
repository root as modules: `./dev python -m lab.calibrate --sim-check`, or
`python3 -m lab.measure_gpu --out $OUT` on the GPU machine (a script run as
a file, `python3 lab/calibrate.py`, would not find its siblings). Importing
the package builds and loads nothing.
"""
import os

# The repository root (where `python -m lab.NAME` runs) and the data folder.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "lab", "data")
