#!/usr/bin/env bash
# Prepares, on a development machine (Debian 12, no GPU), everything one call
# on a GPU machine needs: a build in build-gpu/ (CUDA fatbin, Vulkan shaders,
# HIP-on-CUDA test image), the Vulkan loader packages in .gl/ and the shared
# libraries the test binaries need in .gpulibs/ (the GPU image has no package
# registry). Then, with the device tool:
#   run: bash scripts/gpu-suite.sh      carry: .gl .gpulibs build-gpu
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"

scripts/setup-debian.sh
grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo '/.gl/' >> .git/info/exclude
grep -qx '/.gpulibs/' .git/info/exclude 2>/dev/null || echo '/.gpulibs/' >> .git/info/exclude

# 1. The build (paths inside it are absolute; gpu-suite.sh links them back).
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOVL_BUILD_FUZZERS=OFF
cmake --build build-gpu -j "$(nproc)"

# 2. The Vulkan loader (the GPU image has the NVIDIA ICD but no loader).
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 >/dev/null)
fi

# 3. Shared libraries of our binaries that the GPU image may lack.
rm -rf .gpulibs && mkdir -p .gpulibs
for bin in build-gpu/tools/tovl build-gpu/tests/test_*; do
  [ -x "$bin" ] || continue
  ldd "$bin" | awk '/=> \//{print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' | while read -r lib; do
  cp -L "$lib" .gpulibs/
done
# The Khronos validation layer, so the Vulkan suite can run with it there too.
if [ -f /usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so ]; then
  mkdir -p .gpulibs/layers
  cp -L /usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so .gpulibs/
  sed 's#"library_path": "[^"]*"#"library_path": "../libVkLayer_khronos_validation.so"#' \
    /usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json > .gpulibs/layers/VkLayer_khronos_validation.json
fi
du -sh build-gpu .gl .gpulibs
echo "gpu-prepare: done; now run 'bash scripts/gpu-suite.sh' on the GPU machine carrying .gl .gpulibs build-gpu"
