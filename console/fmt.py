"""Short human figures for narrow columns: bytes, seconds, rates, counts."""

from __future__ import annotations

import math
import time


def nbytes(n: float | None) -> str:
    """`512M`, `12.3G`: binary units, at most 5 characters."""
    if n is None:
        return "—"
    n = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(n) < 1000 or unit == "T":
            if unit == "B":
                return f"{n:.0f}B"
            return f"{n:.1f}{unit}" if abs(n) < 10 else f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}T"  # pragma: no cover - the loop always returns


def secs(s: float | None) -> str:
    """`0.532s`, `12.5s`, `340ms` for an update's duration."""
    if s is None or math.isnan(s):
        return "—"
    if s < 1:
        return f"{s * 1000:.0f}ms"
    if s < 100:
        return f"{s:.2f}s" if s < 10 else f"{s:.1f}s"
    return f"{s:.0f}s"


def duration(s: float | None) -> str:
    """`4h12m`, `3m05s`, `42s` for an ETA or an age."""
    if s is None or math.isnan(s) or s < 0:
        return "—"
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400 * 2:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def count(n: float | None) -> str:
    """`950`, `12.3k`, `4.56M`, `1.2B` for tokens and rates."""
    if n is None:
        return "—"
    n = float(n)
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.2f}{unit}" if v < 10 else f"{v:.1f}{unit}" if v < 100 else f"{v:.0f}{unit}"
    return f"{n:.0f}"


def clock(t: float) -> str:
    """Local wall-clock time of day, `14:03:07`."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def stamp(t: float) -> str:
    """Local date and time, `2026-12-01 14:03:07`, for when a run ended."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
