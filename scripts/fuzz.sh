#!/usr/bin/env bash
# Build and run the libFuzzer targets of fuzz/ (issue 3).
#
#   scripts/fuzz.sh --ci [SECONDS]   each target for SECONDS (default 60): CI's bounded run
#   scripts/fuzz.sh --long [RUNS]    each target for RUNS executions (default 2000000)
#   scripts/fuzz.sh --replay         run every seed once (regression)
#
# Needs clang with libFuzzer (Debian: clang-14 libclang-rt-14-dev) and libcjson-dev.
# BUILD_DIR (default build-fuzz) is configured with clang and only the fuzz
# targets are built, with at most 2 jobs. New inputs go to a scratch corpus,
# never into fuzz/corpus/; a crash leaves its input in $OUT (or the build dir)
# and makes the script fail. Logs go to $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:---ci}
arg=${2:-}
build=${BUILD_DIR:-build-fuzz}
logs=${OUT:-$build/fuzz-logs}
targets=(fuzz_safetensors fuzz_adapter)
mkdir -p "$logs"

cmake -S . -B "$build" -G Ninja -DCMAKE_C_COMPILER="${CC_FUZZ:-clang}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTOVL_BUILD_FUZZERS=ON -DTOVL_BUILD_TESTS=OFF -DTOVL_BUILD_TOOLS=OFF >"$logs/configure.log" 2>&1 \
  || { tail -20 "$logs/configure.log"; exit 1; }
ninja -C "$build" -j2 "${targets[@]}" >"$logs/build.log" 2>&1 || { tail -40 "$logs/build.log"; exit 1; }

status=0
summary=()
for t in "${targets[@]}"; do
  scratch=$(mktemp -d)
  flags=(-dict=fuzz/import.dict -artifact_prefix="$logs/$t-" -print_final_stats=1 -timeout=20 -rss_limit_mb=2048)
  case "$mode" in
    --ci) flags+=(-max_total_time="${arg:-60}") ;;
    --long) flags+=(-runs="${arg:-2000000}") ;;
    --replay) flags+=(-runs=0) ;;
    *) echo "usage: $0 [--ci SECONDS | --long RUNS | --replay]" >&2; exit 2 ;;
  esac
  start=$(date +%s)
  if "$build/fuzz/$t" "${flags[@]}" "$scratch" "fuzz/corpus/$t" >"$logs/$t.log" 2>&1; then
    result=ok
  else
    result="FAILED (see $logs/$t.log)"
    status=1
    grep -E "ERROR|SUMMARY|Test unit written" "$logs/$t.log" | head -5 || true
  fi
  runs=$(grep -oE "stat::number_of_executed_units: [0-9]+" "$logs/$t.log" | grep -oE "[0-9]+$" || echo "?")
  rate=$(grep -oE "stat::average_exec_per_sec: +[0-9]+" "$logs/$t.log" | grep -oE "[0-9]+$" || echo "?")
  cov=$(grep -oE "cov: [0-9]+ ft: [0-9]+" "$logs/$t.log" | tail -1 || echo "?")
  summary+=("$t: $result, $runs executions in $(( $(date +%s) - start )) s ($rate/s), $cov")
  rm -rf "$scratch"
done
echo "fuzz summary ($mode ${arg})"
printf '  %s\n' "${summary[@]}"
exit $status
