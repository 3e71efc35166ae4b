#!/usr/bin/env bash
# Prepares, on a development machine (Debian 12, no GPU), everything one call
# on a GPU machine needs: a build in build-gpu/ (CUDA fatbin, Vulkan shaders,
# HIP-on-CUDA test image) and the release wheel (scripts/dist.sh) in .gpubuild/,
# the Vulkan loader packages in .gl/ and the shared
# libraries the test binaries need in .gpulibs/ (the GPU image has no package
# registry). Then, with the device tool:
#   run: bash scripts/gpu-suite.sh all   carry: .gl .gpulibs .gpubuild
# (or the phases `check` and `sanitize` alone). TOVL_PREPARE_WHEEL=0 leaves
# the wheel out (and any wheel of an earlier run in .gpubuild/ alone): the
# build alone, for a run without the part `wheel`.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"

scripts/setup-debian.sh
# (git's own path for it: in a worktree .git is a file, not a folder.)
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for ignored in /.gl/ /.gpulibs/ /.gpubuild/; do
  grep -qx "$ignored" "$exclude" 2>/dev/null || echo "$ignored" >> "$exclude"
done

# 1. The build, of what is committed (HEAD), in a clean copy so work in
#    progress never reaches the GPU run; then moved here to be carried. Paths
#    inside it are absolute; gpu-suite.sh links them back on the GPU machine.
# One scratch copy per checkout, so two checkouts can prepare at once.
src=/tmp/tovl-gpu-src-$(printf %s "$PWD" | cksum | cut -d" " -f1)
rm -rf "$src" && mkdir -p "$src"
git archive HEAD | tar -x -C "$src"
cmake -S "$src" -B "$src/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOVL_BUILD_FUZZERS=OFF
cmake --build "$src/build-gpu" -j "$(nproc)"
# The Rust bindings' GPU tests (scripts/gpu/rust.sh), built here against that
# build (the GPU image has no cargo): the conformance and fixture test
# binaries and the serving example, under stable names in build-gpu/rust/.
# Their rpath and fixture paths point into $src, which gpu-suite.sh links back.
if command -v cargo >/dev/null || [ -x "$HOME/.cargo/bin/cargo" ]; then
  PATH="$HOME/.cargo/bin:$PATH" TOVL_LIB_DIR="$src/build-gpu" cargo build --offline --release \
    --manifest-path "$src/bindings/rust/Cargo.toml" --target-dir "$src/rust-target" \
    --tests --examples --message-format=json > "$src/rust-build.json"
  mkdir -p "$src/build-gpu/rust"
  python3 - "$src/rust-build.json" "$src/build-gpu/rust" <<'PY'
import json, shutil, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    name = m.get("target", {}).get("name")
    if m.get("reason") == "compiler-artifact" and m.get("executable") and name in ("conform", "fixtures", "serve_demo"):
        shutil.copy2(m["executable"], f"{sys.argv[2]}/{name}")
PY
  ls "$src/build-gpu/rust"
else
  echo "gpu-prepare: no cargo here: the Rust part (scripts/gpu/rust.sh) will report FAIL"
fi
rm -rf build-gpu && cp -a "$src/build-gpu" build-gpu
git rev-parse --short HEAD > build-gpu/COMMIT   # what the figures were built from (no .git there)

# 2. The Vulkan loader (the GPU image has the NVIDIA ICD but no loader).
if ! ls .gl/libglvnd0_*.deb >/dev/null 2>&1; then
  mkdir -p .gl /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null)
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
  # 22 MB, 4.5 MB in xz: what the 64 MiB the device tool carries has room
  # for beside the build. gpu-suite.sh unpacks it.
  xz -T0 -f .gpulibs/libVkLayer_khronos_validation.so
fi
# 4. The build, packed: the device tool carries at most 64 MiB, and every test
#    binary embeds the same fatbin and code-object bundle, which xz folds when
#    its dictionary spans them (about 720 MB to 5 MB; xz's default 8 MiB
#    dictionary leaves each copy in).
(cd build-gpu && find . -name '*.o' -delete && rm -f backends/cuda/*_fatbin.c backends/hip/*_bundle.c libtovl.a &&
  find . -type f \( -name 'test_*' -o -name 'tovl' -o -name 'tovl-*' -o -name 'libtovl.so*' \) -exec strip --strip-debug {} + 2>/dev/null || true)
mkdir -p .gpubuild && tar -c build-gpu | xz -T1 --lzma2=preset=6,dict=768MiB > .gpubuild/build-gpu.tar.xz
# 5. The release wheel, for scripts/gpu/wheel.sh: made by scripts/dist.sh from
#    this checkout (its build-dist/ is reused; 5 MB).
if [ "${TOVL_PREPARE_WHEEL:-1}" != 0 ]; then
  JOBS=$(nproc) scripts/dist.sh
  rm -f .gpubuild/tovl-*.whl && cp dist/tovl-*-manylinux_*_x86_64.whl .gpubuild/
fi
du -sh .gpubuild .gl .gpulibs
echo "gpu-prepare: done; now run 'bash scripts/gpu-suite.sh all' on the GPU machine carrying .gl .gpulibs .gpubuild"
