"""The autopilot: rank 0's hand on the batch split while nobody watches.

It sees, at every boundary, each rank's compute time, peak memory and swap of the last
update (they ride the control all-reduce, trainer/controller.py). Two duties:

- **Rebalance** to the split the balancer (telemetry/balance.py) predicts fastest from each
  rank's cost per sample (trainer/costs.py: relative to its peers, in regimes, with a
  standard error) and the fixed part of every rank's compute (trainer/fixed_part.py: read
  from the split's own changes; it steers by their best fit, a rank at most at its batch
  where the figures allow: a fit read between big batches does not say what a rank measured
  at one sample does at ten). Of the splits that fast, it takes the nearest to the current
  one (fewest samples moved; a rank that gives keeps what fits at the high end of its cost,
  where the others can take the rest: the update waits for its slowest rank, and a cost read
  from few figures after it moved may move on, as a gradual slowdown's does), and moves only
  when every sample goes from a rank clearly slower than where it lands (under that fixed
  part and the most the figures allow), the gain is at least `min_gain` and beyond what the
  noise explains, and the same split was proposed at two boundaries in a row (at one, where
  a rank's confirmed new cost is the reason: its own figures held it already). A move that
  would undo the last one within `cooldown` goes halfway (the costs read at the two splits
  disagree: a cost per sample read at one batch need not hold at another); one back past
  it, a mirror of a change that made the update slower, goes to that split (`mirrors`). Within
  `cooldown` updates of a change it moves only for `CALM_GAIN`, unless a rank's cost moved
  since (a new regime, not one undone as spikes): a change far beyond the noise is then
  followed 4-5 updates after it began (2 figures show it, as many confirm it; the next update
  runs the new split), one nearer the noise within about `Costs.recent` + 4. A rank whose new
  speed awaits confirmation holds up a move only if it may be slower (it could make the move
  moot); one that may be faster keeps its batch and the others move without it, unless the
  move answers another rank's confirmed new speed, its own figures are unlikely spikes, and
  the move beats staying even if they were: then it is taken at its new speed, though at no
  faster than the fastest confirmed rank (a rank at 1 sample can read far faster than it is,
  and such a bet gives it more than a peer's share). The global batch never changes, so
  neither does the math.
- **Guard memory**: a rank whose swap grows, whose OS reports pressure, or whose peak nears
  its --memory-limit-gb gives samples to the others; when no split fits, it warns and (with
  --on-memory-pressure pause) checkpoints and pauses the run.

It decides; the controller submits what it decided to rank 0's own command queue and, while
the pilot steers, applies it at the same boundary (a second tiny all-reduce) unless an
operator's command took that boundary: then at the next, like an operator's `rebalance`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from telemetry import balance
from telemetry.units import GiB, MiB
from trainer.costs import Costs, Estimate
from trainer.fixed_part import FixedPart, capped
from trainer.scatter import MEDIAN_SE, SIGMA_FLOOR, spread

SWAP_GROWTH = 256 * MiB  # swap grown by this much over a window: the rank is swapping
PRESSURE = 0.6  # macOS memory pressure (0..1) from which a rank counts as pressed
MIN_FIGURES = 4  # figures of a rank's regime before its cost is acted on
HOLD = 2  # boundaries in a row that must propose the same split
SETTLED = 8  # figures from which a rank's cost counts as well read
Z_YOUNG = 2.0  # standard errors a move must clear while a rank's cost is read from fewer
Z_AGREE = 3.0  # two ranks' costs closer than this many standard errors agree within the noise
Z_GAIN = 1.0  # standard errors the predicted gain itself must clear
Z_ROOM = 3.0  # standard errors over its cost at which a giving rank is left what fits
POOL_MAX = math.log(1.3)  # ranks further apart than 30% are never pooled, however noisy
TIE = 0.02  # splits predicted within this fraction of the fastest count as fast as it
# The least gain of a move within `cooldown` updates of a change that no rank's new cost calls
# for. At 6% (twice a `min_gain` of 3%), session 27's real runs moved twice between ranks
# equal by the schedule (moving16) and gave a 3x rank, read 1.9x at 1 sample (its sleep
# frees a core), a sample back (gradual16); at 10% none of the three.
CALM_GAIN = 0.10
# A move made for a rank's confirmed new speed takes a rank whose new speed awaits
# confirmation at that speed when its figures are spikes with a chance under this (on this
# box, whose fast spikes are one figure in nine: four fast figures in a row, none since back)
BET_ALPHA = 3e-4
MEASURED_MIN = 3  # updates at a split from which what it measured is read
# Standard errors by which a change must have made the update slower to be undone whole, not
# halfway: session 36's run L r0 read 103 ms at 7,9 and 111 at 9,7, 1.4 standard errors
# apart, then 121 at 7,9 again; session 25's run C gradual16 r1 (rank 3 2x) read 4,4,4,4 2.8
# standard errors slower than the 5,5,4,2 it left.
Z_SLOWER = 2.0
# A move back past the split a mistaken change left is a mirror of it (cut to that split) where
# no rank goes beyond it by more than this many times what it came. Over the kept runs of
# sessions 26-42: mirrors went 1-4 samples beyond after changes of 1-4 (equal pairs 9,7 -> 7,9
# after 8,8 -> 9,7; 10,6 -> 4,12 after 8,8 -> 10,6); a move 4-6 beyond after a change of 1
# answered a new speed that the change's restart hid (session 42's boxG transient16 r1, twice;
# session 36's run L transient16 r1).
MIRROR = 2


@dataclass(frozen=True)
class RankFigures:
    """What one rank measured in the last update."""

    local_batch: int
    compute_s: float
    peak: float  # bytes
    swap: float  # bytes of swap in use on its machine
    pressure: float  # 0..1 (0 where the OS does not say)
    limit: float | None  # its --memory-limit-gb in bytes, or None


@dataclass
class Decision:
    """Commands for rank 0's queue, and what to tell the operator."""

    commands: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    events: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # kind, text, data


@dataclass
class Autopilot:
    """See the module docstring; `observe` is called once per update boundary on rank 0."""

    world: int
    enabled: bool = False
    # A move costs its ranks a recompile (about 0.13 of an update's compute more on this box,
    # session 24), so 3% repays it within a few updates; the noise check guards the rest. At
    # 5%, a rank that recovered where a compute has a fixed part of 6 samples (its move back
    # gains 9%, read lower while the fit is young) got its samples back in 17 of 24 simulated
    # runs; at 3%, 24.
    min_gain: float = 0.03
    window: int = 10
    cooldown: int = 20
    headroom: float = 0.15
    # A rank's compute that does not grow with its batch (a microstep's launch and Python
    # overhead), in samples of its own cost: a rank costs (fixed_samples + batch) of them.
    # None: read from the split's changes (trainer/fixed_part.py); a number: told.
    fixed_samples: float | None = None
    pause_on_pressure: bool = False

    def __post_init__(self) -> None:
        # Compute costs per sample, in regimes (trainer/costs.py); the first figure of the
        # run is a compile and is not read.
        self.costs = Costs(self.world, window=max(20, 2 * self.window))
        self.costs.skip = set(range(self.world))
        self.fixed_part = FixedPart(self.world)
        self.fresh: set[int] = set()  # ranks whose cost moved since the last change
        # ...and for each rank whose young shift awaits confirmation, whether it was fresh before
        # that shift began: a shift undone (spikes after all) leaves the rank as it found it
        self.fresh_before: dict[int, bool] = {}
        self.last_split: list[int] | None = None
        # Memory per sample, and swap: the last `window` updates since the last change.
        self.samples: list[deque[balance.RankSample]] = [
            deque(maxlen=self.window) for _ in range(self.world)
        ]
        self.swaps: list[deque[float]] = [deque(maxlen=self.window) for _ in range(self.world)]
        self.since_change = self.cooldown  # no change yet: nothing to cool down from
        self.streak: tuple[list[int], int] | None = None  # (the same proposal, for how long)
        self.pressed_before: set[int] = set()
        self.pending: dict[str, Any] | None = None  # a change awaiting its measured effect
        self.told_fixed = 0.0  # the fixed part the operator last heard of
        # The split the last change left, and the slowest compute of each update there and
        # here (the last `cooldown`, past the two that recompile): what a change measurably did.
        self.left: list[int] | None = None
        self.left_s: deque[float] = deque()
        self.here_s: deque[float] = deque(maxlen=self.cooldown)
        self.at_split = 0  # updates at this split

    def observe(self, split: list[int], figures: list[RankFigures]) -> Decision:
        """Take one boundary's figures; what to do now (usually nothing)."""
        out = Decision()
        if not any(f.compute_s > 0 for f in figures):
            # the boundary before a run's first update (or a resumed run's): nothing measured
            # yet, and the next update is the one that compiles
            return out
        if self.last_split is not None and split != self.last_split:
            # The split changed (ours, or an operator's): the ranks whose batch changed just
            # ran their first update at it (a recompile), and may cost otherwise per sample.
            changed = [r for r in range(self.world) if split[r] != self.last_split[r]]
            self.costs.restart(changed)
            self.left, self.left_s, self.at_split = self.last_split, self.here_s, 0
            self.here_s = deque(maxlen=self.cooldown)
        self.last_split = list(split)
        for r, f in enumerate(figures):
            if f.local_batch > 0 and f.compute_s > 0:
                self.samples[r].append(balance.RankSample(f.local_batch, f.compute_s, int(f.peak)))
            self.swaps[r].append(f.swap)
        compute = [f.compute_s for f in figures]
        self.fixed_part.add(split, compute)
        self.costs.fixed, self.costs.floor = self.fixed()[0], self.floor()
        self._report_fixed(out)
        moved = self.costs.add(split, compute)
        if moved:  # what came before a rank's new cost tells nothing of the fixed part
            self.fixed_part.shifted(max(self.costs.n(r) for r in moved))
        # A shift undone is no news: the regime before it goes on. Kept as news, it lifted the
        # calm after a change, and a move predicted 3% faster went 10,6 -> 9,7 and back
        # (session 39's pair-gradual16 on the GPU host's CPUs, repeat 0, at 41).
        for r in self.costs.undone:
            if not self.fresh_before.pop(r, True):
                self.fresh.discard(r)
        for r in moved:
            self.fresh_before[r] = r in self.fresh
        self.fresh |= set(moved)
        self.since_change += 1
        slowest = max((f.compute_s for f in figures), default=0.0)
        self.at_split += 1
        if self.at_split > 2:  # the first two updates at a split recompile
            self.here_s.append(slowest)
        self._report_effect(slowest, out)
        if any(len(s) < balance.MIN_UPDATES for s in self.samples):
            return out
        pressed = self._pressed(figures)
        if pressed and not self.enabled:  # watched, not steered: the operator hears of it
            if set(pressed) != self.pressed_before:
                text = "; ".join(f"rank {r}: {why}" for r, why in sorted(pressed.items()))
                out.events.append(("alert", f"memory pressure: {text}", {"ranks": sorted(pressed)}))
            self.pressed_before = set(pressed)
        elif pressed:
            self._relieve(split, pressed, out)
        elif self.enabled:
            self._rebalance(split, out)
        if not pressed:
            self.pressed_before = set()
        return out

    def may_decide(self) -> bool:
        """Whether the next boundary's figures may well bring a move for speed, so that the
        controller makes room to apply it at that boundary (trainer/controller.py): a
        proposal awaits its second look, a rank's new speed is one agreeing figure from
        confirmation, or a rank's confirmed new speed is read from few figures yet (the error
        of its estimate still shrinks fast). Other moves (the memory guard's, one that a long
        regime's error allows at last, or one that comes while a new speed is further from
        confirmation) are applied a boundary later.

        Making room costs a second exchange, tens of ms where ranks outnumber cores
        (benchmarks/control_exchange.py). Replayed on sessions 28-30's 48 real runs with a
        slowdown, announcing also while a young new speed was further from confirmation
        announced 1,153 of 4,608 boundaries (this rule: 423) and, on 12 runs of equal ranks,
        727 of 5,952 (this rule: 9); 5 of the 112 moves made at an announced boundary came
        where this rule does not announce, and are applied a boundary later."""
        if not self.enabled:
            return False
        if self.streak is not None:
            return True
        costs = self.costs
        return any(
            costs.n(r) < SETTLED if costs.confirmed(r) else costs.confirmed_by_next(r)
            for r in self.fresh
        )

    # --- memory -------------------------------------------------------------------------------
    def _pressed(self, figures: list[RankFigures]) -> dict[int, str]:
        why = {}
        for r, f in enumerate(figures):
            grown = (self.swaps[r][-1] - self.swaps[r][0]) if len(self.swaps[r]) > 1 else 0
            if f.limit and f.peak > (1 - self.headroom) * f.limit:
                why[r] = (
                    f"peak {f.peak / GiB:.2f} GiB is over {1 - self.headroom:.0%} of its "
                    f"{f.limit / GiB:.2f} GiB limit"
                )
            elif grown > SWAP_GROWTH:
                why[r] = f"its machine's swap grew {grown / MiB:.0f} MiB in {self.window} updates"
            elif f.pressure >= PRESSURE:
                why[r] = f"its machine reports memory pressure {f.pressure:.0%}"
        return why

    def _relieve(self, split: list[int], pressed: dict[int, str], out: Decision) -> None:
        models, new = self._models(split), list(split)
        for r in pressed:
            give = max(1, math.ceil(new[r] / 4))  # a quarter at a time, at least one sample
            new[r] -= give
            takers = [q for q in range(self.world) if q not in pressed]
            for _ in range(give):
                if not takers or new[r] < 1:
                    break
                q = min(takers, key=lambda q: models[q].time(new[q] + 1))
                new[q] += 1
        fits = sum(new) == sum(split) and min(new) >= 1 and new != split
        text = "; ".join(f"rank {r}: {why}" for r, why in sorted(pressed.items()))
        if not fits:
            if set(pressed) != self.pressed_before:
                data = {"ranks": sorted(pressed), "split": split}
                out.events.append(("alert", f"memory pressure and no split fits: {text}", data))
                if self.pause_on_pressure:
                    out.commands += [("checkpoint", {}), ("pause", {})]
            self.pressed_before = set(pressed)
            return
        self.pressed_before = set(pressed)
        reason = f"autopilot: memory guard ({text})"
        out.commands.append(("rebalance", {"split": new, "reason": reason}))
        out.events.append(("autopilot", f"moving samples off pressed rank(s): {text}", {}))
        self._changed(split, new, 0.0)

    # --- speed --------------------------------------------------------------------------------
    def fixed(self) -> tuple[float, float]:
        """The fixed part in samples that the pilot steers by, and the most the figures
        allow: told, or read from the split's changes (their best fit; 0 before any)."""
        if self.fixed_samples is not None:
            return self.fixed_samples, self.fixed_samples
        read = self.fixed_part.reading()
        return (read.best, read.most) if read else (0.0, 0.0)

    def floor(self) -> float:
        """The least fixed part the figures allow (infinite where told: as told, uncapped)."""
        if self.fixed_samples is not None:
            return math.inf
        read = self.fixed_part.reading()
        return read.least if read else 0.0

    def parts(self, fixed: float, split: list[int]) -> list[float]:
        """Each rank's fixed part, were it `fixed`, as its figures at its batch in `split` are
        read: at most its batch, unless the figures require that much, where read
        (trainer/fixed_part.py, `capped`). A rank keeps it at any batch it is predicted at."""
        least = self.floor()
        return [capped(fixed, b, least) for b in split]

    def _models(self, split: list[int]) -> list[balance.RankModel]:
        """Each rank's model for the balancer: compute of its relative cost per sample
        (trainer/costs.py) x (its fixed part + its batch); memory per sample from the medians
        of its recent updates."""
        models, parts = [], self.parts(self.costs.fixed, split)
        for r, samples in enumerate(self.samples):
            est = self.costs.estimate(r)
            per_mem = statistics.median(s.peak_mem / s.local_batch for s in samples)
            cost = est.cost if est is not None else 1.0
            fixed = cost * parts[r]
            models.append(balance.RankModel(r, fixed, cost, 0, int(per_mem), None, 0, True))
        return models

    def _rebalance(self, split: list[int], out: Decision) -> None:
        new, gain, why_not, betting = self._proposal(split)
        if why_not:
            self.streak = None
            return
        held = self.streak[1] + 1 if self.streak and self.streak[0] == new else 1
        self.streak = (new, held)
        # a rank's confirmed new cost has been held by its own figures already
        news = self._news()
        if held < HOLD and not news:
            return
        moved = "; rank(s) " + ", ".join(map(str, news)) + " changed speed"
        reason = f"autopilot: predicted {gain:.0%} faster" + (moved if news else "")
        if betting:
            ranks = ", ".join(map(str, betting))
            reason += f"; rank(s) {ranks} taken at a new speed not yet confirmed"
        out.commands.append(("rebalance", {"split": new, "reason": reason}))
        self._changed(split, new, gain)

    def _proposal(self, split: list[int]) -> tuple[list[int], float, str, list[int]]:
        """(the split to move to, its predicted gain, "", the pending ranks it takes at their
        new speed) or why not now."""
        fixed, most = (self.parts(f, split) for f in self.fixed())
        # A rank whose new speed awaits confirmation: one that may be slower now may make
        # any move moot (it would be the slowest), so the pilot waits for it; one that may
        # be faster cannot, so it is read at its speed before and keeps its batch in any
        # move made meanwhile (below): the others need not wait for it (on a box whose
        # spikes are fast, two in a row are a young shift that two more figures undo).
        pending = [r for r in range(self.world) if not self.costs.confirmed(r)]
        est = [self.costs.standing(r) for r in range(self.world)]
        # a regime a confirmed shift began is read from its own few figures (their standard
        # error says how well); any other needs MIN_FIGURES
        if any(
            e is None or (e.n < MIN_FIGURES and not self.costs.shifted(r))
            for r, e in enumerate(est)
        ):
            return split, 0.0, "too few figures", []
        if any(self.costs.estimate(r).cost > est[r].cost for r in pending):
            return split, 0.0, "a rank's new speed is not confirmed yet", []
        due = (*self._best(split, est, pending, fixed, most), [])
        # A move due anyway for a rank's confirmed new speed (its recompile is paid) takes a
        # pending rank at its new speed where its figures are unlikely spikes and the move
        # beats staying even if they were: moving16's rank 0, held at batch 1 while slow,
        # recovers as rank 2 slows; held at its batch again, the move went 1,5,5,5 ->
        # 1,7,1,7, and on to 5,5,1,5 seven updates later (session 18, repeat 0).
        if due[2] or not self._news():
            return due
        betting = [r for r in pending if self.costs.spike_chance(r) <= BET_ALPHA]
        if betting:
            # ...taken at no faster than the fastest confirmed rank: a rank back from a
            # slowdown at 1 sample reads faster than it is on this box (run G's moving16 r0:
            # rank 0 read 0.47x its peers, and the bet gave it 9 of 16 samples); a rank with
            # news is confirmed, so there is one
            fastest = min(e.cost for r, e in enumerate(est) if r not in pending)
            bet = list(est)
            for r in betting:
                e = self.costs.estimate(r)
                bet[r] = replace(e, cost=max(e.cost, fastest))
            rest = [r for r in pending if r not in betting]
            new, gain, why = self._best(split, bet, rest, fixed, most)
            if not why and slowest(est, new, fixed) < slowest(est, split, fixed):
                return new, gain, why, betting
        # A rank one agreeing figure from being confirmed, or from the bet, is waited for one
        # boundary: with slow shifts confirmed in 3 figures (trainer/costs.py, POOL_N), the
        # move due for them went 1,5,5,5 -> 2,6,2,6 a figure before rank 0's recovery could
        # be taken, and the rest took 7-20 updates (the simulator's moving16).
        if any(self.costs.nearly(r, BET_ALPHA) for r in pending):
            return split, 0.0, "a rank's new speed may be confirmed at the next figure", []
        return due

    def _best(
        self,
        split: list[int],
        est: list[Estimate],
        pending: list[int],
        fixed: list[float],
        most: list[float],
    ) -> tuple[list[int], float, str]:
        """The nearest split as fast as any, reading each rank at `est` and leaving the
        `pending` ranks their batches, if the move pays beyond the noise; or why not. `fixed`
        and `most`: each rank's fixed part steered by, and the most the figures allow."""
        # Ranks whose costs agree within the noise are one cost to the balancer: a split that
        # favours one of them over another would rest on noise.
        costs = pooled([e.cost for e in est], [e.se for e in est])
        models = self._models(split)
        for m, c, f in zip(models, costs, fixed, strict=True):
            m.per_sample_s, m.fixed_s = c, c * f
        try:
            best = balance.propose(models, sum(split), self.headroom)
            # Pending ranks keep their batches: the fastest the others can make of the rest
            # (the best split overall may want a pending rank to take, which it may not).
            target = held(models, split, pending, self.headroom) if pending else best.predicted_s
        except balance.BalanceError as e:
            return split, 0.0, str(e)
        # a pending rank's cap is its batch, and the target has room for that batch: it
        # neither takes nor gives
        caps = [split[r] if r in pending else cap for r, cap in enumerate(best.caps)]
        # A rank that must give is left what fits at the high end of its cost (Z_ROOM standard
        # errors), where the others can take the rest within the target: the update waits for
        # its slowest rank, so a cost read low costs a straggler, one read high nothing.
        upper = [c * math.exp(Z_ROOM * e.se) for c, e in zip(costs, est, strict=True)]
        new = nearest(split, costs, target * (1 + TIE), caps, fixed, upper)
        if new == split:
            return split, 0.0, "the split is as fast as any"
        before, after = times(costs, fixed, split), times(costs, fixed, new)
        gain = 1 - max(after) / max(before)
        # Within `cooldown` updates of a change (and no rank's cost moved since), only a
        # gain of CALM_GAIN (or twice `min_gain`): small corrections wait, so noise cannot
        # swing the split.
        calm = self.since_change < self.cooldown and not self._news()
        if gain < (max(2 * self.min_gain, CALM_GAIN) if calm else self.min_gain):
            return split, gain, "too little to gain"
        # The gain must be more than the noise of the slowest rank now and of every rank that
        # may end slowest. Ranks pooled as one cost tie there, and one read from a scatter
        # that agrees with anything counts too: gradual16 on this box gave the 1.5x rank, read
        # at 3 samples as 1.05 +- 0.28, its sample back at once, and at 4 it read 1.5x again.
        a = max(range(self.world), key=lambda r: before[r])
        if any(
            c != a and math.log(before[a] / after[c]) < Z_GAIN * math.hypot(est[a].se, est[c].se)
            for c in range(self.world)
        ):
            return split, gain, "a gain within the noise"
        # Each sample must go to a rank that is faster under the fixed part steered by, and
        # under the most the figures allow (a big one makes a move between unequal batches
        # futile). Not under the least: often 0 where the true part is about 1, it reads a
        # rank left 1 sample a third dearer than it is (session 17's moving16 waited 10
        # updates for such a rank).
        for f in (fixed, most) if most != fixed else (fixed,):
            why = unjustified(split, new, est, fixed, f)
            if why:
                return split, gain, why
        # A move back past the split the last change left, about as far as that change moved
        # (a mirror of it, MIRROR), where it measurably made the update slower (a mistake) and
        # no rank's cost has moved since, confirmed or not, goes to that split and no
        # further: the costs read there did not call for a split beyond it (session 41's boxF
        # equal r2 went 8,8 -> 6,10 on a spell of rank 0, then 6,10 -> 10,6 on a fixed part
        # read from changes before it; the ranks were equal). A move further back may answer
        # a new speed that the change's restart of the ranks' regimes hid (session 42's boxG
        # transient16 r1: 9,7 -> 8,8 at 28, rank 1 three times as slow from 30; then 8,8 ->
        # 13,3 was its due); so may one after a change that did not make the update slower
        # (session 36's run L transient16 r1: 12,4 -> 13,3 as rank 1 recovered, then 6,10).
        mistake = self._made_slower()
        if calm and not self.fresh and mistake and self.left and mirrors(split, new, self.left):
            new = list(self.left)
            gain = 1 - max(times(costs, fixed, new)) / max(before)
        # A move back to the split the last one left, within `cooldown` of it and no rank's
        # cost moved since: the costs read at the two splits disagree on which is faster.
        # Costs per sample read at one split need not hold at another (session 35's K r2
        # went 7,9 <-> 9,7 four times, each move predicted 10-20% faster: a rank that had
        # grown to 9 read dearer, whichever it was; glibc's heap, trainer/heap.py, faulting
        # 9,000 pages an update in, held since session 38). The update's time on the way
        # from one split to the other is the slowest of ranks each growing or shrinking with
        # its batch: it falls, then rises, so the fastest lies between. Halfway, where there
        # is a split between. (Unless that change measurably made the update slower: a
        # mistake, undone whole.)
        if calm and new == self.left and not mistake:
            mid = halfway(split, new)
            if mid != split:
                new, gain = mid, 1 - max(times(costs, fixed, mid)) / max(before)
        return new, gain, ""

    def _made_slower(self) -> bool:
        """Whether the last change made the update slower beyond the noise: the median
        slowest compute here over the split it left, by more than Z_SLOWER standard errors
        (from MEASURED_MIN updates at each, at least; their scatter, SIGMA_FLOOR at least)."""
        if min(len(self.left_s), len(self.here_s)) < MEASURED_MIN:
            return False
        (left, se_left), (here, se_here) = level(self.left_s), level(self.here_s)
        return here - left > Z_SLOWER * math.hypot(se_left, se_here)

    def _news(self) -> list[int]:
        """The ranks whose cost moved since the last change, confirmed."""
        return sorted(r for r in self.fresh if self.costs.confirmed(r))

    def _changed(self, old: list[int], new: list[int], gain: float) -> None:
        self.since_change = 0
        self.streak = None
        # a rank whose new speed still awaits confirmation is news yet to answer
        self.fresh = {r for r in self.fresh if not self.costs.confirmed(r)}
        self.fresh_before = dict.fromkeys(self.fresh, False)  # this change answered the rest
        for s in (*self.swaps, *self.samples):
            s.clear()
        self.pending = {
            "from": old,
            "to": new,
            "predicted_gain": gain,
            # the slowest compute here, past the recompiles (None: too few updates here)
            "before_s": statistics.median(self.here_s) if self.here_s else None,
            "after": [],
        }

    def _report_fixed(self, out: Decision) -> None:
        """Tell the operator when the fixed part read from the changes moves (by at least a
        sample, and a quarter of what they last heard)."""
        read = self.fixed_part.reading() if self.fixed_samples is None else None
        if read is None or abs(read.best - self.told_fixed) < max(1.0, self.told_fixed / 4):
            return
        self.told_fixed = read.best
        text = (
            f"a rank's fixed compute (not growing with its batch) reads as "
            f"{read.best:.1f} samples' worth ({read.least:.1f} to {read.most:.1f}; from "
            f"{read.changes} split change(s))"
        )
        data = {"least": read.least, "best": read.best, "most": read.most}
        out.events.append(("autopilot", text, data))

    def _report_effect(self, slowest: float, out: Decision) -> None:
        """`window` updates after a change, say what it measurably did."""
        if self.pending is None or self.since_change <= 2:  # the first updates recompile
            return
        self.pending["after"].append(slowest)
        if len(self.pending["after"]) < self.window:
            return
        p, self.pending = self.pending, None
        after = sorted(p["after"])[len(p["after"]) // 2]
        data = {"from": p["from"], "to": p["to"], "after_s": after, "before_s": p["before_s"]}
        if p["before_s"]:
            change = after / p["before_s"] - 1
            text = (
                f"split {p['from']} -> {p['to']}: slowest compute {p['before_s'] * 1e3:.0f} -> "
                f"{after * 1e3:.0f} ms ({change:+.0%}; predicted {-p['predicted_gain']:+.0%})"
            )
        else:
            text = f"split {p['from']} -> {p['to']}: slowest compute now {after * 1e3:.0f} ms"
        out.events.append(("autopilot", text, data))


def times(costs: list[float], fixed: list[float], split: list[int]) -> list[float]:
    """Each rank's predicted compute at `split`: its cost per sample x (fixed part + batch)."""
    return [c * (f + b) for c, f, b in zip(costs, fixed, split, strict=True)]


def level(times: list[float]) -> tuple[float, float]:
    """The log of the median of `times` and its standard error (their scatter, at least
    SIGMA_FLOOR: the median's is sqrt(pi/2) times the mean's)."""
    q = [math.log(t) for t in times]
    return statistics.median(q), MEDIAN_SE * max(spread(q), SIGMA_FLOOR) / math.sqrt(len(q))


def mirrors(here: list[int], there: list[int], left: list[int]) -> bool:
    """Whether the move from `here` to `there` goes back past `left` (the split the last change
    left) about as far as that change moved: every rank moves toward its batch there, or keeps
    its batch, at least one goes beyond it, and none beyond by more than MIRROR times what it
    came."""
    pairs = list(zip(here, there, left, strict=True))
    # a rank the change left alone (h == lf) may not move: MIRROR times nothing
    back = all(
        (t - h) * (lf - h) >= 0 and abs(t - lf) <= MIRROR * abs(h - lf) for h, t, lf in pairs
    )
    return back and any((t - lf) * (h - lf) < 0 for h, t, lf in pairs)


def halfway(here: list[int], there: list[int]) -> list[int]:
    """The split halfway from `here` to `there`, with the same global batch: of the ranks whose
    two batches differ by an odd number, those that give keep the odd sample first."""
    mid = [(a + b) // 2 for a, b in zip(here, there, strict=True)]
    for r in sorted(range(len(mid)), key=lambda r: here[r] - there[r], reverse=True):
        if sum(mid) < sum(here) and (here[r] + there[r]) % 2:
            mid[r] += 1
    return mid


def slowest(est: list[Estimate], split: list[int], fixed: list[float]) -> float:
    """The slowest rank's predicted compute under `split`, reading the ranks at `est`
    (those that agree within the noise as one) and each at its fixed part."""
    costs = pooled([e.cost for e in est], [e.se for e in est])
    return max(c * (f + b) for c, f, b in zip(costs, fixed, split, strict=True))


def held(
    models: list[balance.RankModel], split: list[int], pinned: list[int], headroom: float
) -> float:
    """The predicted time of the fastest split that leaves the `pinned` ranks their batches."""
    free = [m for m in models if m.rank not in pinned]
    if not free:
        raise balance.BalanceError("every rank's new speed awaits confirmation")
    rest = balance.propose(free, sum(split) - sum(split[r] for r in pinned), headroom)
    return max(rest.predicted_s, *(models[r].time(split[r]) for r in pinned))


def unjustified(
    split: list[int],
    new: list[int],
    est: list[Estimate],
    read_at: list[float],
    fixed: list[float],
) -> str:
    """Why some sample of the move from `split` to `new` would not go from a rank clearly
    slower than where it lands, were each rank's fixed part `fixed` samples (the estimates
    were read at `read_at`), or "" when none."""
    world = len(split)
    # a rank's time does not depend on the fixed part it is read at; its cost per sample does
    raw = [
        e.cost * (a + b) / (f + b) for e, a, f, b in zip(est, read_at, fixed, split, strict=True)
    ]
    costs = pooled(raw, [e.se for e in est])
    # the ranks read as equals where read (at the fixed part steered by), whatever `fixed`
    equals = groups([e.cost for e in est], [e.se for e in est])
    group = {r: i for i, g in enumerate(equals) for r in g}
    before = [c * (f + b) for c, f, b in zip(costs, fixed, split, strict=True)]
    after = [c * (f + b) for c, f, b in zip(costs, fixed, new, strict=True)]
    donors = [r for r in range(world) if new[r] < split[r]]
    takers = [r for r in range(world) if new[r] > split[r]]
    for d in donors:
        for t in takers:
            noise = math.hypot(est[d].se, est[t].se)
            young = min(est[d].n, est[t].n) < SETTLED
            # Between equals only the batches can justify a move (the giver had more samples
            # than the taker will): a swap between equals is never made. Equals are ranks
            # read as one cost, or settled ranks whose costs agree at `fixed`. The first
            # because each rank's fixed part is capped at its own batch, and those parts
            # alone can make a gain (session 29's run C, gradual16 r0 at 36: rank 0 at 5
            # samples, read at a part of 4.76, gave one to rank 1 at 4, read at 4). As read,
            # not as re-read at a larger part: there a rank twice as dear, left 2 samples and
            # read at 9.5 where its peer at 4 is read at 4, looks its peer's equal and still
            # gains by giving (the simulator's SIX, moving16).
            agree = not young and abs(math.log(costs[d] / costs[t])) < Z_AGREE * noise
            if (group[d] == group[t] or agree) and split[d] <= new[t]:
                return f"ranks {d} and {t} cost the same within the noise"
            if young:  # a cost read from few figures: only clear evidence moves samples
                if math.log(before[d] / after[t]) < Z_YOUNG * noise:
                    return f"rank {d} is not clearly slower than rank {t}"
            elif not agree and before[d] <= after[t]:
                return f"rank {t} would end slower than rank {d} began"
    return ""


def nearest(
    split: list[int],
    costs: list[float],
    target: float,
    caps: list[int | None],
    fixed: list[float] | None = None,
    upper: list[float] | None = None,
) -> list[int]:
    """The split nearest to `split` (fewest samples moved) under which no rank's predicted
    time (cost x (its fixed part + batch); no fixed part if None) exceeds `target`: ranks over
    it keep what fits, the rest goes, one sample at a time, to the rank that would be done
    soonest with it. Ranks of equal cost never trade samples: only a rank over the target
    gives, only one under it takes. Given `upper` (each rank's cost at the high end of what
    its figures allow), a rank that gives keeps what fits at it, where the others can take
    the rest; never fewer than 2 samples for that caution alone (at 1 a rank's cost is mostly
    its fixed part, read worst: a rank left 1 was read as recovered and given its samples back
    while still slow, in the simulator's noisy moving runs)."""
    fixed = fixed or [0.0] * len(split)

    def fits(c: float, f: float, cap: int | None) -> int:
        return min(max(1, math.floor(target / c - f + 1e-9)), cap if cap is not None else 1 << 30)

    room = [fits(c, f, cap) for c, f, cap in zip(costs, fixed, caps, strict=True)]
    if upper is not None:
        cautious = [
            max(fits(u, f, cap), min(r, 2)) if b > r else r
            for u, f, cap, b, r in zip(upper, fixed, caps, split, room, strict=True)
        ]
        if sum(cautious) >= sum(split):
            room = cautious
    new = [min(b, r) for b, r in zip(split, room, strict=True)]
    for _ in range(sum(split) - sum(new)):
        open_ = [r for r in range(len(new)) if new[r] < room[r]]
        if not open_:
            return split  # the target cannot hold the global batch: stay
        r = min(open_, key=lambda r: (costs[r] * (fixed[r] + new[r] + 1), r))
        new[r] += 1
    return new


def pooled(costs: list[float], ses: list[float], z: float = Z_AGREE) -> list[float]:
    """Costs with the ranks that agree within `z` standard errors of their neighbours (in
    order of cost) replaced by their group's weighted mean (in log space)."""
    out = list(costs)
    for g in groups(costs, ses, z):
        weights = [1 / max(ses[r], 1e-6) ** 2 for r in g]
        mean = sum(w * math.log(costs[r]) for w, r in zip(weights, g, strict=True)) / sum(weights)
        for r in g:
            out[r] = math.exp(mean)
    return out


def groups(costs: list[float], ses: list[float], z: float = Z_AGREE) -> list[list[int]]:
    """The ranks in groups that agree within `z` standard errors of their neighbours, in
    order of cost (never further apart than POOL_MAX)."""
    order = sorted(range(len(costs)), key=lambda r: costs[r])
    out: list[list[int]] = []
    for r in order:
        last = out[-1][-1] if out else None
        band = min(z * math.hypot(ses[r], ses[last]), POOL_MAX) if last is not None else 0.0
        if last is not None and math.log(costs[r] / costs[last]) < band:
            out[-1].append(r)
        else:
            out.append([r])
    return out
