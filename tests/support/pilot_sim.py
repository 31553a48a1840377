"""The autopilot against ranks simulated with this project's measured noise, and against what
any fixed split, or the oracle, would have done with the same noise (common random numbers).

A rank's compute in an update is its per-sample cost x its batch x the machine's load that
update (shared by all ranks) x its own scatter x now and then a spike, plus a recompile the
first time it runs a batch size. The defaults are what 4 ranks on the 2-core development box
showed under load: log-scatter 0.45 shared, 0.25 each (trainer/costs.py), 5% spikes of 2-6x;
`QUIET` is a rank a core (a guess); `BOX` the same box, quiet, measured with
benchmarks/rank_noise.py.
Used by tests/trainer/test_autopilot.py and benchmarks/autopilot.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from trainer.autopilot import Autopilot, RankFigures

Schedule = Callable[[int], Sequence[float]]  # update -> each rank's cost per sample (s)
GIB = 1 << 30


@dataclass
class Noise:
    shared: float = 0.45
    own: float = 0.25
    spikes: float = 0.05
    fixed_s: float = 0.0  # per-update cost of a rank that does not depend on its batch
    # The same in samples of the rank's own cost (a microstep's launch and Python overhead:
    # a slowdown scales it too, as SlowedStepper's does), and each update's time after its
    # slowest rank (the all-reduce, the step) in samples of the median rank's cost.
    fixed_samples: float = 0.0
    overhead: float = 0.0
    recompile: float = 1.0  # extra compute, as a fraction, the first time a batch size runs
    spike_range: tuple[float, float] = (2.0, 6.0)  # a spike's multiplier, drawn uniformly
    # A compute that is not a straight line in the batch: samples' worth at batch 1, 2, ...
    # (one more a sample beyond the last), in place of fixed_samples + batch; () for none.
    curve: tuple[float, ...] = ()
    # Fast spells: the chance per rank-update that a rank starts one (SPELL_MIN figures or
    # more, each further one with SPELL_ON; SPELL_FAST of its figures about twice as fast).
    spells: float = 0.0


SPELL_MIN, SPELL_MAX = 4, 10  # a spell's figures, fewest and most
SPELL_ON = 0.4  # the chance that a spell of n >= SPELL_MIN figures goes on to n + 1 (this
# box's: 0.3-0.44 from 4 figures to 8)
SPELL_FAST = 0.8  # the share of a spell's figures that are fast
SPELL_RANGE = (0.45, 0.6)  # a fast figure's multiplier in a spell (about twice as fast)


# Each rank on a core of its own (benchmarks/autopilot.py --cores on a 16-core host): little
# shared load or scatter, a spike in one rank-update of 100. A guess, not a measurement.
QUIET = Noise(shared=0.1, own=0.08, spikes=0.01)
# Measured (benchmarks/rank_noise.py, 4 ranks on the 2-core box, 150 updates): a rank's own
# log-scatter 0.09 with no carry-over (lag-1 autocorrelation -0.02), what all share 0.11, and
# one figure in nine far *faster* than its peers (0.43-0.76x: the rank that got a core first
# while the others waited), none far slower.
# Read from the real runs of benchmarks/autopilot.py on the same box: a rank's compute is
# about (1.1 + batch) samples' worth (session 17's fixed arms, each rank's median compute
# over a phase against its batch, 1 to 8: benchmarks/results/2026-12-04-s17/
# fixed_part_fit.py.txt; session 7 read 6 from pilot runs), the first update at a new batch
# takes 1.13x the rank's compute (median of 97 changes in session 23's pilot runs, quartiles
# 0.92-1.39; 2.7-3.4x in sessions 16-22, when that update also measured the live set under a
# tight memory limit: benchmarks/results/2026-12-05-s24/recompile.py.txt), and an update ends
# ~2.3 samples' compute after its slowest rank (session 7).
BOX = Noise(
    shared=0.11,
    own=0.09,
    spikes=0.11,
    spike_range=(0.43, 0.76),
    fixed_samples=1.1,
    overhead=2.3,
    recompile=0.13,
)
# The same box with its fast spells: a rank with a core of the two to itself for 4-10
# updates, about one such run of 4 fast figures or more in 370 rank-updates (150 in the
# kept equal-rank runs of sessions 12-24, about 55,000 rank-updates; 4 figures long: 88, 5:
# 35, 6: 17, 7: 7, 8: 2, 10: 1; benchmarks/results/2026-12-05-s25/spells.py.txt).
SPELLS = dataclasses.replace(BOX, spells=1 / 370)
# The same box with its compute as measured batch by batch (session 17's fixed arms, each
# rank's median compute over a phase by its batch: 0.0255 s at 1, 0.0567 at 2, ... 0.149 at
# 8; benchmarks/results/2026-12-04-s17/fixed_part_fit.py.txt), in samples of the line's
# 0.0172 s: dearer from 1 to 2 (1.8 samples' worth a sample) than from 4 to 8 (0.8). A fixed
# part read from moves between 4 and 8 is about 3 samples there, and 0 to 1 from 1 to 4.
CURVED = dataclasses.replace(BOX, curve=(1.48, 3.30, 4.35, 5.48, 6.52, 7.20, 8.15, 8.66))
# The same box with a fixed part of 6 samples (session 7's reading of it; a small model, or a
# GPU half idle at a small batch): a rank left 1 sample is mostly fixed cost.
SIX = dataclasses.replace(BOX, fixed_samples=6.0)


@dataclass
class Outcome:
    """What happened in one simulated run."""

    splits: list[list[int]]  # the split of each update
    times: list[float]  # each update's time (its slowest rank)
    changes: list[tuple[int, list[int], list[int]]] = field(default_factory=list)  # step, old, new
    unjustified: list[tuple[int, int, int]] = field(default_factory=list)  # step, from, to

    @property
    def total(self) -> float:
        return sum(self.times)


def draws(world: int, updates: int, noise: Noise, seed: int) -> list[list[float]]:
    """Each update's multiplier of each rank's compute (load, scatter, spikes, spells)."""
    rng = random.Random(seed)
    out = []
    for _ in range(updates):
        shared = math.exp(rng.gauss(0, noise.shared))
        row = []
        for _ in range(world):
            spike = rng.uniform(*noise.spike_range) if rng.random() < noise.spikes else 1.0
            row.append(shared * math.exp(rng.gauss(0, noise.own)) * spike)
        out.append(row)
    if noise.spells:  # drawn apart, so that a profile without them draws as before
        spell = random.Random(f"{seed}-spells")
        for r in range(world):
            t = 0
            while t < updates:
                if spell.random() >= noise.spells:
                    t += 1
                    continue
                n = SPELL_MIN
                while n < SPELL_MAX and spell.random() < SPELL_ON:
                    n += 1
                for u in range(t, min(t + n, updates)):
                    if spell.random() < SPELL_FAST:
                        out[u][r] *= spell.uniform(*SPELL_RANGE)
                t += n
    return out


def compute(cost: float, batch: int, mult: float, noise: Noise) -> float:
    return (noise.fixed_s + cost * worth(batch, noise)) * mult


def worth(batch: int, noise: Noise) -> float:
    """A rank's compute at `batch` in samples of its own cost."""
    if not noise.curve:
        return noise.fixed_samples + batch
    last = len(noise.curve)
    return noise.curve[min(batch, last) - 1] + max(0, batch - last)


def after(costs: Sequence[float], noise: Noise) -> float:
    """An update's time after its slowest rank's compute."""
    return noise.overhead * statistics.median(costs)


def fly(
    schedule: Schedule,
    split: list[int],
    updates: int,
    pilot: Autopilot | None = None,
    noise: Noise | None = None,
    seed: int = 0,
) -> Outcome:
    """Run `updates` updates from `split`, steered by `pilot` (None: the split stays)."""
    noise = noise or Noise()
    mult = draws(len(split), updates, noise, seed)
    seen: list[set[int]] = [{b} for b in split]
    out = Outcome([], [])
    # As in a run (trainer/controller.py): what the pilot decides at the boundary after update
    # t - 1 is applied there where it said it may decide, and update t runs it; else it waits
    # in rank 0's queue, which the boundary's first exchange takes from before the pilot looks.
    queued: list = []
    due: list = []  # applied before update t
    for t in range(updates):
        for cmd, args in due:
            if cmd == "rebalance":
                new = list(args["split"])
                out.changes.append((t, split, new))
                costs = schedule(t)
                for d in range(len(split)):
                    for r in range(len(split)):
                        moved = new[d] < split[d] and new[r] > split[r]
                        # a move the true costs (fixed part included) do not justify: the
                        # giver was not slower than the taker will be
                        giver = compute(costs[d], split[d], 1.0, noise)
                        if moved and giver <= compute(costs[r], new[r], 1.0, noise) * (1 + 1e-9):
                            out.unjustified.append((t, d, r))
                split = new
        costs = schedule(t)
        times = []
        for r, (c, b) in enumerate(zip(costs, split, strict=True)):
            extra = 1.0 + (noise.recompile if b not in seen[r] else 0.0)
            seen[r].add(b)
            times.append(compute(c, b, mult[t][r], noise) * extra)
        out.splits.append(list(split))
        out.times.append(max(times) + after(costs, noise))
        due = []
        if pilot is not None:
            expect = pilot.may_decide()
            if queued:
                due.append(queued.pop(0))
            figures = [
                RankFigures(b, c, GIB, 0, 0, None) for b, c in zip(split, times, strict=True)
            ]
            queued += pilot.observe(split, figures).commands
            if expect and queued and not due:
                due.append(queued.pop(0))
    return out


def splits_of(total: int, world: int) -> list[tuple[int, ...]]:
    return [s for s in itertools.product(range(1, total + 1), repeat=world) if sum(s) == total]


def expected(schedule: Schedule, split: Sequence[int], steps: range, noise: Noise) -> float:
    """A split's time over `steps` without noise: what hindsight of the costs predicts."""
    return sum(
        max(compute(c, b, 1.0, noise) for c, b in zip(schedule(t), split, strict=True))
        + after(schedule(t), noise)
        for t in steps
    )


def measured(schedule: Schedule, split: Sequence[int], steps: range, mult, noise: Noise) -> float:
    """A split's time over `steps` with this run's noise."""
    return sum(
        max(
            compute(c, b, mult[t][r], noise)
            for r, (c, b) in enumerate(zip(schedule(t), split, strict=True))
        )
        + after(schedule(t), noise)
        for t in steps
    )


def best_split(schedule: Schedule, world: int, total: int, steps: range, noise: Noise):
    """The split hindsight of the costs picks for `steps` (noise-free); of splits as fast,
    the nearest to even (then the first in rank order)."""
    splits = splits_of(total, world)
    times = [expected(schedule, s, steps, noise) for s in splits]
    least = min(times)
    even = total / world
    fast = [s for s, t in zip(splits, times, strict=True) if t <= least * (1 + 1e-9)]
    return min(fast, key=lambda s: sum(abs(b - even) for b in s))


def best_fixed(
    schedule: Schedule, world: int, total: int, updates: int, noise: Noise, seed: int
) -> tuple[tuple[int, ...], float]:
    """The best fixed split in hindsight (of the costs) and its time with this run's noise."""
    best = best_split(schedule, world, total, range(updates), noise)
    return best, measured(schedule, best, range(updates), draws(world, updates, noise, seed), noise)


def oracle(
    schedule: Schedule,
    world: int,
    total: int,
    updates: int,
    phases: Sequence[int],
    noise: Noise,
    seed: int,
) -> float:
    """The time of the best split of each phase, switched at the right update (the ranks
    whose batch changes pay the recompile there too), with this run's noise."""
    mult = draws(world, updates, noise, seed)
    bounds = [*phases, updates]
    total_s, last = 0.0, None
    for a, b in zip(bounds, bounds[1:], strict=False):
        if b <= a:
            continue
        best = best_split(schedule, world, total, range(a, b), noise)
        total_s += measured(schedule, best, range(a, b), mult, noise)
        if last is not None and best != last:
            costs = schedule(a)
            changed = [r for r in range(world) if best[r] != last[r]]
            total_s += max(
                compute(costs[r], best[r], mult[a][r], noise) * noise.recompile for r in changed
            )
        last = best
    return total_s


def ceiling(
    schedule: Schedule,
    world: int,
    total: int,
    phases: Sequence[int],
    steps: range,
    noise: Noise,
    lag: int,
) -> float:
    """The time over `steps`, without noise, of the best a pilot could do that answers a
    change `lag` updates after it (it must see one first: `lag` >= 1 for any that reads its
    ranks' figures): on each phase's best split (of equals, the nearest even: it cannot
    know which of them the next phase favours) from the start, `lag` updates into every
    later phase, paying the recompile where ranks change batch."""
    bounds = [*phases, steps.stop]
    total_s, last = 0.0, None
    for a, b in zip(bounds, bounds[1:], strict=False):
        if b <= a:
            continue
        best = best_split(schedule, world, total, range(a, b), noise)
        switch = a if last is None else min(a + lag, b)
        if last is not None:
            total_s += expected(schedule, last, range(max(a, steps.start), switch), noise)
        total_s += expected(schedule, best, range(max(switch, steps.start), b), noise)
        if last is not None and best != last and switch in steps:
            costs = schedule(switch)
            changed = [r for r in range(world) if best[r] != last[r]]
            total_s += max(compute(costs[r], best[r], 1.0, noise) for r in changed) * (
                noise.recompile
            )
        last = best
    return total_s


def as_fast(schedule: Schedule, split: Sequence[int], steps: range, noise: Noise) -> bool:
    """Whether `split` is within 2% of the best split over `steps` (noise-free): a change of
    costs it already fits leaves nothing to answer."""
    best = best_split(schedule, len(split), sum(split), steps, noise)
    return expected(schedule, split, steps, noise) <= 1.02 * expected(schedule, best, steps, noise)


def reaction(
    out: Outcome,
    at: int,
    schedule: Schedule | None = None,
    end: int = 0,
    noise: Noise | None = None,
) -> int | str | None:
    """Updates from a change of costs at `at` to the first update under a new split (None:
    never). Given the schedule, the phase's end and the noise: "kept" where the split in place
    was already within 2% of the phase's best (noise-free), so that there was nothing to do."""
    if schedule is not None and as_fast(schedule, out.splits[at], range(at, end), noise or Noise()):
        return "kept"
    after = [t for t, _, _ in out.changes if t >= at]
    return after[0] - at if after else None
