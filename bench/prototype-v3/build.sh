#!/usr/bin/env bash
# Builds the sixth session's lm_head prototypes (docs/PERFORMANCE.md, sixth
# session) into $1 (default /tmp/proto), then runs each with seed 777 when a
# GPU is present. Every variant checks every cell bit for bit first.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/proto}
mkdir -p "$out"
build() { # name flags...
  local n=$1; shift
  nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -Xcompiler -ffp-contract=off \
    -I"$here/bench/prototype-v3" -I"$here/backends/cuda" -I"$here/backends/cpu" -I"$here/include" -I"$here/core" "$@" \
    "$here/bench/prototype-v3/mb.cu" "$here/bench/prototype-v3/cuda_geometry.c" "$here/backends/cpu/dot.c" \
    "$here/core/bf16.c" "$here/core/status.c" -o "$out/$n"
}
L="-DTOVL_V3_LEAN=1 -DTOVL_V3_ROUNDS=2 -DTOVL_V3_STAGES=2"
build v3_r1s2 -DTOVL_V3_STAGES=2 &
build v3 $L &
wait
build v3_t128 $L -DTOVL_CUDA_LMHEAD_THREADS=128 &
build v3_tn2 $L -DTOVL_V3_TN=2 &
wait
build v3_timing $L -DV3_TIMING &
build v3_noload $L -DV3_TIMING -DV3_NOLOAD &
wait
build v3_nocomp $L -DV3_TIMING -DV3_NOCOMP &
build v5 -DTOVL_V5=1 -DTOVL_V3_ROUNDS=2 -DTOVL_V5_AHEAD=0 &
wait
nvcc -O3 -arch=sm_90a "$here/bench/prototype-v3/l2_stream.cu" -o "$out/l2_stream"
if command -v nvidia-smi > /dev/null && nvidia-smi > /dev/null 2>&1; then
  for b in v3_r1s2 v3 v3_t128 v3_tn2 v5 v3_timing v3_noload v3_nocomp; do
    echo "== $b"
    "$out/$b" 777 | grep -Ev '^(embed|device)'
  done
  "$out/l2_stream"
fi
