#!/usr/bin/env bash
# Third-party kernel libraries on a Hopper machine (jax[cuda]==0.11.2, no
# network), in one device call; each step has its own time limit, so a step
# that overruns costs only itself (the default, timing and regop, 400 s; all
# 960 s):
#   named    our named-barrier kernels against the simulator, bit for bit
#            (tests/test_gpu.py);
#   kernels  tokamax's sm90 kernels natively: each case's outputs, for
#            benchmarks/tokamax_suite.py compare against the simulator's;
#   tests    tokamax's test files (attention, GLU, ragged dot) natively;
#   hang     a named-barrier phase that never completes (the simulator's
#            DeadlockError): the launch must not finish on the GPU either;
#   timing   tokamax's sm90 kernels timed at working sizes (benchmarks/
#            tokamax_timing.py measure): kernels the timing model never saw,
#            beside the predictions committed for them before
#            (lab/data/blind_predictions_tokamax.json). The default: the
#            other steps were measured on 2026-12-05;
#   regop    a wgmma whose register operand the next loop step redefines
#            while it may be in flight (wgmma_wait(1)): right or wrong on
#            the GPU, what ptxas said, and its time beside wgmma_wait(0)
#            (lab/register_operand_probe.py; the simulator's side: --sim).
# Carry build/tokamax/src (benchmarks/tokamax_suite.py extract) and .whl: the
# wheels of tokamax's dependencies (lab/library_wheels.sh fetches them; docs/
# gpu-lab.md, "The library plan"). Results: $OUT/library_plan.txt (every step's
# tail) and $OUT/library_plan.tgz (each step's files).
#     bash lab/library_plan.sh [timing] [regop] [named] [kernels] [tests] [hang]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu-results}"; mkdir -p "$OUT"
PY="${PYTHON:-python3}"
STEPS="${*:-timing regop}"
export PYTHONUNBUFFERED=1
# (the steps' folders outside $OUT, packed into $TGZ after each step: what
# comes back is the summary and one archive, whenever the call stops, as the
# device machine returns at most 8 files)
W="$(mktemp -d)/library_plan"; mkdir -p "$W"
LOG="$OUT/library_plan.txt"
TGZ="$OUT/library_plan.tgz"
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  $PY -c "import jax; print('jax', jax.__version__, jax.devices())"
  echo "commit $(git rev-parse HEAD 2>/dev/null)"; echo "steps: $STEPS"
  cat build/tokamax/REVISION 2>/dev/null
} 2>&1 | tee "$LOG"

source lab/plan_step.sh

step named 110 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py \
  -k "named_barrier and not never_completes"
step kernels 140 $PY benchmarks/tokamax_suite.py kernels --native --out "$W/kernels"
# (several processes share the GPU: none takes most of its memory up front)
step tests 270 env XLA_PYTHON_CLIENT_PREALLOCATE=false $PY benchmarks/tokamax_suite.py \
  tests --native --out "$W/tests" -n 8 --timeout 100
step hang 40 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py \
  -k never_completes
# (11 cases, each written as it ends: a compile, a second of calls, seven
# batches of 0.1 s)
step timing 300 $PY benchmarks/tokamax_timing.py measure --out "$W/timing"
# (five cases, each a compile, 50 calls of about 0.3 ms and a compile in a
# process of its own for ptxas's notes: about 10 s a case)
step regop 100 $PY -m lab.register_operand_probe --out "$W/regop"
rm -rf "$(dirname "$W")"
