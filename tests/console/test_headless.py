"""The console stays headless of mlx and the trainer; its CLI errors are one line."""

from __future__ import annotations

import subprocess
import sys

from tests.support.fleet import ROOT

# --- boundaries --------------------------------------------------------------------------------


def test_console_never_imports_mlx_or_trainer():
    code = (
        "import sys, console.app, console.cli, console.demo, console.once, console.replay, "
        "console.ssh, bench.console\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'trainer'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_console_model_stays_headless():
    # The fleet model and its vocabulary load without Textual, SSH or the network code, so
    # views, --once and replay read link phases from the model, never from links.py.
    code = (
        "import sys, console.link_phase, console.fleet, console.events, console.snapshot, "
        "console.series, console.feed, console.replay\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'paramiko') "
        "or m in ('console.links', 'console.live', 'console.connectors', 'console.ssh'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_balance_stays_pure():
    code = (
        "import sys, telemetry.balance\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mlx', 'numpy', 'textual', 'paramiko', 'console', 'trainer'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_console_cli_errors_are_one_line(tmp_path):
    def fleet(*args):
        return subprocess.run(
            [sys.executable, "-m", "fleet.cli", "console", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )

    out = fleet("--hostfile", str(tmp_path / "nope.json"))
    assert out.returncode == 2 and "no such hostfile" in out.stderr
    assert "Traceback" not in out.stderr
    out = fleet("--local")
    assert out.returncode == 2 and "-n N" in out.stderr
    out = fleet("--local", "-n", "2", "--replay", "x")
    assert out.returncode == 2 and "choose one" in out.stderr
    out = fleet("--replay", str(tmp_path))
    assert out.returncode == 2 and "no telemetry logs" in out.stderr
