#!/usr/bin/env bash
# The simulator on the GPU machine's CPUs (16 cores): scaling over worker
# processes, per-op costs, and an 8192^3 quickstart matmul (numerics and race
# checks on) with its peak memory, with a worker per task and without.
# Results under $OUT (or ./build/cpu_scaling).
#     bash lab/cpu_scaling.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build/cpu_scaling}"
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$out/install.txt" 2>&1
export PALLAS_SIM_PROGRESS=0 JAX_PLATFORMS=cpu
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz"; free -g; } >"$out/machine.txt" 2>&1
timeout 240 python3 benchmarks/sim_speed.py --only scaling per-op --sizes 1024 2048 \
  >"$out/scaling.txt" 2>&1
timeout 300 python3 benchmarks/memory.py 4096 8192 >"$out/memory.txt" 2>&1
# (the same with workers that last the launch: what a worker per task costs in time)
timeout 300 python3 benchmarks/memory.py 8192 --no-fresh >"$out/memory_lasting.txt" 2>&1
echo done
