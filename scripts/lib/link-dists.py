#!/usr/bin/env python3
"""Link installed distributions and everything they require into a folder, for a .pth file.

    link-dists.py DEST DIST...     (run by the Python whose environment holds them)

Each distribution of the closure of DIST... under Requires-Dist (extras and
markers that do not apply left out) has its top-level files and folders
symlinked into DEST, its .dist-info included, so that a fresh environment with
DEST on its path sees those packages and nothing else of this environment.
scripts/check-dist.sh uses it to give a fresh environment the test
environment's torch without downloading it again.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement


def closure(names: list[str]) -> list[metadata.Distribution]:
    seen: dict[str, metadata.Distribution] = {}
    extras_seen: set[tuple[str, str]] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [(n, ()) for n in names]
    while todo:
        name, extras = todo.pop()
        key = name.lower().replace("_", "-")
        new = [e for e in ("", *extras) if (key, e) not in extras_seen]
        if not new:
            continue
        extras_seen.update((key, e) for e in new)
        dist = seen.setdefault(key, metadata.distribution(name))
        for r in dist.requires or []:
            req = Requirement(r)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in new):
                todo.append((req.name, tuple(req.extras)))
    return list(seen.values())


def main() -> int:
    dest = Path(sys.argv[1])
    dest.mkdir(parents=True, exist_ok=True)
    for dist in closure(sys.argv[2:]):
        root = Path(str(dist.locate_file("")))
        for top in sorted({Path(str(f)).parts[0] for f in dist.files or []}):
            src = root / top
            if top != ".." and src.exists() and not (dest / top).exists():
                os.symlink(src, dest / top)
    print(f"{dest}: {len(list(dest.iterdir()))} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
