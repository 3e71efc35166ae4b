#!/usr/bin/env bash
# The Python package's check: a virtual environment with torch, transformers,
# peft, pytest, numpy, safetensors, scikit-build-core and mypy from PyPI (created when
# missing, reused when present), the tovl package installed into it from
# python/ (its C library built by scikit-build-core with the project's CMake;
# the build directory python/build/ is kept, so a rebuild is incremental), mypy
# --strict over the package's sources (python/pyproject.toml), then pytest over
# python/tests. Fails when pytest fails or collects nothing, and
# when any test skips for a reason other than a missing GPU.
#
# Usage: scripts/setup-python.sh [PYTEST ARGS...]
# Env:   TOVL_VENV   the environment (default ~/.cache/tovl/venv)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${TOVL_VENV:-$HOME/.cache/tovl/venv}
modules=(torch transformers peft pytest numpy safetensors scikit_build_core mypy)
packages=(torch transformers peft pytest numpy safetensors scikit-build-core mypy)
say() { echo "setup-python: $*"; }

if [ ! -x "$venv/bin/python" ]; then
  say "creating $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
missing=()
for i in "${!modules[@]}"; do
  "$venv/bin/python" -c "import ${modules[$i]}" 2>/dev/null || missing+=("${packages[$i]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} from PyPI into $venv"
  "$venv/bin/python" -m pip install -q "${missing[@]}"
fi

say "installing the tovl package from python/"
# The build requirements are the environment's own (scikit-build-core above),
# so no isolated build environment is downloaded on every run.
"$venv/bin/python" -m pip install -q --no-build-isolation --no-deps --force-reinstall ./python

say "type-checking the package (mypy --strict)"
(cd python && "$venv/bin/python" -m mypy tovl)

report=$(mktemp "${TMPDIR:-/tmp}/tovl-pytest.XXXXXX.xml")
trap 'rm -f "$report"' EXIT
set +e
"$venv/bin/python" -m pytest python/tests -ra -p no:cacheprovider --junitxml="$report" "$@"
rc=$?
set -e
case $rc in
  0) ;;
  5) say "FAILED: pytest collected no tests"; exit 1 ;;
  *) say "FAILED: pytest exit status $rc"; exit "$rc" ;;
esac
# A skip is allowed only where a GPU is missing (the reason says so).
"$venv/bin/python" - "$report" <<'EOF'
import re, sys
import xml.etree.ElementTree as ET
bad = []
for case in ET.parse(sys.argv[1]).iter("testcase"):
    for skip in case.iter("skipped"):
        reason = skip.get("message", "")
        if not re.search(r"\bGPU\b|\bCUDA\b|\bROCm\b", reason):
            bad.append(f"{case.get('classname')}.{case.get('name')}: {reason}")
if bad:
    print("setup-python: FAILED: tests skipped for a reason other than a missing GPU:")
    print("\n".join("  " + b for b in bad))
    sys.exit(1)
EOF
say "ok"
