"""Each rank's compute cost per sample, as the autopilot reads it from a noisy machine.

Three things make the figures of one update a poor guide, each answered here:

- **A busy machine slows every rank at once** (another job, the OS, a shared core): each
  rank's cost is read relative to its peers' at the same update (its log cost per sample
  minus the update's common load, `_common`), so what all share cancels out. On this
  project's 2-core box that took the scatter from 0.55 to 0.2-0.3 (log units).
- **Spikes** (a page fault storm, a recompile): medians in log space, and a robust scatter
  (1.4826 MAD) behind every threshold.
- **Costs that change** (a Mac that heats up, a job that starts beside a rank): each rank's
  figures since its cost last moved form its *regime*. When its newest figures sit on one
  side of the regime's median, further than the noise allows, a new regime starts with
  them: a change is read within a few updates instead of being averaged with the past. How
  few depends on this machine's record: two or three figures suffice where figures that far
  out (`line`) are rare enough that as many in a row on one rank would be chance less than
  once in 1/`FAST_ALPHA` updates (the rate at its 95% upper bound); else `recent` (a large
  shift) to `2 x recent` (a small one) figures, the shift beyond `z` standard errors of
  their median. Such a slow reading's figures were picked for being far out, so it is acted
  on only once later figures confirm it (their median and the newest nearer the new level
  than the old); as many later figures back at the old level refute it (a run of spikes:
  the old regime goes on).
- **The common load** is read from the ranks whose regimes are settled (`MIN_SPREAD_N`
  figures, confirmed): a rank's unconfirmed regime would carry its error into every other.

An estimate carries its standard error, so that the autopilot acts only on differences the
noise cannot explain. Pure Python (no mlx).
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
MIN_REF = 3  # figures of the old regime a shift is measured against
Z_LINE = 4.0  # a figure this many of its rank's scatters from its regime is far out
FAST_ALPHA = 1e-4  # false shifts per update (all ranks) that a two- or three-figure reading risks
Z_RATE = 1.645  # the far-out rate is taken at its one-sided 95% upper bound, not its estimate


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
        self.regimes: list[deque[float]] = [deque(maxlen=self.window) for _ in range(world)]
        # how a rank's regime began: "" (not with a shift), "fast" or "slow" (its reading)
        self.shifted = [""] * world
        # a slow reading's shift, until figures that did not show it confirm or refute it:
        # (the old regime's figures, its median, the new level, how many figures showed it)
        self.origin: list[tuple[list[float], float, float, int] | None] = [None] * world
        self.skip: set[int] = set()  # ranks whose next figure is not read (a recompile)
        # The machine's record of far-out figures (beyond `line` of their regime), all ranks
        # together: how often one is, and so how many in a row a shift must show. A figure
        # joins it `recent` updates late, once it is clear that it began no shift.
        self.read = 0
        self.far = 0
        self.flags: list[deque[bool]] = [deque() for _ in range(world)]

    def add(self, batches: Sequence[int], compute_s: Sequence[float]) -> list[int]:
        """One update's figures; returns the ranks whose cost just moved (a new regime)."""
        logs = [
            math.log(c / b) if b > 0 and c > 0 else None
            for b, c in zip(batches, compute_s, strict=True)
        ]
        valid = [v for v in logs if v is not None]
        if len(valid) < len(logs) or not valid:
            return []  # an update some rank did not measure: nothing to compare with
        common = self._common(logs)
        moved = []
        for r, v in enumerate(logs):
            if r in self.skip:
                self.skip.discard(r)
                continue
            self._record(r, v - common)
            self.regimes[r].append(v - common)
            if self._refuted(r):
                moved.append(r)  # back where it was: what was read from the shift is void
                continue
            k, how = self._shifted(r)
            if k:
                q = list(self.regimes[r])
                old, kept = q[:-k], q[-k:]
                self.regimes[r].clear()
                self.regimes[r].extend(kept)
                self.shifted[r] = how
                self.origin[r] = (
                    (old, statistics.median(old), statistics.median(kept), k)
                    if how == "slow"
                    else None
                )
                self.flags[r].clear()  # a shift's figures are far out for a reason, not noise
                moved.append(r)
        return moved

    def _after(self, r: int) -> tuple[list[float], bool, bool] | None:
        """A slow reading's figures since the ones that showed its shift, whether their
        median sits nearer the new level than the old, and whether the newest does (None:
        no slow reading pending)."""
        if self.origin[r] is None:
            return None
        _, old, new, k = self.origin[r]
        after = list(self.regimes[r])[k:]
        if not after:
            return after, False, False

        def nearer(x: float) -> bool:
            return abs(x - new) < abs(x - old)

        return after, nearer(statistics.median(after)), nearer(after[-1])

    def _refuted(self, r: int) -> bool:
        """A slow reading's shift that as many later figures as showed it (at least two)
        place, by their median, at the old level was a run of spikes: the old regime goes
        on, with them."""
        seen = self._after(r)
        if seen is None:
            return False
        after, held, _ = seen
        if held or len(after) < max(2, self.origin[r][3]):
            if self.confirmed(r):
                self.origin[r] = None  # nothing left to wait for
            return False
        self.regimes[r].clear()
        self.regimes[r].extend((self.origin[r][0] + after)[-self.window :])
        self.shifted[r], self.origin[r] = "", None
        return True

    def _confirm(self, r: int) -> int:
        """Figures past a slow reading's that confirm it: one, and at least as many as make
        its regime longer than `recent` (the figures that showed the shift were picked for
        being far out; only figures that were not can say the new level holds)."""
        return max(1, self.recent + 1 - self.origin[r][3])

    def _common(self, logs: list[float]) -> float:
        """What this update's load did to every rank (log): the median, over the ranks
        whose regime is read, of how far each sits from its regime. Not the median of the
        ranks' costs: between ranks of unequal cost that jumps with any one rank's spike (on
        4 ranks, the middle two change), and every other rank would seem to move."""
        steady = [
            v - statistics.median(self.regimes[r])
            for r, v in enumerate(logs)
            if self.n(r) >= MIN_SPREAD_N and r not in self.skip and self.confirmed(r)
        ]
        return statistics.median(steady) if len(steady) >= 2 else statistics.median(logs)

    def line(self, r: int) -> float:
        """How far (log) from its regime's median a figure of rank r is far out."""
        return max(self.min_shift, Z_LINE * self.sigma(r))

    def fast(self) -> int:
        """The fewest figures in a row (2 or 3) from which this machine's record makes a
        shift safe to read, or 0 (use the slow reading). The rate of far-out figures is
        taken at its 95% upper bound (Poisson, Wilson-Hilferty): a short record that
        happens to hold few of them does not pass for a quiet machine."""
        n = self.far + 1
        upper = n * (1 - 1 / (9 * n) + Z_RATE / (3 * math.sqrt(n))) ** 3
        rate = upper / max(self.read, 1)
        return next((k for k in (2, 3) if self.world * rate**k <= FAST_ALPHA), 0)

    def _record(self, r: int, x: float) -> None:
        q = self.regimes[r]
        if len(q) < MIN_SPREAD_N:
            return
        flags = self.flags[r]
        flags.append(abs(x - statistics.median(q)) > self.line(r))
        if len(flags) > self.recent:
            self.read += 1
            self.far += flags.popleft()

    def confirmed(self, r: int) -> bool:
        """Whether rank r's regime can be acted on: a slow reading's shift once figures
        that did not show it (`_confirm` of them) sit nearer the new level than the old. A
        fast reading's figures are evidence enough (each far out, which this machine's
        record says is rare: see `fast`)."""
        seen = self._after(r)
        # (and the newest of them: what is acted on is where the rank is now)
        return seen is None or (seen[1] and seen[2] and len(seen[0]) >= self._confirm(r))

    def quick(self, r: int) -> bool:
        """Whether rank r's regime began with a fast reading (two or three figures)."""
        return self.shifted[r] == "fast"

    def restart(self, ranks: Sequence[int]) -> None:
        """These ranks' batch changed: their cost per sample may differ at the new batch (a
        fixed part), and their first update there recompiles; start their regimes over."""
        for r in ranks:
            self.regimes[r].clear()
            self.flags[r].clear()
            self.shifted[r], self.origin[r] = "", None
            self.skip.add(r)

    def clear(self) -> None:
        self.restart(range(self.world))
        self.skip.clear()

    def n(self, r: int) -> int:
        return len(self.regimes[r])

    def sigma(self, r: int) -> float:
        """The log-scatter of one figure of rank r: its own once it has enough, never below
        the ranks' pooled one (four figures' MAD is itself noise)."""
        own = [_spread(list(q)) for q in self.regimes if len(q) >= MIN_SPREAD_N]
        pooled = statistics.median(own) if own else SIGMA_PRIOR
        mine = _spread(list(self.regimes[r])) if self.n(r) >= MIN_SPREAD_N else pooled
        return max(mine, pooled, SIGMA_FLOOR)

    def estimate(self, r: int) -> Estimate | None:
        """Rank r's relative cost per sample in its regime, or None without figures."""
        q = list(self.regimes[r])
        if not q:
            return None
        sigma = self.sigma(r)
        # the median's standard error: sqrt(pi/2) times the mean's
        return Estimate(
            math.exp(statistics.median(q)), 1.2533 * sigma / math.sqrt(len(q)), len(q), sigma
        )

    def _shifted(self, r: int) -> tuple[int, str]:
        """How many of rank r's newest figures show that its cost moved, and how that was
        read ("fast" or "slow"); (0, "") if it did not move."""
        q = list(self.regimes[r])
        fast, line = self.fast(), self.line(r)
        if fast and len(q) >= fast + MIN_REF:
            # every one of the newest `fast` figures far out, on the same side
            mid = statistics.median(q[:-fast])
            new = [x - mid for x in q[-fast:]]
            if all(x > line for x in new) or all(x < -line for x in new):
                return fast, "fast"
        for k in range(self.recent, 2 * self.recent + 1, 2):
            if len(q) < k + MIN_REF:
                break
            ref, new = q[:-k], q[-k:]
            mid = statistics.median(ref)
            shift = statistics.median(new) - mid
            se = 1.2533 * self.sigma(r) * math.sqrt(1 / len(new) + 1 / len(ref))
            if abs(shift) < max(self.min_shift, self.z * se):
                continue
            if fast and (q[-1] - mid) * shift > line * abs(shift):
                return 0, ""  # a shift this large is the fast reading's, an update or two on
            same_side = sum((x > mid) == (shift > 0) for x in new)
            if same_side >= k - 1 - (k - self.recent) // 2:  # a spike or two the other way
                # the new regime: its newest figures past half the shift (not old ones that
                # a median of `k` took in with them)
                kept = 0
                for x in reversed(new):
                    if (x - mid) * shift < shift * shift / 2:
                        break
                    kept += 1
                # (a newest figure back at the old level: it is read again a figure on)
                return (kept, "slow") if kept >= 2 else (0, "")
        return 0, ""


def _spread(q: list[float]) -> float:
    mid = statistics.median(q)
    return 1.4826 * statistics.median(abs(x - mid) for x in q)
