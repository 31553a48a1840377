"""Where the loop is: the step, the tokens and the data cursor, the split in force, the evals.

Saved with every checkpoint as `state.json` (the same keys as ever: older checkpoints load) and
restored on resume; `start_step`, `evals_since_progress` and `progress` belong to one session.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

EVALS_KEPT = 50  # the newest evaluations a checkpoint carries (the report and `best` read them)


@dataclass
class LoopState:
    """The loop's resumable position; the one thing the loop changes as it goes."""

    split: list[int]  # the batch split in force (a rebalance changes it)
    step: int = 0  # updates done
    tokens: int = 0  # real tokens trained on, every rank together
    cursor: int = 0  # samples of the global order consumed
    lr: float = 0.0  # the learning rate of the last update
    evals: list[list[float]] = field(default_factory=list)  # [step, val loss], newest last
    best: dict[str, Any] | None = None  # {"step", "val_loss"} of the lowest val loss so far
    start_step: int = 0  # the step this session began at (evaluations start after it)
    # Early stopping, within one session: the evaluation that last beat the one before it by
    # --early-stop-min-delta ({"step", "val_loss"}; None: `best` at the start), and how many
    # evaluations since.
    progress: dict[str, Any] | None = None
    evals_since_progress: int = 0

    def to_json(self) -> dict[str, Any]:
        """The state as a checkpoint's state.json holds it."""
        out = asdict(self)
        if self.best is None:
            del out["best"]
        return out

    @classmethod
    def from_json(cls, saved: dict[str, Any], split: list[int]) -> LoopState:
        """A state read back from `saved` (unknown keys ignored), with this session's split."""
        known = {f.name for f in fields(cls)}
        state = cls(**{k: v for k, v in saved.items() if k in known and k != "split"}, split=split)
        state.start_step, state.evals_since_progress, state.progress = state.step, 0, None
        return state

    def note_eval(self, val_loss: float) -> None:
        self.evals = [*self.evals, [self.step, val_loss]][-EVALS_KEPT:]
