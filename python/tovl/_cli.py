"""The `tovl` console script: runs the CLI binary bundled with the package.

The commands (conform, devices, inspect, run, bench) are the C CLI's own, the
same program the C install puts in bin/; this only finds it in the package
(tovl/bin/tovl, linked to the bundled libtovl) and replaces the Python process
with it, so exit status and signals are the CLI's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def cli_path() -> Path:
    """The bundled CLI binary."""
    return Path(__file__).parent / "bin" / "tovl"


def main() -> None:
    exe = cli_path()
    if not os.access(exe, os.X_OK):
        sys.exit(f"tovl: this installation has no CLI binary at {exe} (built with TOVL_BUILD_TOOLS=OFF?)")
    os.execv(exe, [str(exe), *sys.argv[1:]])
