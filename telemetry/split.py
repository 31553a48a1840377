"""The batch split: how many samples of every global microbatch each rank takes.

The one parser and the one validator, shared by the trainer (a rebalance at a boundary), the
wire protocol (a command's shape), the balancer and the console's rebalance dialog.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from telemetry.errors import TelemetryError


class SplitError(TelemetryError, ValueError):
    """A split that cannot be read."""


def parse(text: str) -> list[int]:
    """Parse "3,2,2,1" (commas or spaces) into integers, with a clear error."""
    parts = [p for p in str(text).replace(",", " ").split() if p]
    if not parts:
        raise SplitError("empty split")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise SplitError(
            f"split must be whole numbers separated by commas: {_short(text)}"
        ) from None


def shape_problem(value: object) -> str:
    """Why `value` is not a list of positive integers (what a rebalance must carry), or ""."""
    if not isinstance(value, list | tuple) or not value:
        return f"a split is a list of integers, got {_short(value)}"
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in value):
        return f"every local batch must be a whole number, got {_short(value)}"
    if any(b < 1 for b in value):
        return f"every rank needs at least 1 sample, got {_short(value)}"
    return ""


def problems(
    split: object,
    global_batch: int,
    world_size: int,
    caps: Sequence[int | None] | None = None,
    min_batch: int = 1,
    cap_detail: Callable[[int, int], str] | None = None,
) -> list[str]:
    """Everything wrong with `split` for a run of `world_size` ranks and this global batch.

    `caps` are the largest local batches each rank's memory allows (None: no limit);
    `cap_detail(rank, batch)` may add why, e.g. the predicted memory. Empty when it fits.
    """
    shape = shape_problem(split)
    if shape and "at least" not in shape:
        return [shape]
    assert isinstance(split, list | tuple)
    errors: list[str] = []
    if len(split) != world_size:
        errors.append(
            f"split {_short(split)} has {len(split)} entries: "
            f"{len(split)} values for {world_size} ranks"
        )
    small = [r for r, b in enumerate(split) if b < max(1, min_batch)]
    if small:
        errors.append(
            f"rank(s) {', '.join(map(str, small))}: every rank needs at least "
            f"{max(1, min_batch)} sample(s)"
        )
    if sum(split) != global_batch:
        errors.append(
            f"split {_short(split)} sums to {sum(split)}, but the global batch is "
            f"{global_batch}; a rebalance keeps the global batch"
        )
    if caps is not None and len(caps) == len(split):
        for r, (b, cap) in enumerate(zip(split, caps, strict=True)):
            if cap is not None and b > cap:
                detail = cap_detail(r, b) if cap_detail else ""
                errors.append(
                    f"rank {r} can hold at most {cap} samples within its memory limit, "
                    f"not {b}" + (f" ({detail})" if detail else "")
                )
    return errors


def _short(value: object, limit: int = 60) -> str:
    """A bounded description of an untrusted value: error texts never grow with the input."""
    if isinstance(value, list | tuple) and len(value) > 16:
        return f"[{', '.join(map(repr, value[:8]))}, ... ({len(value)} values)]"[: 2 * limit]
    text = repr(list(value)) if isinstance(value, list | tuple) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
