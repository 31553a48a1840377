"""The real console in a real terminal (tmux), against fake ranks: rows appear, `?` opens help,
`p` asks before pausing, `q` quits and leaves the run going."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.support.fleet import ROOT
from tests.support.sshd import FakeRanks, free_port_base

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("tmux") is None and not os.environ.get("CI"), reason="tmux not installed"
    ),
]


class Tmux:
    """One detached session on a private tmux server (-L), so no user session is touched."""

    def __init__(self, name: str, command: str, cols: int = 100, rows: int = 30) -> None:
        self.socket = name
        env = dict(os.environ, TERM="xterm-256color")
        self.env = env
        self.tmux("new-session", "-d", "-s", "t", "-x", str(cols), "-y", str(rows), command)

    def tmux(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
        )

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t").stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not on screen:\n{screen}")

    def wait_gone(self, text: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while text in self.screen():
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} still on screen")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.tmux("has-session", "-t", "t").returncode == 0

    def kill(self) -> None:
        self.tmux("kill-server")


def test_console_in_a_real_terminal(tmp_path):
    ranks = FakeRanks(tmp_path / "run", 2, free_port_base(2))
    command = shlex.join(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "console",
            "--local",
            "-n",
            "2",
            "--port-base",
            str(ranks.port_base),
            "--run-dir",
            str(ranks.run_dir),
        ]
    )
    term = Tmux(f"fleet-test-{os.getpid()}", f"cd {shlex.quote(str(ROOT))} && {command}")
    try:
        screen = term.wait_for("2/2 live")
        assert "fake-0" in screen and "fake-1" in screen
        assert "RUNNING" in screen and "● live" in screen
        term.keys("?")
        term.wait_for("A rank's line")
        term.keys("Escape")  # alone: an escape followed at once by a key reads as Alt+key
        term.wait_gone("A rank's line")
        term.keys("p")
        term.wait_for("Pause the run?")
        term.keys("n")
        screen = term.wait_for("pause: cancelled")
        assert "PAUSED" not in screen
        term.keys("q")
        deadline = time.monotonic() + 15
        while term.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not term.alive(), "q did not quit the console"
        assert all(p.poll() is None for p in ranks.procs), "quitting the console hurt the run"
    finally:
        term.kill()
        ranks.stop()


def test_at_80_columns_what_matters_stays_and_every_key_shows(tmp_path):
    """Issue 18, defect 9, in a real 80x24 terminal: the alert and the straggler lead the
    header's second line (they were cut first); a paused run shows no tok/s and no ETA; the
    footer has `a` and `l`; a sample of several lines stays one line of the log; the
    autopilot's follow-up reads as a measurement; the rebalance dialog explains "max batch";
    help's straggler example looks like the rows' marker."""
    ranks = FakeRanks(tmp_path / "run", 4, free_port_base(4), slow="1,1,1,3", news=True)
    command = shlex.join(
        [
            *(sys.executable, "-m", "fleet.cli", "console", "--local", "-n", "4"),
            *("--port-base", str(ranks.port_base), "--run-dir", str(ranks.run_dir)),
        ]
    )
    term = Tmux(f"fleet-test80-{os.getpid()}", f"cd {shlex.quote(str(ROOT))} && {command}", 80, 24)
    try:
        term.wait_for("autopilot measured its")
        screen = term.wait_for("? Help")  # the footer, drawn once the bindings are known
        lines = screen.splitlines()
        assert lines[1].startswith(" ⚠ memory: rank 1 swaps 2.0 GiB  straggler » rank 3  loss ")
        assert "»  3 fake-3" in screen  # the row's marker, as the header and help say it
        footer = [line for line in lines if line.strip()][-1]
        for key in ("c Checkpoint", "p Pause", "a Autopilot", "l Reconnect", "? Help"):
            assert key in footer, footer
        assert "sample: def f(x):⏎    return x" in screen  # one row, cut
        assert not any("│    return x + 1" in line for line in lines)  # no stray line
        assert "compute went 300 → 200 ms (-33%)" in screen  # (wrapped in the pane)
        term.keys("?")
        help_screen = term.wait_for("A rank's line")
        assert "»  3 the straggler (here rank 3)" in help_screen
        term.keys("Escape")
        term.wait_gone("A rank's line")
        term.keys("r")
        dialog = term.wait_for("max batch")
        assert "max batch: the largest local batch that fits" in " ".join(dialog.split())
        term.keys("Escape")
        term.wait_gone("max batch:")
        term.keys("p")
        term.wait_for("Pause the run?")
        term.keys("y")
        screen = term.wait_for("PAUSED")
        header = screen.splitlines()[1]
        assert "tok/s" not in header and "ETA" not in header, header
    finally:
        term.kill()
        ranks.stop()
