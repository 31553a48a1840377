"""A run that loses a rank restarts and matches an unfailed run (slow: real ranks, SIGKILL)."""

from __future__ import annotations

import random
import signal

import psutil
import pytest

from telemetry.arrowlog import read_events
from tests.support.fleet import run_fleet
from tests.support.ranks import (
    TINY,
    assert_same_weights,
    rank_pid,
    single,
    wait_for_checkpoint,
    weights,
)


@pytest.mark.slow
def test_a_run_that_loses_a_rank_restarts_and_matches_an_unfailed_run(tiny_data, tmp_path):
    from tests.support.fleet import spawn_launch

    both = ("--updates", "10", "--checkpoint-every", "2")
    single(tiny_data, tmp_path / "whole", "--local-batch", "6", *both)
    run = tmp_path / "restarted"
    proc = spawn_launch(
        *(3, tiny_data, run, *TINY, "--local-batches", "3,2,1", *both),
        launch_opts=("--restarts", "2", "--restart-backoff", "0.2", "--stop-grace", "10"),
    )
    try:
        victim = rank_pid(run, 2)
        wait_for_checkpoint(run, random.choice([2, 4, 6]), proc)
        psutil.Process(victim).send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "restart 1 of 2" in err
    assert_same_weights(weights(tmp_path / "whole", 10), weights(run, 10))
    kinds = [e.kind for e in read_events(run, 0)]
    assert "restarted" in kinds
    report = run_fleet("report", str(run)).stdout
    assert "Restarts" in report and "rank 2" in report  # the restart and whom it was after


@pytest.mark.slow
def test_the_restart_line_names_the_update_the_rank_died_after(tiny_data, tmp_path):
    import re

    from tests.support.fleet import spawn_launch

    run = tmp_path / "named"
    proc = spawn_launch(
        *(2, tiny_data, run, *TINY, "--local-batches", "2,2", "--updates", "40"),
        *("--checkpoint-every", "1", "--log-every", "1000"),
        launch_opts=("--restarts", "1", "--restart-backoff", "0.2", "--stop-grace", "10"),
    )
    try:
        victim = rank_pid(run, 1)
        wait_for_checkpoint(run, 6, proc)  # update 6 is done (it is saved)
        psutil.Process(victim).send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    said = re.search(r"rank 1 (?:was killed|exited with code -9) after update (\d+); rest", err)
    assert said, err[-3000:]
    # never older than the newest checkpoint at the kill (beats lagged up to 1 s: 20 for 21)
    restarted = next(e for e in read_events(run, 0) if e.kind == "restarted")
    assert int(said.group(1)) >= 6
    # it resumed from there, or from the update before when the kill came during the save of
    # the update it had just done (a suite run: "after update 8", resumed from step 7)
    assert restarted.step >= int(said.group(1)) - 1


def test_a_failure_before_the_first_update_says_so():
    from trainer.launch.restart import Failure

    assert Failure(1, "exited with code 3", -1).describe() == (
        "rank 1 exited with code 3 before its first update"
    )
    assert Failure(0, "was killed", 21).describe() == "rank 0 was killed after update 21"
