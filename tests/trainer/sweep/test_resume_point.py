"""Where a restarted trial resumes: its newest good checkpoint, but never at or past the
budget's end while the evaluation there is missing from its log (the trainer would skip it)."""

from __future__ import annotations

import mlx.core as mx

from trainer.checkpoint import catalog, store
from trainer.sweep.trial import resume_point


def save(run, step, agree=True):
    return store.save(
        run,
        step,
        params={"w": mx.zeros((2,))},
        optimizer_state={},
        state={"step": step},
        config={},
        identity={"replicas_agree": agree},
        make_latest=agree,
    )


def test_the_newest_checkpoint_unless_it_would_lose_the_final_evaluation(tmp_path):
    run = tmp_path / "run"
    assert resume_point(run, 40, set()) is None  # nothing saved: start over
    for step in (10, 20, 30, 40):
        save(run, step)
    assert resume_point(run, 40, {10, 20, 30}).name == "step-000030"  # not at 40: no eval
    assert resume_point(run, 40, {10, 20, 30, 40}).name == "step-000040"
    assert resume_point(run, 40, {10}).name == "step-000030"  # a lost 20 or 30: one point less
    save(run, 41)  # the trial's last update: finished, the study not yet told
    assert resume_point(run, 40, {10, 20, 30, 40}).name == "step-000041"
    assert resume_point(run, 40, {10, 20, 30}).name == "step-000030"  # its eval event lost


def test_a_checkpoint_that_fails_to_verify_or_disagreed_is_passed_over(tmp_path):
    run = tmp_path / "run"
    save(run, 10)
    save(run, 20)
    save(run, 30, agree=False)
    (catalog.step_dir(run, 20) / catalog.WEIGHTS).write_bytes(b"damaged")
    assert resume_point(run, 40, set()).name == "step-000010"
