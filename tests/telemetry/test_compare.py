"""`fleet report RUN1 RUN2`: runs side by side with their val-loss curves, and each run's
samples over its evaluations."""

from __future__ import annotations

import json

import pytest

from telemetry.compare import chart, plot, smoothed, title
from telemetry.errors import TelemetryError
from tests.support.fleet import run_fleet

TINY = ("--depth", "1", "--width", "32", "--heads", "1", "--local-batch", "4")


def train(data, run, *args):
    run_fleet(
        *("train", "--data", str(data), "--run-dir", str(run), *TINY, "--updates", "7"),
        *("--eval-every", "2", "--eval-samples", "16", "--telemetry-port-base", "0", *args),
    )


def test_two_runs_side_by_side(tiny_data, tmp_path):
    a, b = tmp_path / "adamw", tmp_path / "muon"
    train(tiny_data, a)
    train(tiny_data, b, "--optimizer", "muon")
    out = run_fleet("report", str(a), str(b)).stdout
    assert "Runs side by side" in out and "adamw" in out and "muon" in out
    assert "validation loss" in out and "o adamw  x muon" in out  # the chart and its legend
    data = json.loads(run_fleet("report", str(a), str(b), "--json").stdout)
    rows = {r["run"]: r for r in data["runs"]}
    assert rows["adamw"]["depth"] == 1 and rows["adamw"]["width"] == 32
    assert rows["muon"]["best_step"] in (2, 4, 6, 7) and rows["muon"]["params"] > 0
    assert [s for s, _ in data["curves"]["adamw"]] == [2, 4, 6, 7]  # and the last update
    assert rows["adamw"]["last_sample"]  # the test sentence of the last evaluation
    single = run_fleet("report", str(a)).stdout
    assert "sample (--prompt)" in single  # each evaluation with its sample


def test_plot_writes_a_picture(tiny_data, tmp_path):
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny_data, a)
    train(tiny_data, b, "--lr", "1e-3")
    out = tmp_path / "curves.png"
    run_fleet("report", str(a), str(b), "--plot", str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chart_puts_every_run_on_one_grid():
    text = chart({"a": [(0, 3.0), (10, 2.0)], "b": [(0, 3.5), (10, 2.5)]}, width=20, height=6)
    lines = text.splitlines()
    assert lines[0] == "validation loss" and "3.5000" in lines[1] and "2.0000" in lines[6]
    assert text.count("o") >= 2 and text.count("x") >= 2 and lines[-1] == "o a  x b"
    assert "no evaluations" in chart({"a": []})


def test_the_plot_draws_the_train_loss_too_and_says_what_it_drew(tiny_data, tmp_path):
    """Issue 18, defect 5: runs without evaluations gave an empty picture announced as
    "val-loss curves drawn". Now the smoothed train loss is drawn (and said), per update or
    per token, under a title naming the runs and their sizes."""
    pytest.importorskip("matplotlib")
    a, b = tmp_path / "a", tmp_path / "b"
    train(tiny_data, a, "--eval-every", "0")
    train(tiny_data, b, "--eval-every", "0", "--local-batch", "8")
    out = tmp_path / "curves.svg"
    text = run_fleet("report", str(a), str(b), "--plot", str(out), "--x", "tokens").stdout
    assert f"{out}: drew train loss (smoothed) of 2 runs; no run has evaluations" in text
    svg = out.read_text()  # matplotlib writes each text as a comment beside its glyphs
    for words in ("a train (smoothed)", "b train (smoothed)", "tokens seen", "a (0.0"):
        assert f"<!-- {words}" in svg, words
    data = json.loads(run_fleet("report", str(a), str(b), "--json").stdout)
    points = data["series"]["b"]["train"]
    assert [p[0] for p in points] == list(range(1, 8)) and points[-1][1] == 7 * 8 * 32
    assert "train loss, smoothed" in text and f"tokens {points[-1][1]:,}" in text  # the chart


def test_the_plot_refuses_when_there_is_nothing_to_draw(tmp_path):
    out = tmp_path / "empty.png"
    nothing = {"runs": [], "series": {"a": {"val": [], "train": []}}}
    with pytest.raises(TelemetryError, match="nothing to draw"):
        plot(nothing, out)
    assert not out.exists()


def test_the_title_names_each_run_and_its_size():
    runs = [{"run": "a", "params": 140_000, "depth": 2, "width": 64}, {"run": "b"}]
    assert title(runs) == "a (0.14M params, depth 2, width 64) vs b (size unknown)"


def test_the_train_loss_is_smoothed_without_a_pull_to_zero():
    assert smoothed([4.0, 4.0, 4.0]) == pytest.approx([4.0, 4.0, 4.0])
    falling = smoothed([5.0, 1.0])
    assert falling[0] == 5.0 and 1.0 < falling[1] < 5.0
