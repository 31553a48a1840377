"""Nothing escapes `fleet launch`: a run whose launcher is killed (even by SIGKILL) stops
itself at the next update with a checkpoint, and a stop asked in the launcher's first moment
reaches ranks that start after it (real ranks, real signals, real process trees)."""

from __future__ import annotations

import time

import psutil
import pytest

from tests.support.fleet import spawn_launch
from tests.support.ranks import (
    LIFELINE_S,
    TINY,
    hold_output,
    last_update,
    newest_step,
    nothing_left,
    run_processes,
    sigterm,
    stop_cause,
    wait_for_checkpoint,
    wait_until_gone,
)
from trainer.checkpoint import catalog

pytestmark = pytest.mark.slow


def start(tiny_data, run, grace: str = "60"):
    return spawn_launch(
        *(2, tiny_data, run, *TINY, "--local-batches", "2,2", "--updates", "100000"),
        *("--checkpoint-every", "1", "--log-every", "1000"),
        launch_opts=("--stop-grace", grace),
    )


def test_sigkill_of_fleet_launch_stops_every_rank_with_a_checkpoint(tiny_data, tmp_path):
    run = tmp_path / "run"
    proc = start(tiny_data, run)
    with nothing_left(proc, run):
        wait_for_checkpoint(run, 2, proc)
        proc.kill()  # SIGKILL: no handler runs, nothing is cleaned up by fleet launch
        proc.wait()
        left = wait_until_gone(run, timeout=60)
    assert left == [], [p.cmdline() for p in left]
    # stopped at a boundary with a checkpoint: no update is lost
    path, _, _ = catalog.resolve(run, "latest")
    assert catalog.read_json(path, catalog.STATE)["step"] == last_update(run)


def test_a_stop_in_the_launchers_first_moment_reaches_every_rank(tiny_data, tmp_path):
    run = tmp_path / "run"
    proc = start(tiny_data, run)
    with nothing_left(proc, run):
        # SIGTERM the moment mlx.launch exists: no rank has started yet
        deadline = time.monotonic() + 60
        while not psutil.Process(proc.pid).children():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.005)
        _, err = sigterm(proc)
    assert "stopped on SIGTERM: the ranks stopped" in err, err[-3000:]
    assert wait_until_gone(run, timeout=10) == []  # (the old code: all still training)
    path, _, _ = catalog.resolve(run, "latest")  # every rank stopped at its first boundary
    assert catalog.read_json(path, catalog.STATE)["step"] == 0


def test_output_that_nobody_reads_does_not_stop_the_run(tiny_data, tmp_path):
    """Ctrl-S in the terminal, or `| less` left alone: fleet launch's output pipe fills within
    seconds (a progress line an update). The lifeline must reach the ranks all the same, and
    nothing printed is lost once the output is read."""
    run = tmp_path / "run"
    proc = spawn_launch(
        *(2, tiny_data, run, *TINY, "--local-batches", "2,2", "--updates", "100000"),
        launch_opts=("--lifeline-timeout", str(LIFELINE_S)),
    )
    with nothing_left(proc, run):
        hold_output(proc, 2 * LIFELINE_S)  # two lifeline timeouts with nothing read
        # Still training: no rank has stopped (a stop saves; the old code's ranks stopped for
        # "a lost lifeline" one timeout after the pipe filled).
        assert newest_step(run) == 0 and len(run_processes(run)) >= 2
        out, _ = sigterm(proc)
    assert stop_cause(out, 100000) == "SIGTERM to fleet launch"
