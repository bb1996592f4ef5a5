#!/usr/bin/env bash
# The timing model's open measurements, most telling first, for a Hopper
# machine with jax[cuda]==0.11.2 and no network: each step has its own time
# limit (one device call runs at most 10 minutes), so a step that overruns
# costs only itself. Installs this checkout without fetching anything.
#   the next call (default), about 8 minutes (limits add to 485 s):
#     blocks     where a matmul block's time goes: the warp-specialized
#                matmul (two slots, three, one consumer) and the fp8 one at
#                three K each, 8192x8192 outputs (a block's fixed cost apart
#                from its steps'), and their loads alone, no wgmma (the L2's
#                rate for the tiles they share) (families, names ending
#                "(block study)");
#     hbmrows    HBM read in boxes of 16- and 32-byte rows of long rows
#                (calibrate hbm_rows_16b_*, _32b_*: the model takes them at
#                64-byte rows' cost);
#     smemscale  RMSnorm's second body alone, no TMA beside it, at 8, 16 and 32
#                KiB tiles (calibrate smem_rw_scale_*): whether the H200's 1.6x
#                the model's cycles for it is its own work or the pipeline's;
#     gmem       plain GMEM loads, one block: a dependent scalar chain and a
#                loop of row loads, from the L1, the L2 and HBM (calibrate
#                plain_load_*; the rows' references failed on 2026-12-07);
#     sem        global semaphores: two blocks handing a token back and forth
#                (sem_pingpong, again) and one block's signals in a row
#                (sem_signals: what a signal holds its own thread);
#     blind6     the sixth blind set: column sums, a matmul with a fused bias
#                and SiLU, and GELU by plain GMEM loads and stores, kinds none
#                of the sets before has (families, names ending "(blind 6)");
#   then (a second call):
#     again5     the fifth blind set a second time (its rows' noise), with the
#                causal row the first run's deadline left out;
#   measured on 2026-12-07, kept to run again:
#     fp8        our fp8 matmul's pipeline steps (pipeline_trace --fp8), 128x128
#                and 64x256 tiles at two and four slots;
#     l2half     the in-step L2 streams (l2_half*);
#     wstrace    the warp-specialized matmul's every step at two and three
#                slots (lab/ws_trace.py);
#     copyown    one block an SM reading its own tiles, and copying them back
#                (calibrate stream_own_*, copy_own_*);
#     smemrw     the row kernels' body alone (calibrate smem_rw_*);
#     blind5     the fifth blind set (families, names ending "(blind 5)");
#   measured on 2026-12-06, kept to run again:
#     rowstrace  RMSnorm's and softmax's pipeline steps part by part, one
#                block an SM and two (lab/rows_trace.py);
#     attention  JAX's attention step phase by phase (lab/attention_trace.py);
#     blind4     the fourth blind set (families, names ending "(blind 4)");
#   measured on 2026-12-05, kept to run again:
#     rows       row max/sum micros (calibrate row_*);
#     fp8k       the fp8 matmul at 8192x4096x8192, two and four slots;
#     l2         L2 streams whose readers share tiles out of step (l2_lag*);
#     blind3     the third blind set (families, names ending "(blind 3)");
#     sass       ptxas's registers for our families (sass_study --set families);
#     again      every family again, sustained (the noise: families_again_*).
# Results: $OUT/timing_plan.txt (every step's tail) and $OUT/timing_plan.tgz
# (each step's files), as the device machine returns at most 8 files. Read
# back on the CPU as docs/gpu-lab.md, "The timing plan", says.
#     bash lab/timing_plan.sh [blocks] [hbmrows] [smemscale] [gmem] [sem] [blind6] [again5] [fp8] [l2half] [wstrace] [copyown] [smemrw] [blind5] [rowstrace]
#                             [attention] [blind4] [rows] [fp8k] [l2] [blind3] [sass] [again]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
STEPS="${*:-blocks hbmrows smemscale gmem sem blind6}"
export PYTHONUNBUFFERED=1
# (the steps' folders outside $OUT, packed into $TGZ after each step: what
# comes back is the summary and one archive, whenever the call stops)
W="$(mktemp -d)/timing_plan"; mkdir -p "$W"
LOG="$OUT/timing_plan.txt"
TGZ="$OUT/timing_plan.tgz"
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
  echo "commit $(git rev-parse HEAD 2>/dev/null)"; echo "steps: $STEPS"
} 2>&1 | tee "$LOG"

source lab/plan_step.sh

step rows 70 $PY -m lab.measure_gpu --only-micros --filter row_ --deadline 60
# (six cases, each written as it ends: about 14 s a case there)
step rowstrace 130 $PY -m lab.rows_trace
# (a case's profiled call takes about 30 s there: 4 cases, each written as it ends)
step attention 190 $PY -m lab.attention_trace
step fp8 65 $PY -m lab.pipeline_trace --fp8
# (four cases of 64 steps, each profiled over all of them)
step wstrace 110 $PY -m lab.ws_trace
# (six micros, two loop lengths each, written as each chunk ends)
step copyown 140 $PY -m lab.measure_gpu --only-micros --filter _own_ --deadline 130
# (the pair the H200 ranks 12% apart and the model not: K 4096, two and four slots)
# (eight micros of a few hundred cycles an iteration; the rows step's 12
# took 7 s there)
step smemrw 65 $PY -m lab.measure_gpu --only-micros --filter smem_rw_ --deadline 60
# (three of those micros: RMSnorm's second body alone)
step smemscale 65 $PY -m lab.measure_gpu --only-micros --filter smem_rw_scale --deadline 60
step fp8k 50 $PY -m lab.pipeline_trace --fp8 --k 4096 --case 8192 128 128 2 \
  --case 8192 128 128 4
step l2 80 $PY -m lab.measure_gpu --only-micros --filter l2_lag --deadline 65
# (the in-step streams beside them; 24 l2_lag streams took 11 s there)
step l2half 65 $PY -m lab.measure_gpu --only-micros --filter l2_half --deadline 60
# (four micros of one block, plain GMEM loads: under a millisecond a call)
step gmem 70 $PY -m lab.measure_gpu --only-micros --filter plain_load_ --deadline 60
step sem 65 $PY -m lab.measure_gpu --only-micros --filter sem_ --deadline 60
# (two streams of 512 MiB in narrow rows: a few ms a call)
step hbmrows 70 $PY -m lab.measure_gpu --only-micros --filter b_32slots_2_per_sm --deadline 60
step blind3 170 $PY -m lab.measure_gpu --only-suite --families --filter "(blind 3)" \
  --sustain-s 1.0 --batch-s 0.1 --deadline 160
# (28 rows; the third set's 14 took 26 s there)
step blind4 120 $PY -m lab.measure_gpu --only-suite --families --filter "(blind 4)" \
  --sustain-s 1.0 --batch-s 0.1 --deadline 110
# (33 rows)
step blind5 115 $PY -m lab.measure_gpu --only-suite --families --filter "(blind 5)" \
  --sustain-s 1.0 --batch-s 0.1 --deadline 105
# (the same 33 rows again, their noise, and the causal row the first run's
# deadline left out: three chunks of 16, the last starting with 40 s left)
# (35 rows of three new kinds: two chunks, the second starting by 65 s)
step blind6 125 $PY -m lab.measure_gpu --only-suite --families --filter "(blind 6)" \
  --sustain-s 1.0 --batch-s 0.1 --chunk 18 --deadline 115
step again5 160 $PY -m lab.measure_gpu --only-suite --families --filter "(blind 5)" \
  --sustain-s 1.0 --batch-s 0.1 --deadline 150
# (17 rows, the largest a 1 ms call: one chunk)
step blocks 90 $PY -m lab.measure_gpu --only-suite --families --filter "(block study)" \
  --sustain-s 1.0 --batch-s 0.1 --chunk 17 --deadline 80
step sass 200 $PY -m lab.sass_study --set families --jobs 8 --timeout 120
step again 560 $PY -m lab.measure_gpu --only-suite --families --sustain-s 1.0 \
  --batch-s 0.1 --deadline 420

rm -rf "$(dirname "$W")"
