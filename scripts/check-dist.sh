#!/usr/bin/env bash
# Installs the release artifacts of scripts/dist.sh and uses them, never the
# source tree's build:
#   SHA256SUMS  every file of dist/ matches it
#   the wheel   into a fresh virtual environment with torch and numpy from PyPI
#               and no compiler on PATH: the `tovl` console
#               script (--version, devices, conform on cpu), then, from outside the
#               tree, import tovl, tovl.backends(), the ops on CPU tensors and an
#               AdapterPool serving a fixture adapter (scripts/lib/wheel-smoke.py)
#   the .deb    unpacked with dpkg -x into an empty root, its Depends listed;
#               examples/ built against its usr/ via find_package and pkg-config,
#               shared and static, and run (scripts/check-install.sh --installed)
#   the tarball the same, unpacked anywhere
# torch (with its CUDA libraries, 4 GB from PyPI) is the test environment's,
# $TOVL_VENV (default ~/.cache/tovl/venv, made by scripts/setup-python.sh from
# PyPI), linked into the fresh environment with its requirements and nothing
# else (scripts/lib/link-dists.py): downloading it again took longer than the
# rest of `make test`. Without that environment, or with
# TOVL_CHECK_DIST_TORCH=pypi, pip installs torch from PyPI (binary wheels only)
# into the fresh one. The fresh environment is removed afterwards.
#
# Usage: scripts/check-dist.sh [DIST_DIR]   (default dist/)
# Env: TOVL_CHECK_DIST_DEVICE  the device of the wheel's checks (default cpu; cuda
#                              on a GPU machine: scripts/gpu/wheel.sh)
#      TOVL_CHECK_DIST_SKIP_C=1  only the wheel (the GPU machine has no compiler)
#      KEEP=1                  keep the temporary directory
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
dist=$(cd "${1:-dist}" && pwd)
device=${TOVL_CHECK_DIST_DEVICE:-cpu}
work=$(mktemp -d "${TMPDIR:-/tmp}/tovl-check-dist.XXXXXX")
failed=1
cleanup() {
  if [ "${KEEP:-0}" = 1 ] || [ "$failed" = 1 ]; then
    rm -rf "$work/venv" # the only big part; the logs stay
    echo "check-dist: logs kept in $work"
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
say() { echo "check-dist: $*"; }
die() { echo "check-dist: FAILED: $*" >&2; exit 1; }
t0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }

(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || die "dist/ does not match its SHA256SUMS"
[ "$(wc -l <"$dist/SHA256SUMS")" -eq "$(find "$dist" -maxdepth 1 -type f ! -name SHA256SUMS | wc -l)" ] \
  || die "SHA256SUMS does not list every file of $dist"
wheel=$(ls "$dist"/tovl-*-py3-none-manylinux_*_x86_64.whl 2>/dev/null | head -1)
deb=$(ls "$dist"/tovl_*_amd64.deb 2>/dev/null | head -1)
tarball=$(ls "$dist"/tovl-*-linux-x86_64.tar.gz 2>/dev/null | head -1)
[ -n "$wheel" ] || die "no manylinux wheel in $dist"
say "SHA256SUMS ok; $(basename "$wheel")"

# --- the wheel ---------------------------------------------------------------
venv=$work/venv
python3 -m venv "$venv"
# PATH for everything the environment runs: its own bin/ and a folder of the
# few tools pip and the checks call, none of them a compiler.
tools=$work/bin
mkdir -p "$tools"
for t in sh bash env uname ls cat rm mkdir; do ln -s "$(command -v "$t")" "$tools/$t"; done
nocc="$venv/bin:$tools"
for cc in cc gcc clang nvcc hipcc c++ g++ ld cmake; do
  if PATH=$nocc command -v "$cc" >/dev/null 2>&1; then die "$cc is on the wheel check's PATH"; fi
done
test_venv=${TOVL_VENV:-$HOME/.cache/tovl/venv}
if [ "${TOVL_CHECK_DIST_TORCH:-}" != pypi ] && "$test_venv/bin/python" -c 'import torch, numpy, packaging' 2>/dev/null; then
  say "a fresh environment, with torch and numpy (and their requirements) of $test_venv linked in"
  "$test_venv/bin/python" "$src/scripts/lib/link-dists.py" "$work/borrowed" torch numpy >/dev/null
  echo "$work/borrowed" >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/borrowed.pth"
else
  say "a fresh environment, with torch and numpy from PyPI (binary wheels only)"
  PATH=$nocc "$venv/bin/python" -m pip install -q --only-binary=:all: torch numpy >"$work/pip-torch.log" 2>&1 \
    || { tail -20 "$work/pip-torch.log"; die "pip install torch numpy"; }
fi
say "  torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)') ($(elapsed))"
say "installing $(basename "$wheel")"
PATH=$nocc "$venv/bin/python" -m pip install -q --only-binary=:all: "$wheel" >"$work/pip-wheel.log" 2>&1 \
  || { tail -20 "$work/pip-wheel.log"; die "pip install of the wheel"; }
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
cd "$work" # nothing of the tree on sys.path from here
PATH=$nocc "$venv/bin/tovl" --version >"$work/cli-version.txt" 2>&1 || { cat "$work/cli-version.txt"; die "tovl --version (console script)"; }
say "  console script: $(head -1 "$work/cli-version.txt")"
PATH=$nocc "$venv/bin/tovl" devices >"$work/cli-devices.txt" 2>&1 || { cat "$work/cli-devices.txt"; die "tovl devices (console script)"; }
sed 's/^/check-dist:     /' "$work/cli-devices.txt"
conform_backends=cpu
[ "$device" = cuda ] && conform_backends="cpu cuda vulkan"
for b in $conform_backends; do
  PATH=$nocc "$venv/bin/tovl" conform --backend "$b" >"$work/cli-conform-$b.txt" 2>&1 || { tail -30 "$work/cli-conform-$b.txt"; die "tovl conform --backend $b (console script)"; }
  say "  tovl conform --backend $b: $(tail -1 "$work/cli-conform-$b.txt")"
done
PATH=$nocc "$venv/bin/python" "$src/scripts/lib/wheel-smoke.py" "$src/tests/fixtures" --device "$device" \
  --expect-dir "$site" >"$work/wheel-smoke.txt" 2>&1 || { cat "$work/wheel-smoke.txt"; die "the wheel's Python checks"; }
sed 's/^/check-dist:   /' "$work/wheel-smoke.txt"
cd "$src"
rm -rf "$venv"
say "wheel ok ($(elapsed))"

if [ "${TOVL_CHECK_DIST_SKIP_C:-0}" = 1 ]; then
  failed=0
  exit 0
fi

# --- the .deb and the tarball --------------------------------------------------
[ -n "$deb" ] || die "no .deb in $dist"
[ -n "$tarball" ] || die "no release tarball in $dist"
say "$(basename "$deb"): Depends: $(dpkg-deb -f "$deb" Depends)"
mkdir -p "$work/deb-root"
dpkg -x "$deb" "$work/deb-root"
scripts/check-install.sh --installed "$work/deb-root/usr" 2>&1 | sed 's/^/check-dist:   /' || die "the .deb's tree"
say "$(basename "$tarball")"
mkdir -p "$work/tar-root"
tar -xzf "$tarball" -C "$work/tar-root"
top=$(find "$work/tar-root" -mindepth 1 -maxdepth 1 -type d)
[ "$(echo "$top" | wc -l)" -eq 1 ] || die "the tarball has more than one top folder"
scripts/check-install.sh --installed "$top" 2>&1 | sed 's/^/check-dist:   /' || die "the tarball's tree"
failed=0
say "OK: the wheel, the .deb and the tarball installed and used ($(elapsed))"
