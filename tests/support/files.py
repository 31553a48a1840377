"""A folder's contents as a value: what a command must leave alone, compared before and after."""

from __future__ import annotations

import os
from pathlib import Path


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every file's bytes and every link's target under `folder`, by relative path; the run
    folder's `lock` aside (its note names whoever last claimed it, a refused run included)."""
    out: dict[str, bytes | str] = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if rel == "lock":
            continue
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out
