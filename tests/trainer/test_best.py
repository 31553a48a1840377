"""The best checkpoint is kept and early stopping explains itself, on a tiny real run."""

from __future__ import annotations

import pytest

from telemetry.arrowlog import read_events
from tests.support.fleet import run_fleet
from trainer.checkpoint import catalog

TINY = ("--depth", "1", "--width", "32", "--heads", "1", "--local-batch", "4", "--seed", "1")


def train(data, run, *args):
    return run_fleet(
        "train",
        "--data",
        str(data),
        "--run-dir",
        str(run),
        *TINY,
        "--telemetry-port-base",
        "0",
        "--eval-samples",
        "16",
        *args,
    )


def test_the_lowest_validation_loss_is_kept_as_best(tiny_data, tmp_path):
    run = tmp_path / "run"
    train(tiny_data, run, "--updates", "9", "--eval-every", "2", "--keep-checkpoints", "1")
    evals = [e for e in read_events(run, 0) if e.kind == "eval"]
    low = min(evals, key=lambda e: e.data["val_loss"])
    path, manifest, _ = catalog.resolve(run, catalog.BEST)
    assert manifest["step"] == low.step  # kept although --keep-checkpoints 1 pruned others
    assert evals[-1].data["best_step"] == low.step
    state = catalog.read_json(catalog.resolve(run, "latest")[0], catalog.STATE)
    assert state["best"] == {"step": low.step, "val_loss": low.data["val_loss"]}
    report = run_fleet("report", str(run)).stdout
    assert f"Best validation loss: {low.data['val_loss']:.4f} at update {low.step}" in report


def test_early_stop_says_why_and_a_resume_goes_on(tiny_data, tmp_path):
    run = tmp_path / "run"
    # no loss is 100 lower than the first: every evaluation after it counts against patience
    args = ("--eval-every", "2", "--early-stop-patience", "2", "--early-stop-min-delta", "100")
    out = train(tiny_data, run, "--updates", "20", *args)
    assert "early stop at update 6: the best validation loss is" in out.stdout
    assert "at update 2; the last 2 evaluations" in out.stdout
    assert catalog.resolve(run, "latest")[1]["step"] == 6
    again = train(tiny_data, run, "--resume", "latest", "--updates", "20")
    assert "resumed from" in again.stdout
    assert "early stop at update 10" in again.stdout  # patience counted afresh
    report = run_fleet("report", str(run)).stdout
    assert "Stopped at update 6: early stop at update 6" in report


def test_best_is_refused_by_name_when_the_run_never_evaluated(tmp_path):
    with pytest.raises(catalog.CheckpointError, match="kept no best checkpoint"):
        catalog.resolve(tmp_path, catalog.BEST)
