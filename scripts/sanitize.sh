#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer
# (LeakSanitizer included), in build-asan: the "asan" preset of
# CMakePresets.json. Every test fails on any sanitizer report (see
# tests/hardening.cmake and docs/SANITIZERS.md).
# Usage: scripts/sanitize.sh [extra ctest arguments, e.g. -R test_faults]
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs" "$@"
echo "sanitize: ASan + UBSan + LSan suite passed (build-asan)"
