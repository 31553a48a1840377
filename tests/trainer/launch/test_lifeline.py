"""The lifeline's three ends without ranks: fleet launch's pipe, the tether inside mlx.launch
(a real child process), and a rank's watch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil

from tests.support.fleet import fleet_env
from trainer.launch import lifeline


def watch_on_pipe(timeout: float = 15.0) -> tuple[lifeline.Watch, int]:
    r, w = os.pipe()
    return lifeline.Watch(timeout, fd=r).start(), w


def settle(watch: lifeline.Watch, want: int, seconds: float = 5.0) -> int:
    deadline = time.monotonic() + seconds
    while watch.code() != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return watch.code()


def test_alive_lines_keep_a_rank_going_and_a_stop_line_stops_it():
    watch, w = watch_on_pipe()
    os.write(w, b"fleet:alive\nsomething typed\nfleet:alive\n")
    time.sleep(0.2)
    assert watch.code() == 0
    os.write(w, b"fleet:stop SIGHUP\n")
    assert settle(watch, lifeline.LAUNCHER_SIGNAL + signal.SIGHUP) == 129
    assert lifeline.describe(watch.code(), 0) == (
        "SIGHUP (the terminal or SSH session closed) to fleet launch"
    )
    os.close(w)


def test_an_ended_input_or_silence_is_a_lost_launcher():
    watch, w = watch_on_pipe()
    os.close(w)  # mlx.launch died: the pipe ends
    assert settle(watch, lifeline.LOST_CODE) == lifeline.LOST_CODE
    assert "input from mlx.launch ended" in watch.why()
    quiet, w = watch_on_pipe(timeout=0.3)  # an ssh connection gone silent
    assert quiet.code() == 0
    assert settle(quiet, lifeline.LOST_CODE) == lifeline.LOST_CODE
    assert "no word from fleet launch" in quiet.why()
    os.close(w)


# A stand-in for mlx.launch: the tether, then a loop copying its standard input to stdout
# (as mlx.launch copies it to every rank), with a child that plays a rank and never stops.
MLX_LAUNCH = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from trainer.launch.lifeline import tether
    tether()
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "fleet.cli"])
    print("rank", rank.pid, flush=True)
    while line := os.read(0, 4096):
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
    """
)


def test_the_tether_tells_the_ranks_when_fleet_launch_dies_then_ends_them():
    line = lifeline.Lifeline()
    env = {**fleet_env(), lifeline.GRACE_ENV: "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", MLX_LAUNCH], stdin=line.read_fd, stdout=subprocess.PIPE, env=env
    )
    line.start()
    try:
        rank = int(child.stdout.readline().split()[1])
        line.stop("SIGTERM")
        assert child.stdout.readline() == b"fleet:stop SIGTERM\n"
        line.close()  # fleet launch is gone (as if SIGKILLed: the pipe closes)
        assert child.stdout.readline() == b"fleet:lost\n"
        child.wait(timeout=30)  # after the grace the tether ends the rank, then itself
        time.sleep(0.2)
        assert not _running(rank)
    finally:
        child.kill()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_launchers_loop_sleeps_while_a_rank_s_input_is_always_writable(monkeypatch):
    # mlx.launch selects on each rank's stdin for writing: a pipe always is, so its loop spun
    import select
    import types

    # a calm ten times the product's, so that "at once" stands out from "waited" on a box
    # loaded enough to hold a thread back for tens of ms
    monkeypatch.setattr(lifeline, "CALM_S", 0.5)
    launch = types.SimpleNamespace(select=select.select)
    lifeline._calm(launch)
    out_r, out_w = os.pipe()  # the rank's output: nothing yet
    in_r, in_w = os.pipe()  # the rank's input: always writable
    try:
        t0 = time.monotonic()
        ready, writable, _ = launch.select([out_r], [in_w], [], 1.0)
        assert (ready, writable) == ([], [in_w])
        assert time.monotonic() - t0 >= 0.8 * lifeline.CALM_S  # it waited
        os.write(out_w, b"loss 3.2\n")
        t0 = time.monotonic()
        ready, writable, _ = launch.select([out_r], [in_w], [], 1.0)
        assert (ready, writable) == ([out_r], [in_w])
        assert time.monotonic() - t0 < lifeline.CALM_S  # output wakes it at once
        assert launch.select([out_r], [], [], 0)[0] == [out_r]  # no input: the call as it was
    finally:
        for fd in (out_r, out_w, in_r, in_w):
            os.close(fd)
