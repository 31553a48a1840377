"""`fleet launch --restarts`: a run that loses a rank relaunches from its newest verified
checkpoint and ends with the weights of a run that never failed."""

from __future__ import annotations

from tests.support.fleet import run_fleet
from trainer.launch import restart


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


def test_restarts_need_a_train_command():
    proc = run_fleet("launch", "-n", "2", "--restarts", "1", "--", "report", "x", check=False)
    assert proc.returncode == 2 and "--restarts needs a `train` command" in proc.stderr


def test_a_relaunch_drops_overwrite_it_goes_on_in_its_own_folder(tmp_path):
    cmd = ["train", "--data", "d", "--overwrite", "--updates", "9"]
    assert restart.relaunch_command(cmd, tmp_path, [2]) == [
        *("train", "--data", "d", "--updates", "9", "--local-batches", "2")
    ]
