"""Reconnect delays as a tiny strategy object: exponential, capped, jittered."""

from __future__ import annotations

import random


class Backoff:
    """Delays of `initial * factor**n`, capped at `max`, each scaled by 1 ± `jitter`.

    Use `next()` before each retry and `reset()` after a success. Jitter keeps many
    consoles that lost the same rank from reconnecting in lockstep.
    """

    def __init__(
        self,
        initial: float = 0.5,
        factor: float = 2.0,
        max: float = 30.0,  # shadows the builtin: the name callers expect
        jitter: float = 0.1,
        *,
        rng: random.Random | None = None,
    ) -> None:
        if initial <= 0 or factor < 1 or max < initial or not 0 <= jitter < 1:
            raise ValueError(
                f"Backoff needs 0 < initial <= max, factor >= 1 and 0 <= jitter < 1 "
                f"(got initial={initial}, factor={factor}, max={max}, jitter={jitter})"
            )
        self.initial = initial
        self.factor = factor
        self.max = max
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.attempts = 0

    def next(self) -> float:
        """The delay in seconds before the next attempt; each call backs off further."""
        base = min(self.max, self.initial * self.factor**self.attempts)
        if base < self.max:  # stop growing the exponent once capped (no float overflow)
            self.attempts += 1
        spread = base * self.jitter
        return max(0.0, base + self._rng.uniform(-spread, spread))

    def reset(self) -> None:
        """Start again from `initial` (call after a successful connection)."""
        self.attempts = 0
