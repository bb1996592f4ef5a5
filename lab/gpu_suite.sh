#!/usr/bin/env bash
# The GPU suite, for a Hopper machine with jax[cuda]==0.11.2 and no network.
# Installs this checkout without fetching anything, then (by part, all by default):
#   tests      the quickstart on both backends, the tensor-core and register
#              numerics probes (the golden file tests/test_wgmma.py reads is
#              written anew, with its provenance), the whole test suite with the
#              gpu-marked tests;
#   agreement  the thorough agreement suite (tests/agreement/run.py);
#   timing     the timing table and the hardware probes;
#   families   our own kernel families (lab/families.py), sustained, into
#              $OUT/families/h200_measured.json (committed as "families_study").
# Results go to $OUT (default ./gpu-results): a few files and one tarball, as
# the device machine returns at most 8 files.
#     bash lab/gpu_suite.sh [tests] [agreement] [timing] [families]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
PARTS="${*:-tests agreement timing families}"
export PYTHONUNBUFFERED=1 PALLAS_SIM_COMMIT="${PALLAS_SIM_COMMIT:-$(git rev-parse HEAD 2>/dev/null)}"
LOGS="$OUT/logs"; mkdir -p "$LOGS"
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  echo "commit $PALLAS_SIM_COMMIT"
} 2>&1 | tee "$OUT/env.txt"

if [[ " $PARTS " == *" tests "* ]]; then
  $PY examples/quickstart.py --backend mosaic 2>&1 | tee "$LOGS/quickstart_mosaic.txt"
  $PY examples/quickstart.py --backend sim --gpu h200 2>&1 | tee "$LOGS/quickstart_sim.txt"
  OUT="$LOGS" $PY -m lab.wgmma_numerics_probe --golden tests/data/wgmma_h200.npz 2>&1 | tail -2
  cp tests/data/wgmma_h200.npz "$OUT/wgmma_h200.npz"
  $PY -m lab.wgmma_numerics_fit "$LOGS/wgmma_probe.npz" 2>&1 | tee "$LOGS/wgmma_fit.txt"
  $PY -m lab.register_numerics_probe 2>&1 | tee "$OUT/register_numerics.txt"
  $PY -m pytest -q -rfs -p no:cacheprovider tests 2>&1 | tee "$OUT/pytest_gpu.txt" | tail -30
fi
if [[ " $PARTS " == *" agreement "* ]]; then
  $PY tests/agreement/run.py --out "$LOGS/agreement" 2>&1 | tail -30
  cp "$LOGS/agreement/SUMMARY.md" "$OUT/agreement_summary.md"
fi
if [[ " $PARTS " == *" timing "* ]]; then
  $PY -m lab.gpu_timing 2>&1 | tee "$LOGS/gpu_timing.txt"
  $PY -m lab.gpu_probes 2>&1 | tee "$LOGS/gpu_probes.txt"
  $PY -m lab.contraction_probe 2>&1 | tee "$LOGS/contraction.txt"
fi
if [[ " $PARTS " == *" families "* ]]; then
  $PY -m lab.measure_gpu --only-suite --families --sustain-s 1.0 --batch-s 0.1 \
    --deadline 480 --out "$OUT/families" 2>&1 | tee "$LOGS/families.txt" | tail -60
fi
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOGS"
