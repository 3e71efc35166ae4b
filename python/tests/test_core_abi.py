"""Every ctypes mirror in tovl._lib has the C struct's size, alignment and field offsets: a small
C program compiled against include/tovl/tovl.h prints them, and they are compared here."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

from tovl import _lib
from helpers_core import REPO


def test_struct_mirrors_match_the_header(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "a C compiler is needed to read the header's layouts (scripts/setup-debian.sh installs gcc)"
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <stdalign.h>", "#include <tovl/tovl.h>",
             "int main(void) {"]
    for cname, py in _lib.STRUCTS.items():
        lines.append(f'printf("{cname} %zu %zu\\n", sizeof({cname}), alignof({cname}));')
        for field, _ in py._fields_:
            lines.append(f'printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layouts.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layouts"
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", f"-I{REPO / 'include'}", str(src), "-o", str(exe)],
                   check=True)
    got = dict(line.split(" ", 1) for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                              text=True).stdout.splitlines())
    checked = 0
    for cname, py in _lib.STRUCTS.items():
        assert got[cname] == f"{ctypes.sizeof(py)} {ctypes.alignment(py)}", cname
        for field, _ in py._fields_:
            assert int(got[f"{cname}.{field}"]) == getattr(py, field).offset, f"{cname}.{field}"
            checked += 1
    assert checked > 60


def test_every_function_of_the_header_has_a_prototype() -> None:
    import re

    header = (REPO / "include" / "tovl" / "tovl.h").read_text()
    declared = set(re.findall(r"TOVL_API[^;(]*?\b(tovl_\w+)\s*\(", header))
    assert len(declared) > 50
    assert declared <= set(_lib._PROTOTYPES), sorted(declared - set(_lib._PROTOTYPES))
