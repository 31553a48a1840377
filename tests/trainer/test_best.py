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


def evals_of(run) -> list[tuple[int, float]]:
    return [(e.step, e.data["val_loss"]) for e in read_events(run, 0) if e.kind == "eval"]


def test_early_stop_says_why_and_a_resume_goes_on(tiny_data, tmp_path):
    run = tmp_path / "run"
    # no loss is 100 lower than the first: every evaluation after it counts against patience
    args = ("--eval-every", "2", "--early-stop-patience", "2", "--early-stop-min-delta", "100")
    out = train(tiny_data, run, "--updates", "20", *args)
    assert "early stop at update 6: the last 2 evaluations (" in out.stdout
    assert (
        "were none lower than" in out.stdout
        and "(update 2) by --early-stop-min-delta 100" in out.stdout
    )
    low_step, low = min(evals_of(run), key=lambda e: e[1])
    assert f"the best validation loss is {low:.4f} at update {low_step}" in out.stdout
    assert (
        f"stopped at update 6 of 20 (early stop); checkpoint {run}/checkpoints/step-000006; "
        f"to go on: fleet train --resume latest --run-dir {run}" in out.stdout
    )
    assert catalog.resolve(run, "latest")[1]["step"] == 6
    again = train(tiny_data, run, "--resume", "latest", "--updates", "20")
    assert "resumed from" in again.stdout
    assert "early stop at update 10" in again.stdout  # patience counted afresh
    report = run_fleet("report", str(run)).stdout
    assert "Stopped early at update 6: the last 2 evaluations" in report
    assert report.count("early stop") == 0  # said once, as "Stopped early" (issue 18, defect 4)


def test_the_last_update_is_evaluated_and_can_be_best(tiny_data, tmp_path):
    """Issue 18, defect 3: with --updates 9 --eval-every 4 only updates 4 and 8 were evaluated,
    so `best` could never be the final model. The end of a run (and --stop-at) evaluates."""
    run = tmp_path / "run"
    out = train(tiny_data, run, "--updates", "9", "--eval-every", "4", "--lr", "1e-2")
    assert [step for step, _ in evals_of(run)] == [4, 8, 9]
    assert "eval  step 9: val loss" in out.stdout
    low_step, low = min(evals_of(run), key=lambda e: e[1])
    assert low_step == 9  # a rising learning rate's last update is its best model here
    assert catalog.resolve(run, catalog.BEST)[1]["step"] == 9
    assert f"Best validation loss: {low:.4f} at update 9" in run_fleet("report", str(run)).stdout
    # --stop-at evaluates where it stops; the resume does not evaluate that update again
    stopped = tmp_path / "stopped"
    train(tiny_data, stopped, "--updates", "12", "--eval-every", "4", "--stop-at", "6")
    train(tiny_data, stopped, "--resume", "latest")
    assert [step for step, _ in evals_of(stopped)] == [4, 6, 8, 12]


def test_one_best_for_the_report_the_link_export_and_sample(tiny_data, tmp_path):
    """Issue 18, defect 4: with --early-stop-min-delta the `best` link kept the first loss
    lower by the delta (update 35) while the report named the lowest (update 45). One rule
    now: `best` is the lowest validation loss; the delta only counts patience."""
    run = tmp_path / "run"
    train(
        tiny_data,
        run,
        *("--updates", "10", "--eval-every", "2", "--lr", "1e-2"),
        *("--early-stop-min-delta", "100"),  # no evaluation counts as progress: none resets
    )
    low_step, low = min(evals_of(run), key=lambda e: e[1])
    assert low_step > 2  # the loss fell after the first evaluation, by less than the delta
    assert catalog.resolve(run, catalog.BEST)[1]["step"] == low_step
    assert f"Best validation loss: {low:.4f} at update {low_step}" in (
        run_fleet("report", str(run)).stdout
    )
    sampled = run_fleet("sample", str(run), "--best", "--tokens", "1")
    assert f"(update {low_step})" in sampled.stderr
    out = tmp_path / "export"
    exported = run_fleet("export", str(run), "--best", "--out", str(out))
    assert f"(update {low_step}, fp32)" in exported.stdout


def test_best_is_refused_by_name_when_the_run_never_evaluated(tmp_path):
    with pytest.raises(catalog.CheckpointError, match="kept no best checkpoint"):
        catalog.resolve(tmp_path, catalog.BEST)
