"""Each rank's compute cost per sample, as the autopilot reads it from a noisy machine.

Three things make the figures of one update a poor guide, each answered here:

- **A busy machine slows every rank at once** (another job, the OS, a shared core): each
  rank's cost is read relative to its peers' at the same update (its log cost per sample
  minus the median of all ranks' at that update), so what all share cancels out. On this
  project's 2-core box that took the scatter from 0.55 to 0.2-0.3 (log units).
- **Spikes** (a page fault storm, a recompile): medians in log space, and a robust scatter
  (1.4826 MAD) behind every threshold.
- **Costs that change** (a Mac that heats up, a job that starts beside a rank): each rank's
  figures since its cost last moved form its *regime*. When its newest `recent` figures sit
  on one side of the regime's median, further than the noise allows (`z` standard errors,
  and at least `min_shift`), a new regime starts with them: a change is read within
  `recent` updates instead of being averaged with the past.

A rank's compute is read as its cost x (fixed + batch), `fixed` being the part that does not
grow with its batch (trainer/fixed_part.py reads it; 0 until it has); each update's figures are
kept as measured, so that a new reading re-reads every regime. An estimate carries its
standard error, so that the autopilot acts only on differences the noise cannot explain. Pure
Python (no mlx).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

SIGMA_PRIOR = 0.3  # log-scatter assumed until there are figures enough to measure it
SIGMA_FLOOR = 0.03  # no machine is steadier than this (timer, scheduler)
MIN_SPREAD_N = 5  # figures a rank needs before its own scatter is trusted


@dataclass(frozen=True)
class Estimate:
    """A rank's cost per sample relative to its peers (1.0: like the median rank)."""

    cost: float
    se: float  # standard error of log(cost)
    n: int  # figures in its regime
    sigma: float  # the log-scatter of one figure


class Costs:
    """Per-rank regimes of relative cost per sample (see the module docstring)."""

    def __init__(
        self,
        world: int,
        window: int = 20,
        recent: int = 4,
        z: float = 3.0,
        min_shift: float = math.log(1.25),
    ) -> None:
        self.world, self.window, self.recent = world, max(window, recent + 2), recent
        self.z, self.min_shift = z, min_shift
        self.confirm = recent + 1
        # Each regime holds update numbers; an update's figures are kept raw, so that a new
        # reading of the fixed part (`fixed`) re-reads every cost from what was measured.
        self.regimes: list[deque[int]] = [deque(maxlen=self.window) for _ in range(world)]
        self.figures: dict[int, tuple[Sequence[int], Sequence[float]]] = {}
        self.values: dict[int, list[float]] = {}  # relative log cost per sample, at `fixed`
        self.updates = 0
        self._fixed = 0.0
        self.shifted = [False] * world  # whether a rank's regime began with a shift
        self.skip: set[int] = set()  # ranks whose next figure is not read (a recompile)

    @property
    def fixed(self) -> float:
        """A rank's compute that does not grow with its batch, in samples of its own cost:
        a rank at batch b costs (fixed + b) of them (trainer/fixed_part.py reads it)."""
        return self._fixed

    @fixed.setter
    def fixed(self, samples: float) -> None:
        if samples != self._fixed:
            self._fixed = samples
            self.values = {u: self._value(*self.figures[u]) for u in self.figures}

    def add(self, batches: Sequence[int], compute_s: Sequence[float]) -> list[int]:
        """One update's figures; returns the ranks whose cost just moved (a new regime)."""
        if not all(b > 0 and c > 0 for b, c in zip(batches, compute_s, strict=True)):
            return []  # an update some rank did not measure: nothing to compare with
        u, self.updates = self.updates, self.updates + 1
        self.figures[u] = (tuple(batches), tuple(compute_s))
        self.values[u] = self._value(batches, compute_s)
        moved = []
        for r in range(self.world):
            if r in self.skip:
                self.skip.discard(r)
                continue
            self.regimes[r].append(u)
            if self._shifted(r):
                kept = list(self.regimes[r])[-self.recent :]
                self.regimes[r].clear()
                self.regimes[r].extend(kept)
                self.shifted[r] = True
                moved.append(r)
        self._forget()
        return moved

    def _value(self, batches: Sequence[int], compute_s: Sequence[float]) -> list[float]:
        """Each rank's log cost per sample minus the median rank's: what all share cancels."""
        logs = [math.log(c / (b + self._fixed)) for b, c in zip(batches, compute_s, strict=True)]
        common = statistics.median(logs)
        return [v - common for v in logs]

    def _forget(self) -> None:
        """Drop the figures no regime holds any more."""
        held = {u for q in self.regimes for u in q}
        for u in [u for u in self.figures if u not in held and u < self.updates - 1]:
            del self.figures[u], self.values[u]

    def _regime(self, r: int) -> list[float]:
        return [self.values[u][r] for u in self.regimes[r]]

    def confirmed(self, r: int) -> bool:
        """Whether rank r's regime can be acted on: the figures that showed a shift were
        picked for being far out, so a regime they started needs `confirm` figures."""
        return not self.shifted[r] or self.n(r) >= self.confirm

    def restart(self, ranks: Sequence[int]) -> None:
        """These ranks' batch changed: their cost per sample may differ at the new batch (a
        fixed part), and their first update there recompiles; start their regimes over."""
        for r in ranks:
            self.regimes[r].clear()
            self.shifted[r] = False
            self.skip.add(r)

    def clear(self) -> None:
        self.restart(range(self.world))
        self.skip.clear()

    def n(self, r: int) -> int:
        return len(self.regimes[r])

    def sigma(self, r: int) -> float:
        """The log-scatter of one figure of rank r: its own once it has enough, never below
        the ranks' pooled one (four figures' MAD is itself noise)."""
        own = [_spread(self._regime(q)) for q in range(self.world) if self.n(q) >= MIN_SPREAD_N]
        pooled = statistics.median(own) if own else SIGMA_PRIOR
        mine = _spread(self._regime(r)) if self.n(r) >= MIN_SPREAD_N else pooled
        return max(mine, pooled, SIGMA_FLOOR)

    def estimate(self, r: int) -> Estimate | None:
        """Rank r's relative cost per sample in its regime, or None without figures."""
        q = self._regime(r)
        if not q:
            return None
        sigma = self.sigma(r)
        # the median's standard error: sqrt(pi/2) times the mean's
        return Estimate(
            math.exp(statistics.median(q)), 1.2533 * sigma / math.sqrt(len(q)), len(q), sigma
        )

    def _shifted(self, r: int) -> bool:
        q = self._regime(r)
        if len(q) < self.recent + 3:
            return False
        ref, new = q[: -self.recent], q[-self.recent :]
        mid = statistics.median(ref)
        shift = statistics.median(new) - mid
        se = 1.2533 * self.sigma(r) * math.sqrt(1 / len(new) + 1 / len(ref))
        if abs(shift) < max(self.min_shift, self.z * se):
            return False
        same_side = sum((x > mid) == (shift > 0) for x in new)
        return same_side >= len(new) - 1  # one figure may be a spike the other way


def _spread(q: list[float]) -> float:
    mid = statistics.median(q)
    return 1.4826 * statistics.median(abs(x - mid) for x in q)
