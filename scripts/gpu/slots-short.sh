#!/usr/bin/env bash
# named-only: gpu-suite.sh runs this part only when it is named
# (`bash scripts/gpu-suite.sh check slots-short`); a full run has slots.sh,
# tp.sh and python.sh, which hold all of it.
#
# The fixed-shape sets' GPU figures and checks in one short call (about two
# minutes on the H200), for a GPU call with little time left:
#   1. tovl bench --capacity beside the from_slots set, each fixed set checked
#      bit for bit first (medians of 10): cuda over 8 x 4 rows in capacity 256
#      (the gated pair), the same with TOVL_CUDA_GATED_PAIR=0 (tiles alone),
#      cuda over 8 x 64 in capacity 64 and 256, vulkan over 8 x 4 (the tiles'
#      column loop), the HIP source (--cuda-image) over 8 x 4 and 8 x 64 (the
#      shaped grids);
#   2. side by side: test_cuda_graph's fixed-shape shard sets (N = 1 .. 8,
#      TOVL_SHARD_ROUNDS rounds, default 100, under one captured graph) and
#      test_tp.py's GPU tests (the ranks' pools under captured graphs).
# Logs go to $OUT (default /tmp/tovl-gpu-out/slots-short); a summary prints last.
set -uo pipefail
part=slots-short step_tail=14
source "$(dirname "$0")/../lib/gpu-part.sh"
tovl=$build/tools/tovl
hip_cubin=$build/tests/token_overlay_hip_on_cuda.cubin
echo "build: $(build_commit), seed $fresh_seed"
step devices "$tovl" devices
bench=(--hooks-only --seed "$fresh_seed" --repeats 10)
step cuda-rows4 timeout 25 "$tovl" bench --backend cuda "${bench[@]}" --tokens 8,64,512 --rows 4 --capacity 256
step cuda-rows4-tiles env TOVL_CUDA_GATED_PAIR=0 timeout 15 "$tovl" bench --backend cuda "${bench[@]}" \
  --tokens 512 --rows 4 --capacity 256
step cuda-rows64 timeout 25 "$tovl" bench --backend cuda "${bench[@]}" --tokens 1,8,64,512 --capacity 64,256
step vulkan-rows4 timeout 20 "$tovl" bench --backend vulkan "${bench[@]}" --tokens 64,512 --rows 4 --capacity 256
step hip-rows4 timeout 20 "$tovl" bench --cuda-image "$hip_cubin" "${bench[@]}" --tokens 8,64,512 --rows 4 --capacity 256
step hip-rows64 timeout 20 "$tovl" bench --cuda-image "$hip_cubin" "${bench[@]}" --tokens 64,512 --capacity 64,256

# The checks need no quiet GPU: both at once.
(TOVL_SHARD_ROUNDS=${TOVL_SHARD_ROUNDS:-100} step graph-shards timeout 60 "$build/tests/test_cuda_graph" --jobs 1 --verbose \
  --filter 'cuda_graph/shard_slots_*'; printf '%s\n' "${summary[@]: -1}" > "$out/graph-shards.outcome") &
checks=$!
if python_env; then
  step_skip_ok=1 step pytest-tp timeout 60 python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_tp.py -k gpu
else
  summary+=("FAIL  pytest-tp (no libtovl.so in $build)")
fi
wait "$checks"
summary+=("$(cat "$out/graph-shards.outcome")")

for f in cuda-rows4 cuda-rows4-tiles cuda-rows64 vulkan-rows4 hip-rows4 hip-rows64; do
  [ -f "$out/$f.log" ] && sed -n '/^--capacity/,/^load/p' "$out/$f.log" | sed "s/^/$f: /"
done
echo "== slots-short: build $(build_commit)"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -qv '^ok'
