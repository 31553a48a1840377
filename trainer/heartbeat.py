"""Each rank's last sign of life, in a small file that its peers and `fleet launch` read while a
collective hangs: who stopped making progress, where, and since when.

`RUN/ranks/rank-N.json` is rewritten about once a second by the rank's watchdog thread (never by
the training loop): its stage, the update, when that stage began, and when it last beat. A rank
that is stopped (SIGSTOP, a Mac deep in swap) stops beating; one that died leaves a pid that is
gone. Ranks on other hosts write their own run folder, so this names local peers only.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from telemetry import rundir
from telemetry.files import read_regular

STALE_S = 3.0  # a rank that has not beaten for this long (3 beats) is not responding
# The stages in the order a rank passes them between two updates (the step counts up right
# before "report"): at one step, a rank in an earlier stage is behind the others, which wait
# for it in the next collective.
ORDER = (
    "report",
    "checkpoint",
    "control",
    "paused",
    "eval",
    "compute",
    "barrier",
    "all-reduce",
    "optimizer",
)


@dataclass(frozen=True)
class Beat:
    """One rank's sign of life."""

    rank: int
    pid: int
    host: str
    stage: str
    step: int
    stage_since: float  # wall-clock time the stage began
    beat: float  # wall-clock time of this beat


def path(run_dir: str | Path, rank: int) -> Path:
    return rundir.at(run_dir).ranks / f"rank-{rank}.json"


def write(run_dir: str | Path, rank: int, stage: str, step: int, stage_since: float) -> None:
    """Replace this rank's beat (a rename: readers never see half a file; no fsync: advisory)."""
    p = path(run_dir, rank)
    p.parent.mkdir(parents=True, exist_ok=True)
    beat = Beat(rank, os.getpid(), socket.gethostname(), stage, step, stage_since, time.time())
    tmp = p.with_name(f".{p.name}.{os.getpid()}")
    tmp.write_text(json.dumps(asdict(beat)))
    os.replace(tmp, p)


def read_all(run_dir: str | Path) -> dict[int, Beat]:
    """Every rank's last beat found in the run folder, by rank (unreadable files are skipped)."""
    beats = {}
    for p in sorted(rundir.at(run_dir).ranks.glob("rank-*.json")):
        with contextlib.suppress(OSError, ValueError, TypeError):
            b = Beat(**json.loads(read_regular(p, 1 << 16)))  # a FIFO there must not hang us
            beats[b.rank] = b
    return beats


def _gone(b: Beat) -> bool:
    """The rank's process no longer exists, or is a zombie (ranks on this host only)."""
    if b.host != socket.gethostname():
        return False
    try:
        return psutil.Process(b.pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def _progress(b: Beat) -> tuple[int, int, float]:
    """How far a rank has come: update, stage within it, then how late it entered the stage."""
    stage = ORDER.index(b.stage) if b.stage in ORDER else len(ORDER)
    return (b.step, stage, b.stage_since)


def culprit(beats: dict[int, Beat], now: float | None = None, exclude: int | None = None) -> str:
    """Name the rank that stopped making progress, in one phrase, or "" if none stands out.

    Order of evidence: of the ranks whose process is gone or that stopped beating, the one
    silent the longest; else the rank that is furthest behind (lowest update, earliest stage),
    since the healthy ones have moved on and wait for it in a collective.
    """
    now = time.time() if now is None else now
    peers = {r: b for r, b in beats.items() if r != exclude}
    # The first to go silent is the cause; ranks that exited after it (their watchdogs
    # fired, or they lost it as a peer) beat until later.
    silent = [b for b in peers.values() if _gone(b) or now - b.beat > STALE_S]
    if silent:
        b = min(silent, key=lambda b: b.beat)
        if _gone(b):
            return (
                f"rank {b.rank} (pid {b.pid}) is gone; last seen in '{b.stage}' at update {b.step}"
            )
        return (
            f"rank {b.rank} stopped responding {now - b.beat:.0f} s ago, in '{b.stage}' at "
            f"update {b.step} (stopped, hung or swapping)"
        )
    if len(beats) > 1:
        behind = min(beats.values(), key=_progress)
        ahead = max(beats.values(), key=_progress)
        if behind.rank != exclude and _progress(ahead)[:2] > _progress(behind)[:2]:
            return (
                f"rank {behind.rank} is behind, in '{behind.stage}' at update {behind.step} "
                f"for {now - behind.stage_since:.0f} s"
            )
    return ""


def clear(run_dir: str | Path, rank: int) -> None:
    """Remove this rank's beat at a clean exit (a finished rank is not a stalled one)."""
    with contextlib.suppress(OSError):
        path(run_dir, rank).unlink()
