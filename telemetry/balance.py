"""Propose how to split a fixed global batch across unequal ranks.

Each rank's cost is modelled as linear in its local batch ``b``:

    compute(b) = fixed_s + per_sample_s * b        peak_mem(b) = base_mem + per_sample_mem * b

fitted from the updates it reported. In data-parallel training every rank waits for the
slowest one at the gradient all-reduce, so an update takes ``max_r compute_r(b_r)`` (plus the
all-reduce and optimizer, which do not depend on the split). `propose` minimises that maximum
over integer splits that sum to the global batch, keeping every rank's predicted peak memory
under ``(1 - headroom) * mem_limit``.

Pure Python on purpose: the console imports it, and the console never imports mlx.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from telemetry.split import problems
from telemetry.units import gib_text

# Fewer updates than this per rank and a fit is called a guess.
MIN_UPDATES = 3
# Residual scatter of compute time (relative to its mean) above which a rank is too noisy to trust.
MAX_NOISE = 0.15
# A proposal that saves less than this fraction of the update time keeps the current split.
MIN_GAIN = 0.01


class BalanceError(ValueError):
    """No split satisfies the constraints (too little memory, or too few samples)."""


@dataclass(slots=True)
class RankSample:
    """One update's measurement on one rank."""

    local_batch: int
    compute_s: float
    peak_mem: int
    mem_total: int | None = None


@dataclass(slots=True)
class RankModel:
    """A rank's fitted cost: compute time and peak memory, both linear in the local batch."""

    rank: int
    fixed_s: float
    per_sample_s: float
    base_mem: int
    per_sample_mem: int
    mem_limit: int | None
    n: int  # updates the fit is based on
    confident: bool
    reason: str = ""  # why not confident; empty when confident
    noise: float = 0.0  # residual std of compute time / mean compute time

    def time(self, batch: int) -> float:
        """Predicted compute seconds at this local batch."""
        return self.fixed_s + self.per_sample_s * batch

    def mem(self, batch: int) -> int:
        """Predicted peak memory in bytes at this local batch."""
        return self.base_mem + self.per_sample_mem * batch

    def cap(self, headroom: float = 0.15) -> int | None:
        """Largest local batch whose predicted peak stays under (1 - headroom) of the limit."""
        return batch_cap(self.mem_limit, self.base_mem, self.per_sample_mem, headroom)


def batch_cap(
    limit: float | None, base_mem: float, per_sample_mem: float, headroom: float = 0.15
) -> int | None:
    """The memory model, the one the balancer and the trainer's rebalance check share: the
    largest local batch whose peak (base + per sample x batch) stays under (1 - headroom) of
    `limit` bytes. None when there is no limit (or no cost per sample)."""
    if limit is None:
        return None
    budget = (1.0 - headroom) * limit - base_mem
    if per_sample_mem <= 0:
        return None if budget >= 0 else 0
    return max(0, math.floor(budget / per_sample_mem))


@dataclass(slots=True)
class Proposal:
    """A proposed split, what it should cost, and how sure we are."""

    split: list[int]
    predicted_s: float  # predicted compute time of the slowest rank under `split`
    rank_s: list[float]  # predicted compute time of each rank under `split`
    rank_mem: list[int]  # predicted peak memory of each rank under `split`
    caps: list[int | None]  # the largest local batch memory allows on each rank (None: no limit)
    confident: bool
    reason: str
    current_split: list[int] | None = None
    current_s: float | None = None
    gain: float | None = None  # fraction of the update's compute time saved: 1 - predicted/current
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """A JSON-ready mapping."""
        return {
            "split": self.split,
            "predicted_s": self.predicted_s,
            "rank_s": self.rank_s,
            "rank_mem": self.rank_mem,
            "caps": self.caps,
            "confident": self.confident,
            "reason": self.reason,
            "current_split": self.current_split,
            "current_s": self.current_s,
            "gain": self.gain,
            "notes": self.notes,
        }


def _linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares intercept and slope; needs at least two distinct xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    return my - slope * mx, slope


def _through_origin(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of a line through the origin."""
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)


def _fit_rank(rank: int, samples: Sequence[RankSample], mem_limit: int | None) -> RankModel:
    samples = [s for s in samples if s.local_batch > 0 and s.compute_s > 0]
    if not samples:
        raise BalanceError(f"rank {rank}: no usable updates (need local_batch > 0, compute_s > 0)")
    xs = [float(s.local_batch) for s in samples]
    ts = [s.compute_s for s in samples]
    ms = [float(s.peak_mem) for s in samples]
    reasons: list[str] = []
    if mem_limit is None:
        mem_limit = next((s.mem_total for s in reversed(samples) if s.mem_total), None)

    if len(set(xs)) < 2:
        # One batch size cannot separate a fixed cost from a per-sample cost. Assuming it is all
        # per-sample overstates the gain of moving work; for memory it overstates the peak at a
        # larger batch, which errs on the safe side.
        fixed, per = 0.0, _through_origin(xs, ts)
        base, per_mem = 0.0, _through_origin(xs, ms)
        reasons.append("one batch size measured, fixed cost assumed zero")
    else:
        fixed, per = _linear_fit(xs, ts)
        if per <= 0 or fixed < 0:
            # Noise bent the line (a slope <= 0 cannot be right); fall back to proportional.
            fixed, per = 0.0, _through_origin(xs, ts)
            if per <= 0:
                raise BalanceError(f"rank {rank}: compute time does not grow with batch")
        base, per_mem = _linear_fit(xs, ms)
        if per_mem < 0 or base < 0:
            base, per_mem = 0.0, max(0.0, _through_origin(xs, ms))

    residuals = [t - (fixed + per * x) for x, t in zip(xs, ts, strict=True)]
    mean_t = statistics.fmean(ts)
    noise = (
        math.sqrt(sum(r * r for r in residuals) / len(residuals)) / mean_t
        if len(residuals) > 1
        else 0.0
    )
    if len(samples) < MIN_UPDATES:
        reasons.append(f"only {len(samples)} update(s) measured")
    if noise > MAX_NOISE:
        reasons.append(f"compute time varies {noise:.0%} around the fit")
    return RankModel(
        rank=rank,
        fixed_s=fixed,
        per_sample_s=per,
        base_mem=int(round(base)),
        per_sample_mem=int(math.ceil(per_mem)),  # round up: memory errs on the safe side
        mem_limit=mem_limit,
        n=len(samples),
        confident=not reasons,
        reason="; ".join(reasons),
        noise=noise,
    )


def fit(
    samples_by_rank: Sequence[Sequence[RankSample]],
    mem_limits: Sequence[int | None] | None = None,
) -> list[RankModel]:
    """Fit each rank's linear cost model from its measured updates.

    `mem_limits` overrides the memory limit per rank; otherwise each rank's latest `mem_total`.
    """
    if not samples_by_rank:
        raise BalanceError("no ranks to fit")
    if mem_limits is not None and len(mem_limits) != len(samples_by_rank):
        raise BalanceError(f"{len(mem_limits)} memory limits for {len(samples_by_rank)} ranks")
    limits = list(mem_limits) if mem_limits is not None else [None] * len(samples_by_rank)
    return [_fit_rank(r, s, limits[r]) for r, s in enumerate(samples_by_rank)]


def predict(models: Sequence[RankModel], split: Sequence[int]) -> float:
    """Predicted compute time of an update: the slowest rank's."""
    if len(models) != len(split):
        raise BalanceError(f"split has {len(split)} entries for {len(models)} ranks")
    return max(m.time(b) for m, b in zip(models, split, strict=True))


def propose(
    models: Sequence[RankModel],
    global_batch: int,
    headroom: float = 0.15,
    min_batch: int = 1,
    current: Sequence[int] | None = None,
) -> Proposal:
    """The integer split of `global_batch` that minimises the predicted update time.

    Greedy: every rank starts at `min_batch`; each remaining sample goes to the rank whose cost
    after taking it is smallest, among ranks still under their memory cap. For costs that grow
    with the batch this is optimal for the max (it fills the lowest available "time slots" first).
    """
    world = len(models)
    if world == 0:
        raise BalanceError("no ranks")
    if not 0 <= headroom < 1:
        raise BalanceError(f"headroom must be in [0, 1), got {headroom}")
    if min_batch < 0:
        raise BalanceError(f"min_batch must be >= 0, got {min_batch}")
    if global_batch < world * min_batch:
        raise BalanceError(
            f"global batch {global_batch} cannot give {world} ranks {min_batch} sample(s) each"
        )
    caps = [m.cap(headroom) for m in models]
    for m, cap in zip(models, caps, strict=True):
        if cap is not None and cap < min_batch:
            raise BalanceError(
                f"rank {m.rank}: even {min_batch} sample(s) would exceed "
                f"{1 - headroom:.0%} of its memory"
            )
    if all(c is not None for c in caps) and sum(caps) < global_batch:  # type: ignore[arg-type]
        raise BalanceError(
            f"memory caps allow at most {sum(caps)} samples in all "  # type: ignore[arg-type]
            f"(headroom {headroom:.0%}), fewer than the global batch {global_batch}"
        )

    split = [min_batch] * world
    # Heap of (cost after one more sample, rank); ties go to the lower rank for determinism.
    heap = [(m.time(min_batch + 1), r) for r, m in enumerate(models) if _room(caps[r], min_batch)]
    heapq.heapify(heap)
    for _ in range(global_batch - world * min_batch):
        cost, r = heapq.heappop(heap)
        split[r] += 1
        if _room(caps[r], split[r]):
            heapq.heappush(heap, (models[r].time(split[r] + 1), r))
    predicted = predict(models, split)

    notes: list[str] = []
    current_split = list(current) if current is not None else None
    current_s = gain = None
    if current_split is not None and len(current_split) == world:
        current_s = predict(models, current_split)
        # Moving samples for a gain inside the noise only churns the run.
        valid = not validate(current_split, global_batch, world, models, headroom, min_batch)
        if valid and current_s <= predicted * (1 + MIN_GAIN):
            notes.append(f"the current split is already within {MIN_GAIN:.0%} of the best")
            split, predicted = current_split, current_s
        gain = 1.0 - predicted / current_s if current_s > 0 else 0.0
    for r, (cap, b) in enumerate(zip(caps, split, strict=True)):
        if cap is not None and b == cap:
            notes.append(f"rank {r} is held at its memory cap ({cap})")

    # One line per distinct reason, naming the ranks it applies to.
    unsure: dict[str, list[int]] = {}
    for m in models:
        if not m.confident:
            for why in m.reason.split("; "):
                unsure.setdefault(why, []).append(m.rank)
    return Proposal(
        split=split,
        predicted_s=predicted,
        rank_s=[m.time(b) for m, b in zip(models, split, strict=True)],
        rank_mem=[m.mem(b) for m, b in zip(models, split, strict=True)],
        caps=caps,
        confident=not unsure,
        reason="; ".join(
            f"{'rank' if len(rs) == 1 else 'ranks'} {_ranks(rs)}: {why}"
            for why, rs in unsure.items()
        )
        or "fitted from enough steady updates",
        current_split=current_split,
        current_s=current_s,
        gain=gain,
        notes=notes,
    )


def _room(cap: int | None, batch: int) -> bool:
    return cap is None or batch < cap


def validate(
    split: Sequence[int],
    global_batch: int,
    world_size: int,
    models: Sequence[RankModel] | None = None,
    headroom: float = 0.15,
    min_batch: int = 1,
) -> list[str]:
    """Everything wrong with a split, as sentences; empty when it can be sent (telemetry.split
    checks; the fitted models give each rank's memory cap and why)."""
    fitted = models is not None and len(models) == len(split)
    caps = [m.cap(headroom) for m in models] if fitted else None

    def why(rank: int, batch: int) -> str:
        m = models[rank]
        return (
            f"~{gib_text(m.mem(batch))} of {gib_text(m.mem_limit or 0)}; "
            f"cap {caps[rank]} with {headroom:.0%} headroom"
        )

    return problems(split, global_batch, world_size, caps, min_batch, why if fitted else None)


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))
