#!/usr/bin/env bash
# The GPU suite, for a Hopper machine with jax[cuda]==0.11.2 and no network:
# installs this checkout without fetching anything, then runs the quickstart on
# both backends, the whole test suite (with the `gpu`-marked tests), the thorough
# agreement suite, the timing table and the hardware and numerics probes.
# Results go to $OUT (or ./gpu-results).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
} 2>&1 | tee "$OUT/env.txt"
export PYTHONUNBUFFERED=1
$PY examples/quickstart.py --backend mosaic 2>&1 | tee "$OUT/quickstart_mosaic.txt"
$PY examples/quickstart.py --backend sim --gpu h200 2>&1 | tee "$OUT/quickstart_sim.txt"
$PY -m pytest -v -s -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.txt"
$PY tests/agreement/run.py --out "$OUT/agreement" 2>&1 | tail -25
$PY benchmarks/gpu_timing.py 2>&1 | tee "$OUT/gpu_timing.txt"
$PY benchmarks/gpu_probes.py 2>&1 | tee "$OUT/gpu_probes.txt"
$PY benchmarks/wgmma_numerics_probe.py 2>&1 | tail -1
$PY benchmarks/wgmma_numerics_fit.py "$OUT/wgmma_probe.npz" 2>&1 | tee "$OUT/wgmma_fit.txt"
$PY benchmarks/contraction_probe.py 2>&1 | tee "$OUT/contraction.txt"
