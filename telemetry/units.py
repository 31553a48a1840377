"""Byte units, defined once for the whole product, and how a size reads in a message."""

from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def gib_text(n: float) -> str:
    """A size in GiB with one decimal, as checks and refusals state limits: "3.5 GiB"."""
    return f"{n / GiB:.1f} GiB"
