"""The pruning rule, and why a trial was pruned, with its figures.

Not the published log's mistake: a trial is never compared with one champion's ratio. It is
judged only at its evaluation points, only after a warm-up (a fraction of the budget, half by
default), and against the field: Optuna's median rule (worse than the median of the finished
trials at the same point of the budget) or its asynchronous successive halving (not among the
best 1/reduction of the trials that reached the same rung). A NaN, or a loss that climbs back
above where the trial started, is pruned at once, at any point.

Steps given to Optuna are the fraction of the budget in thousandths, so trials of different
batch sizes (and so different update counts) are judged at the same point of the budget.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

STEPS = 1000  # Optuna's step: thousandths of the budget
DIVERGE_WINDOW = 10  # updates whose mean loss is compared with the first update's


def step_of(fraction: float) -> int:
    """Optuna's step for a point of the budget."""
    return round(STEPS * fraction)


def make_pruner(rule: str, warmup: float, min_trials: int, reduction: int) -> Any:
    """Optuna's pruner for the rule: median, halving, or none."""
    import optuna

    if rule == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=min_trials, n_warmup_steps=step_of(warmup), n_min_trials=min_trials
        )
    if rule == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=max(1, step_of(warmup)), reduction_factor=reduction
        )
    return optuna.pruners.NopPruner()


def diverging(losses: dict[int, float], ratio: float) -> str | None:
    """Why a trial's training loss says to stop it now, or None: a NaN or infinite loss, or
    (ratio > 0) the mean of the last DIVERGE_WINDOW losses above `ratio` x the first one."""
    if not losses:
        return None
    steps = sorted(losses)
    bad = next((s for s in steps if not math.isfinite(losses[s])), None)
    if bad is not None:
        return f"the training loss is {losses[bad]} at update {bad}"
    if not ratio or len(steps) < 2 * DIVERGE_WINDOW:
        return None
    first = losses[steps[0]]
    recent = statistics.fmean(losses[s] for s in steps[-DIVERGE_WINDOW:])
    if recent > ratio * first:
        return (
            f"diverging: the mean training loss of updates {steps[-DIVERGE_WINDOW]}-{steps[-1]} "
            f"is {recent:.4f}, above {ratio:g} x the first update's {first:.4f}"
        )
    return None


def explain(
    rule: str,
    value: float,
    step: int,
    trials: list[Any],
    number: int,
    minimize: bool,
    reduction: int,
) -> str:
    """Why Optuna pruned trial `number` at `step` with `value`, with the figures it went by.

    `trials` are the study's FrozenTrials (this one included)."""
    where = f"at {step / STEPS:.0%} of the budget"
    if not math.isfinite(value):
        return f"the metric is {value} {where}"
    worse = "above" if minimize else "below"
    if rule == "median":
        field = [
            t.intermediate_values[step]
            for t in trials
            if t.state.name == "COMPLETE" and step in t.intermediate_values
        ]
        if field:
            middle = statistics.median(field)
            return (
                f"median rule {where}: {value:.4f} is {worse} the median {middle:.4f} "
                f"of the {len(field)} finished trial(s) there"
            )
        return f"median rule {where}: {value:.4f}"
    if rule == "halving":
        rung = 0
        mine = next((t for t in trials if t.number == number), None)
        while mine is not None and f"completed_rung_{rung + 1}" in mine.system_attrs:
            rung += 1
        key = f"completed_rung_{rung}"
        competing = sorted(
            (t.system_attrs[key] for t in trials if key in t.system_attrs), reverse=not minimize
        )
        keep = max(1, len(competing) // reduction)
        if competing:
            cut = competing[keep - 1]
            return (
                f"successive halving, rung {rung} {where}: {value:.4f} is not among the best "
                f"{keep} of the {len(competing)} trial(s) that reached it (the cut is {cut:.4f})"
            )
        return f"successive halving {where}: {value:.4f}"
    return f"pruned {where}: {value:.4f}"
