#!/usr/bin/env bash
# Builds bench/lmhead_microbench.cu once per lm_head tile variant (-D
# overrides of backends/cuda/launch_shape.h), in parallel, and runs each on
# the GPU with one seed: every cell is checked bit for bit before timing.
#
#   bash bench/lmhead-variants.sh [seed]
# Needs nvcc and a GPU; about a minute on an H200 machine.
set -uo pipefail
seed=${1:-12345}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
variants=(
  "default|"
  "large IB4, small WJ8|-DTOVL_CUDA_LMHEAD_LARGE_IB=4 -DTOVL_CUDA_LMHEAD_SMALL_WJ=8 -DTOVL_CUDA_LMHEAD_SMALL_WCM=1"
  "large 32x8, small 8x8|-DTOVL_CUDA_LMHEAD_LARGE_BM=32 -DTOVL_CUDA_LMHEAD_LARGE_BN=8 -DTOVL_CUDA_LMHEAD_LARGE_WCM=8 -DTOVL_CUDA_LMHEAD_SMALL_BN=8"
  "small 4x8|-DTOVL_CUDA_LMHEAD_SMALL_BM=4 -DTOVL_CUDA_LMHEAD_SMALL_BN=8 -DTOVL_CUDA_LMHEAD_SMALL_WCM=1"
)
i=0
for v in "${variants[@]}"; do
  flags=${v#*|}
  # shellcheck disable=SC2086
  nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -Xcompiler -ffp-contract=off \
    -I"$here/backends/cuda" -I"$here/include" $flags "$here/bench/lmhead_microbench.cu" -o "$work/mb$i" \
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
    cat "$work/build$i.log"; status=1
  fi
  i=$((i + 1))
done
rm -rf "$work"
exit $status
