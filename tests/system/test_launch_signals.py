"""Signals to `fleet launch`: every rank stops at an update boundary with a checkpoint, and
no process of the run is left afterwards (real ranks, real process trees)."""

from __future__ import annotations

import signal
import time

import psutil
import pytest

from tests.support.fleet import run_fleet
from tests.support.ranks import rank_pid, run_processes, start, wait_for_updates
from trainer import heartbeat
from trainer.checkpoint import catalog

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_to_fleet_launch_stops_every_rank_with_a_checkpoint(tiny_data, tmp_path, signum):
    run = tmp_path / "run"
    proc = start(tiny_data, run, grace="60")
    try:
        rank_pid(run, 2)
        wait_for_updates(run)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err[-3000:]
    # the ranks got the signal fleet launch got: a Ctrl-C is reported as one (issue 18, 12),
    # and the stop prints the exact command that goes on (issue 18, defect 11)
    words = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}.get(signum, "SIGHUP")
    assert f"to go on: fleet launch -n 3 -- train --resume latest --run-dir {run}" in out
    report = run_fleet("report", str(run)).stdout
    assert f" by {words}" in report and "on rank" not in report
    assert f"stopped on {signal.Signals(signum).name}: the ranks stopped" in err
    # a stop at a boundary: the newest checkpoint is verified and latest, the run resumable
    path, _, _ = catalog.resolve(run, "latest")
    assert catalog.read_json(path, catalog.STATE)["step"] > 0
    assert "Traceback" not in err
    time.sleep(0.5)
    assert run_processes(run) == []
    assert heartbeat.read_all(run) == {}  # ranks that stopped cleanly leave no beat behind


def test_a_rank_that_ignores_the_stop_is_ended_after_the_grace(tiny_data, tmp_path):
    run = tmp_path / "run"
    proc = start(tiny_data, run, grace="3")
    victim = None
    try:
        victim = rank_pid(run, 1)
        wait_for_updates(run)
        psutil.Process(victim).send_signal(signal.SIGSTOP)  # it can neither stop nor die
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=90)
    finally:
        if victim is not None and psutil.pid_exists(victim):
            psutil.Process(victim).kill()
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "ranks that did not stop in time were ended" in err
    time.sleep(0.5)
    assert run_processes(run) == []
