"""Token arrays packed into fixed-length rows, each row sent to the train or val subset.

Rows are cut from the token stream back to back, and a row is held out for validation by a
hash of its index (`is_val_row`), not by document, so a corpus of a few large files still
gets the requested fraction; the cost is that a validation row's neighbours in its document
may be training rows.
"""

from __future__ import annotations

import numpy as np

from trainer.data.shard_writer import ShardWriter

ROW_HASH_SALT = 0x9E3779B97F4A7C15  # splitmix64's increment: seeds the held-out rows' hash


def row_hash(index: np.ndarray) -> np.ndarray:
    """splitmix64 of each row index: a fixed, well-mixed hash that picks the validation rows."""
    z = index.astype(np.uint64) + np.uint64(ROW_HASH_SALT)  # uint64 arrays wrap silently
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def is_val_row(index: np.ndarray, fraction: float) -> np.ndarray:
    """Whether each row index is held out for validation (row 0 never is)."""
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    chosen = (row_hash(index) >> np.uint64(11)) < np.uint64(int(fraction * (1 << 53)))
    return chosen & (index != 0)


class Packer:
    """Packs token arrays into rows of `width` and routes them to the train or val writer.

    Holds fewer than one row group of tokens, plus the newest whole row: that row is routed
    only once the next one exists, so the final row can go to validation when the hash gave
    it no rows at all (small corpora must still get a validation set).
    """

    def __init__(
        self,
        width: int,
        dtype: type[np.unsignedinteger],
        pad: int,
        fraction: float,
        train: ShardWriter,
        val: ShardWriter,
        group: int,
    ) -> None:
        self.width, self.dtype, self.pad, self.fraction = width, dtype, pad, fraction
        self.train, self.val = train, val
        self.flush_at = width * group
        self.parts: list[np.ndarray] = []
        self.pending = 0
        self.held: np.ndarray | None = None
        self.next_row = 0  # global index of the held row (rows before it are routed)
        self.tokens = 0
        self.pad_tokens = 0

    def add(self, ids: np.ndarray) -> None:
        """Append token ids to the stream; whole rows are routed once a row group's worth waits."""
        self.parts.append(ids)
        self.pending += len(ids)
        self.tokens += len(ids)
        if self.pending >= self.flush_at:
            self._cut(final=False)

    def _cut(self, final: bool) -> None:
        if not self.parts:
            self.parts = [np.zeros(0, dtype=self.dtype)]
        stream = np.concatenate(self.parts).astype(self.dtype, copy=False)
        whole = len(stream) // self.width
        rows = stream[: whole * self.width].reshape(whole, self.width)
        rest = stream[whole * self.width :]
        self.parts, self.pending = ([rest], len(rest)) if len(rest) else ([], 0)
        if final and len(rest) >= 2:  # a lone trailing EOS has no target to learn: dropped
            last = np.full((1, self.width), self.pad, dtype=self.dtype)
            last[0, : len(rest)] = rest
            self.pad_tokens += self.width - len(rest)
            rows = np.concatenate([rows, last])
        if final and len(rest) == 1:
            self.tokens -= 1
        if not len(rows):
            return
        if self.held is not None:
            rows = np.concatenate([self.held[None], rows])
        self.held = rows[-1].copy()
        self._route(rows[:-1])

    def _route(self, rows: np.ndarray) -> None:
        index = np.arange(self.next_row, self.next_row + len(rows))
        val = is_val_row(index, self.fraction)
        self.train.add(rows[~val])
        self.val.add(rows[val])
        self.next_row += len(rows)

    def finish(self) -> None:
        """Pad and route the last row, and the held one (the writers still need closing)."""
        self._cut(final=True)
        if self.held is None:
            return
        index = self.next_row
        to_val = bool(is_val_row(np.array([index]), self.fraction)[0]) or (
            self.fraction > 0 and index >= 1 and self.val.rows == 0
        )
        (self.val if to_val else self.train).add(self.held[None])
        self.next_row += 1
        self.held = None
