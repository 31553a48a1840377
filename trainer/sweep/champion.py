"""The honest champion: the best k search trials are re-run on new seeds, and the champion is
the best mean over each one's seeds, shown with its spread (a champion of one seed is often
noise: gains of ~1e-3 bits per byte sit inside the seed-to-seed spread)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

SEARCH, CONFIRM = "search", "confirm"


@dataclass(frozen=True)
class Record:
    """One trial as the champion sees it (built from Optuna's FrozenTrial)."""

    number: int
    params: dict[str, Any]
    seed: int
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    value: float | None = None
    role: str = SEARCH
    of: int | None = None  # the search trial a confirmation re-runs
    diverged: bool = False  # ended on a NaN or a diverging loss


@dataclass(frozen=True)
class Candidate:
    """A top-k search trial and its re-runs on other seeds."""

    number: int
    params: dict[str, Any]
    values: tuple[float, ...]  # one per seed that finished (a diverged re-run counts as inf)
    seeds: tuple[int, ...]
    missing: tuple[int, ...] = field(default=())  # seeds not finished (running or failed)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else math.nan

    @property
    def spread(self) -> tuple[float, float, float]:
        """(min, max, sample standard deviation; 0 for one value)."""
        v = self.values
        return min(v), max(v), statistics.stdev(v) if len(v) > 1 else 0.0


def finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def top(records: list[Record], k: int, minimize: bool) -> list[Record]:
    """The best k finished search trials (ties to the earlier trial)."""
    done = [r for r in records if r.role == SEARCH and r.state == "COMPLETE" and finite(r.value)]
    sign = 1 if minimize else -1
    return sorted(done, key=lambda r: (sign * r.value, r.number))[:k]


def reruns_needed(
    records: list[Record], k: int, seeds: tuple[int, ...], minimize: bool
) -> list[tuple[Record, int]]:
    """(top trial, seed) pairs still to run: each top trial on each new seed, once.
    A confirmation that exists in any state (even failed) is not asked for again."""
    asked = {(r.of, r.seed) for r in records if r.role == CONFIRM}
    return [(t, s) for t in top(records, k, minimize) for s in seeds if (t.number, s) not in asked]


def candidates(
    records: list[Record], k: int, seeds: tuple[int, ...], minimize: bool
) -> list[Candidate]:
    """The top k with every seed's value so far, best mean first."""
    out = []
    worst = math.inf if minimize else -math.inf
    for t in top(records, k, minimize):
        values, done = [t.value], [t.seed]
        for r in records:
            if r.role != CONFIRM or r.of != t.number:
                continue
            if r.state == "COMPLETE" and finite(r.value):
                values.append(r.value)
                done.append(r.seed)
            elif r.diverged:  # a re-run that blew up says the setting is fragile
                values.append(worst)
                done.append(r.seed)
        missing = tuple(s for s in seeds if s not in done)
        out.append(Candidate(t.number, t.params, tuple(values), tuple(done), missing))
    sign = 1 if minimize else -1
    return sorted(out, key=lambda c: (sign * c.mean, c.number))


def crown(
    records: list[Record], k: int, seeds: tuple[int, ...], minimize: bool
) -> tuple[Candidate | None, bool]:
    """(the champion so far, whether it is final: every re-run of every top trial ended)."""
    cands = candidates(records, k, seeds, minimize)
    if not cands:
        return None, False
    pending = {(r.of, r.seed) for r in records if r.role == CONFIRM and r.state in _LIVE}
    final = not reruns_needed(records, k, seeds, minimize) and not pending
    return cands[0], final


_LIVE = ("RUNNING", "WAITING")
