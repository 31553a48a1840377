"""`fleet sweep` end to end with real trials: real ranks on the tiny corpus, a SIGTERM in the
middle and --resume, the report, status and promote, and --report-to from rank 0 only."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from tests.support.fleet import fleet_env, run_fleet
from trainer.sweep import report

pytestmark = pytest.mark.slow

SPEC = """
name = "tiny"
sampler = "SAMPLER"
trials = TRIALS
sampler_seed = 1
[train]
data = "DATA"
depth = 1
width = 32
heads = 1
local_batch = 4
eval_samples = 64
device = "cpu"
report_to = "tensorboard"
[search]
SEARCH
[budget]
tokens = 5120
evals = 4
[prune]
min_trials = 2
[champion]
top_k = 1
seeds = [1]
[fleet]
ranks = RANKS
"""


def spec(tmp_path, data, sampler="random", trials=3, ranks=1, search=None):
    text = (
        SPEC.replace("DATA", str(data))
        .replace("SAMPLER", sampler)
        .replace("TRIALS", str(trials))
        .replace("RANKS", str(ranks))
        .replace("SEARCH", search or "lr = { low = 1e-3, high = 1e-2, log = true }")
    )
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


def test_a_sweep_stopped_by_sigterm_resumes_and_crowns_a_champion(tmp_path, tiny_data):
    path, folder = spec(tmp_path, tiny_data), tmp_path / "sweep"
    argv = [sys.executable, "-m", "fleet.cli", "sweep", str(path), "--out", str(folder)]
    proc = subprocess.Popen(argv, env=fleet_env(), stdout=subprocess.PIPE, text=True)
    ckpts = folder / "trials" / "0001" / "checkpoints"
    deadline = time.monotonic() + 240
    while not (ckpts.is_dir() and list(ckpts.glob("step-*"))):  # trial 1 is under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "the running trials were checkpointed" in out
    st = run_fleet("sweep", "status", str(folder)).stdout
    assert "no controller running" in st and "1 running" in st

    resumed = run_fleet("sweep", str(path), "--out", str(folder), "--resume", timeout=600).stdout
    assert "trial 1 (trial, seed 0): resumed from step-" in resumed, resumed
    assert "fleet sweep: champion trial" in resumed
    s = report.open_sweep(folder)
    assert [t.user_attrs["role"] for t in s.trials] == ["search"] * 3 + ["confirm"]
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in s.trials)
    assert 1000 in s.trials[1].intermediate_values  # the budget's last evaluation, after resume
    assert len(list((folder / "trials" / "0001" / "telemetry").glob("rank-0*.arrow"))) == 2

    text = run_fleet("report", str(folder), "--plot", str(tmp_path / "s.png")).stdout
    assert "val_bpb" in text and "the top 1 re-run on new seeds" in text
    assert (tmp_path / "s.png").stat().st_size > 0
    line = run_fleet("sweep", "promote", str(folder)).stdout.splitlines()[-1]
    assert line.startswith("fleet train --data ") and "--lr " in line
    assert run_fleet("report", str(folder), "--json", check=False).returncode == 0
    # every trial reported to its own TensorBoard folder
    for t in s.trials:
        events = list((folder / "trials" / f"{t.number:04d}" / "trackers").rglob("events.out.*"))
        assert len(events) >= 1


def test_two_rank_trials_of_a_grid_log_once_per_run(tmp_path, tiny_data):
    path = spec(tmp_path, tiny_data, "grid", 0, ranks=2, search="lr = [3e-3, 1e-2]")
    path.write_text(path.read_text().replace("seeds = [1]", "seeds = []"))
    folder = tmp_path / "grid"
    out = run_fleet("sweep", str(path), "--out", str(folder), timeout=600).stdout
    assert "fleet sweep: champion trial" in out
    s = report.open_sweep(folder)
    assert sorted(t.params["lr"] for t in s.trials) == [3e-3, 1e-2]
    assert all(t.state.name == "COMPLETE" for t in s.trials)
    for t in s.trials:
        run = folder / "trials" / f"{t.number:04d}"
        assert sorted(p.name for p in (run / "telemetry").glob("rank-*.arrow")) == [
            "rank-0.arrow",
            "rank-1.arrow",
        ]  # two ranks trained it
        assert len(list((run / "trackers").rglob("events.out.*"))) == 1  # one logged it
