#!/usr/bin/env bash
# The wheels lab/library_plan.sh carries to the GPU machine (no network
# there): tokamax's needs that its image lacks or holds at other versions,
# at the versions the tokamax venv here runs (benchmarks/tokamax_suite.py
# setup), for its Python 3.12 on x86-64, into .whl (git-ignored through
# .git/info/exclude). tensorstore, orbax, optax, protobuf and treescope are
# the image's. Then carry .whl and build/tokamax/src in the device call.
#     bash lab/library_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
VENV_PIP="build/tokamax/venv/bin/python -m pip"
NAMES="absl-py einshape jaxtyping wadler_lindig pydantic pydantic_core annotated-types
  typing-inspection typing_extensions qwix flax typeguard immutabledict tensorboardX chex"
pins=()
for n in $NAMES; do
  v=$($VENV_PIP show "$n" 2>/dev/null | sed -n 's/^Version: //p')
  [[ -n "$v" ]] || { echo "$n: not in build/tokamax/venv (run tokamax_suite.py setup)" >&2; exit 1; }
  pins+=("$n==$v")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d .whl "${pins[@]}"
ls .whl; du -sh .whl
