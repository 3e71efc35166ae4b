#!/usr/bin/env bash
# Installs the Debian 12 packages tovl builds and tests with. As root it runs
# apt-get (once, only when something is missing); otherwise it prints the line
# to run. The CUDA toolkit (nvcc) is not a Debian package here: when nvcc is
# absent the CUDA backend is simply left out, with the reason, at configure.
set -euo pipefail

packages=(
  cmake ninja-build gcc g++ make pkg-config python3
  libcriterion-dev libcjson-dev nettle-dev
  libvulkan-dev libvulkan-volk-dev glslang-tools spirv-tools
  mesa-vulkan-drivers vulkan-validationlayers
  hipcc libamdhip64-dev rocm-device-libs llvm-15 clang-15
  valgrind clang libclang-rt-14-dev
  bindgen
  dpkg-dev lintian
)
# Extra packages a component asks for (one per line), e.g. scripts/packages-hip.txt.
for f in "$(dirname "$0")"/packages-*.txt; do
  [ -f "$f" ] && while read -r p; do [ -n "$p" ] && packages+=("$p"); done < "$f"
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing Debian packages; run as root:"
  echo "  apt-get update && apt-get install -y ${missing[*]}"
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
