#!/usr/bin/env bash
# The hardening part of the GPU run (issue 4), on the GPU machine, from the
# repo root, with the build in ./build-gpu (scripts/gpu-prepare.sh).
# scripts/gpu-suite.sh runs it with the other scripts/gpu/*.sh; alone, once
# the suite has unpacked the build: bash scripts/gpu/hardening.sh
#   1. test_hostile on every backend present (hostile batches against an
#      oracle, guards around every output): each GPU backend that
#      `tovl devices` lists as present must really run, not skip;
#   2. test_faults (fault injection; the core is backend-independent: a sanity run);
#   3. compute-sanitizer memcheck (leak check on) and racecheck over
#      test_hostile restricted to CUDA, every Criterion worker traced;
#   4. examples/consumer.c built against build-gpu's libtovl.so and run on
#      each GPU backend present and on "auto": the engine-side call sequence.
# Logs go to $OUT/hardening (default /tmp/tovl-gpu-out/hardening); a summary
# prints last. Knobs: TOVL_HARDENING_SANITIZERS (default "memcheck racecheck";
# "none" skips step 3, as does TOVL_CUDA_SANITIZERS=none, which gpu-suite.sh's
# check phase sets), TOVL_HARDENING_SANITIZER_TIMEOUT (seconds per tool, 200).
set -uo pipefail
part=hardening step_tail=6
source "$(dirname "$0")/../lib/gpu-part.sh"
limit=${TOVL_HARDENING_SANITIZER_TIMEOUT:-200}
tools=${TOVL_HARDENING_SANITIZERS:-memcheck racecheck}
[ "${TOVL_CUDA_SANITIZERS:-}" = none ] && tools=none

if [ ! -x "$build/tests/test_hostile" ]; then
  echo "hardening: $build/tests/test_hostile was not built (scripts/gpu-prepare.sh; TOVL_GPU_BUILD)"
  exit 1
fi
step devices "$build/tools/tovl" devices
present=$(present_backends | sed 's/\bcpu //')
echo "hardening: GPU backends present: ${present:-none}"

# 1. Hostile batches on every backend present; absent ones skip by design.
step_skip_ok=1 step hostile env TOVL_TEST_SEED="$fresh_seed" "$build/tests/test_hostile" --jobs 2 --verbose
# shellcheck disable=SC2086 # one word per backend
expect_ran_on hostile hostile $present

# 2. Fault injection.
step faults env TOVL_TEST_SEED="$fresh_seed" "$build/tests/test_faults" --jobs 2

# 3. compute-sanitizer on the hostile batches, CUDA only.
if [ "$tools" = none ]; then
  summary+=("skip  compute-sanitizer (TOVL_HARDENING_SANITIZERS / TOVL_CUDA_SANITIZERS = none)")
elif [[ " $present " != *" cuda "* ]] || ! command -v compute-sanitizer >/dev/null; then
  summary+=("skip  compute-sanitizer: no CUDA device or no compute-sanitizer")
else
  for tool in $tools; do
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    step_skip_ok=1 step "sanitize-$tool" env TOVL_TEST_BACKENDS=cuda TOVL_TEST_SEED="$fresh_seed" \
      timeout "$limit" compute-sanitizer --tool "$tool" "${extra[@]}" --target-processes all --error-exitcode 1 \
      "$build/tests/test_hostile" --jobs 1
    dirty=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$out/sanitize-$tool.log" | grep -vc ': 0 ')
    if ! grep -q 'hostile: on cuda ' "$out/sanitize-$tool.log" || [ "$dirty" -ne 0 ]; then
      summary[${#summary[@]}-1]="FAIL  sanitize-$tool: $dirty reports with errors, or cuda did not run"
    fi
  done
fi

# 4. The example consumer against this build's libtovl.so.
step consumer-build cc -std=c11 -O2 -Wall -Wextra -Werror -Iinclude examples/consumer.c -o "$out/consumer" \
  -L"$build" -ltovl -Wl,-rpath,"$here/$build"
if [ -x "$out/consumer" ]; then
  for b in $present auto; do
    step "consumer-$b" "$out/consumer" "$b"
  done
fi

echo
echo "=== hardening summary (seed $fresh_seed; logs in $out)"
printf 'hostile:    %s; runs: %s\n' "$(grep -m1 Synthesis "$out/hostile.log" | sed 's/.*Synthesis: //')" \
  "$(grep -o 'hostile: on [a-z]*' "$out/hostile.log" | awk '{print $3}' | sort | uniq -c | tr -s ' \n' ' ')"
printf 'faults:     %s operations driven\n' "$(grep -c 'injected failures, each clean' "$out/faults.log")"
for log in "$out"/sanitize-*.log; do
  [ -f "$log" ] || continue
  printf 'sanitizer:  %-20s %s\n' "$(basename "$log" .log)" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | sort | uniq -c | tr -s ' \n' ' ')"
done
for log in "$out"/consumer-*.log; do
  grep -h '^consumer: backend' "$log" 2>/dev/null | sed 's/^/consumer:   /'
done
printf '%s\n' "${summary[@]}"
outcome=$(printf '%s\n' "${summary[@]}")
! grep -q '^\(FAIL\|TIME\)' <<<"$outcome"
