#!/usr/bin/env bash
# Fixed-shape sets (slots loaded in place) on the GPU machine, from the repo
# root: the checks and the figures of docs/PERFORMANCE.md "Fixed-shape sets"
# in one part, short enough to run beside another in one device call.
#   1. tovl devices; the conformance suite on cuda (every kernel variant the
#      backend takes, bit for bit against the CPU reference), test_cuda's
#      GPU-sized batches (the large tiles) and test_hip_on_cuda (the HIP
#      port's source on this GPU);
#   2. test_cuda_graph's and test_vulkan's slots tests: 1000 rounds of loads
#      under one captured graph / one recorded command buffer, the ordering
#      test, 10,000 swaps' memory, capacity 160 past the shaped rows; the
#      fixed-shape shard sets of N = 1 .. 8 under one graph / command buffer;
#   3. tovl bench --capacity beside the from_slots set, each checked bit for
#      bit first, on cuda, the HIP source (--cuda-image) and vulkan: capacity
#      64 and 256 over 8 x 64 rows, 256 over 8 x 4.
# Logs go to $OUT (default /tmp/tovl-gpu-out/slots); a summary prints last.
set -uo pipefail
part=slots step_tail=6
source "$(dirname "$0")/../lib/gpu-part.sh"
tovl=$build/tools/tovl
hip_cubin=$build/tests/token_overlay_hip_on_cuda.cubin
tokens=1,8,64,512
echo "build: $(build_commit), seed $fresh_seed"
step devices "$tovl" devices
step conform-cuda "$tovl" conform --backend cuda
step cuda-batches timeout 120 "$build/tests/test_cuda" --jobs 1 --verbose --filter 'cuda/hooks_match_the_cpu_on_gpu_sized_batches'
step hip-on-cuda timeout 120 "$build/tests/test_hip_on_cuda" --jobs 1 --verbose
step graph-slots "$build/tests/test_cuda_graph" --jobs 1 --verbose --filter 'cuda_graph/@(slots_*|a_load_*|ten_thousand_*)'
step graph-shards "$build/tests/test_cuda_graph" --jobs 1 --verbose --filter 'cuda_graph/shard_slots_*'
step vulkan-slots "$build/tests/test_vulkan" --jobs 1 --verbose --filter 'vulkan/slots_*'
step vulkan-shards "$build/tests/test_vulkan" --jobs 1 --verbose --filter 'vulkan_shards/*'
for b in cuda hip vulkan; do
  case $b in
    hip) target=(--cuda-image "$hip_cubin") ;;
    *) target=(--backend "$b") ;;
  esac
  step "bench-$b" "$tovl" bench "${target[@]}" --hooks-only --tokens "$tokens" --seed "$fresh_seed" \
    --capacity 64,256 --json "$out/bench-$b.json"
  step "bench-$b-rows4" "$tovl" bench "${target[@]}" --hooks-only --tokens "$tokens" --seed "$fresh_seed" \
    --rows 4 --capacity 256 --json "$out/bench-$b-rows4.json"
done
for f in bench-cuda bench-cuda-rows4 bench-hip bench-hip-rows4 bench-vulkan bench-vulkan-rows4; do
  [ -f "$out/$f.log" ] && sed -n '/^--capacity/,/^$/p' "$out/$f.log" | sed "s/^/$f: /"
done
echo "== slots: build $(build_commit)"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -qv '^ok'
