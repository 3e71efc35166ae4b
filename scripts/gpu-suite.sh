#!/usr/bin/env bash
# Runs, on a GPU machine, in one call: the whole test suite, the conformance
# table on every backend present, each backend's own GPU checks
# (scripts/gpu/*.sh: sanitizers, graphs, benchmarks, the PyTorch peer), and
# writes its logs as one archive per phase, $OUT/gpu-logs-PHASE.tar.gz (the
# device tool brings back only a few files), plus $OUT/summary-PHASE.txt. Prepare with
# scripts/gpu-prepare.sh first.
#
#   bash scripts/gpu-suite.sh [all|check|sanitize] [PART...]
# check: tests, conformance, each backend's GPU part and benchmarks, no
# sanitizers; sanitize: compute-sanitizer's four
# tools on the CUDA conformance suite, the large lm_head tiles and the HIP
# port's run (about a minute on the H200); all: both (one device call is
# enough). PARTs (cuda, vulkan, ...: scripts/gpu/PART.sh) run only those parts
# of check, without its ctest and conformance steps unless the part "tests"
# is named too (a check too long for one 10-minute call runs in pieces). A
# part marked named-only (slots-short: the fixed-shape sets' figures and
# checks in about two minutes) runs only when named.
set -uo pipefail
phase=${1:-all}
case "$phase" in all|check|sanitize) ;; *) echo "usage: gpu-suite.sh [all|check|sanitize] [PART...]"; exit 2;; esac
shift $(( $# > 0 ? 1 : 0 ))
parts=("$@")
# The part "tests" is check's own ctest and conformance steps.
tests=1
if [ ${#parts[@]} -gt 0 ]; then
  tests=0
  for p in "${parts[@]}"; do
    [ "$p" = tests ] && { tests=1; continue; }
    [ -f "$(dirname "$0")/gpu/$p.sh" ] || { echo "gpu-suite.sh: no part '$p' (scripts/gpu/$p.sh)"; exit 2; }
  done
fi
here=$(cd "$(dirname "$0")/.." && pwd)
final_out=${OUT:-/tmp/tovl-gpu-out}
export OUT=/tmp/tovl-gpu-logs
rm -rf "$OUT"
mkdir -p "$OUT" "$final_out"
cd "$here"

# The build, packed by gpu-prepare.sh.
if [ -f .gpubuild/build-gpu.tar.xz ]; then
  rm -rf build-gpu && tar -xJf .gpubuild/build-gpu.tar.xz
fi

# The Vulkan loader, unpacked into / (as the device README says), and the
# NVIDIA ICD.
for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
ldconfig
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export VK_LAYER_PATH="$here/.gpulibs/layers"
# The validation layer, packed by gpu-prepare.sh.
if [ -f .gpulibs/libVkLayer_khronos_validation.so.xz ]; then
  xz -dkf .gpulibs/libVkLayer_khronos_validation.so.xz
fi

# The build tree holds absolute paths of the machine that built it: its
# source folder and the build folder itself; point both back here. A copy of
# shared/ carried as .shared stands in for the ../shared beside the source.
built_in=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' build-gpu/CMakeCache.txt)
build_in=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' build-gpu/CMakeCache.txt)
if [ -n "$built_in" ] && [ "$built_in" != "$here" ] && [ ! -e "$built_in" ]; then
  mkdir -p "$(dirname "$built_in")" && ln -s "$here" "$built_in"
fi
if [ -n "$build_in" ] && [ ! -e "$build_in" ]; then
  mkdir -p "$(dirname "$build_in")" && ln -s "$here/build-gpu" "$build_in"
fi
if [ -d .shared ] && [ -n "$built_in" ] && [ ! -e "$(dirname "$built_in")/shared" ]; then
  ln -s "$here/.shared" "$(dirname "$built_in")/shared"
fi
tovl_env() { LD_LIBRARY_PATH="$here/.gpulibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

summary=()
step() { # step NAME COMMAND...: run, log, remember the result
  local name=$1; shift
  echo "=== $name: $*"
  if "$@" > "$OUT/$name.log" 2>&1; then summary+=("ok    $name"); else summary+=("FAIL  $name (rc $?)"); fi
  tail -n 25 "$OUT/$name.log"
}

# The parts' own compute-sanitizer runs are off: the sanitize phase below
# covers them in less time.
export TOVL_CUDA_SANITIZERS=none TOVL_HIP_SANITIZERS=none
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
step devices tovl_env build-gpu/tools/tovl devices
if [ "$phase" != sanitize ]; then
  # Left out here: checks of the build's own artifacts with the build
  # machine's tools (llvm-objdump, spirv-dis, the build's cmake), which the GPU image lacks,
  # and the host emulators of the CUDA and HIP kernels (no GPU in them; the HIP one alone
  # took 218 s of this step on the H200): CI runs all of them on every submission.
  [ "$tests" = 1 ] && step ctest tovl_env ctest --test-dir build-gpu --output-on-failure -j 4 \
    -E 'test_tp_cli_|test_tp_bench_|test_cpu_no_fma|test_hip_no_fused_fp|test_hip_fused_check_sees_contraction|test_vulkan_spirv_no_contraction|test_api_doc_lists_every_function|test_cuda_emu|test_hip_emu'
  ls /usr/local/nvidia/share/vulkan/icd.d/ /usr/share/vulkan/icd.d/ /etc/vulkan/icd.d/ > "$OUT/vulkan-icds.txt" 2>&1
  VK_LOADER_DEBUG=error,warn,driver tovl_env build-gpu/tools/tovl devices > "$OUT/vulkan-loader.txt" 2>&1
  [ "$tests" = 1 ] && step conform tovl_env build-gpu/tools/tovl conform --json "$OUT/conform.json" \
    --junit "$OUT/conform.xml"
  for part in scripts/gpu/*.sh; do
    [ -f "$part" ] || continue
    name=$(basename "$part" .sh)
    if [ ${#parts[@]} -gt 0 ] && [[ " ${parts[*]} " != *" $name "* ]]; then
      continue
    fi
    # A part marked named-only (a short subset of the others) runs only when named.
    if [ ${#parts[@]} -eq 0 ] && grep -q '^# named-only:' "$part"; then
      continue
    fi
    step "gpu-$name" env TOVL_ENV_LIBS="$here/.gpulibs" bash "$part"
  done
fi
if [ "$phase" != check ]; then
  seed=$(( ($(date +%s) ^ $$) & 0x7fffffff ))
  limit=${TOVL_SANITIZE_TIMEOUT:-70}   # per run; eight runs must fit one 10-minute call
  for tool in memcheck racecheck initcheck synccheck; do
    step "sanitize-cuda-$tool" tovl_env timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 1 \
      build-gpu/tools/tovl conform --backend cuda --seed "$seed"
  done
  # The conformance cases use the small lm_head tiles; test_cuda's GPU-sized
  # batches reach the large ones.
  for tool in memcheck racecheck; do
    step "sanitize-cuda-large-$tool" tovl_env timeout "$limit" compute-sanitizer --tool "$tool" \
      --target-processes all --error-exitcode 1 env TOVL_TEST_SEED="$seed" build-gpu/tests/test_cuda --jobs 1 \
      --filter 'cuda/hooks_match_the_cpu_on_gpu_sized_batches'
  done
  if [ -x build-gpu/tests/test_hip_on_cuda ]; then
    # --report-api-errors no: opening a module of another port probes for the
    # global tovl_cuda_port_abi, and cuModuleGetGlobal's "not found" answer is
    # expected there; memory errors are still reported.
    for tool in memcheck racecheck; do
      step "sanitize-hip-on-cuda-$tool" tovl_env timeout "$limit" compute-sanitizer --tool "$tool" --report-api-errors no \
        --target-processes all --error-exitcode 1 env TOVL_TEST_SEED="$seed" build-gpu/tests/test_hip_on_cuda --jobs 1
    done
  fi
  grep -h -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT"/sanitize-*.log | sort | uniq -c
fi

{
  echo "=== summary ($(date -u +%FT%TZ), $(head -2 "$OUT/gpu.txt" | tail -1))"
  printf '%s\n' "${summary[@]}"
} | tee "$final_out/summary-$phase.txt"
tar -C "$(dirname "$OUT")" -czf "$final_out/gpu-logs-$phase.tar.gz" "$(basename "$OUT")"
