#!/usr/bin/env bash
# Install tovl into a temporary prefix and build and run the example consumer
# against the installed tree only, through both routes:
#   CMake:      find_package(tovl) -> tovl::tovl (shared) and tovl::tovl_static
#   pkg-config: tovl.pc            -> -ltovl (shared) and libtovl.a + Libs.private
# The prefix is moved after installing, so both routes must be relocatable.
#
# Usage: scripts/check-install.sh [BUILD_DIR]
#        scripts/check-install.sh --installed PREFIX
#   BUILD_DIR   an already configured build tree to build and install
#               (default: a fresh Release build, without tests, under the
#               temporary directory: what a packager builds; `make test`
#               passes build-dist/, the release build of scripts/dist.sh)
#   --installed PREFIX  no build: check a tree installed otherwise, such as
#               the .deb unpacked (PREFIX = its usr/) or the release tarball
#               (scripts/check-dist.sh)
# Env: TOVL_CONSUMER_BACKENDS  backends the consumers run on (default "cpu auto")
#      KEEP=1                  keep the temporary directory
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
jobs=${JOBS:-2}
work=$(mktemp -d "${TMPDIR:-/tmp}/tovl-install-check.XXXXXX")
cleanup() { if [ "${KEEP:-0}" = 1 ] || [ "${failed:-1}" = 1 ]; then echo "check-install: files kept in $work"; else rm -rf "$work"; fi; }
trap cleanup EXIT
failed=1
step() { echo "check-install: $*"; }
die() { echo "check-install: FAILED: $*" >&2; exit 1; }

build=${1:-}
installed=
if [ "$build" = --installed ]; then
  installed=${2:?"--installed needs a PREFIX"}
  [ -d "$installed" ] || die "no installed tree at $installed"
  prefix=$(cd "$installed" && pwd)
  build=
fi
if [ -n "$installed" ]; then
  step "checking the installed tree $prefix"
elif [ -z "$build" ]; then
  build=$work/build
  step "configuring a fresh build in $build"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTOVL_BUILD_TESTS=OFF >"$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log"; die "configure"; }
fi
if [ -z "$installed" ]; then # build, install into a staging prefix, relocate
  [ -f "$build/CMakeCache.txt" ] || die "$build is not a configured build tree"
  build=$(cd "$build" && pwd) # absolute: it is also searched for in the installed files
  step "building $build"
  cmake --build "$build" -j "$jobs" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; die "build"; }

  staged=$work/staged
  step "installing into $staged"
  cmake --install "$build" --prefix "$staged" >"$work/install.log" 2>&1 || { tail -30 "$work/install.log"; die "install"; }
  # Relocate: nothing may point back at the staging prefix or the build tree.
  prefix=$work/prefix
  mv "$staged" "$prefix"
  if grep -rIl -e "$staged" -e "$build" "$prefix" >/dev/null 2>&1; then
    grep -rIn -e "$staged" -e "$build" "$prefix" | head -5
    die "the installed tree names the staging prefix or the build tree"
  fi
fi

libdir=$(dirname "$(find "$prefix" -name tovl.pc -path '*/pkgconfig/*' | head -1)")/..
libdir=$(cd "$libdir" && pwd)
for f in include/tovl/tovl.h include/tovl/backend.h include/tovl/kernel_args.h bin/tovl; do
  [ -e "$prefix/$f" ] || die "missing $f"
done
for f in libtovl.so libtovl.a pkgconfig/tovl.pc cmake/tovl/tovlConfig.cmake cmake/tovl/tovlConfigVersion.cmake \
         cmake/tovl/tovlTargets.cmake; do
  [ -e "$libdir/$f" ] || die "missing $libdir/$f"
done
soname=$(objdump -p "$libdir/libtovl.so" | awk '/SONAME/ {print $2}')
[ -n "$soname" ] && [ -e "$libdir/$soname" ] || die "libtovl.so has no SONAME link (SONAME '$soname')"
# The shared library exports the API and nothing of its internals (volk, cJSON, backends).
exported=$(nm -D --defined-only "$libdir/libtovl.so" | awk '$2 ~ /[TDRB]/ {print $3}')
stray=$(echo "$exported" | grep -v '^tovl_' | grep -v '^_' || true)
[ -z "$stray" ] || die "libtovl.so exports non-tovl symbols: $(echo $stray | head -c 300)"
# Every function the installed headers declare is exported (a backend's own
# header only when that backend is compiled in).
"$prefix/bin/tovl" devices >"$work/devices.txt" 2>&1 || { cat "$work/devices.txt"; die "installed tovl devices"; }
declared=0
for h in "$prefix"/include/tovl/*.h; do
  b=$(basename "$h" .h); b=${b#tovl_}
  if grep -q "^$b .*$b backend not built" "$work/devices.txt"; then continue; fi
  for fn in $(sed -n 's/^TOVL_API[^(]*[ *]\(tovl_[a-z0-9_]*\)(.*/\1/p' "$h"); do
    declared=$((declared + 1))
    grep -qx "$fn" <<<"$exported" || die "$(basename "$h") declares $fn but libtovl.so does not export it"
  done
done
[ "$declared" -gt 40 ] || die "found only $declared TOVL_API declarations: the check is broken"
step "installed: $(cd "$prefix" && find . -type f | wc -l) files, SONAME $soname, $(echo "$exported" | wc -l) exported symbols, all $declared declared ones"

grep -q '^cpu *present' "$work/devices.txt" || { cat "$work/devices.txt"; die "installed CLI does not list cpu"; }

step "route 1: CMake find_package(tovl)"
cmake -S "$src/examples" -B "$work/example-cmake" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  >"$work/example-cmake.log" 2>&1 || { tail -30 "$work/example-cmake.log"; die "example configure (find_package)"; }
grep -o 'tovl [0-9.]* found in .*' "$work/example-cmake.log" | sed 's/^/check-install:   /'
cmake --build "$work/example-cmake" >>"$work/example-cmake.log" 2>&1 || { tail -30 "$work/example-cmake.log"; die "example build (find_package)"; }

step "route 2: pkg-config"
PKG_CONFIG_PATH="$libdir/pkgconfig" make -s -C "$src/examples" OUT="$work" >"$work/example-pc.log" 2>&1 \
  || { tail -30 "$work/example-pc.log"; die "example build (pkg-config)"; }

# Each shared consumer must load the installed libtovl, not one from elsewhere.
# (ldd's output is read whole first: grep -q stopping early would make ldd die
# of SIGPIPE, and pipefail would report that as no match.)
deps=$(ldd "$work/example-cmake/tovl_consumer")
grep -q "$prefix/.*libtovl.so" <<<"$deps" || die "CMake consumer does not use the installed libtovl.so"
deps=$(LD_LIBRARY_PATH="$libdir" ldd "$work/consumer-pc")
grep -q "$prefix/.*libtovl.so" <<<"$deps" || die "pkg-config consumer does not use the installed libtovl.so"
for exe in "$work/example-cmake/tovl_consumer_static" "$work/consumer-pc-static"; do
  deps=$(ldd "$exe")
  ! grep -q libtovl <<<"$deps" || die "$exe should not need libtovl.so"
done

runs=0
for backend in ${TOVL_CONSUMER_BACKENDS:-cpu auto}; do
  for exe in example-cmake/tovl_consumer example-cmake/tovl_consumer_static consumer-pc consumer-pc-static; do
    if ! LD_LIBRARY_PATH="$libdir" "$work/$exe" "$backend" >"$work/run.log" 2>&1; then
      cat "$work/run.log"
      die "$exe $backend"
    fi
    runs=$((runs + 1))
  done
  step "  consumers on '$backend': $(grep '^consumer: backend' "$work/run.log" | sed 's/consumer: backend //')"
done
failed=0
step "OK: $([ -n "$installed" ] && echo "installed tree" || echo "installed, relocated"), 4 consumers built (CMake shared/static, pkg-config shared/static), $runs runs passed"
