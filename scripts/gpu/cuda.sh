#!/usr/bin/env bash
# The CUDA part of the GPU run (issue 6), on the H200 machine, from the repo
# root, with the build in ./build-gpu (scripts/gpu-prepare.sh; TOVL_GPU_BUILD
# names another tree). Runs:
#   1. tovl devices: the CUDA backend present, its device and kernels;
#   2. the CUDA tests: test_cuda (GPU-sized batches against the CPU, a wrapped
#      context, a module from a file, the timing members), test_cuda_graph
#      (both hooks captured in a CUDA graph, replays bit-identical) and
#      test_conform_cuda;
#   3. tovl conform --backend cuda with a fresh seed and two fixed ones, and
#      against the shipped golden file (tests/golden/, a CPU's digests);
#   4. compute-sanitizer memcheck, racecheck, initcheck and synccheck on the
#      conformance suite (small tiles) and on test_cuda's GPU-sized batches
#      (large tiles), each under a time limit;
#   5. tovl bench --backend cuda (graph-replay and single-launch medians, GB/s,
#      fraction of the copy bandwidth), again with TOVL_CUDA_PDL=0 (plain
#      launches, no programmatic dependent launch), then bench/torch_peer.py:
#      the same work in PyTorch on the same GPU, and both side by side with
#      the goals; then tovl bench at T = 1 .. 512 with --dump, and
#      bench/triton_peer.py on that workload: the closest prior art's design
#      (vLLM PR #55796) in Triton, side by side with tovl at every T;
#      (Fixed-shape sets beside the from_slots set: the part scripts/gpu/slots.sh.)
#   6. bench/lmhead_microbench, where the build made it: the kernels alone on
#      the bench workload, every cell checked, then timed; again with a
#      subnormal in the hidden rows (TOVL_MB_SUBNORMALS=1), so that every
#      lm_head tile fails the fused loop's range check and is redone unfused.
# Logs go to $OUT/cuda (default /tmp/tovl-gpu-out/cuda); a summary prints last.
# Knobs: TOVL_CUDA_SANITIZERS (default "memcheck racecheck initcheck
# synccheck"), TOVL_CUDA_SANITIZER_TIMEOUT (seconds per run, default 150),
# TOVL_CUDA_SKIP_TORCH=1 (neither the PyTorch nor the Triton peer).
set -uo pipefail
part=cuda step_tail=6
source "$(dirname "$0")/../lib/gpu-part.sh"
tovl=$build/tools/tovl

if [ ! -x "$tovl" ]; then
  echo "cuda: $tovl was not built (configure and build $build first)"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$out/gpu.txt" 2>&1

# 1. The backend is there.
step devices "$tovl" devices
if ! grep -qE '^cuda +present' "$out/devices.log"; then
  summary[${#summary[@]}-1]="FAIL  devices: $(grep -m1 '^cuda' "$out/devices.log")"
fi

# 2. The CUDA tests (each skips without a GPU: a skip counts as a failure here).
for t in test_cuda test_cuda_graph test_conform_cuda; do
  step "$t" env TOVL_TEST_SEED="$fresh_seed" "$build/tests/$t" --verbose --jobs 1
done

# 3. The conformance suite through the CLI, three seeds.
for seed in "$fresh_seed" 1 20261129; do
  step "conform-seed-$seed" "$tovl" conform --backend cuda --seed "$seed" --json "$out/conform-$seed.json"
done
step conform-golden "$tovl" conform --backend cuda --against tests/golden/conform-seed-1.json \
  --json "$out/conform-golden.json" --junit "$out/conform-golden.xml"

# 4. Sanitizers. The conformance cases are small (the small lm_head tiles);
#    test_cuda's batches reach the large tiles. Criterion forks: follow it.
if command -v compute-sanitizer > /dev/null 2>&1; then
  for tool in ${TOVL_CUDA_SANITIZERS:-memcheck racecheck initcheck synccheck}; do
    [ "$tool" = none ] && continue # the suite runs sanitizers in a phase of their own
    limit=${TOVL_CUDA_SANITIZER_TIMEOUT:-150}
    step "sanitizer-$tool-conform" timeout "$limit" \
      compute-sanitizer --tool "$tool" --error-exitcode 1 "$tovl" conform --backend cuda --seed "$fresh_seed"
    step "sanitizer-$tool-batches" timeout "$limit" \
      compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 1 \
      env TOVL_TEST_SEED="$fresh_seed" "$build/tests/test_cuda" --jobs 1 \
      --filter 'cuda/hooks_match_the_cpu_on_gpu_sized_batches'
  done
else
  summary+=("FAIL  compute-sanitizer not found")
fi

# 5. Benchmarks, and the PyTorch peer beside them.
step bench "$tovl" bench --backend cuda --seed "$fresh_seed" --json "$out/bench.json"
step bench-pdl-off env TOVL_CUDA_PDL=0 "$tovl" bench --backend cuda --seed "$fresh_seed" \
  --json "$out/bench-pdl-off.json"
if [ "${TOVL_CUDA_SKIP_TORCH:-0}" != 1 ]; then
  step torch-peer python3 bench/torch_peer.py --seed "$fresh_seed" --json "$out/torch_peer.json" \
    --tovl-json "$out/bench.json"
fi

# The closest prior art at decode and prefill batch sizes, on the workload
# tovl bench wrote (issue 23).
peer_sizes=1,8,16,32,64,128,256,512
workload_dir=$(mktemp -d)
step bench-sizes "$tovl" bench --backend cuda --seed "$fresh_seed" --tokens "$peer_sizes" \
  --json "$out/bench-sizes.json" --dump "$workload_dir/workload.safetensors"
if [ "${TOVL_CUDA_SKIP_TORCH:-0}" != 1 ]; then
  step triton-peer python3 bench/triton_peer.py --workload "$workload_dir/workload.safetensors" \
    --tovl-json "$out/bench-sizes.json" --json "$out/triton_peer.json"
fi
rm -rf "$workload_dir"

# 6. The microbenchmark (built by CMake's build check when nvcc saw sm_90).
microbench=$build/backends/cuda/lmhead_microbench
if [ -x "$microbench" ]; then
  step lmhead_microbench "$microbench" "$fresh_seed"
  step lmhead_microbench_unfused env TOVL_MB_SUBNORMALS=1 TOVL_MB_T=512,160 "$microbench" "$fresh_seed"
fi

echo
echo "=== cuda summary (seed $fresh_seed; logs in $out)"
echo "machine:    $(cat "$out/gpu.txt")"
grep -m1 '^cuda' "$out/devices.log" | sed 's/^/device:     /'
for log in "$out"/conform-seed-*.log "$out"/conform-golden.log; do
  [ -f "$log" ] || continue
  printf 'conform:    %-24s %s\n' "$(basename "$log" .log)" "$(grep -m1 '^conform:' "$log")"
done
for t in test_cuda test_cuda_graph test_conform_cuda; do
  printf 'tests:      %-24s %s\n' "$t" "$(grep -m1 'Synthesis' "$out/$t.log" 2>/dev/null)"
done
for log in "$out"/sanitizer-*.log; do
  [ -f "$log" ] || continue
  printf 'sanitizer:  %-30s %s\n' "$(basename "$log" .log)" "$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log")"
done
# show LOG TITLE FROM [KEEP]: LOG from its first line matching FROM (a sed
# pattern) under TITLE, only the lines matching KEEP (an ERE) when given.
show() {
  [ -f "$out/$1" ] || return 0
  echo "$2"
  sed -n "/$3/,\$p" "$out/$1" | grep -E "${4:-^}"
}
show bench.log "bench (tovl bench --backend cuda):" '^kernel '
show bench-pdl-off.log "bench with TOVL_CUDA_PDL=0 (plain launches), the hooks:" '^kernel ' '^(kernel|embed|lmhead)'
show torch-peer.log "against PyTorch:" '^tovl ('
show bench-sizes.log "bench at T = $peer_sizes, the hooks:" '^kernel ' '^(kernel|embed|lmhead)'
show triton-peer.log "against the PR #55796 design (Triton):" '^lm_head, graph'
for mb in lmhead_microbench lmhead_microbench_unfused; do
  [ -f "$out/$mb.log" ] || continue
  echo "$mb:"
  grep -E '^(device|lmhead_overlay|embed_overlay|all bit-exact|FAIL|  )' "$out/$mb.log" | head -40
done
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q '^\(FAIL\|TIME\)'
