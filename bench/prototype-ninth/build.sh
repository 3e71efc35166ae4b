#!/usr/bin/env bash
# PROTOTYPES of the ninth session (docs/PERFORMANCE.md, "Ninth session"):
# builds every variant measured there into /tmp/proto9 and runs them (seed 777)
# where a GPU is present. Each program is bench/lmhead_microbench.cu or a copy
# of it: every cell is checked bit for bit against the CPU reference first.
#   dyn_*  the kept kernels with the staging ring in dynamic shared memory,
#          3/4 (kept), 6/8, 8/12, 12/16 chunks (large/small variant)
#   t_*    blocks of 512 threads (four groups of 128): small 8 x 8 tiles (TN 2,
#          ring 4 or 3), large 8 x 8 at two blocks per SM, large 8 x 16
#   tn2    small 8 x 4 tiles (TN = 2) at two blocks per SM
#   sr_*   lmhead_slotrows.cuh: no shared-memory ring, operand words loaded
#          into registers DEPTH chunks ahead, a block per (slot, 4 overlay
#          rows); SR=all uses it for both batch sizes
set -euo pipefail
cd "$(dirname "$0")/../.."
out=/tmp/proto9
mkdir -p "$out"
NV="nvcc -O3 -arch=sm_90 --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -Xcompiler -ffp-contract=off
    -Ibackends/cuda -Ibackends/cpu -Iinclude -Icore -Ibench"
LIB="backends/cuda/cuda_geometry.c backends/cpu/dot.c core/bf16.c core/status.c"
b() { local name=$1 src=$2; shift 2; $NV "$@" "$src" $LIB -o "$out/$name" & }
P=bench/prototype-ninth
b dyn_kept $P/mb_dyn.cu -DTOVL_LMHEAD_DYN
b dyn_6_8 $P/mb_dyn.cu -DTOVL_LMHEAD_DYN -DTOVL_CUDA_LMHEAD_LARGE_STAGES=6 -DTOVL_CUDA_LMHEAD_SMALL_STAGES=8
b dyn_8_12 $P/mb_dyn.cu -DTOVL_LMHEAD_DYN -DTOVL_CUDA_LMHEAD_LARGE_STAGES=8 -DTOVL_CUDA_LMHEAD_SMALL_STAGES=12
b dyn_12_16 $P/mb_dyn.cu -DTOVL_LMHEAD_DYN -DTOVL_CUDA_LMHEAD_LARGE_STAGES=12 -DTOVL_CUDA_LMHEAD_SMALL_STAGES=16
wait
b t_small512 bench/lmhead_microbench.cu -DTOVL_CUDA_LMHEAD_SMALL_THREADS=512 -DTOVL_CUDA_LMHEAD_SMALL_TN=2
b t_small512_ring3 bench/lmhead_microbench.cu -DTOVL_CUDA_LMHEAD_SMALL_THREADS=512 -DTOVL_CUDA_LMHEAD_SMALL_TN=2 \
  -DTOVL_CUDA_LMHEAD_SMALL_STAGES=3
b t_large512_8x8 bench/lmhead_microbench.cu -DTOVL_CUDA_LMHEAD_LARGE_THREADS=512 -DTOVL_CUDA_LMHEAD_LARGE_TN=2 \
  -DTOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS=2
b t_large512_8x16 bench/lmhead_microbench.cu -DTOVL_CUDA_LMHEAD_LARGE_THREADS=512 -DTOVL_CUDA_LMHEAD_LARGE_TN=4 \
  -DTOVL_CUDA_LMHEAD_LARGE_MIN_BLOCKS=1
wait
b tn2 bench/lmhead_microbench.cu -DTOVL_CUDA_LMHEAD_SMALL_TN=2 -DTOVL_CUDA_LMHEAD_SMALL_MIN_BLOCKS=2
b sr_d4 $P/mb_sr.cu
b sr_d2 $P/mb_sr.cu -DSR_DEPTH=2
b sr_d6 $P/mb_sr.cu -DSR_DEPTH=6
b sr_tm16 $P/mb_sr.cu -DSR_TM=16
wait
if nvidia-smi >/dev/null 2>&1; then
  for p in "$out"/*; do
    echo "== $(basename "$p")"
    case "$(basename "$p")" in sr_*) SR=all "$p" 777 ;; *) "$p" 777 ;; esac
  done
fi
