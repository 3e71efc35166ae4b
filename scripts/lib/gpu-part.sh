# Shared by the GPU-run parts (scripts/gpu/<part>.sh), sourced after setting
# `part` (cuda, hip, vulkan). Sets: here (repo root, the working directory),
# out ($OUT/<part>), build (TOVL_GPU_BUILD or build-gpu), fresh_seed, summary
# (the outcome lines), and step().
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$here" || exit 1
out=${OUT:-/tmp/tovl-gpu-out}/$part
mkdir -p "$out"
if [ -n "${TOVL_ENV_LIBS:-}" ]; then
  export LD_LIBRARY_PATH="$TOVL_ENV_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
build=${TOVL_GPU_BUILD:-build-gpu}   # another tree only for a local dry run
fresh_seed=$(( ($(date +%s) ^ $$) & 0x7fffffff ))
summary=()

# skipped_line LOG: the first Criterion skip in LOG, other than the tests a
# --filter leaves out (which --verbose lists as "Test is disabled").
skipped_line() {
  grep '\[SKIP\]' "$1" | grep -v ': Test is disabled$' | head -1
}

# step NAME COMMAND...: run, keep the log as $out/NAME.log, remember the
# outcome: TIME when `timeout` stopped it (rc 124), FAIL on a non-zero status,
# and FAIL when a Criterion test skipped or none ran, unless step_skip_ok=1
# (on the GPU machine a GPU test must run). Prints the log's last step_tail lines.
step() {
  local name=$1; shift
  echo "=== $part/$name: $*"
  "$@" > "$out/$name.log" 2>&1
  local rc=$? skipped
  skipped=$(skipped_line "$out/$name.log")
  if [ $rc -eq 124 ]; then
    summary+=("TIME  $name (stopped after its time limit; see $name.log)")
  elif [ $rc -ne 0 ]; then
    summary+=("FAIL  $name (rc $rc)")
  elif [ "${step_skip_ok:-0}" != 1 ] && [ -n "$skipped" ]; then
    summary+=("FAIL  $name skipped: $(sed -E 's/^.*\[SKIP\] [^ ]*: //' <<< "$skipped")")
  elif [ "${step_skip_ok:-0}" != 1 ] && grep -q 'Synthesis: Tested: 0 ' "$out/$name.log"; then
    # Without --verbose Criterion prints no [SKIP] line; its synthesis still says nothing ran.
    summary+=("FAIL  $name ran no test (Criterion: Tested: 0)")
  else
    summary+=("ok    $name")
  fi
  tail -n "${step_tail:-8}" "$out/$name.log"
}

# build_commit: the commit the build was made from (gpu-prepare.sh writes it).
build_commit() {
  cat "$here/$build/COMMIT" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo '?'
}

# present_backends: the backends $out/devices.log (a `tovl devices` step named
# devices) lists as present, space-separated.
present_backends() {
  awk '$2 ~ /^present/ {print $1}' "$out/devices.log" | tr '\n' ' '
}

# expect_ran_on LOG TAG BACKEND...: a FAIL line for each BACKEND on which the
# test behind $out/LOG.log did not say "TAG: on BACKEND " (it skipped there).
expect_ran_on() {
  local log=$1 tag=$2 b; shift 2
  for b in "$@"; do
    grep -q "$tag: on $b " "$out/$log.log" ||
      summary+=("FAIL  $log: $b is present but the test did not run on it")
  done
}

# python_env: the GPU image's own python3 imports the package from python/
# over $build/libtovl.so: TOVL_LIBRARY, PYTHONPATH (the source tree, and the
# package's metadata, the version the tests compare with the library's, in a
# folder of its own). Returns 1 when the build has no libtovl.so.
python_env() {
  local lib version meta
  lib=$(ls "$here/$build"/libtovl.so* 2>/dev/null | head -1)
  [ -n "$lib" ] || { echo "no libtovl.so in $build"; return 1; }
  version=$(sed -n 's/^#define TOVL_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$here/include/tovl/tovl.h" | paste -sd.)
  meta=$(mktemp -d)
  mkdir -p "$meta/tovl-$version.dist-info"
  printf 'Metadata-Version: 2.1\nName: tovl\nVersion: %s\n' "$version" > "$meta/tovl-$version.dist-info/METADATA"
  export TOVL_LIBRARY=$lib PYTHONPATH="$here/python:$meta${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
}
