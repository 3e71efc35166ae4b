#!/usr/bin/env bash
# Valgrind memcheck over the CPU test suite: every CTest test of BUILD_DIR
# except those of the GPU backends (their drivers are not valgrind-clean and
# lavapipe's JIT is too slow under it), with GPU backends hidden from the rest
# (TOVL_TEST_BACKENDS=cpu, no Vulkan ICD). Criterion runs each test in a child
# process, and a child's valgrind exit status does not reach the test's
# verdict, so every process writes its own log and each log's ERROR SUMMARY
# and leak summary is checked here (a log without one, from a process that was
# killed, fails too). Programs the tests start (the tovl CLI through /bin/sh)
# are traced as well.
#
# Usage: scripts/valgrind.sh [BUILD_DIR] [TEST_REGEX]
#   BUILD_DIR   a configured, non-sanitizer build (default: build, the default preset)
#   TEST_REGEX  only tests whose name matches (default: all CPU tests)
# Env: TOVL_VALGRIND_EXCLUDE   extended regex of test names to leave out
#      OUT                     logs go to $OUT/valgrind when set
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
only=${2:-.}
exclude=${TOVL_VALGRIND_EXCLUDE:-'cuda|hip|vulkan|^test_backend$'}
logs=${OUT:+$OUT/valgrind}
logs=${logs:-$build/valgrind}
command -v valgrind >/dev/null || { echo "valgrind: not installed (apt-get install valgrind)"; exit 1; }
[ -f "$build/CTestTestfile.cmake" ] || { echo "valgrind: $build is not a configured build tree"; exit 1; }
cmake --build "$build" -j "${JOBS:-2}" >/dev/null
rm -rf "$logs"
mkdir -p "$logs"
logs=$(cd "$logs" && pwd) # absolute: tests and the programs they start change directory

# name<TAB>command... for every test whose program lives in the build tree.
mapfile -t tests < <(ctest --test-dir "$build" -N --show-only=json-v1 | python3 -c '
import json, os, sys
build = os.path.realpath(sys.argv[1])
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or []
    if cmd and os.path.realpath(cmd[0]).startswith(build + os.sep):
        print("\t".join([t["name"]] + cmd))
' "$build")

total=0 failed=0 ran=()
for line in "${tests[@]}"; do
  IFS=$'\t' read -r -a parts <<<"$line"
  name=${parts[0]}
  cmd=("${parts[@]:1}")
  [[ $name =~ $only ]] || continue
  [[ $name =~ $exclude ]] && continue
  mkdir -p "$logs/$name"
  start=$SECONDS
  set +e
  TOVL_TEST_BACKENDS=cpu VK_ICD_FILENAMES=/dev/null \
    valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect,possible \
      --errors-for-leak-kinds=definite,indirect,possible --error-exitcode=1 \
      --suppressions="$PWD/scripts/valgrind.supp" --trace-children=yes \
      --log-file="$logs/$name/%p.log" "${cmd[@]}" >"$logs/$name/output.txt" 2>&1
  rc=$?
  set -e
  procs=$(ls "$logs/$name"/*.log | wc -l)
  bad=$(grep -L "ERROR SUMMARY: 0 errors" "$logs/$name"/*.log || true)
  total=$((total + 1))
  if [ "$rc" -ne 0 ] || [ -n "$bad" ]; then
    failed=$((failed + 1))
    echo "valgrind: FAIL $name (exit $rc, $procs processes; see $logs/$name)"
    for f in $bad; do grep -m1 "Command:" "$f"; grep -A12 -m3 -E "Invalid|uninitialised|definitely lost in|indirectly lost in|possibly lost in" "$f" | head -40; done
    tail -3 "$logs/$name/output.txt"
  else
    echo "valgrind: ok   $name ($procs processes, $((SECONDS - start)) s)"
  fi
  ran+=("$name")
done
echo "valgrind: $((total - failed)) of $total CPU test executables clean under memcheck (leak-check=full; logs in $logs)"
[ "$total" -gt 0 ] && [ "$failed" -eq 0 ]
