"""`make demo` on a fresh clone says what it is doing while it builds .venv, and for how long
(issue 18, defect 15: it was silent for about 75 s). A stand-in Python makes it instant."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.fleet import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")

# Stands in for python3: `-m venv DIR` makes DIR/bin/python (itself); `-m pip ...` succeeds.
FAKE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && chmod +x "$3/bin/python"
fi
exit 0
"""


def test_building_the_environment_says_what_and_how_long(tmp_path):
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "-s", "-C", str(ROOT), f"VENV={venv}", f"PYTHON={fake}", "venv"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"make: setting up {venv} with mlx-fleet[")
    assert "about 1-2 minutes on a fresh clone" in out.stdout
    assert f"make: creating {venv} with {fake}" in lines
    assert "make: installing mlx-fleet[" in out.stdout
    assert lines[-1].startswith(f"make: {venv} is ready (") and lines[-1].endswith(" s)")
    again = subprocess.run(
        ["make", "-s", "-C", str(ROOT), f"VENV={venv}", f"PYTHON={fake}", "venv"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.stdout == ""  # built: nothing to say, nothing done
