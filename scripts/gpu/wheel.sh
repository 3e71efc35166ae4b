#!/usr/bin/env bash
# The release wheel on the GPU machine, from the repo root: dist/'s wheel,
# carried in .gpubuild/ by scripts/gpu-prepare.sh, installed into a fresh
# virtual environment. The machine reaches no package index, so the
# environment sees the image's own torch and numpy (a .pth file naming the
# site-packages of the image's python3, which may itself be a virtual
# environment) and tovl comes from the wheel alone (no TOVL_LIBRARY, no
# source tree on sys.path, run from /tmp). Runs:
#   1. pip install of the wheel (--no-index --no-deps);
#   2. the `tovl` console script: --version, devices, conform on cuda and on vulkan;
#   3. scripts/lib/wheel-smoke.py --device cuda: import tovl, tovl.backends(),
#      an AdapterPool on cuda:0 serving a fixture adapter, the ops on CUDA
#      tensors against PEFT's recorded output.
# Logs go to $OUT (default /tmp/tovl-gpu-out/wheel); a summary prints last.
set -uo pipefail
part=wheel step_tail=12 step_skip_ok=1
source "$(dirname "$0")/../lib/gpu-part.sh"
wheel=$(ls "$here"/.gpubuild/tovl-*-manylinux_*_x86_64.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "no wheel in .gpubuild/ (scripts/gpu-prepare.sh copies dist/'s there)"
  exit 1
fi
echo "wheel: $(basename "$wheel")"
venv=/tmp/tovl-wheel-venv
rm -rf "$venv"
# The image's python may lack ensurepip: then the environment borrows the
# image's pip too, which installs into the environment it runs in.
python3 -m venv "$venv" 2>/dev/null || { rm -rf "$venv"; python3 -m venv --without-pip "$venv"; }
python3 -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
  > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/image-site.pth"
unset TOVL_LIBRARY PYTHONPATH
cd /tmp
step install "$venv/bin/python" -m pip install --no-index --no-deps "$wheel"
step version "$venv/bin/tovl" --version
step devices "$venv/bin/tovl" devices
for b in cuda vulkan; do
  step "conform-$b" "$venv/bin/tovl" conform --backend "$b"
done
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
step smoke-cuda "$venv/bin/python" "$here/scripts/lib/wheel-smoke.py" "$here/tests/fixtures" --device cuda --expect-dir "$site"
cd "$here"
rm -rf "$venv"
printf '%s\n' "${summary[@]}"
! printf '%s\n' "${summary[@]}" | grep -qv '^ok'
