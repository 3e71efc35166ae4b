#!/usr/bin/env python3
"""Assemble the tovl wheel from an installed `python` component and the package sources.

    make-wheel.py --stage DIR --package python/tovl --pyproject python/pyproject.toml
                  --version X.Y.Z --tag py3-none-linux_x86_64 --out DIR

DIR (the stage) is `cmake --install BUILD --component python --prefix DIR`:
tovl/libtovl.so.<ABI> and tovl/bin/tovl (python/tovl_wheel.cmake). The
metadata is python/pyproject.toml's [project] table, the same one
scikit-build-core reads for `pip install ./python`; the release build makes the
wheel this way so that it reuses the one build the .deb and the tarball come
from. Timestamps are SOURCE_DATE_EPOCH's, so the same inputs give the same file.
Prints the wheel's path.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import sys
import time
import tomllib
import zipfile
from pathlib import Path


def metadata(project: dict, version: str) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {version}"]
    if "description" in project:
        lines.append(f"Summary: {project['description']}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {d}" for d in project.get("dependencies", [])]
    for extra, deps in project.get("optional-dependencies", {}).items():
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}; extra == "{extra}"' for d in deps]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for opt in ("stage", "package", "pyproject", "version", "tag", "out"):
        ap.add_argument(f"--{opt}", required=True)
    a = ap.parse_args()
    project = tomllib.loads(Path(a.pyproject).read_text())["project"]
    name, version = project["name"], a.version
    stage, package = Path(a.stage), Path(a.package)
    if not (stage / name).is_dir():
        sys.exit(f"make-wheel: {stage} holds no {name}/ (install the build's `python` component there)")

    files: dict[str, Path] = {}
    for src in sorted(package.rglob("*")):
        if src.is_file() and "__pycache__" not in src.parts and src.suffix != ".pyc":
            files[f"{name}/{src.relative_to(package).as_posix()}"] = src
    for src in sorted((stage / name).rglob("*")):
        if src.is_file():
            files[src.relative_to(stage).as_posix()] = src
    if not any(k.startswith(f"{name}/libtovl.so.") for k in files):
        sys.exit(f"make-wheel: no {name}/libtovl.so.<ABI> in {stage}")

    dist_info = f"{name}-{version}.dist-info"
    generated = {
        f"{dist_info}/METADATA": metadata(project, version),
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tovl scripts/lib/make-wheel.py\n"
        f"Root-Is-Purelib: false\nTag: {a.tag}\n",
    }
    scripts = project.get("scripts", {})
    if scripts:
        generated[f"{dist_info}/entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items())

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    stamp = time.gmtime(max(epoch, 315532800))[:6]  # zip cannot hold dates before 1980
    out = Path(a.out) / f"{name}-{version}-{a.tag}.whl"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = []

    def put(zf: zipfile.ZipFile, arcname: str, data: bytes, mode: int) -> None:
        info = zipfile.ZipInfo(arcname, stamp)
        info.external_attr = (mode & 0o777 | 0o100000) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, data, compresslevel=9)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{arcname},sha256={digest},{len(data)}")

    with zipfile.ZipFile(out, "w") as zf:
        for arcname, src in files.items():
            put(zf, arcname, src.read_bytes(), 0o755 if os.access(src, os.X_OK) else 0o644)
        for arcname, text in generated.items():
            put(zf, arcname, text.encode(), 0o644)
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", stamp)
        info.external_attr = 0o100644 << 16
        zf.writestr(info, "\n".join(record) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
