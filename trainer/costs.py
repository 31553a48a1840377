"""Each rank's compute cost per sample, as the autopilot reads it from a noisy machine.

Three things make the figures of one update a poor guide, each answered here:

- **A busy machine slows every rank at once** (another job, the OS, a shared core): each
  rank's cost is read relative to its peers' at the same update (its log cost per sample
  minus the median of all ranks' at that update), so what all share cancels out. On this
  project's 2-core box that took the scatter from 0.55 to 0.2-0.3 (log units). Of two ranks
  the median is their mean: each shows half of a change of either, and is judged so.
- **Spikes** (a page fault storm, a recompile): medians in log space, and a robust scatter
  (1.4826 MAD) behind every threshold.
- **Costs that change** (a Mac that heats up, a job that starts beside a rank): each rank's
  figures since its cost last moved form its *regime*. When its newest `recent` figures sit
  on one side of the regime's median, further than the noise allows (`z` standard errors,
  and at least `min_shift`), a new regime starts with them: a change is read within
  `recent` updates instead of being averaged with the past (a slow rank's recovery also
  where its newest figures fall below every one of its regime: by rank order, not by a
  scatter that a rank slowed at a small batch widens). A change far beyond the noise
  is read sooner, from as few as `fast` figures in a row that are each out of the regime,
  where the rank's own record says so many outliers in a row are not its spikes (the
  share of its last `RECORD` figures that were out on that side, to the power of the run,
  under `FAST_ALPHA`; on the slow side shrunk toward all ranks' records, `POOL_N`). A
  regime started by a shift is *confirmed* by the figures that come after the ones that
  showed it (most past halfway to the new level; as many as make the whole run as unlikely
  for its spikes as `CONFIRM_ALPHA`, or, each figure's chance read by how far out it is, as
  `SIZE_ALPHA`: a 3x slowdown is none of a box's 1.5x spikes; `CONFIRM_MEDIAN` after a
  shift read from the median; a rank faster than it has been, alone, once its regime is
  `SPELL` figures long: this box's fast spells come in runs, not one figure at a time), or
  *undone* by two back at the old level: those were spikes, and the old regime goes on
  with them. Until then a decision reads the rank at its cost before (`standing`), and the
  autopilot waits for it or leaves its batch alone (or, in a move due anyway, takes it at
  its new cost where its figures are unlikely spikes: `spike_chance`).
  The scatter a shift is judged by is one its own figures did not widen: its regime's
  without them, and for a young regime (a restart at a new batch, a shift) the scatter its
  rank's last long regime showed until it has `MIN_SPREAD_N` figures besides those judged.
  The level it is judged against leaves out the figures that showed the shift its regime
  began with: they were picked for being far out.

A rank's compute is read as its cost x (fixed + batch), `fixed` being the part that does not
grow with its batch (trainer/fixed_part.py reads it; 0 until it has; a rank is read at
most at its batch where the figures allow: `floor`, `fixed_part.capped`); each update's figures
are kept as measured, so that a new reading re-reads every regime. An estimate carries its
standard error, so that the autopilot acts only on differences the noise cannot explain. Pure
Python (no mlx).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from trainer.fixed_part import capped
from trainer.scatter import MEDIAN_SE, SIGMA_FLOOR, spread

SIGMA_PRIOR = 0.3  # log-scatter assumed until there are figures enough to measure it
MIN_SPREAD_N = 5  # figures a rank needs before its own scatter is trusted
CARRIED_N = 10  # ...and a regime, for its scatter to outlive it (a MAD of 5 is often off 2x)
Z_OUT = 2.5  # one figure this many scatters (and min_shift) off its regime's median is out
# Outliers in a row read as a shift when the rank's own share of such outliers, to the power
# of the run, is under this: about 1 rank-update in 300 of a steady rank starts a shift that
# its next figures then have to confirm.
FAST_ALPHA = 0.003
RECORD = 200  # figures of a rank's record of outliers (all its regimes)
# A rank's share of slow outliers is its own record's shrunk toward all ranks' (with the
# weight of POOL_N figures) once it holds POOL_FROM figures. Alone, its +1 (one more outlier
# assumed) is 1/47 at update 50, and a 3x slowdown then needs 4 figures to be confirmed; read
# against all four ranks' records (about 1/180), 3. Fast outliers keep a rank's own record:
# a rank that got faster holds nobody up, and this box's fast spells (a rank with a core to
# itself) are its own. Pooled from the first figures, a rank's own spikes were diluted and
# 6-figure regimes started shifts (session 16's moving16 repeat 1 lost its first move).
POOL_N = 50
POOL_FROM = 20
# ...and is confirmed when that share, to the power of its run and the figures after it that
# agree, is under this (a steady rank's spikes: about one regime in 10^6 rank-updates; at
# 10^-5 a noisy machine's spikes, tests/support/pilot_sim.Noise, moved samples between equal
# ranks in 2 of 24 simulated runs of 500 updates).
CONFIRM_ALPHA = 1e-6
# ...or, each figure's chance read from the share of figures at least as far out, under
# this: a far tail read from a few hundred figures is often read low (tests/support/
# pilot_sim.Noise's spikes, 2-6x in one figure of 20: equal ranks changed split in 8 of 200
# runs of 500 updates at CONFIRM_ALPHA, 6 at this, 5 without the size read; session 27's run
# B transient16 r0 had its 3x slowdown confirmed by 1 figure after the 2 that showed it at
# CONFIRM_ALPHA, 2 at this, 3 without).
SIZE_ALPHA = 1e-7
# Figures after a shift read from the median that must agree with it (at 2, the noisy
# machine's equal ranks changed split in 1 of 24 such runs).
CONFIRM_MEDIAN = 3
# A rank that gets faster than it has been (a new best: from the lowest level it held for
# CARRIED_N figures or more), where no other rank turned slower than it has been within
# `recent` updates of it, is confirmed only once its new regime holds this many figures. On
# this box one rank of four now and then has a core to itself and runs twice as fast for
# 4-10 updates: its fast figures in a row (outliers as its record counts them, 1 in 9 to 20,
# each taken as independent) confirmed it 3-9 updates in, and the 3 samples it was given
# came back 6-13 updates later (8 of 33 real runs of 500 updates on equal ranks, sessions
# 12-24; spells of 8 figures or more: 3).
# A rank back at a level it held (a slowdown that ends), or faster as another turns slower
# (a load that moved between machines: moving16), is confirmed as any shift.
SPELL = 12


@dataclass
class Shift:
    """How a rank's regime began: with figures far out of the one before (a shift)."""

    before: list[int]  # the old regime's updates, until the shift is confirmed or undone
    picked: tuple[int, ...]  # the updates of the figures that showed it (the regime's first)
    needed: int  # figures after them that must agree to confirm it
    confirmed: bool = False
    new_best: bool = False  # faster than any level the rank held long (SPELL)

    @property
    def shown(self) -> int:
        """How many figures showed it."""
        return len(self.picked)


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
        fast: int = 2,
    ) -> None:
        self.world, self.window, self.recent = world, max(window, recent + 2), recent
        # Of two ranks the median is their mean: a rank whose cost moves by d shows d/2 in
        # its relative figures (and its peer -d/2), and their jitter 1/sqrt(2) of one rank's.
        # Judged at full size, a pair's 1.5x slowdown (0.2 each) stayed under `min_shift` and
        # crept in through the regime's median, 12-15 updates late (session 35's pairs).
        self.shown_share = 0.5 if world == 2 else 1.0
        self.z, self.min_shift = z, min_shift * self.shown_share
        self.fast = min(fast, recent)
        self.sigma_floor = SIGMA_FLOOR * math.sqrt(self.shown_share)
        self.sigma_prior = SIGMA_PRIOR * math.sqrt(self.shown_share)
        # ...and their levels' errors are one error, not two independent ones as a comparison
        # (the hypot of two standard errors) takes them: the difference of two mirrored levels
        # is off twice as far as each, so each one's standard error is given sqrt(2) times its
        # own (equal pairs on the simulator's noisy machine, tests/support/pilot_sim.Noise,
        # changed split 173 times in 24 runs of 500 updates; 60 with it).
        self.se_scale = 1 / math.sqrt(self.shown_share)
        # Each regime holds update numbers; an update's figures are kept raw, so that a new
        # reading of the fixed part (`fixed`) re-reads every cost from what was measured.
        self.regimes: list[deque[int]] = [deque(maxlen=self.window) for _ in range(world)]
        self.figures: dict[int, tuple[Sequence[int], Sequence[float]]] = {}
        self.values: dict[int, list[float]] = {}  # relative log cost per sample, at `fixed`
        self.updates = 0
        self._fixed = 0.0
        self._floor = math.inf
        self.shift: list[Shift | None] = [None] * world  # None: a regime begun otherwise
        self.undone: list[int] = []  # the ranks whose young shift the last `add` undid
        # Each rank's record: update -> how far a figure out of its regime was (log units,
        # + above, - below), else 0; the figures of a confirmed shift are not spikes: 0
        self.record: list[dict[int, float]] = [{} for _ in range(world)]
        # ...and its outliers on each side, how far out, in order (`_outs`): a share is read
        # over all ranks' records several times a boundary, a record changes once an update
        self._sorted: dict[tuple[int, int], list[float]] = {}
        self.skip: set[int] = set()  # ranks whose next figure is not read (a recompile)
        # Each rank's scatter in its last regime of CARRIED_N figures or more: a rank's
        # noise does not start over with its batch or its speed, and a young regime's own
        # few figures cannot tell it (see `sigma`).
        self.carried: list[float | None] = [None] * world
        # Each rank's lowest level (median relative log cost) in a regime of CARRIED_N figures
        # or more, as read when it ended: a faster one is a new best (SPELL).
        self.best: list[float | None] = [None] * world
        # Where each rank's last confirmed shift to slower than any level it held long began
        # (an update number; None: none yet)
        self.slowed_at: list[int | None] = [None] * world
        # Each rank's regime's scatter, with the regime it was read from (`_spread_of`): the
        # pilot asks for it dozens of times a boundary (`sigma`), a regime changes once an update
        self._spreads: dict[int, tuple[tuple[int, ...], float | None]] = {}

    @property
    def fixed(self) -> float:
        """A rank's compute that does not grow with its batch, in samples of its own cost:
        a rank at batch b costs (fixed + b) of them (trainer/fixed_part.py reads it)."""
        return self._fixed

    @fixed.setter
    def fixed(self, samples: float) -> None:
        if samples != self._fixed:
            self._fixed = samples
            self._reread()

    @property
    def floor(self) -> float:
        """The least fixed part the figures allow: a rank is read at `fixed`, at most at its
        batch unless this is as much (trainer/fixed_part.py, `capped`). Infinite (the
        default): at `fixed`, as told."""
        return self._floor

    @floor.setter
    def floor(self, samples: float) -> None:
        if samples != self._floor:
            self._floor = samples
            self._reread()

    def _reread(self) -> None:
        """Read every kept update's figures again, at the fixed part as it now stands."""
        self.values = {u: self._value(*self.figures[u]) for u in self.figures}
        self._spreads.clear()

    def part(self, batch: int) -> float:
        """The fixed part a figure at `batch` is read at."""
        return capped(self._fixed, batch, self._floor)

    def add(self, batches: Sequence[int], compute_s: Sequence[float]) -> list[int]:
        """One update's figures; returns the ranks whose cost just moved (a new regime), and
        keeps in `undone` those whose young shift they undid."""
        self.undone = []
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
            self._tally(r)
            if not self.confirmed(r):
                self._confirm(r)
            k, needed = self._new_shift(r)
            if k:
                old = list(self.regimes[r])
                self._carry(r, old[:-k])
                best = self._new_best(r, old[:-k], old[-k:])
                self.regimes[r].clear()
                self.regimes[r].extend(old[-k:])
                self.shift[r] = Shift(old[:-k], tuple(old[-k:]), needed, new_best=best)
                moved.append(r)
        # a new best is read at once where another rank's slowdown was confirmed by this
        # update's figures (the loop above confirms ranks in rank order)
        for r in range(self.world):
            shift = self.shift[r]
            if shift is not None and shift.new_best and not shift.confirmed and shift.before:
                self._confirm(r)
        self._forget()
        return moved

    def _bar(self, r: int, but: int = 0) -> float:
        """How far off its regime's median one figure of rank r must be to be out (`but`:
        its newest figures being judged, see `sigma`)."""
        return max(self.min_shift, Z_OUT * self.sigma(r, but))

    def _tally(self, r: int) -> None:
        """Add rank r's newest figure to its record of outliers."""
        q = self._regime(r)
        if len(q) < 4:  # too few to say what is out
            return
        off, bar = q[-1] - statistics.median(q[:-1]), self._bar(r)
        record = self.record[r]
        record[self.regimes[r][-1]] = off if abs(off) > bar else 0.0
        if len(record) > RECORD:
            del record[min(record)]
        self._forget_outs(r)

    def _share(self, r: int, side: int, but: int = 0, size: float = 0.0) -> float:
        """The share of rank r's figures out of their regime on `side` (+1 above, -1
        below), at least `size` out, with one more assumed, leaving out its newest `but`
        figures (the run being judged): what its record says of a figure's chance to be out
        (that far); for a slow side, shrunk toward all ranks' records (`POOL_N`)."""
        record = self.record[r]
        left = [
            record[u] for u in list(self.regimes[r])[len(self.regimes[r]) - but :] if u in record
        ]
        held = len(record) - len(left)
        out = self._outs(r, side, size) - sum(side * off > 0 and side * off >= size for off in left)
        if side < 0 or held < POOL_FROM:
            return (out + 1) / (held + 2)
        others = [q for q in range(self.world) if q != r]
        every = held + sum(len(self.record[q]) for q in others)
        pooled = (out + sum(self._outs(q, side, size) for q in others) + 1) / (every + 2)
        shrunk = (out + POOL_N * pooled) / (held + POOL_N)
        # Far out, a rank's own figures hold few or none: shrunk toward them, the share would
        # read low (the simulator's 2-6x spikes then moved samples between equal ranks).
        return max(shrunk, pooled) if size else shrunk

    def _outs(self, r: int, side: int, size: float) -> int:
        """How many figures of rank r's record are out on `side`, at least `size` out."""
        key = (r, side)
        if key not in self._sorted:
            self._sorted[key] = sorted(
                side * off for off in self.record[r].values() if side * off > 0
            )
        far = self._sorted[key]
        return len(far) - bisect.bisect_left(far, size)

    def _forget_outs(self, r: int) -> None:
        """Rank r's record changed: its outliers are counted again when next asked."""
        self._sorted.pop((r, 1), None)
        self._sorted.pop((r, -1), None)

    def _confirm(self, r: int) -> None:
        """Confirm rank r's young shift, undo it, or leave it pending (module docstring)."""
        shift = self.shift[r]
        side, after, agree = self._after(r)
        if _confirms(after, agree, self._needed(r)):
            shift.confirmed, shift.before = True, []
            best = self.best[r]
            # a rank that held no level long is settling (as `_new_best` reads it): its
            # first figures after a restart read cheap, and then its own level, slower
            if side > 0 and best is not None and self._level(r) > best + self.min_shift:
                self.slowed_at[r] = self.regimes[r][0]  # slower than it has been long
            for u in self.regimes[r]:  # the new level's figures were no spikes
                if u in self.record[r]:
                    self.record[r][u] = 0.0
            self._forget_outs(r)
        elif after - agree >= 2:  # spikes: the old regime goes on, with them
            now = list(self.regimes[r])
            self.regimes[r].clear()
            self.regimes[r].extend(shift.before + now)
            self.shift[r] = None
            self.undone.append(r)

    def _after(self, r: int) -> tuple[int, int, int]:
        """Rank r's young shift: its side (+1 slower, -1 faster), the figures after those
        that showed it, and how many of them agree (past halfway from the old level)."""
        shift = self.shift[r]
        q = self._regime(r)
        mid = statistics.median(self.values[u][r] for u in shift.before)
        shown = statistics.median(q[: shift.shown])
        half, side = (mid + shown) / 2, (1 if shown > mid else -1)
        after = q[shift.shown :]
        return side, len(after), sum(side * (x - half) > 0 for x in after)

    def _young(self, r: int) -> Shift | None:
        """Rank r's shift while it awaits confirmation against the regime before it."""
        shift = self.shift[r]
        return shift if shift is not None and not shift.confirmed and shift.before else None

    def nearly(self, r: int, alpha: float) -> bool:
        """Whether one more figure that agrees would confirm rank r's young shift, or take
        its chance to be spikes (`spike_chance`) to at most `alpha`."""
        if self._young(r) is None:
            return False
        return self.confirmed_by_next(r) or self.spike_chance(r, 1) <= alpha

    def confirmed_by_next(self, r: int) -> bool:
        """Whether one more figure that agrees would confirm rank r's young shift."""
        if self._young(r) is None:
            return False
        _, after, agree = self._after(r)
        return _confirms(after + 1, agree + 1, self._needed(r))

    def _needed(self, r: int) -> int:
        """The figures after those that showed rank r's young shift that must agree to
        confirm it: for a new best alone, as many as make its regime SPELL figures long."""
        shift, began = self.shift[r], self.regimes[r][0]
        alone = not any(
            at is not None and abs(at - began) <= self.recent
            for q, at in enumerate(self.slowed_at)
            if q != r
        )
        return max(shift.needed, SPELL - shift.shown) if shift.new_best and alone else shift.needed

    def spike_chance(self, r: int, ahead: int = 0) -> float:
        """The chance, by rank r's record, that its young shift is spikes: that the figures
        which showed it and every one since (all agreeing), and `ahead` more that agree,
        were outliers of the old level on that side. 1.0 without a young shift, or once a
        figure since has disagreed."""
        shift = self._young(r)
        if shift is None:
            return 1.0
        side, after, agree = self._after(r)
        if agree < after:
            return 1.0
        return self._share(r, side, but=len(self.regimes[r])) ** (shift.shown + after + ahead)

    def _value(self, batches: Sequence[int], compute_s: Sequence[float]) -> list[float]:
        """Each rank's log cost per sample minus the median rank's: what all share cancels."""
        logs = [math.log(c / (b + self.part(b))) for b, c in zip(batches, compute_s, strict=True)]
        common = statistics.median(logs)
        return [v - common for v in logs]

    def _forget(self) -> None:
        """Drop the figures no regime holds any more."""
        held = {u for q in self.regimes for u in q}
        held |= {u for shift in self.shift if shift is not None for u in shift.before}
        for u in [u for u in self.figures if u not in held and u < self.updates - 1]:
            del self.figures[u], self.values[u]

    def _level(self, r: int) -> float:
        """Rank r's level: its regime's median relative log cost."""
        return statistics.median(self._regime(r))

    def _regime(self, r: int) -> list[float]:
        return [self.values[u][r] for u in self.regimes[r]]

    def confirmed(self, r: int) -> bool:
        """Whether rank r's regime can be acted on: the figures that showed a shift were
        picked for being far out, so a regime they started waits for those after them."""
        shift = self.shift[r]
        return shift is None or shift.confirmed

    def shifted(self, r: int) -> bool:
        """Whether rank r's regime began with a shift (confirmed or not)."""
        return self.shift[r] is not None

    def restart(self, ranks: Sequence[int]) -> None:
        """These ranks' batch changed: their cost per sample may differ at the new batch (a
        fixed part), and their first update there recompiles; start their regimes over."""
        for r in ranks:
            self._carry(r, list(self.regimes[r]))
            self.regimes[r].clear()
            self.shift[r] = None
            self.skip.add(r)

    def _carry(self, r: int, regime: list[int]) -> None:
        """Keep the scatter and the level of rank r's regime that ends (if it had figures
        enough)."""
        if len(regime) >= CARRIED_N:
            q = [self.values[u][r] for u in regime]
            self.carried[r] = spread(q)
            level, best = statistics.median(q), self.best[r]
            self.best[r] = level if best is None else min(best, level)

    def _new_best(self, r: int, before: list[int], shown: list[int]) -> bool:
        """Whether the figures `shown` (updates) put rank r faster than it has been: the
        regime `before` them was at the lowest level it held long (within `min_shift`; that
        regime carried already), and they are faster. A rank that is slower than a level it
        held before is recovering (read at other batches, the levels differ by the fixed
        part's misreading, 0.7x at 1 sample against 5 in session 22's transient16); one that
        held no level long yet is settling (its first figures are a compile's)."""
        level = statistics.median(self.values[u][r] for u in shown)
        was, best = statistics.median(self.values[u][r] for u in before), self.best[r]
        return best is not None and level < was <= best + self.min_shift

    def standing(self, r: int) -> Estimate | None:
        """Rank r's cost as a decision may take it: its regime's, or while a young shift
        awaits confirmation, the regime's before it (the shift may yet be undone)."""
        shift = self.shift[r]
        if shift is None or shift.confirmed or not shift.before:
            return self.estimate(r)
        return self._estimate(r, [self.values[u][r] for u in shift.before])

    def n(self, r: int) -> int:
        return len(self.regimes[r])

    def sigma(self, r: int, but: int = 0) -> float:
        """The log-scatter of one figure of rank r, never below the ranks' pooled one (four
        figures' MAD is itself noise): its regime's own, read without its newest `but` (those
        being judged), once it has MIN_SPREAD_N figures besides them, else its last regime's.
        A run of figures at a new level widens the scatter about the regime's median with
        every figure, and would hide the shift it shows (session 16's recoveries). A regime
        that began at a restart can be half at a new level within 5 figures: its own MAD is
        then about the shift, and would hide it."""
        spreads = {q: self._spread_of(q) for q in range(self.world)}
        if but:  # the figures being judged would widen the scatter that judges them
            spreads[r] = _trusted_spread(self._regime(r)[:-but])
        own = {q: x for q, x in spreads.items() if x is not None}
        pooled = statistics.median(own.values()) if own else self.sigma_prior
        mine = own.get(r, self.carried[r])
        return max(pooled if mine is None else mine, pooled, self.sigma_floor)

    def _spread_of(self, r: int) -> float | None:
        """Rank r's regime's scatter (None under MIN_SPREAD_N figures), read again only when
        its regime or the reading of the figures (`fixed`) changed."""
        key = tuple(self.regimes[r])
        kept = self._spreads.get(r)
        if kept is None or kept[0] != key:
            kept = self._spreads[r] = (key, _trusted_spread(self._regime(r)))
        return kept[1]

    def estimate(self, r: int) -> Estimate | None:
        """Rank r's relative cost per sample in its regime, or None without figures."""
        q = self._regime(r)
        return self._estimate(r, q) if q else None

    def _estimate(self, r: int, q: list[float]) -> Estimate:
        sigma = self.sigma(r)
        # the median's standard error: sqrt(pi/2) times the mean's
        se = self.se_scale * MEDIAN_SE * sigma / math.sqrt(len(q))
        return Estimate(math.exp(statistics.median(q)), se, len(q), sigma)

    def _new_shift(self, r: int) -> tuple[int, int]:
        """How many of rank r's newest figures show its cost moved (0: none did), and how
        many after them must agree to confirm it."""
        q = self._regime(r)
        if not self.confirmed(r):
            return 0, 0  # a young shift is confirmed or undone first
        # The figures that showed the shift a regime began with were picked for being far
        # out: no level to judge the next shift by (session 25's transient16 repeat 2: rank 1
        # back at 1 sample read 0.54x and 0.45x, then 1.0x; its next figures, at 1.0x, read as
        # a slowdown against those two, and its recovery waited 8 updates more).
        shift = self.shift[r]
        picked = set(shift.picked) if shift is not None else set()
        judged = [u not in picked for u in self.regimes[r]]

        def reference(newest: int) -> list[float]:  # the regime but its newest, unpicked
            return [x for x, j in zip(q[:-newest], judged[:-newest], strict=True) if j]

        for k in range(self.fast, self.recent):  # a run of outliers, each out on one side
            ref = reference(k)
            if len(ref) < 3:
                break
            mid, bar = statistics.median(ref), self._bar(r, but=k)
            for side in (1, -1):
                share, least = self._share(r, side, but=k), min(side * (x - mid) for x in q[-k:])
                if least > bar and share**k <= FAST_ALPHA:
                    return k, self._confirming(r, side, k, least, share)
        # A slow rank's recovery, read by rank order where its scatter hides it: `k` figures
        # below every figure of its regime before them (by chance, where nothing changed,
        # 1 in C(n + k, k)) and their median `min_shift` down. A rank slowed at a small batch
        # can scatter widely (session 32's run F, transient16: 3x at 1 sample, 0.040-0.118 s,
        # a log scatter of 0.45); back at 0.021-0.035 s, it was inside the bar above and read
        # only as its regime's median crossed, 9 updates on. Only for a rank slower than its
        # peers (its level over `min_shift`): one at their speed that runs fast for a while
        # is a fast spell (SPELL), which this would read within a few figures.
        for k in range(self.fast + 1, self.recent + 1):
            ref, new = reference(k), q[-k:]
            if math.comb(len(ref) + k, k) * FAST_ALPHA < 1:
                continue
            level = statistics.median(ref)
            below = max(new) < min(ref) and level - statistics.median(new) > self.min_shift
            if level > self.min_shift and below:
                return k, CONFIRM_MEDIAN
        ref, new = reference(self.recent), q[-self.recent :]
        if len(ref) < 3:
            return 0, 0
        mid = statistics.median(ref)
        delta = statistics.median(new) - mid
        sigma = self.sigma(r, but=self.recent)
        se = MEDIAN_SE * sigma * math.sqrt(1 / len(new) + 1 / len(ref))
        if abs(delta) < max(self.min_shift, self.z * se):
            return 0, 0
        if sum((x > mid) == (delta > 0) for x in new) < len(new) - 1:
            return 0, 0  # one may be a spike the other way, no more
        # the regime starts with the newest figures past halfway (older ones are the old
        # level's, picked up by the median)
        side, half = (1 if delta > 0 else -1), mid + delta / 2
        k = 0
        while k < len(new) and side * (new[-1 - k] - half) > 0:
            k += 1
        return (k, CONFIRM_MEDIAN) if k >= 2 else (0, 0)

    def _confirming(self, r: int, side: int, k: int, size: float, share: float) -> int:
        """The figures after a run of `k` outliers at least `size` out on `side` that must
        agree (past halfway) to make the whole run as unlikely for rank r's spikes as
        CONFIRM_ALPHA, each read as any outlier (`share`: the share of its figures out on that
        side); or fewer, where the run is further out than its spikes go (a 3x slowdown on a
        box whose slow spikes reach 1.5x is none of them) and, each figure read by how far out
        it is, it is as unlikely as SIZE_ALPHA."""
        plain = math.ceil(math.log(CONFIRM_ALPHA) / math.log(share)) - k
        run, each = self._share(r, side, k, size), self._share(r, side, k, size / 2)
        sized = math.ceil((math.log(SIZE_ALPHA) - k * math.log(run)) / math.log(each))
        return max(1, min(plain, sized))


def _trusted_spread(q: list[float]) -> float | None:
    """The scatter of figures `q`, or None under MIN_SPREAD_N of them."""
    return spread(q) if len(q) >= MIN_SPREAD_N else None


def _confirms(after: int, agree: int, needed: int) -> bool:
    """Whether a young shift's figures since those that showed it confirm it: most of them,
    and at least `needed`, past halfway from the old level to the new."""
    return 2 * agree > after and agree >= needed
