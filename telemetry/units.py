"""Byte units, defined once for the whole product, and how a size reads in a message."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def gib_text(n: float) -> str:
    """A size in GiB with one decimal, as checks and refusals state limits: "3.5 GiB"."""
    return f"{n / GiB:.1f} GiB"


def size_text(n: float) -> str:
    """A size in the unit that reads best: "512 KiB", "12 MiB", "3.50 GiB" (never "0.01 GiB")."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            v = n / scale
            return (
                f"{v:.2f} {unit}"
                if unit == "GiB"
                else f"{v:.1f} {unit}"
                if v < 10
                else f"{v:.0f} {unit}"
            )
    return f"{n:.0f} B"
