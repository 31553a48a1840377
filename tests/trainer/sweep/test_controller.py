"""The controller's bookkeeping, on fake trials (tests/support/fake_trial.py: the same flags
and telemetry as `fleet train`, no mlx): pruning with reasons, the re-runs and the champion, a
failed trial recorded while the sweep goes on, a crash and a SIGTERM resumed with nothing lost
or repeated, and the one-line refusals."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from tests.support.fleet import fleet_env
from trainer.sweep import controller as sweep_controller
from trainer.sweep import report, status
from trainer.sweep.controller import Controller, SweepError
from trainer.sweep.spec import load

SPEC = """
name = "fake"
sampler = "random"
trials = 6
sampler_seed = 3
[train]
synthetic = true
seq_len = 32
local_batch = 8
[search]
lr = { low = 1e-4, high = 3e-2, log = true }
[baseline]
lr = 0.08
[budget]
tokens = 5120
evals = 4
[metric]
name = "val_loss"
[prune]
min_trials = 2
[champion]
top_k = 2
seeds = [1]
"""


def fake(spec, train, hostfile, port):
    return [sys.executable, "-m", "tests.support.fake_trial", *train]


@pytest.fixture(autouse=True)
def quick_poll(monkeypatch):
    monkeypatch.setattr(sweep_controller, "POLL_S", 0.05)


def make(tmp_path, text=SPEC, **env):
    path = tmp_path / "fake.toml"
    path.write_text(text)
    return load(path, tmp_path / "sweep"), fleet_env(**env)


def study_of(spec):
    return report.open_sweep(spec.folder)


def test_a_sweep_prunes_with_reasons_reruns_the_best_and_crowns_the_best_mean(tmp_path):
    spec, env = make(tmp_path)
    said = []
    assert Controller(spec, env=env, argv_for=fake, say=said.append).run() == 0
    s = study_of(spec)
    search = [t for t in s.trials if t.user_attrs["role"] == "search"]
    reruns = [t for t in s.trials if t.user_attrs["role"] == "confirm"]
    assert len(search) == 6 and len(reruns) == 2
    baseline = search[0]
    assert baseline.params == {"lr": 0.08} and baseline.state.name == "PRUNED"
    assert baseline.user_attrs["pruned"] == "the training loss is nan at update 3"
    for t in search[1:]:
        if t.state.name == "PRUNED":  # never before the warm-up, always with its figures
            assert t.user_attrs["pruned"].startswith("median rule at ")
            assert (
                max(t.intermediate_values) >= 500
                and "finished trial(s) there" in (t.user_attrs["pruned"])
            )
        else:
            assert t.state.name == "COMPLETE" and 1000 in t.intermediate_values
    best_two = sorted((t for t in search if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert sorted(t.user_attrs["of"] for t in reruns) == sorted(t.number for t in best_two[:2])
    assert all(t.user_attrs["seed"] == 1 and t.state.name == "COMPLETE" for t in reruns)
    data = report.summary(s)
    assert data["final"] and data["champion"] in {t.number for t in best_two[:2]}
    text = report.render(data)
    assert "the training loss is nan at update 3" in text and "*" in text
    assert said[-1].startswith(f"fleet sweep: champion trial {data['champion']}: val_loss ")
    st = status.status(s)
    assert (st["done"], len(st["running"]), st["failed"]) == (6 - st["pruned"] + 2, 0, 0)
    line = report.promote(s, 5000, "runs/full")
    assert "fleet train --synthetic --seq-len 32 --local-batch 8 --lr " in line
    assert line.endswith("--seed 0 --run-dir runs/full --updates 5000")


def test_a_failed_trial_is_recorded_with_its_reason_and_the_sweep_goes_on(tmp_path):
    spec, env = make(tmp_path, SPEC.replace("trials = 6", "trials = 3"), FAKE_TRIAL_FAIL="0001")
    assert Controller(spec, env=env, argv_for=fake, say=lambda m: None).run() == 0
    s = study_of(spec)
    states = {t.number: t.state.name for t in s.trials}
    assert states[1] == "FAIL" and states[2] in ("COMPLETE", "PRUNED")
    assert s.trials[1].user_attrs["failed"] == "exited with code 1: fake trial: boom"
    assert "failed: exited with code 1: fake trial: boom" in report.render(report.summary(s))


class Crash(Exception):
    pass


def test_a_crash_mid_trial_resumes_with_none_lost_or_repeated(tmp_path):
    spec, env = make(tmp_path, FAKE_TRIAL_SLOW="0002")  # still running when resumed

    def crash_at_trial_2(msg: str) -> None:
        if msg.startswith("trial 2 ("):
            deadline = time.monotonic() + 60
            while not (spec.folder / "trials" / "0002" / "telemetry").is_dir():
                assert time.monotonic() < deadline  # the trial is writing its logs
                time.sleep(0.05)
            raise Crash  # the controller dies here, its trial left running (an orphan)

    with pytest.raises(Crash):
        Controller(spec, env=env, argv_for=fake, say=crash_at_trial_2).run()
    before = {t.number: t.state.name for t in study_of(spec).trials}
    assert before[2] == "RUNNING" and all(before[n] != "RUNNING" for n in (0, 1))
    said = []
    with pytest.raises(SweepError, match="holds a sweep already"):
        Controller(spec, env=env, argv_for=fake)
    assert Controller(spec, resume=True, env=env, argv_for=fake, say=said.append).run() == 0
    assert "trial 2: ended the process the last controller left" in said
    s = study_of(spec)
    # Every trial once: the finished ones kept as they were, the one in flight restarted.
    assert {t.number: t.state.name for t in s.trials if t.number < 2} == {
        n: before[n] for n in (0, 1)
    }
    assert sum(t.user_attrs["role"] == "search" for t in s.trials) == 6
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in s.trials)
    assert len(list((spec.folder / "trials").glob("0002.restart-*"))) == 1  # no checkpoint


def test_sigterm_stops_the_trial_and_the_sweep_and_resume_goes_on(tmp_path):
    spec, env = make(tmp_path, SPEC.replace("trials = 6", "trials = 3"), FAKE_TRIAL_DELAY="0.05")

    def term_at_trial_1(msg: str) -> None:
        if msg.startswith("trial 1 ("):
            os.kill(os.getpid(), signal.SIGTERM)

    assert Controller(spec, env=env, argv_for=fake, say=term_at_trial_1).run() == 128 + 15
    s = study_of(spec)
    assert [t.state.name for t in s.trials] == ["PRUNED", "RUNNING"]
    assert Controller(spec, resume=True, env=env, argv_for=fake, say=lambda m: None).run() == 0
    assert len(study_of(spec).trials) == 3 + 2


def test_a_folder_of_another_spec_or_nothing_to_resume_is_one_line(tmp_path):
    spec, env = make(tmp_path, SPEC.replace("trials = 6", "trials = 1"))
    with pytest.raises(SweepError, match="nothing to resume"):
        Controller(spec, resume=True, env=env, argv_for=fake)
    Controller(spec, env=env, argv_for=fake, say=lambda m: None).run()
    other, _ = make(tmp_path, SPEC.replace("low = 1e-4", "low = 2e-4"))
    with pytest.raises(SweepError) as e:
        Controller(other, resume=True, env=env, argv_for=fake)
    assert "was made by another spec (search.lr.low differs" in str(e.value)
    more, _ = make(tmp_path, SPEC.replace("trials = 6", "trials = 2"))  # more trials: allowed
    assert Controller(more, resume=True, env=env, argv_for=fake, say=lambda m: None).run() == 0
    assert sum(t.user_attrs["role"] == "search" for t in study_of(more).trials) == 2


def test_concurrent_trials_run_side_by_side(tmp_path):
    text = SPEC.replace("trials = 6", "trials = 4").replace("[baseline]\nlr = 0.08\n", "")
    spec, env = make(tmp_path, text + "[fleet]\nconcurrent = 2\n", FAKE_TRIAL_DELAY="0.1")
    said = []
    assert Controller(spec, env=env, argv_for=fake, say=said.append).run() == 0
    first_end = next(i for i, m in enumerate(said) if ": finished" in m or ": pruned" in m)
    assert sum(" started: " in m for m in said[:first_end]) == 2  # two at once
    s = study_of(spec)
    assert len(s.trials) == 4 + 2 and all(t.state.name != "FAIL" for t in s.trials)


def test_the_command_line_says_each_mistake_in_one_line(tmp_path):
    from tests.support.fleet import run_fleet

    bad = tmp_path / "bad.toml"
    bad.write_text(SPEC.replace("local_batch = 8", "local_bach = 8"))
    for args, says in [
        (["sweep", str(tmp_path / "missing.toml")], "cannot read it"),
        (["sweep", str(bad)], "[train] --local-bach is not a fleet train flag"),
        (["sweep", "status"], "give the sweep folder: fleet sweep status SWEEP"),
        (["sweep", "status", str(tmp_path)], "is not a sweep folder"),
    ]:
        out = run_fleet(*args, check=False)
        assert out.returncode == 2 and says in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
