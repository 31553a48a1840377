"""A new run never overwrites a run folder (issue 18, defect 1): it refuses one that holds a run,
saying what the folder holds and the ways on; `--overwrite` moves the old run aside, and a
resume goes on as ever. `fleet launch` and `fleet check` refuse before any rank starts."""

from __future__ import annotations

import sys
import time

from telemetry import rundir
from telemetry.arrowlog import read_events
from tests.support.files import snapshot
from tests.support.fleet import run_fleet
from trainer.checkpoint import catalog
from trainer.launch.check import host_facts

TINY = ("--depth", "1", "--width", "32", "--heads", "1", "--local-batch", "4", "--seed", "1")


def train(data, run, *args, check=True):
    return run_fleet(
        "train",
        *("--data", str(data), "--run-dir", str(run), *TINY, "--telemetry-port-base", "0"),
        *("--eval-samples", "8", *args),
        check=check,
    )


def test_held_names_what_a_run_leaves_and_nothing_else(tmp_path):
    run = tmp_path / "run"
    assert rundir.held(run) == []  # missing
    run.mkdir()
    (run / "demo-launch.log").write_text("a user's file\n")
    assert rundir.held(run) == []  # made by mkdir, or holding other files
    (run / "config.json").write_text("{}")
    assert rundir.held(run) == ["config.json"]
    for step in (10, 20):
        (run / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
        (run / "checkpoints" / f"step-{step:06d}" / catalog.MANIFEST).write_text("{}")
    (run / "checkpoints" / ".tmp-step-000030-1").mkdir()  # unfinished saves are not counted
    (run / "checkpoints" / "step-000030").mkdir()
    (run / "checkpoints" / "latest").symlink_to("step-000020")
    (run / "telemetry").mkdir()
    for name in ("rank-0.arrow", "rank-0.1.arrow", "events-rank-0.arrow", "rank-1.arrow"):
        (run / "telemetry" / name).write_bytes(b"")
    assert rundir.held(run) == [
        "config.json",
        "2 checkpoints up to step-000020",
        "telemetry logs of 2 ranks",
    ]


def test_a_new_run_refuses_a_folder_that_holds_a_run_and_changes_nothing(tiny_data, tmp_path):
    run = tmp_path / "run1"
    train(tiny_data, run, "--updates", "6", "--checkpoint-every", "2", "--eval-every", "2")
    before = snapshot(run)
    again = train(tiny_data, run, "--updates", "3", check=False)
    assert again.returncode == 2
    err = again.stderr.strip()
    assert err.count("\n") == 0, err  # one line: what it holds and the ways on
    assert f"{run} already holds a run (config.json, 3 checkpoints up to step-000006" in err
    for way in ("--resume latest", "another --run-dir", "--overwrite"):
        assert way in err
    assert snapshot(run) == before  # config.json, latest, best, checkpoints, logs: untouched
    assert [p.name for p in tmp_path.iterdir()] == ["run1"]


def test_rundir_knows_the_checkpoint_manifest_by_its_name():
    assert rundir.CHECKPOINT_MANIFEST == catalog.MANIFEST


def test_a_folder_made_by_mkdir_is_taken(tiny_data, tmp_path):
    run = tmp_path / "fresh"
    run.mkdir()
    (run / "notes.txt").write_text("mine\n")
    train(tiny_data, run, "--updates", "2")
    assert (run / "notes.txt").read_text() == "mine\n"
    assert catalog.resolve(run, "latest")[1]["step"] == 2


def test_overwrite_moves_the_old_run_aside_and_deletes_nothing(tiny_data, tmp_path):
    run = tmp_path / "run1"
    train(tiny_data, run, "--updates", "4", "--checkpoint-every", "2")
    before = snapshot(run)
    out = train(tiny_data, run, "--updates", "2", "--overwrite")
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run1.old-")]
    assert len(aside) == 1, list(tmp_path.iterdir())
    assert f"moved the run in {run} to {aside[0]}" in out.stdout
    assert snapshot(aside[0]) == before  # the old run, whole, under its new name
    assert catalog.resolve(run, "latest")[1]["step"] == 2  # the new run alone
    assert {e.step for e in read_events(run, 0) if e.kind == "started"} == {0}
    assert '"overwrite": true' in (run / "config.json").read_text()
    # the new run holds a run in its turn: a third run refuses it again
    assert train(tiny_data, run, "--updates", "2", check=False).returncode == 2


def test_a_resume_goes_on_and_refuses_overwrite(tiny_data, tmp_path):
    run = tmp_path / "run1"
    train(tiny_data, run, "--updates", "2")
    out = train(tiny_data, run, "--resume", "latest", "--updates", "4")
    assert "resumed from" in out.stdout
    both = train(tiny_data, run, "--resume", "latest", "--overwrite", check=False)
    assert both.returncode == 2 and "give one of them" in both.stderr


def test_a_relaunch_with_nothing_to_resume_goes_on_in_its_folder(tiny_data, tmp_path):
    """`fleet launch --restarts` relaunches without --resume when nothing was saved yet: the
    folder holds its own failed attempt (config.json, logs), which is no other run."""
    import subprocess

    from tests.support.fleet import fleet_env

    run = tmp_path / "run1"
    train(tiny_data, run, "--updates", "2")
    argv = [sys.executable, "-m", "fleet.cli", "train", "--data", str(tiny_data)]
    argv += ["--run-dir", str(run), *TINY, "--telemetry-port-base", "0", "--updates", "2"]
    env = fleet_env(FLEET_RESTART='{"attempt": 1, "reason": "rank 1 was killed"}')
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["run1"]


def test_aside_names_never_clash(tmp_path):
    run = tmp_path / "run"
    now = time.mktime((2026, 12, 1, 14, 30, 0, 0, 0, -1))
    first = rundir.aside_name(run, now)
    assert first.name == "run.old-20261201-143000"
    first.mkdir()
    assert rundir.aside_name(run, now).name == "run.old-20261201-143000-2"
    assert rundir.move_aside(tmp_path / "missing") is None


def test_launch_refuses_before_any_rank_starts(tiny_data, tmp_path):
    run = tmp_path / "run1"
    train(tiny_data, run, "--updates", "2")
    before = snapshot(run)
    t0 = time.monotonic()
    out = run_fleet(
        *("launch", "-n", "2", "--", "train", "--data", str(tiny_data), "--run-dir", str(run)),
        *(*TINY, "--updates", "2"),
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.startswith(f"fleet launch: error: {run} already holds a run (")
    assert "--resume latest" in out.stderr
    assert snapshot(run) == before
    assert time.monotonic() - t0 < 60  # no rank was started (each would load mlx first)


def test_check_names_a_run_folder_that_holds_a_run(tiny_data, tmp_path):
    run = tmp_path / "run1"
    train(tiny_data, run, "--updates", "2")
    out = run_fleet(
        *("check", "-n", "1", "--", "train", "--data", str(tiny_data), "--run-dir", str(run)),
        check=False,
    )
    assert out.returncode == 2 and f"{run} already holds a run (config.json" in out.stderr
    # each host of a hostfile reports what its run folder holds (the script runs over ssh)
    facts = host_facts(None, sys.executable, str(tiny_data), str(run))
    assert facts["run_held"][0] == "config.json"
    assert host_facts(None, sys.executable, "", str(tmp_path / "new"))["run_held"] == []
