"""The KV cache beside the model: one block's keys and values so far, grown in steps."""

from __future__ import annotations

import mlx.core as mx

CACHE_STEP = 256  # positions a cache grows by: one copy per 256 tokens, not one per token


class KVCache:
    """One block's keys and values so far, shaped (batch, heads, positions, head_dim)."""

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0  # positions held: the next token's position

    def update(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        """Append the new positions' keys and values; returns all of them so far."""
        start, stop = self.offset, self.offset + k.shape[2]
        if self.keys is None or stop > self.keys.shape[2]:
            grow = -(-(stop - start) // CACHE_STEP) * CACHE_STEP
            B, H, _, D = k.shape
            new_k, new_v = mx.zeros((B, H, grow, D), k.dtype), mx.zeros((B, H, grow, D), v.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys[..., :start, :], new_k], axis=2)
                self.values = mx.concatenate([self.values[..., :start, :], new_v], axis=2)
        self.keys[..., start:stop, :] = k
        self.values[..., start:stop, :] = v
        self.offset = stop
        return self.keys[..., :stop, :], self.values[..., :stop, :]
