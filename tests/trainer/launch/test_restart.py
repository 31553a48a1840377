"""`fleet launch --restarts`: a run that loses a rank relaunches from its newest verified
checkpoint and ends with the weights of a run that never failed."""

from __future__ import annotations

import json

from tests.support.fleet import run_fleet
from trainer import heartbeat
from trainer.checkpoint import catalog
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


def saved(run_dir, step: int, serial: int) -> None:
    """A complete save's folder as the catalog reads it, unverified (a manifest, no body)."""
    folder = catalog.step_dir(run_dir, step)
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"format": 2, "serial": serial}))


def test_a_failure_is_dated_by_what_the_attempt_saved_when_the_beats_lag(tmp_path):
    """A rank beats about once a second, a fast run updates many times a second: the restart
    line named "update 5" for a kill after update 6 was saved (seen in the suite)."""
    saved(tmp_path, 4, serial=1)  # before the attempt
    mark = catalog.newest_serial(tmp_path)
    heartbeat.write(tmp_path, 1, "compute", 5, 0.0)
    saved(tmp_path, 6, serial=2)
    assert restart.failure_of(1, "was killed", tmp_path, mark).step == 6
    assert restart.failure_of(1, "was killed", tmp_path, catalog.newest_serial(tmp_path)).step == 5


def test_an_older_step_saved_again_after_a_resume_dates_the_failure(tmp_path):
    """A resume from step 4 with step 8 on disk (it did not verify): the attempt's own save
    of step 5 counts, not the stale step 8."""
    saved(tmp_path, 8, serial=2)
    saved(tmp_path, 4, serial=1)
    mark = catalog.newest_serial(tmp_path)
    saved(tmp_path, 5, serial=3)
    assert mark == 2 and restart.failure_of(0, "was killed", tmp_path, mark).step == 5
    assert restart.failure_of(0, "was killed", tmp_path / "nothing-here", 0).step == -1


def test_restarts_need_a_train_command():
    proc = run_fleet("launch", "-n", "2", "--restarts", "1", "--", "report", "x", check=False)
    assert proc.returncode == 2 and "--restarts needs a `train` command" in proc.stderr


def test_a_relaunch_drops_overwrite_it_goes_on_in_its_own_folder(tmp_path):
    cmd = ["train", "--data", "d", "--overwrite", "--updates", "9"]
    assert restart.relaunch_command(cmd, tmp_path, [2]) == [
        *("train", "--data", "d", "--updates", "9", "--local-batches", "2")
    ]
