"""The autopilot: rank 0's hand on the batch split while nobody watches.

It sees, at every boundary, each rank's compute time, peak memory and swap of the last
update (they ride the control all-reduce, trainer/controller.py). Two duties:

- **Rebalance** when the balancer (telemetry/balance.py) predicts a gain of at least
  `min_gain` for `window` boundaries in a row, from each rank's median compute per sample
  over its recent updates; then wait `cooldown` updates before the next change. The global
  batch never changes, so neither does the math. A fixed slowdown converges within two
  changes; noise alone does not move a median enough to predict a gain a whole window long.
- **Guard memory**: a rank whose swap grows, whose OS reports pressure, or whose peak nears
  its --memory-limit-gb gives samples to the others; when no split fits, it warns and (with
  --on-memory-pressure pause) checkpoints and pauses the run.

It decides; the controller submits what it decided to rank 0's own command queue, so the
change is applied at the next boundary like an operator's `rebalance`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from telemetry import balance
from telemetry.units import GiB, MiB

SWAP_GROWTH = 256 * MiB  # swap grown by this much over a window: the rank is swapping
PRESSURE = 0.6  # macOS memory pressure (0..1) from which a rank counts as pressed
# A rank whose compute per sample deviates from its median by as much as the median itself
# (the median deviation, relative) is not read at all. Below that the median is trusted: a
# shared 2-core machine showed deviations of 0.3-0.8 while the medians stayed within a few %.
STEADY = 1.0


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
    min_gain: float = 0.05
    window: int = 10
    cooldown: int = 20
    headroom: float = 0.15
    pause_on_pressure: bool = False

    def __post_init__(self) -> None:
        # The last `window` updates of each rank since the last change: costs per sample are
        # read as medians, so a change of split needs no history, and a slowdown that moves
        # is seen within a window instead of being averaged with the past.
        self.samples: list[deque[balance.RankSample]] = [
            deque(maxlen=self.window) for _ in range(self.world)
        ]
        self.swaps: list[deque[float]] = [deque(maxlen=self.window) for _ in range(self.world)]
        self.since_change = self.cooldown  # no change yet: nothing to cool down from
        self.streak: tuple[list[int], int] | None = None  # (the same proposal, for how long)
        self.pressed_before: set[int] = set()
        self.pending: dict[str, Any] | None = None  # a change awaiting its measured effect
        self.recent: deque[float] = deque(maxlen=self.window)  # the slowest compute, per update

    def observe(self, split: list[int], figures: list[RankFigures]) -> Decision:
        """Take one boundary's figures; what to do now (usually nothing)."""
        out = Decision()
        for r, f in enumerate(figures):
            if f.local_batch > 0 and f.compute_s > 0:
                self.samples[r].append(balance.RankSample(f.local_batch, f.compute_s, int(f.peak)))
            self.swaps[r].append(f.swap)
        self.since_change += 1
        slowest = max((f.compute_s for f in figures), default=0.0)
        self.recent.append(slowest)
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
        elif self.enabled and self.since_change >= self.cooldown:
            self._rebalance(split, out)
        if not pressed:
            self.pressed_before = set()
        return out

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
        models, new = self._models(), list(split)
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
        self._changed(split, new, 0.0, sorted(self.recent)[len(self.recent) // 2])

    # --- speed --------------------------------------------------------------------------------
    def _models(self) -> list[balance.RankModel]:
        """Each rank's cost from the medians of its recent updates: a busy moment on a shared
        machine moves a least-squares fit, not a median. Compute is taken as proportional to
        the batch (the fixed cost is small next to the microsteps), memory likewise."""
        models = []
        for r, samples in enumerate(self.samples):
            per = [s.compute_s / s.local_batch for s in samples]
            mid = statistics.median(per)
            spread = statistics.median(abs(p - mid) for p in per) / mid if mid > 0 else 1.0
            per_mem = statistics.median(s.peak_mem / s.local_batch for s in samples)
            models.append(
                balance.RankModel(r, 0.0, mid, 0, int(per_mem), None, len(per), True, "", spread)
            )
        return models

    def _rebalance(self, split: list[int], out: Decision) -> None:
        models = self._models()
        try:
            prop = balance.propose(models, sum(split), self.headroom, current=split)
        except balance.BalanceError:
            self.streak = None
            return
        steady = all(m.noise < STEADY and m.n >= self.window for m in models)
        if not steady or prop.gain is None or prop.gain < self.min_gain or prop.split == split:
            self.streak = None
            return
        # The gain must hold `window` boundaries in a row; ties between equal ranks may flip
        # the proposal, so what must hold is the gain, and the newest proposal is taken.
        self.streak = (prop.split, self.streak[1] + 1 if self.streak else 1)
        if self.streak[1] < self.window:
            return
        reason = f"autopilot: predicted {prop.gain:.0%} faster, held {self.window} updates"
        out.commands.append(("rebalance", {"split": prop.split, "reason": reason}))
        before = sorted(self.recent)[len(self.recent) // 2]
        self._changed(split, prop.split, prop.gain, before)

    def _changed(self, old: list[int], new: list[int], gain: float, before: float | None) -> None:
        self.since_change = 0
        self.streak = None
        self.recent.clear()
        for s in (*self.swaps, *self.samples):
            s.clear()
        self.pending = {
            "from": old,
            "to": new,
            "predicted_gain": gain,
            "before_s": before,
            "after": [],
        }

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
