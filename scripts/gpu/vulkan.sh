#!/usr/bin/env bash
# The Vulkan part of the GPU run (issue 5), on the H200 machine, from the repo
# root, with the build in ./build-gpu and the Vulkan loader already set up by
# scripts/gpu-suite.sh (VK_DRIVER_FILES = the NVIDIA ICD; VK_LAYER_PATH = the
# carried Khronos validation layer, when present). Runs:
#   1. the Vulkan CTest tests (conformance bit-exact, wrapped-device hooks),
#      with the validation layer when it loads here;
#   2. tovl conform --backend vulkan, without and with the validation layer,
#      and against the shipped golden file (tests/golden/, a CPU's digests);
#   3. `tovl bench` on vulkan and, for the 1.5x comparison, on cuda, at T = 1, 8,
#      64 and 512 (TOVL_BENCH_ARGS replaces that), with the per-dispatch floor.
# Logs go to $OUT (default /tmp/tovl-gpu-out/vulkan); a summary prints last.
set -uo pipefail
part=vulkan step_tail=15 step_skip_ok=1   # the Vulkan part judges its tests by status only
source "$(dirname "$0")/../lib/gpu-part.sh"
export TOVL_REQUIRE_VULKAN=1
tovl=$build/tools/tovl
seed=$fresh_seed

step devices "$tovl" devices
if ! grep -q '^vulkan  *present' "$out/devices.log"; then
  echo "vulkan backend not present here; see $out/devices.log"
  printf '%s\n' "${summary[@]}"
  exit 1
fi
grep -A9 '^vulkan' "$out/devices.log" | grep -E 'subgroup_size|f32_denormals|driver' > "$out/properties.txt"

# Does the validation layer load on this machine? The probe's output is kept
# (and read after it exits: `grep -q` in a pipe under pipefail would fail the
# test whenever tovl writes after grep has found its line).
TOVL_VULKAN_VALIDATION=1 "$tovl" devices > "$out/validation-probe.log" 2>&1
if grep -q '^vulkan  *present' "$out/validation-probe.log"; then
  validation=on
else
  validation="off (VK_LAYER_KHRONOS_validation does not load here: $(grep -m1 '^vulkan' "$out/validation-probe.log"))"
fi

if [ "$validation" = on ]; then
  # (the SPIR-V checks need the build machine's spirv-dis, the tp CLI tests
  # its cmake; CI runs them)
  step ctest ctest --test-dir "$build" -R 'vulkan' -E 'spirv_no_contraction|test_tp_cli_|test_tp_bench_' \
    --output-on-failure
else
  # The validation-counted tests need the layer; run the rest.
  step ctest ctest --test-dir "$build" -R '^test_vulkan[.]' --output-on-failure
fi
step conform "$tovl" conform --backend vulkan --seed "$seed"
step conform-golden "$tovl" conform --backend vulkan --against tests/golden/conform-seed-1.json \
  --json "$out/conform-golden.json" --junit "$out/conform-golden.xml"
if [ "$validation" = on ]; then
  step conform-validation env TOVL_VULKAN_VALIDATION=1 "$tovl" conform --backend vulkan --seed "$seed"
  if grep -q 'tovl vulkan validation:' "$out/conform-validation.log"; then
    summary+=("FAIL  validation messages: $(grep -c 'tovl vulkan validation:' "$out/conform-validation.log")")
  else
    summary+=("ok    validation messages: 0")
  fi
fi

# The benchmark: `tovl bench` on vulkan and, for the 1.5x comparison, on cuda
# in the same run (graph us = 100 launches recorded once; Vulkan: one command
# buffer between timestamps).
step bench-vulkan "$tovl" bench --backend vulkan --seed "$seed" --json "$out/bench-vulkan.json" ${TOVL_BENCH_ARGS:---tokens 1,8,64,512}
if grep -q '^cuda  *present' "$out/devices.log"; then
  step bench-cuda "$tovl" bench --backend cuda --seed "$seed" --json "$out/bench-cuda.json" ${TOVL_BENCH_ARGS:---tokens 1,8,64,512}
fi
# (Fixed-shape sets beside the from_slots set: the part scripts/gpu/slots.sh.)
{
  echo "device:     $(sed -n 's/^vulkan  *present: //p' "$out/devices.log")"
  sed 's/^ */properties: /' "$out/properties.txt"
  echo "validation: $validation"
  python3 - "$out/bench-vulkan.json" "$out/bench-cuda.json" <<'PY'
import json, os, sys
def load(path):
    return json.load(open(path)) if os.path.exists(path) else None
vk, cu = load(sys.argv[1]), load(sys.argv[2])
if not vk:
    print("bench:      no Vulkan figures"); sys.exit(0)
print("copy:       vulkan %.1f GB/s (read + written)" % vk["copy_gbps"])
cuda = {(r["kernel"], r["case"]): r for r in (cu or {"results": []})["results"]}
for r in vk["results"]:
    if r["kernel"] == "rowdiff":
        # vkCmdCopyBuffer streams far below the device's limit (about 850
        # GB/s on the H200), so the rate is held against CUDA's copy of the
        # same run when there is one.
        if cu:
            print("rowdiff:    %-20s %9.2f us  %.0f GB/s = %.1f%% of the CUDA copy bandwidth (goal >= 90%%)"
                  % (r["case"], r["graph_us"], r["gbps"], 100 * r["gbps"] / cu["copy_gbps"]))
        else:
            print("rowdiff:    %-20s %9.2f us  %.0f GB/s = %.1f%% of vkCmdCopyBuffer's rate (no CUDA here)"
                  % (r["case"], r["graph_us"], r["gbps"], 100 * r["copy_fraction"]))
        continue
    if r["kernel"].startswith("dispatch_floor_"):
        print("floor:      %-24s %-14s vulkan %8.2f us  (single %.2f us)" % (r["kernel"], r["case"], r["graph_us"],
              r["single_us"]))
        continue
    c = cuda.get((r["kernel"], r["case"]))
    ratio = "ratio %.2f (goal <= 1.5)" % (r["graph_us"] / c["graph_us"]) if c else "cuda n/a"
    print("hook:       %-20s %-18s vulkan %8.2f us  cuda %8s us  %s" % (r["kernel"], r["case"], r["graph_us"],
          "%.2f" % c["graph_us"] if c else "-", ratio))
PY
} > "$out/figures.txt"

echo
echo "=== vulkan summary (seed $seed; logs in $out)"
cat "$out/figures.txt"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -q '^FAIL'
