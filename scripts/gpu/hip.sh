#!/usr/bin/env bash
# The HIP part of the GPU run (issue 7), on the H200 machine, from the repo
# root, with the build in ./build-gpu (scripts/gpu-prepare.sh). There is no AMD
# GPU there either: what runs is the HIP port's own source, token_overlay.hip,
# compiled by nvcc through backends/hip/hip_on_cuda.h into test_hip_on_cuda and
# loaded through the CUDA backend's host code. Runs:
#   1. test_hip_on_cuda: the whole conformance suite on the HIP port against
#      the CPU reference, bit for bit, with a fresh seed and two fixed ones
#      (and against the shipped golden file); then tovl conform --cuda-image
#      on the same cubin against that golden file (tests/golden/);
#   2. the same under compute-sanitizer memcheck and racecheck (the LDS tree),
#      each under a time limit (the whole GPU suite is one 10-minute command);
#   3. the HIP backend itself on that machine: unavailable, with its reason;
#   4. tovl bench on the HIP port's source (the same cubin, --cuda-image) and
#      on the CUDA port, one after the other in this run with one seed, and
#      the two side by side (scripts/lib/bench_side_by_side.py): rowdiff and
#      its fraction of copy, the idle dispatch, embed and lm_head bf16 at
#      T = 1, 8, 64, 512. The HIP source's cubin defines
#      tovl_cuda_dependent_launch, so the CUDA backend launches it with
#      programmatic dependent launch as it does the CUDA port; then both
#      again with plain launches (TOVL_CUDA_PDL=0), a second table.
#      TOVL_HIP_BENCH=0 leaves this out.
# Logs go to $OUT/hip (default /tmp/tovl-gpu-out/hip); a summary prints last.
# TOVL_HIP_SANITIZERS (default "memcheck racecheck"; synccheck and initcheck
# also work) and TOVL_HIP_SANITIZER_TIMEOUT (seconds per tool, default 150)
# bound step 2; a tool stopped by its limit is reported as TIME, not as a pass.
set -uo pipefail
part=hip step_tail=8
source "$(dirname "$0")/../lib/gpu-part.sh"
test_bin=$build/tests/test_hip_on_cuda
hip_cubin=$build/tests/token_overlay_hip_on_cuda.cubin
tovl=$build/tools/tovl
bench_tokens=1,8,64,512

if [ ! -x "$test_bin" ]; then
  echo "hip: $test_bin was not built (it needs nvcc and the CUDA backend in $build)"
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1

# 1. The HIP port, bit for bit against the CPU reference.
for seed in "$fresh_seed" 1 20261129; do
  step "conform-seed-$seed" env TOVL_TEST_SEED="$seed" "$test_bin" --verbose
  if ! grep -qE '^conform .* ok$' "$out/conform-seed-$seed.log"; then
    summary[${#summary[@]}-1]="FAIL  conform-seed-$seed ran no conformance case"
  fi
done

step conform-golden "$tovl" conform --cuda-image "$hip_cubin" --against tests/golden/conform-seed-1.json \
  --json "$out/conform-golden.json" --junit "$out/conform-golden.xml"

# 2. Sanitizers (Criterion forks each test: follow the children). Opening the
#    HIP port's module probes for the CUDA port's optional globals
#    (tovl_cuda_port_abi, ...), and cuModuleGetGlobal's "not found" is the
#    expected answer: API errors are not reported, memory errors are.
if command -v compute-sanitizer > /dev/null 2>&1; then
  for tool in ${TOVL_HIP_SANITIZERS:-memcheck racecheck}; do
    [ "$tool" = none ] && continue # the suite runs sanitizers in a phase of their own
    step "sanitizer-$tool" timeout "${TOVL_HIP_SANITIZER_TIMEOUT:-150}" \
      compute-sanitizer --tool "$tool" --report-api-errors no --target-processes all --error-exitcode 1 \
      env TOVL_TEST_SEED="$fresh_seed" "$test_bin" --verbose
  done
else
  summary+=("skip  compute-sanitizer not found")
fi

# 3. The HIP backend where no AMD runtime or GPU exists: unavailable, quietly.
step test-hip "$build/tests/test_hip" --verbose
"$build/tools/tovl" devices > "$out/devices.log" 2>&1
hip_line=$(grep -m1 '^hip ' "$out/devices.log")

# 4. The HIP source's figures beside the CUDA port's, one run, one seed.
bench_table=""
if [ "${TOVL_HIP_BENCH:-1}" != 0 ]; then
  step bench-hip-source "$tovl" bench --cuda-image "$hip_cubin" --tokens "$bench_tokens" --seed "$fresh_seed" \
    --json "$out/bench-hip-source.json"
  step bench-cuda-port "$tovl" bench --backend cuda --tokens "$bench_tokens" --seed "$fresh_seed" \
    --json "$out/bench-cuda-port.json"
  if [ -s "$out/bench-hip-source.json" ] && [ -s "$out/bench-cuda-port.json" ]; then
    python3 scripts/lib/bench_side_by_side.py "$out/bench-cuda-port.json" "CUDA port" \
      "$out/bench-hip-source.json" "HIP source on an NVIDIA GPU" > "$out/bench-side-by-side.md" 2>&1 ||
      summary+=("FAIL  bench-side-by-side (see bench-side-by-side.md)")
    bench_table=$out/bench-side-by-side.md
  fi
  # (Fixed-shape sets beside the from_slots set: the part scripts/gpu/slots.sh.)
  step bench-hip-source-plain env TOVL_CUDA_PDL=0 "$tovl" bench --cuda-image "$hip_cubin" --tokens "$bench_tokens" \
    --seed "$fresh_seed" --hooks-only --json "$out/bench-hip-source-plain.json"
  step bench-cuda-port-plain env TOVL_CUDA_PDL=0 "$tovl" bench --backend cuda --tokens "$bench_tokens" \
    --seed "$fresh_seed" --hooks-only --json "$out/bench-cuda-port-plain.json"
  if [ -s "$out/bench-hip-source-plain.json" ] && [ -s "$out/bench-cuda-port-plain.json" ]; then
    python3 scripts/lib/bench_side_by_side.py "$out/bench-cuda-port-plain.json" "CUDA port, plain launches" \
      "$out/bench-hip-source-plain.json" "HIP source, plain launches" > "$out/bench-side-by-side-plain.md" 2>&1 ||
      summary+=("FAIL  bench-side-by-side-plain (see bench-side-by-side-plain.md)")
  fi
fi

echo
echo "=== hip summary (seeds $fresh_seed 1 20261129; logs in $out)"
echo "machine:    $(cat "$out/gpu.txt")"
echo "ran:        the HIP port's source (token_overlay.hip via hip_on_cuda.h, nvcc sm_90) through the CUDA backend"
for log in "$out"/conform-seed-*.log; do
  [ -f "$log" ] || continue
  printf 'conform:    %-22s %3d cases ok, %d failed, %d skipped\n' "$(basename "$log" .log)" \
    "$(grep -cE '^conform .* ok$' "$log")" "$(grep -cE '^conform .* FAIL' "$log")" "$(grep -cE '^conform .* SKIP' "$log")"
done
echo "golden:     $(grep -m1 '^conform:' "$out/conform-golden.log" 2>/dev/null)"
echo "hip here:   ${hip_line:-?}"
if [ -n "$bench_table" ]; then
  echo "bench:      tovl bench --tokens $bench_tokens --seed $fresh_seed, $(date -u +%FT%TZ), commit $(build_commit)"
  cat "$bench_table"
  [ -s "$out/bench-side-by-side-plain.md" ] && echo && cat "$out/bench-side-by-side-plain.md"
fi
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q '^FAIL'
