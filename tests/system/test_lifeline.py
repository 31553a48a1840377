"""Nothing escapes `fleet launch`: a run whose launcher is killed (even by SIGKILL) stops
itself at the next update with a checkpoint, and a stop asked in the launcher's first moment
reaches ranks that start after it (real ranks, real signals, real process trees)."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.support.fleet import spawn_launch
from tests.support.ranks import TINY, last_update, wait_for_checkpoint, wait_until_gone
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
    try:
        wait_for_checkpoint(run, 2, proc)
        proc.kill()  # SIGKILL: no handler runs, nothing is cleaned up by fleet launch
        proc.wait()
        left = wait_until_gone(run, timeout=60)
    finally:
        proc.kill()
        wait_until_gone(run, timeout=0)  # a failure here leaves nothing running
    assert left == [], [p.cmdline() for p in left]
    # stopped at a boundary with a checkpoint: no update is lost
    path, _, _ = catalog.resolve(run, "latest")
    assert catalog.read_json(path, catalog.STATE)["step"] == last_update(run)


def test_a_stop_in_the_launchers_first_moment_reaches_every_rank(tiny_data, tmp_path):
    run = tmp_path / "run"
    proc = start(tiny_data, run)
    try:
        # SIGTERM the moment mlx.launch exists: no rank has started yet
        deadline = time.monotonic() + 60
        while not psutil.Process(proc.pid).children():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        wait_until_gone(run, timeout=0)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "stopped on SIGTERM: the ranks stopped" in err, err[-3000:]
    assert wait_until_gone(run, timeout=10) == []  # (the old code: all still training)
    path, _, _ = catalog.resolve(run, "latest")  # every rank stopped at its first boundary
    assert catalog.read_json(path, catalog.STATE)["step"] == 0
