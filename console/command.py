"""How the operator types `fleet` on this machine, for the commands the console suggests.

`make demo` runs `.venv/bin/fleet` without putting `.venv/bin` on PATH, so a hint that says
`fleet console ...` cannot be typed as printed. This says `fleet` only when PATH finds this
very installation, else the script's path (relative to here when it is below), else
`python -m fleet.cli` with this interpreter.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path


def fleet_command(python: str = sys.executable, cwd: str | None = None) -> list[str]:
    """The words that run `fleet` here, as a user would type them."""
    script = Path(python).parent / "fleet"  # the venv's entry point, beside its python
    found = shutil.which("fleet")
    if found and script.exists() and os.path.samefile(found, script):
        return ["fleet"]
    if script.exists():
        try:
            rel = script.absolute().relative_to(Path(cwd or os.getcwd()).absolute())
            return [str(rel) if rel.parent != Path(".") else f"./{rel}"]
        except ValueError:
            return [str(script)]
    return [python, "-m", "fleet.cli"]


def typed(args: Sequence[str], python: str = sys.executable) -> str:
    """`fleet ARGS` as one line to paste: `.venv/bin/fleet console --local -n 4 ...`."""
    return shlex.join([*fleet_command(python), *args])
