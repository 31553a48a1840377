"""The live progress line rank 0 prints after each update."""

from __future__ import annotations

import sys
import time

from telemetry.records import Update
from telemetry.units import size_text


def human_tokens(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class Progress:
    """Formats one line per update: step, loss, tokens/s, peak memory, lr, ETA, and the
    per-rank compute/wait with the slowest rank marked when there is more than one."""

    def __init__(self, total_updates: int, stream=None) -> None:
        self.total = total_updates
        self.stream = stream or sys.stdout
        self.ema: float | None = None  # smoothed update time, for the ETA
        self.started = time.monotonic()

    def line(self, rec: Update, ranks: list[tuple[float, float, float]] | None = None) -> str:
        """`ranks`: per rank (compute_s, wait_s, peak bytes) for the cluster view."""
        self.ema = rec.update_s if self.ema is None else 0.9 * self.ema + 0.1 * rec.update_s
        eta = self.ema * max(0, self.total - rec.step)
        tps = rec.update_tokens / rec.update_s if rec.update_s > 0 else 0.0
        peak = max((r[2] for r in ranks), default=rec.peak_mem) if ranks else rec.peak_mem
        parts = [
            f"step {rec.step:>{len(str(self.total))}}/{self.total}",
            f"loss {rec.loss:.4f}",
            f"{human_tokens(tps)} tok/s",
            f"peak {size_text(peak)}",
            f"lr {rec.lr:.2e}",
            f"{rec.update_s * 1000:.0f} ms",
            f"eta {duration(eta)}",
        ]
        if ranks and len(ranks) > 1:
            slowest = max(range(len(ranks)), key=lambda r: ranks[r][0])
            cells = [
                f"{'*' if r == slowest else ''}r{r} {c * 1000:.0f}/{w * 1000:.0f}"
                for r, (c, w, _) in enumerate(ranks)
            ]
            parts.append("compute/wait ms " + " ".join(cells))
        return " | ".join(parts)

    def print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
