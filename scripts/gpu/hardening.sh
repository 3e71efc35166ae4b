#!/usr/bin/env bash
# The hardening part of the GPU run (issue 4), on the GPU machine, from the
# repo root, with the build in ./build-gpu (scripts/gpu-prepare.sh;
# TOVL_GPU_BUILD names another tree). scripts/gpu-suite.sh runs it with the
# other scripts/gpu/*.sh; alone: bash scripts/gpu/hardening.sh
#   1. test_hostile on every backend present (hostile batches against an
#      oracle, guards around every output): CUDA, HIP and Vulkan must really
#      run where the machine has them, not skip;
#   2. test_faults (fault injection; backend-independent core, a sanity run);
#   3. compute-sanitizer memcheck (leak check on) and racecheck over
#      test_hostile restricted to CUDA, every Criterion worker process traced;
#   4. examples/consumer.c built against build-gpu's libtovl.so and run on
#      each GPU backend present: the engine-side call sequence on the device.
# Logs go to $OUT/hardening (default /tmp/tovl-gpu-out/hardening); a summary
# prints last. Knobs: TOVL_HARDENING_SANITIZERS (default "memcheck racecheck";
# "none" skips step 3, as does TOVL_CUDA_SANITIZERS=none, which gpu-suite.sh's
# check phase sets), TOVL_HARDENING_SANITIZER_TIMEOUT (seconds per tool, 200).
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cd "$here" || exit 1
out=${OUT:-/tmp/tovl-gpu-out}/hardening
mkdir -p "$out"
if [ -n "${TOVL_ENV_LIBS:-}" ]; then
  export LD_LIBRARY_PATH="$TOVL_ENV_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
build=${TOVL_GPU_BUILD:-build-gpu}
limit=${TOVL_HARDENING_SANITIZER_TIMEOUT:-200}
tools=${TOVL_HARDENING_SANITIZERS:-memcheck racecheck}
[ "${TOVL_CUDA_SANITIZERS:-}" = none ] && tools=none
results=()
record() { results+=("$(printf '%-5s %s' "$1" "$2")"); }

if [ ! -x "$build/tests/test_hostile" ]; then
  echo "hardening: $build/tests/test_hostile missing (run scripts/gpu-prepare.sh; TOVL_GPU_BUILD)"
  exit 1
fi
"$build/tools/tovl" devices > "$out/devices.txt" 2>&1
cat "$out/devices.txt"
present=$(awk '$2 ~ /^present/ {print $1}' "$out/devices.txt" | grep -v '^cpu$' | tr '\n' ' ')
echo "hardening: GPU backends present: ${present:-none}"

# 1. Hostile batches on every backend present.
"$build/tests/test_hostile" --jobs 2 --verbose > "$out/hostile.log" 2>&1
rc=$?
ran=$(grep -o 'hostile: on [a-z]*' "$out/hostile.log" | awk '{print $3}' | sort | uniq -c | tr '\n' ' ')
missing=""
for b in $present; do
  grep -q "hostile: on $b " "$out/hostile.log" || missing="$missing $b"
done
if [ $rc -eq 0 ] && [ -z "$missing" ] && grep -q 'Failing: 0 | Crashing: 0' "$out/hostile.log"; then
  record ok "test_hostile: $(grep Synthesis "$out/hostile.log" | sed 's/.*Synthesis: //'); runs per backend: $ran"
else
  record FAIL "test_hostile (rc $rc; not run on:${missing:- -}); see $out/hostile.log"
  grep -B2 -A6 -E 'FAIL|Assertion' "$out/hostile.log" | head -40
fi

# 2. Fault injection.
"$build/tests/test_faults" --jobs 2 > "$out/faults.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q 'Failing: 0 | Crashing: 0' "$out/faults.log"; then
  record ok "test_faults: $(grep -c 'injected failures, each clean' "$out/faults.log") operations driven, $(grep Synthesis "$out/faults.log" | sed 's/.*Synthesis: //')"
else
  record FAIL "test_faults (rc $rc); see $out/faults.log"
fi

# 3. compute-sanitizer on the hostile batches, CUDA only.
if [ "$tools" = none ]; then
  record skip "compute-sanitizer: turned off (TOVL_HARDENING_SANITIZERS / TOVL_CUDA_SANITIZERS)"
elif [[ " $present " == *" cuda "* ]] && command -v compute-sanitizer >/dev/null; then
  for tool in $tools; do
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    TOVL_TEST_BACKENDS=cuda timeout "$limit" compute-sanitizer --tool "$tool" "${extra[@]}" \
      --target-processes all --error-exitcode 1 "$build/tests/test_hostile" --jobs 1 > "$out/sanitize-$tool.log" 2>&1
    rc=$?
    summaries=$(grep -cE '(ERROR|RACECHECK) SUMMARY' "$out/sanitize-$tool.log")
    dirty=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$out/sanitize-$tool.log" | grep -vc ': 0 ')
    if [ $rc -eq 0 ] && [ "$summaries" -gt 0 ] && [ "$dirty" -eq 0 ] && grep -q 'Failing: 0 | Crashing: 0' "$out/sanitize-$tool.log"; then
      record ok "compute-sanitizer $tool on test_hostile (cuda): $summaries processes, 0 errors"
    else
      record FAIL "compute-sanitizer $tool on test_hostile (rc $rc, $dirty of $summaries processes with errors); see $out/sanitize-$tool.log"
      grep -m5 -A8 -E '^========= (Invalid|Race|Error|Leaked)' "$out/sanitize-$tool.log" | head -40
    fi
  done
else
  record skip "compute-sanitizer: no CUDA device or no compute-sanitizer"
fi

# 4. The example consumer on each GPU backend, against this build's libtovl.so.
if cc -std=c11 -O2 -Wall -Wextra -Werror -Iinclude examples/consumer.c -o "$out/consumer" \
     -L"$build" -ltovl -Wl,-rpath,"$here/$build" > "$out/consumer-build.log" 2>&1; then
  for b in $present auto; do
    if "$out/consumer" "$b" > "$out/consumer-$b.log" 2>&1; then
      record ok "consumer on $b: $(grep '^consumer: backend' "$out/consumer-$b.log" | sed 's/consumer: backend //')"
    else
      record FAIL "consumer on $b; see $out/consumer-$b.log"
      tail -5 "$out/consumer-$b.log"
    fi
  done
else
  record FAIL "consumer build; see $out/consumer-build.log"
  tail -5 "$out/consumer-build.log"
fi

echo "=== hardening summary"
printf '%s\n' "${results[@]}" | tee "$out/summary.txt"
summary=$(printf '%s\n' "${results[@]}")
! grep -q '^FAIL' <<<"$summary"
