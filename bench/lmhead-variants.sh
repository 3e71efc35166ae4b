#!/usr/bin/env bash
# Builds bench/lmhead_microbench.cu once per lm_head variant (-D overrides of
# the tunables in backends/cuda/launch_shape.h), in parallel, and runs each on
# the GPU with one seed; every cell is checked bit for bit before timing, and
# each line shows registers and local (spill) bytes per thread.
#
#   bash bench/lmhead-variants.sh [seed] ['label|-D flags' ...]
# With no variants given, runs the list below: the default against the
# alternatives docs/PERFORMANCE.md lists under "Designs measured and not kept"
# (the 8 x 16 tiles at one block per SM; other ring depths, register caps). Needs nvcc and a
# GPU; about a minute on an H200 machine.
set -uo pipefail
seed=${1:-12345}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -gt 0 ]; then
  variants=("$@")
else
  variants=(
    "default|"
    "large 8x16 tiles, 1 block per SM|-DTOVL_CUDA_LMHEAD_LARGE_TN=8 -DTOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS=1"
    "small capped at 128 registers|-DTOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS=2"
    "small ring of 3 chunks|-DTOVL_CUDA_LMHEAD_SMALL_STAGES=3"
  )
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
i=0
for v in "${variants[@]}"; do
  # shellcheck disable=SC2086 # the flags are words
  nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -Xcompiler -ffp-contract=off \
    -I"$here/backends/cuda" -I"$here/backends/cpu" -I"$here/include" -I"$here/core" ${v#*|} \
    "$here/bench/lmhead_microbench.cu" "$here/backends/cuda/cuda_geometry.c" "$here/backends/cpu/dot.c" \
    "$here/core/bf16.c" "$here/core/status.c" -o "$work/mb$i" \
    > "$work/build$i.log" 2>&1 &
  i=$((i + 1))
done
wait
status=0
i=0
for v in "${variants[@]}"; do
  echo "=== variant $i: ${v%%|*} (${v#*|})"
  if [ -x "$work/mb$i" ]; then
    "$work/mb$i" "$seed" || status=1
  else
    cat "$work/build$i.log"
    status=1
  fi
  i=$((i + 1))
done
exit $status
