#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer included), in build-asan: the "asan" preset of
# CMakePresets.json. Every test fails on any sanitizer report (see
# tests/hardening.cmake and docs/SANITIZERS.md).
# Then ThreadSanitizer over stress_slots (the "tsan" preset, build-tsan): a
# loader thread loading and unloading a fixed-shape set's slot beside a
# serving thread running the hooks, on the CPU backend and on Vulkan (Criterion's
# runner does not run under TSan, so this check is a plain program).
# Usage: scripts/sanitize.sh [extra ctest arguments, e.g. -R test_faults]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs" "$@"
echo "sanitize: ASan + UBSan + LSan suite passed (build-asan)"
cmake --preset tsan >/dev/null
cmake --build --preset tsan -j "$jobs"
TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1" build-tsan/tests/stress_slots
echo "sanitize: ThreadSanitizer clean on a loader thread beside a serving thread (build-tsan)"
