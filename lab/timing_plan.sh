#!/usr/bin/env bash
# The timing model's open measurements, most telling first, for a Hopper
# machine with jax[cuda]==0.11.2 and no network: each step has its own time
# limit (one device call runs at most 10 minutes), so a step that overruns
# costs only itself. Installs this checkout without fetching anything.
#   first call (default), about 9.5 minutes (limits add to 560 s):
#     rows       row max/sum micros (calibrate row_*): the exchange across a
#                row's 4 lanes, against attention's missing step cost;
#     attention  JAX's attention step phase by phase (lab/attention_trace.py);
#     fp8        our fp8 matmul's pipeline steps (pipeline_trace --fp8), and
#     fp8k       the same at 8192x4096x8192, two and four slots;
#     l2         L2 streams whose readers share tiles out of step (l2_lag*),
#                beside the in-step ones (l2_half*) again;
#     blind3     the third blind set (families, names ending "(blind 3)");
#   second call:
#     sass       ptxas's registers for our families (sass_study --set families);
#     again      every family again, sustained (the noise: families_again_*).
# Results: $OUT/timing_plan.txt (every step's tail) and $OUT/timing_plan.tgz
# (each step's files), as the device machine returns at most 8 files. Read
# back on the CPU as docs/gpu-lab.md, "The timing plan", says.
#     bash lab/timing_plan.sh [rows] [attention] [fp8] [l2] [blind3] [sass] [again]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
STEPS="${*:-rows attention fp8 fp8k l2 blind3}"
export PYTHONUNBUFFERED=1
W="$OUT/timing_plan"; mkdir -p "$W"
LOG="$OUT/timing_plan.txt"
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
  echo "commit $(git rev-parse HEAD 2>/dev/null)"; echo "steps: $STEPS"
} 2>&1 | tee "$LOG"

source lab/plan_step.sh

step rows 70 $PY -m lab.measure_gpu --only-micros --filter row_ --deadline 60
step attention 90 $PY -m lab.attention_trace
step fp8 80 $PY -m lab.pipeline_trace --fp8
# (the pair the H200 ranks 12% apart and the model not: K 4096, two and four slots)
step fp8k 50 $PY -m lab.pipeline_trace --fp8 --k 4096 --case 8192 128 128 2 \
  --case 8192 128 128 4
step l2 100 bash -c "$PY -m lab.measure_gpu --only-micros --filter l2_lag --deadline 55 \
  && mkdir -p \$OUT/half && $PY -m lab.measure_gpu --only-micros --filter l2_half \
  --deadline 35 --out \$OUT/half"
step blind3 170 $PY -m lab.measure_gpu --only-suite --families --filter "(blind 3)" \
  --sustain-s 1.0 --batch-s 0.1 --deadline 160
step sass 200 $PY -m lab.sass_study --set families --jobs 8 --timeout 120
step again 560 $PY -m lab.measure_gpu --only-suite --families --sustain-s 1.0 \
  --batch-s 0.1 --deadline 420

tar czf "$OUT/timing_plan.tgz" -C "$OUT" timing_plan && rm -rf "$W"
