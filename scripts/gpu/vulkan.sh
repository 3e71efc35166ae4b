#!/usr/bin/env bash
# The Vulkan part of the GPU run (issue 5), on the H200 machine, from the repo
# root, with the build in ./build-gpu and the Vulkan loader already set up by
# scripts/gpu-suite.sh (VK_DRIVER_FILES = the NVIDIA ICD; VK_LAYER_PATH = the
# carried Khronos validation layer, when present). Runs:
#   1. the Vulkan CTest tests (conformance bit-exact, wrapped-device hooks),
#      with the validation layer when it loads here;
#   2. tovl conform --backend vulkan, without and with the validation layer;
#   3. the issue-5 benchmark on vulkan and, for the 1.5x comparison, on cuda;
#      and `tovl bench --backend vulkan` once that command exists.
# Logs go to $OUT (default /tmp/tovl-gpu-out/vulkan); a summary prints last.
set -uo pipefail
part=vulkan step_tail=15 step_skip_ok=1   # the Vulkan part judges its tests by status only
source "$(dirname "$0")/../lib/gpu-part.sh"
export TOVL_REQUIRE_VULKAN=1
tovl=$build/tools/tovl
bench=$build/backends/vulkan/tovl-overlay-bench
seed=$fresh_seed

step devices "$tovl" devices
if ! grep -q '^vulkan  *present' "$out/devices.log"; then
  echo "vulkan backend not present here; see $out/devices.log"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
grep -A9 '^vulkan' "$out/devices.log" | grep -E 'subgroup_size|f32_denormals|driver' > "$out/properties.txt"

# Does the validation layer load on this machine?
if TOVL_VULKAN_VALIDATION=1 "$tovl" devices 2>&1 | grep -q '^vulkan  *present'; then
  validation=on
else
  validation="off (VK_LAYER_KHRONOS_validation does not load here)"
fi

if [ "$validation" = on ]; then
  step ctest ctest --test-dir "$build" -R 'vulkan' --output-on-failure
else
  # The validation-counted tests need the layer; run the rest.
  step ctest ctest --test-dir "$build" -R '^test_vulkan$' --output-on-failure
fi
step conform "$tovl" conform --backend vulkan --seed "$seed"
if [ "$validation" = on ]; then
  step conform-validation env TOVL_VULKAN_VALIDATION=1 "$tovl" conform --backend vulkan --seed "$seed"
  if grep -q 'tovl vulkan validation:' "$out/conform-validation.log"; then
    summary+=("FAIL  validation messages: $(grep -c 'tovl vulkan validation:' "$out/conform-validation.log")")
  else
    summary+=("ok    validation messages: 0")
  fi
fi

step bench-vulkan "$bench" --backend vulkan ${TOVL_BENCH_ARGS:-}
if grep -q '^cuda  *present' "$out/devices.log"; then
  step bench-cuda "$bench" --backend cuda ${TOVL_BENCH_ARGS:-}
fi
if "$tovl" bench --help > /dev/null 2>&1; then
  step tovl-bench "$tovl" bench --backend vulkan
else
  summary+=("skip  tovl bench (not implemented in this build)")
fi

# Figures: rowdiff as % of copy; hooks, Vulkan vs CUDA (batched = recorded once).
figure() { # figure LOG PATTERN: the batched us/launch of the first matching line
  [ -f "$1" ] && awk -v p="$2" 'index($0, p) == 1 { for (i = 1; i <= NF; i++) if ($i == "batched") { print $(i+1); exit } }' "$1"
}
{
  echo "device:     $(sed -n 's/^vulkan  *present: //p' "$out/devices.log")"
  sed 's/^ */properties: /' "$out/properties.txt"
  echo "validation: $validation"
  grep -E '^(copy_bandwidth|rowdiff)' "$out/bench-vulkan.log" 2>/dev/null | sed 's/^/vulkan:     /'
  for k in "embed_overlay T=512" "lmhead_overlay_bf16 T=512" "lmhead_overlay_f32 T=512" \
           "embed_overlay T=64" "lmhead_overlay_bf16 T=64" "lmhead_overlay_f32 T=64"; do
    v=$(figure "$out/bench-vulkan.log" "$k"); c=$(figure "$out/bench-cuda.log" "$k")
    if [ -n "$v" ] && [ -n "$c" ]; then
      printf 'hook:       %-26s vulkan %8s us  cuda %8s us  ratio %s (goal <= 1.5)\n' "$k" "$v" "$c" \
        "$(awk -v a="$v" -v b="$c" 'BEGIN { printf "%.2f", a / b }')"
    else
      printf 'hook:       %-26s vulkan %8s us  cuda %s\n' "$k" "${v:-?}" "${c:-n/a}"
    fi
  done
} > "$out/figures.txt"

echo
echo "=== vulkan summary (seed $seed; logs in $out)"
cat "$out/figures.txt"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q '^FAIL'
