"""A disk that fills up during a run: the checkpoint that does not fit is refused with the
folder and what is free, nothing partial is left, training goes on, the previous checkpoint
and the telemetry log stay intact (a real 3 MiB tmpfs as the run folder)."""

from __future__ import annotations

import os
import subprocess

import pytest

from telemetry.arrowlog import read_updates
from tests.support.fleet import run_fleet
from trainer.checkpoint import catalog, store

pytestmark = pytest.mark.slow

TINY = ("--synthetic", "--depth", "1", "--width", "64", "--heads", "1", "--seq-len", "32")


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {e}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_refuses_the_checkpoint_and_training_goes_on(small_disk):
    run = small_disk / "run"
    proc = run_fleet(
        *("train", *TINY, "--run-dir", str(run), "--updates", "6", "--checkpoint-every", "2"),
        *("--keep-checkpoints", "1", "--telemetry-port-base", "0"),
        check=False,
    )
    err = proc.stderr
    # step 2 fits; step 4 and 6 do not: each is refused in one line with the folder
    assert "no space for checkpoint step-000004 in" in err and "MiB free" in err
    assert "training on; the next checkpoint tries again" in err
    assert "stopped at update 6 without a checkpoint of it" in err
    assert proc.returncode == 1 and "Traceback" not in err
    assert not [p for p in os.listdir(run / "checkpoints") if p.startswith(".tmp-")]
    path, _, _ = catalog.resolve(run, "latest")  # the previous one, untouched
    assert path.name == "step-000002"
    assert read_updates(run, 0).num_rows == 6  # every update is in the telemetry log


def test_on_checkpoint_error_stop_ends_the_run_at_the_next_update(small_disk):
    run = small_disk / "run"
    proc = run_fleet(
        *("train", *TINY, "--run-dir", str(run), "--updates", "20", "--checkpoint-every", "2"),
        *("--keep-checkpoints", "1", "--telemetry-port-base", "0"),
        *("--on-checkpoint-error", "stop"),
        check=False,
    )
    assert "stopping at the next update" in proc.stderr
    assert proc.returncode == 1
    assert read_updates(run, 0).num_rows == 4  # stopped at update 4's boundary, not 20
    assert catalog.resolve(run, "latest")[0].name == "step-000002"


def test_a_write_that_fails_midway_leaves_no_partial(tmp_path, monkeypatch):
    import mlx.core as mx

    def full(path, arrays):
        with open(path, "wb") as f:
            f.write(b"x" * 100)
        raise RuntimeError("[write] Unable to write 51890 bytes to file.")

    monkeypatch.setattr(mx, "save_safetensors", full)
    with pytest.raises(catalog.NoSpace, match="could not write checkpoint step-000001 in"):
        store.save(
            tmp_path,
            1,
            params={"w": mx.zeros((4,))},
            optimizer_state={},
            state={"step": 1},
            config={},
            identity={},
        )
    assert os.listdir(catalog.root(tmp_path)) == []


def fill(disk) -> None:
    """Take every free byte of the tmpfs."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass


def test_a_start_on_a_full_disk_goes_on_with_one_line_errors(small_disk):
    fill(small_disk)
    run = small_disk / "run"
    proc = run_fleet(
        *("train", *TINY, "--run-dir", str(run), "--updates", "4", "--checkpoint-every", "2"),
        *("--telemetry-port-base", "0"),
        check=False,
    )
    err = proc.stderr
    assert "Traceback" not in err, err[-3000:]
    assert f"could not write {run / 'config.json'} (No space left on device)" in err
    assert "control.key (No space left on device): commands wait until it can be" in err
    assert "step 4/4" in proc.stdout  # trained to the end
    assert "stopped at update 4 without a checkpoint of it; resume from the start" in err
    assert proc.returncode == 1


def test_a_resumed_run_whose_saves_fail_names_the_checkpoint_it_resumed(small_disk):
    run = small_disk / "run"
    both = ("--telemetry-port-base", "0", "--keep-checkpoints", "1")
    run_fleet("train", *TINY, "--run-dir", str(run), "--updates", "2", *both)
    fill(small_disk)
    proc = run_fleet(
        *("train", "--resume", "latest", "--run-dir", str(run), "--updates", "4", *both),
        check=False,
    )
    err = proc.stderr
    assert "Traceback" not in err and proc.returncode == 1
    newest = catalog.step_dir(run, 2)
    assert f"stopped at update 4 without a checkpoint of it; resume from {newest}" in err
    assert "the start" not in err


def test_a_latest_link_that_cannot_be_written_leaves_the_run_going(tmp_path):
    run = tmp_path / "run"
    (catalog.root(run) / catalog.LATEST / "in-the-way").mkdir(parents=True)  # not replaceable
    proc = run_fleet(
        *("train", *TINY, "--run-dir", str(run), "--updates", "3", "--checkpoint-every", "1"),
        *("--telemetry-port-base", "0"),
        check=False,
    )
    err = proc.stderr
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert "step-000001 is saved, but latest could not be moved to it" in err
    path, _, _ = catalog.resolve(run, "latest")  # the newest save is still found
    assert path.name == "step-000003"
