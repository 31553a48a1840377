"""The fixed part of a rank's compute (what does not grow with its batch), read from the moves.

A rank's compute in an update is about `cost x (fixed + batch)`: the fixed part is a
microstep's launch, its Python, and on a shared machine the time a rank waits for a core. In
samples of the rank's own cost it is 0 for a big model on its own machine and was about 6 for
four ranks on this project's 2-core box (benchmarks/RESULTS.md, session 7). Read as 0 where
it is not, a rank with few samples looks dear per sample: it is given fewer still, and when
it recovers the pilot does not see it.

Nothing measures it directly, but every change of the split does: a rank whose batch went
from b1 to b2 and whose cost did not change took `(F + b2) / (F + b1)` as long. Each update's
log compute times are taken relative to the update's mean (what all ranks share cancels),
the medians of the `window` updates before a change and after it (its first update
recompiles and is not read) give each rank's change, and the F that explains every rank's
change over the last `moves` changes best (a robust least squares, in standard errors) is
the best fit, with the range of F the figures do not rule out.

The fit carries a prior toward small fixed parts (`PRIOR`). A change in whose windows a
rank's cost moved (a rank that slowed in the update its batch fell) reads as a fixed part of
tens of samples, and while the changes are few the best fit can jump between that and the
true one as the windows fill: session 13's gradual16 repeat 2, updates 55-60, read 64, 0.59,
0.25, 64, 64, 0.25 samples without it, and 0.84, 0.59, 0.25, 6.7, 0.84, 0.25 with it. Where
the figures pin the fixed part down (moves of several samples a rank) it moves the fit
little.

A rank is read at the fit, or at its own batch where that is less, unless the figures
require a fixed part of at least its batch (`capped`): no more than half of what a rank
measured is taken as fixed, unless the figures say so. The fit holds for the batches of the
changes it was read from; a compute that is not a straight line in the batch (this box's:
0.0255 s at 1, 0.094 at 4, 0.149 at 8: about 0.1 samples between 1 and 4 and 3 between 4 and
8), or a fit misread (on a shared box the ranks' speeds move with the split), would
otherwise decide what a rank measured at a few samples does at many. Read at 8 samples, a
rank that took 1 s at batch 1 reads as 0.11 s a sample and is predicted 2 s at batch 10; its
cost per sample rests on the fit more than on its figures. Session 19's gradual16 moved
5,5,5,1 -> 2,2,2,10 on a fit of 8 (0 to 23) and 4,4,7,1 -> 4,4,4,4 on one of 2.8 (0 to 4.8),
giving rank 3, 2x and 3x slow, 10 and 4 samples: it then took 0.2-0.5 s where its peers took
0.03-0.12. Where the fit is at most the smallest batch, nothing changes. Where the figures
require a fixed part of the rank's batch or more, the premise is refuted and the fit holds:
session 20 read a rank there at the least they allowed, and with a true fixed part of 6
samples (a compute whose launch costs as much as 6 samples: a small model) a rank left 1
sample while 3x slow was read dear per sample after it recovered and got its samples back in
51 of 96 simulated runs (session 19, the fit at any batch: 89; session 21: 71; session 22,
slowdowns confirmed sooner: 60; in most of the rest its peers at 5, capped at 5 where the fit
was 5.7, made the move back look too small). Pure Python (no mlx).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainer.scatter import MAD_SIGMA, MEDIAN_SE, SIGMA_FLOOR

# Updates under a split before a change of it can be read: a move 3 updates after a rank
# slowed has 3 rows of the new regime before it (at 4 it went unread, the fixed part stayed 0,
# and a rank left 1 sample never got its samples back: the simulator's transient16 seed 33).
MIN_BEFORE = 3
MIN_AFTER = 3  # updates after a change before it is read (provisionally, until `window`)
CAP = 3.0  # standard errors beyond which a rank's change counts no more (its cost moved)
MIN_SHIFT = math.log(1.25)  # a window whose halves differ by this much holds a cost shift
CHI2 = 3.84  # the score's rise that bounds the range (95% for one parameter)
# The prior: log(1 + F) is 0 give or take this much (a fixed part of 1.7 samples costs the
# fit as much as one rank's change one standard error off, 6.4 samples as much as two). This
# project's 2-core box measured about 1 sample (session 17's fixed arms, tests/support/
# pilot_sim.BOX); tens of samples are let through only where several changes agree.
PRIOR = 1.0
# PRIOR and CHI2 were set on fits of this many ranks; each change's evidence is weighed
# against theirs (`_fit`)
TUNED_WORLD = 4


@dataclass(frozen=True)
class Reading:
    """The fixed part in samples: the best fit (with the prior), and the least and the most
    the figures allow. A pilot steers by the best fit: the least is often 0 where the part is
    about 1, and read at 0 a rank left 1 sample looks a third dearer per sample than its
    peers, and is given its samples back a few at a time (session 17's moving16)."""

    least: float
    best: float
    most: float
    changes: int  # split changes read


@dataclass
class _Change:
    before: tuple[int, ...]
    after: tuple[int, ...]
    rows_before: list[list[float]]
    rows_after: list[list[float]] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        """Whether enough updates after it are in to read it (provisionally until `window`)."""
        return len(self.rows_after) >= MIN_AFTER


class FixedPart:
    """Reads the fixed part from the split changes it is shown (see the module docstring)."""

    def __init__(self, world: int, window: int = 8, moves: int = 8, upto: float = 64.0) -> None:
        self.world, self.window = world, window
        self.changes: deque[_Change] = deque(maxlen=moves)
        self.open: _Change | None = None  # the last change, its updates after still coming
        self.rows: deque[list[float]] = deque(maxlen=window)  # under the current split
        self.split: tuple[int, ...] | None = None
        self.skip = False
        # 0, then a geometric ladder to `upto` (a quarter-octave apart)
        self.grid = [0.0] + [upto * 2 ** (-k / 4) for k in range(40, -1, -1)]
        self._reading: Reading | None = None

    def add(self, split: Sequence[int], compute_s: Sequence[float]) -> None:
        """One update's batches and compute times."""
        if not all(c > 0 for c in compute_s):
            return  # some rank measured nothing (before a run's first update): not the recompile
        split = tuple(split)
        if split != self.split:
            self._close()
            if self.split is not None and len(self.rows) >= MIN_BEFORE:
                self.open = _Change(self.split, split, list(self.rows))
            self.rows.clear()
            self.split, self.skip = split, True
        if self.skip:
            self.skip = False  # the first update at a new split recompiles
            return
        logs = [math.log(c) for c in compute_s]
        mean = statistics.fmean(logs)
        row = [v - mean for v in logs]
        self.rows.append(row)
        if self.open is not None:
            self.open.rows_after.append(row)
            if self.open.ready:
                self._reading = None
            if len(self.open.rows_after) >= self.window:
                self._close()

    def shifted(self, keep: int) -> None:
        """A rank's cost moved: only the last `keep` updates are of its new regime."""
        while len(self.rows) > keep:
            self.rows.popleft()

    def reading(self) -> Reading | None:
        """The fixed part the changes read so far point to, or None before any."""
        if self._reading is None:
            self._reading = self._fit()
        return self._reading

    def _close(self) -> None:
        if self.open is not None and self.open.ready:
            self.changes.append(self.open)
        self.open, self._reading = None, None

    def _windows(self, c: _Change, sigma: float) -> tuple[list, list] | None:
        """The updates before and after a change that hold one cost a rank: a window whose
        halves disagree (a cost moved in it) keeps the half nearest the change; None if
        that does not settle it. A cost that moved there would be read as the fixed part."""
        before, after = c.rows_before, c.rows_after
        if not _steady(before, sigma):
            before = before[len(before) // 2 :]
        if not _steady(after, sigma):
            after = after[: len(after) // 2]
        if min(len(before), len(after)) < MIN_AFTER:
            return None
        return (before, after) if _steady(before, sigma) and _steady(after, sigma) else None

    def _fit(self) -> Reading | None:
        changes = list(self.changes)
        if self.open is not None and self.open.ready:
            changes.append(self.open)
        if not changes:
            return None
        sigma = _scatter([w for c in changes for w in (c.rows_before, c.rows_after)])
        terms = []  # (a rank's measured change, its standard error, its batches, the rank)
        read = 0
        for c in changes:
            windows = self._windows(c, sigma)
            if windows is None:
                continue
            before, after = windows
            read += 1
            se = MEDIAN_SE * sigma * math.sqrt(1 / len(before) + 1 / len(after))
            for r in range(self.world):
                moved = _median(after, r) - _median(before, r)
                terms.append((moved, se, c.before, c.after, r))
        if not terms:
            return None

        # Each update's figures are taken relative to their mean, so one change's terms sum to
        # zero: N ranks give N - 1 pieces of evidence, not N, and their squares (each over the
        # scatter of a relative figure, `sigma`) sum to N / (N - 1) times the chi-square. PRIOR
        # and CHI2 were set on four ranks' fits (TUNED_WORLD), whose terms counted 4/3 as much,
        # so each term is weighed (N - 1) / N against four's 3/4: four ranks read as before, and
        # two no longer count one piece of evidence twice (each term is the other's negated).
        # Counted twice, one change whose rank slowed as its batch fell outweighed the prior
        # (session 43's boxI pair-gradual16 r1: 8,8 -> 9,7 as rank 1 went 1.5x -> 2x, read as 32
        # samples, 0 to 64); on replays of the kept pair runs, moves that answered a rank's new
        # speed went past the best split.
        weight = (self.world - 1) / self.world * TUNED_WORLD / (TUNED_WORLD - 1)

        def score(f: float) -> float:
            total = (math.log1p(f) / PRIOR) ** 2
            for moved, se, b1, b2, r in terms:
                predicted = _relative(b2, f, r) - _relative(b1, f, r)
                total += weight * min(((moved - predicted) / se) ** 2, CAP * CAP)
            return total

        scores = [score(f) for f in self.grid]
        least = min(scores)
        inside = [f for f, s in zip(self.grid, scores, strict=True) if s - least <= CHI2]
        best = self.grid[scores.index(least)]
        return Reading(min(inside), best, max(inside), read)


def _relative(batches: tuple[int, ...], f: float, r: int) -> float:
    """log(f + b_r) less its mean over the ranks: a rank's share of an update, in log time."""
    logs = [math.log(f + b) for b in batches]
    return logs[r] - statistics.fmean(logs)


def _median(rows: list[list[float]], r: int) -> float:
    return statistics.median(row[r] for row in rows)


def _scatter(windows: list[list[list[float]]]) -> float:
    """The robust log-scatter of one figure about its rank's median in its window (1.4826
    MAD, pooled over the windows)."""
    devs = []
    for rows in windows:
        for r in range(len(rows[0])):
            mid = _median(rows, r)
            devs += [abs(row[r] - mid) for row in rows]
    return max(MAD_SIGMA * statistics.median(devs), SIGMA_FLOOR)


def _steady(rows: list[list[float]], sigma: float) -> bool:
    """Whether every rank's first and second half of `rows` agree within the noise."""
    half = len(rows) // 2
    if half < 3:
        return True  # too few to tell
    first, second = rows[:half], rows[-half:]
    se = MEDIAN_SE * sigma * math.sqrt(2 / half)
    return all(
        abs(_median(second, r) - _median(first, r)) < max(MIN_SHIFT, 3 * se)
        for r in range(len(rows[0]))
    )


def capped(fixed: float, batch: int, least: float) -> float:
    """The fixed part a rank at `batch` is read at, were it `fixed` and the least the
    figures allow `least`: at most its batch, unless the figures require that much (see the
    module docstring)."""
    return fixed if least >= batch else min(fixed, batch)
