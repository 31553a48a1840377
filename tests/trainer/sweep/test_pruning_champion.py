"""The pruning rule (Optuna's, judged only after the warm-up, never against one champion) and
the champion (the best mean over seeds, not the best single run)."""

from __future__ import annotations

import math

import optuna
import pytest

from trainer.sweep import champion, pruning
from trainer.sweep.champion import CONFIRM, Record

optuna.logging.set_verbosity(optuna.logging.WARNING)


def study_with(finished: list[list[float]], rule: str = "median", warmup: float = 0.5):
    """A study whose finished trials reported these values at 25/50/75/100% of the budget."""
    study = optuna.create_study(pruner=pruning.make_pruner(rule, warmup, 2, 3))
    for values in finished:
        t = study.ask()
        for i, v in enumerate(values):
            t.report(v, pruning.step_of((i + 1) / len(values)))
        study.tell(t, values[-1])
    return study


def test_median_rule_waits_for_the_warm_up_then_explains_with_figures():
    study = study_with([[6.0, 5.0, 4.5, 4.0], [6.2, 5.2, 4.7, 4.2], [6.4, 5.4, 4.9, 4.4]])
    t = study.ask()
    t.report(9.0, pruning.step_of(0.25))  # far behind, but before the warm-up: kept
    assert not t.should_prune()
    t.report(9.0, pruning.step_of(0.5))
    assert t.should_prune()
    why = pruning.explain("median", 9.0, 500, study.get_trials(), t.number, True, 3)
    assert why == (
        "median rule at 50% of the budget: 9.0000 is above the median 5.2000 of the 3 "
        "finished trial(s) there"
    )


def test_one_champion_never_prunes_alone():
    # The log's mistake was a gate against one champion's ratio: with a single finished trial
    # the median rule (min_trials 2) keeps everything, however far behind.
    study = study_with([[4.0, 3.0, 2.5, 2.0]])
    t = study.ask()
    t.report(50.0, pruning.step_of(0.75))
    assert not t.should_prune()


def test_successive_halving_keeps_the_best_third_at_a_rung():
    study = optuna.create_study(pruner=pruning.make_pruner("halving", 0.5, 2, 3))
    kept = []
    for v in (5.0, 4.0, 6.0, 3.0, 7.0, 8.0):
        t = study.ask()
        t.report(v, pruning.step_of(0.5))
        kept.append(not t.should_prune())
        study.tell(t, v)
    assert kept[:2] == [True, True] and kept[-2:] == [False, False]
    why = pruning.explain("halving", 8.0, 500, study.get_trials(), 5, True, 3)
    assert "not among the best 2 of the 6 trial(s)" in why and "the cut is 4.0000" in why


@pytest.mark.parametrize(
    ("losses", "ratio", "says"),
    [
        ({1: 5.5, 2: math.nan}, 1.0, "the training loss is nan at update 2"),
        ({1: 5.5, 2: math.inf}, 0.0, "the training loss is inf at update 2"),
        ({s: 5.5 + 0.1 * s for s in range(1, 25)}, 1.0, "diverging: the mean training loss"),
        ({s: 5.5 + 0.1 * s for s in range(1, 25)}, 0.0, None),  # 0 = never
        ({s: 5.5 - 0.1 * s for s in range(1, 25)}, 1.0, None),  # learning
        ({s: 5.9 for s in range(1, 12)}, 1.0, None),  # too early to say
    ],
)
def test_a_nan_or_a_diverging_loss_is_pruned_at_once(losses, ratio, says):
    why = pruning.diverging(losses, ratio)
    assert (why is None) if says is None else why.startswith(says), why


def rec(n, value, seed=0, role="search", of=None, state="COMPLETE", diverged=False):
    return Record(n, {"lr": n}, seed, state, value, role, of, diverged)


def test_the_champion_is_the_best_mean_not_the_best_single_seed():
    records = [
        rec(0, 2.00),  # the best single run: a lucky seed
        rec(1, 2.01),
        rec(2, 2.50),
        rec(3, None, state="PRUNED"),
        rec(4, 2.09, 1, CONFIRM, 0),
        rec(5, 2.11, 2, CONFIRM, 0),
        rec(6, 2.02, 1, CONFIRM, 1),
        rec(7, 2.00, 2, CONFIRM, 1),
    ]
    best, final = champion.crown(records, 2, (1, 2), minimize=True)
    assert final and best.number == 1 and best.seeds == (0, 1, 2)
    assert best.mean == pytest.approx(2.01) and best.spread[:2] == (2.00, 2.02)
    assert best.spread[2] == pytest.approx(0.01)
    cands = champion.candidates(records, 2, (1, 2), True)
    assert [c.number for c in cands] == [1, 0] and cands[1].mean == pytest.approx(2.0667, 1e-3)


def test_reruns_are_asked_once_and_the_crown_waits_for_them():
    records = [rec(0, 2.0), rec(1, 2.1), rec(2, 1.9, state="PRUNED")]
    assert [(t.number, s) for t, s in champion.reruns_needed(records, 2, (1, 2), True)] == [
        (0, 1),
        (0, 2),
        (1, 1),
        (1, 2),
    ]
    records += [rec(3, None, 1, CONFIRM, 0, state="RUNNING"), rec(4, None, 2, CONFIRM, 0, "FAIL")]
    assert len(champion.reruns_needed(records, 2, (1, 2), True)) == 2  # never the same twice
    best, final = champion.crown(records, 2, (1, 2), True)
    assert best.number == 0 and not final and best.missing == (1, 2)


def test_a_rerun_that_diverged_cannot_be_crowned_and_maximize_flips():
    records = [rec(0, 2.0), rec(1, 2.1), rec(2, None, 1, CONFIRM, 0, "PRUNED", diverged=True)]
    best, _ = champion.crown(records, 2, (1,), minimize=True)
    assert best.number == 1  # trial 0's re-run blew up: its mean is inf
    best, _ = champion.crown([rec(0, 2.0), rec(1, 2.1)], 2, (), minimize=False)
    assert best.number == 1
