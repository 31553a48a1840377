"""What a trial's run folder says: its evaluations (as the sweep's metric), its losses,
throughput and memory, how it ended; read from its telemetry logs, never from the ranks.

Bits per byte: the held-out loss summed over the scored targets, in nats, / ln 2 / the UTF-8
bytes of those targets (EOS and PAD hold no bytes; PAD targets are not scored). The bytes are
counted from the very rows an evaluation scores (the first --eval-samples held-out rows, in
file order), so a trial's val_bpb compares across tokenizers.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from telemetry.arrowlog import read_events, read_updates
from telemetry.errors import TelemetryError


class MetricError(ValueError):
    """A metric that cannot be computed for this trial; the message says why."""


@functools.cache
def val_bytes(data: str, eval_samples: int) -> tuple[int, int]:
    """(scored targets, their UTF-8 bytes) of the rows an evaluation scores."""
    from trainer.data.dataset import Dataset, val_batches

    dataset = Dataset.open(data)
    lengths = byte_lengths(dataset.tokenizer, Path(data))
    targets = nbytes = 0
    for rows in val_batches(dataset, 256, eval_samples or None):
        scored = rows[:, 1:][rows[:, 1:] != dataset.pad_id]
        targets += int(scored.size)
        nbytes += int(lengths[scored].sum())
    return targets, nbytes


def byte_lengths(identity: dict[str, Any], data: Path) -> np.ndarray:
    """UTF-8 bytes of each token id (0 for the special tokens)."""
    lengths = np.zeros(identity["vocab_size"], dtype=np.int64)
    if identity["kind"] == "byte":
        lengths[:256] = 1
        return lengths
    try:
        from tokenizers import Tokenizer, pre_tokenizers
    except ImportError:
        raise MetricError(
            "val_bpb of a tokenizer.json dataset needs the tokenizers extra: "
            "pip install 'mlx-fleet[tokenizers]'"
        ) from None
    path = identity.get("path") or str(data / "tokenizer.json")
    tok = Tokenizer.from_file(path)
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())  # one character per byte
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    for token, i in tok.get_vocab().items():
        if token in special:
            continue
        if not set(token) <= alphabet:
            raise MetricError(f"{path}: token {token!r} is not byte-level: bytes unknown")
        lengths[i] = len(token)
    return lengths


def to_metric(metric: str, val_loss: float, val_tokens: int, data: str, samples: int) -> float:
    """The sweep's metric from one evaluation: val_loss as it is, or in bits per byte."""
    if metric == "val_loss" or not math.isfinite(val_loss):
        return val_loss
    targets, nbytes = val_bytes(data, samples)
    if targets != val_tokens:
        raise MetricError(
            f"the evaluation scored {val_tokens} targets, the held-out rows hold {targets}: "
            "the dataset changed under the sweep"
        )
    return val_loss * targets / (nbytes * math.log(2))


@dataclass
class Progress:
    """A trial's run so far, from its telemetry logs."""

    evals: dict[int, tuple[float, int]] = field(default_factory=dict)  # step -> (loss, tokens)
    losses: dict[int, float] = field(default_factory=dict)  # step -> train loss (rank 0)
    tokens_per_s: float = 0.0  # median over the run, all ranks together
    peak_mem: int = 0  # bytes, the largest of any rank
    error: str = ""  # the last `error` event's message
    stopped: str = ""  # the last `stopped` event's reason
    step: int = 0  # the newest update logged

    @property
    def last_eval(self) -> int:
        return max(self.evals, default=0)


def progress(run_dir: str | Path) -> Progress:
    """Read a trial's logs (a resumed run's segments in order; a step seen twice, as after a
    resume from an earlier checkpoint, keeps its newest record)."""
    out = Progress()
    try:
        events = read_events(run_dir, 0)
        updates = read_updates(run_dir).to_pylist()
    except TelemetryError:
        return out
    for e in events:
        if e.kind == "eval" and "val_loss" in e.data:
            out.evals[int(e.step)] = (float(e.data["val_loss"]), int(e.data.get("val_tokens", 0)))
        elif e.kind == "error":
            out.error = e.message
        elif e.kind == "stopped":
            out.stopped = str(e.data.get("reason") or e.message)
    rates = []
    for u in updates:
        out.peak_mem = max(out.peak_mem, int(u.get("peak_mem") or 0))
        if u["rank"] == 0:
            out.losses[int(u["step"])] = float(u["loss"])
            out.step = max(out.step, int(u["step"]))
            if u["update_s"]:
                rates.append(u["update_tokens"] / u["update_s"])
    out.tokens_per_s = statistics.median(rates) if rates else 0.0
    return out
