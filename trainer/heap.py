"""glibc's heap, held between updates: a rank whose batch grows does not fault its pages in anew.

On Linux, MLX's CPU allocator is plain malloc, and glibc adapts its thresholds as it goes: a
freed block under the mmap threshold goes back to the heap, and the heap's free top is given
back to the system once it passes the trim threshold, both raised to the largest block freed
so far. A rank that starts at its batch settles; one that grows into a batch larger than any it
freed keeps giving its pages back and taking them anew. Measured here (session 38,
benchmarks/RESULTS.md): the trainer's Stepper at 12 samples after 8 took about 14,000 minor
page faults an update, against 1,700 at 12 from the start; with the thresholds fixed (mmap only
above MMAP_THRESHOLD, no trim of the heap's top under TRIM_THRESHOLD), 0 at either. In sessions
35-36's quiet pair runs, the rank the pilot had given samples read 2-15% dearer a sample than
the same rank at the same split in the fixed arm (7-15% in the transient's slow phase), and
the pilot steered by it: a rank that took samples looked dearer than it was. What a rank frees
is now kept for its next update; `resized` gives it back where the batch shrinks (a rank
relieved for memory).

macOS (the fleet's own machines) has its own malloc and Metal its own buffer cache: nothing to
do there. The environment's own malloc settings (MALLOC_*_, GLIBC_TUNABLES) are left alone.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

from telemetry.units import MiB

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
# glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX): a block above it is
# mapped and unmapped each time whatever is set (MLX's largest arrays at a big model's size)
MMAP_THRESHOLD = 32 * MiB
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: glibc trims no free top under 2 GiB itself
SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_held: ctypes.CDLL | None = None  # the C library, once `hold` has fixed its thresholds


def _libc() -> ctypes.CDLL | None:
    """This process's C library where it is glibc's, else None."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(None)


def _chosen() -> bool:
    """Whether the environment sets glibc's malloc itself."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    return any(k in os.environ for k in SETTINGS) or "glibc.malloc." in tunables


def hold() -> str | None:
    """Fix glibc's mmap and trim thresholds for this process (see the module docstring); the
    line for the run's log, or None where there is no glibc."""
    global _held
    libc = _libc()
    if libc is None:
        return None
    if _chosen():
        return "heap: glibc's malloc as the environment sets it"
    if not (
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        return "heap: glibc's own thresholds (mallopt refused)"
    _held = libc
    return f"heap held (glibc: what a rank frees under {MMAP_THRESHOLD // MiB} MiB is reused)"


def resized(old: int, new: int) -> None:
    """A rank's local batch changed from `old` to `new` samples: where it shrank (a rank
    relieved for memory) and `hold` kept what the larger batch freed, that goes back to the
    system (a few ms)."""
    if new < old and _held is not None:
        _held.malloc_trim(0)
