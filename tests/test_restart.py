"""`fleet launch --restarts`: a run that loses a rank relaunches from its newest verified
checkpoint and ends with the weights of a run that never failed."""

from __future__ import annotations

import random
import signal
import time

import psutil
import pytest

from telemetry.arrowlog import read_events
from tests.conftest import run_fleet
from tests.test_distributed import TINY, assert_same_weights, rank_pid, single, weights
from trainer.checkpoint import catalog
from trainer.launch import restart


def newest_step(run) -> int:
    done = catalog.complete(run) if (run / "checkpoints").is_dir() else []
    return max((int(p.name.split("-")[1]) for p in done), default=0)


def wait_for_checkpoint(run, step: int, proc, timeout: float = 120) -> None:
    """Until the run has saved `step` (a random point of the run, for the kill that follows)."""
    deadline = time.monotonic() + timeout
    while newest_step(run) < step:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint {step} in {timeout} s"
        time.sleep(0.1)


def test_a_relaunch_resumes_latest_with_the_new_split(tmp_path):
    cmd = ["train", "--data", "d", "--local-batches", "2,2,2", "--resume=x", "--updates", "9"]
    assert restart.relaunch_command(cmd, tmp_path, [3, 3]) == [
        *("train", "--data", "d", "--updates", "9", "--local-batches", "3,3")
    ]  # nothing saved yet: it starts over


def test_a_shrunk_split_keeps_the_global_batch_without_measurements(tmp_path):
    assert restart.shrunk_split([4, 2, 2], [0, 2], tmp_path) == [5, 3]
    assert restart.shrunk_split([1, 1, 5], [0, 1], None) == [4, 3]
    assert sum(restart.shrunk_split([2, 2, 2, 2], [1, 2, 3], None)) == 8


def test_the_same_failure_at_the_same_update_compares_equal():
    assert restart.Failure(2, "was killed", 7) == restart.Failure(2, "was killed", 7)
    assert restart.Failure(2, "was killed", 7) != restart.Failure(2, "was killed", 9)


@pytest.mark.slow
def test_a_run_that_loses_a_rank_restarts_and_matches_an_unfailed_run(tiny_data, tmp_path):
    from tests.conftest import spawn_launch

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


def test_restarts_need_a_train_command():
    proc = run_fleet("launch", "-n", "2", "--restarts", "1", "--", "report", "x", check=False)
    assert proc.returncode == 2 and "--restarts needs a `train` command" in proc.stderr
