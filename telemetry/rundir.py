"""The run folder's layout, in one place: every path inside RUN that the trainer, telemetry and
the console read or write.

    RUN/
      config.json          the resolved config of the newest session (rank 0)
      lock                 held by the run's ranks on this host: one writer (trainer/lock.py)
      control.key          the per-run HMAC key for control commands (mode 0600)
      checkpoints/         step-NNNNNN/ folders, `latest` and `best` (trainer/checkpoint)
      telemetry/           rank-N.arrow logs, rank-N.sock, ports.json (telemetry)
      ranks/               rank-N.json heartbeats (trainer/heartbeat.py)
      launch/              hostfiles of restarts that shrank the fleet (trainer/launch)
      trackers/            what --report-to writes here: tensorboard/, swanlog/, wandb/

The same names serve a run folder on another host: `at(PurePosixPath(remote))` keeps the path
type it is given, so the console builds remote paths with them too.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path, PurePath

CONFIG = "config.json"
LOCK = "lock"
CONTROL_KEY = "control.key"
CHECKPOINTS = "checkpoints"
TELEMETRY = "telemetry"
PORTS = "ports.json"  # inside TELEMETRY
RANKS = "ranks"
LAUNCH = "launch"
TRACKERS = "trackers"
CHECKPOINT_MANIFEST = "manifest.json"  # a checkpoint's last file (trainer/checkpoint/manifest.py)
ASIDE = ".old-"  # RUN.old-20261201-143000: a run that `fleet train --overwrite` moved aside


@dataclass(frozen=True, slots=True)
class RunDir:
    """A run folder and the paths inside it."""

    root: PurePath

    @property
    def config(self) -> PurePath:
        return self.root / CONFIG

    @property
    def lock(self) -> PurePath:
        return self.root / LOCK

    @property
    def control_key(self) -> PurePath:
        return self.root / CONTROL_KEY

    @property
    def checkpoints(self) -> PurePath:
        return self.root / CHECKPOINTS

    @property
    def telemetry(self) -> PurePath:
        return self.root / TELEMETRY

    @property
    def ports(self) -> PurePath:
        return self.telemetry / PORTS

    @property
    def ranks(self) -> PurePath:
        return self.root / RANKS

    @property
    def launch(self) -> PurePath:
        return self.root / LAUNCH

    @property
    def trackers(self) -> PurePath:
        return self.root / TRACKERS


def at(run_dir: str | os.PathLike[str]) -> RunDir:
    """The layout of the run folder `run_dir`: a local Path unless given a PurePath already."""
    root = run_dir if isinstance(run_dir, PurePath) else Path(run_dir)
    return RunDir(root)


def held(run_dir: str | os.PathLike[str]) -> list[str]:
    """What of a run the folder holds, as short phrases ([] when it holds none).

    A run is what `fleet train` leaves: its config.json, checkpoints, telemetry logs. A folder
    that is missing, empty, or holds only other files (`mkdir`, the demo's launch log) holds
    no run, and a new run may take it.
    """
    where = at(run_dir)
    root = Path(where.root)
    if not root.is_dir():
        return []
    out = [CONFIG] if Path(where.config).is_file() else []
    ckpts = Path(where.checkpoints)
    saved = sorted(
        p.name
        for p in (ckpts.iterdir() if ckpts.is_dir() else ())
        if not p.is_symlink()
        and not p.name.startswith(".")
        and (p / CHECKPOINT_MANIFEST).is_file()  # a save that never completed is none
    )
    if saved:
        out.append(f"{len(saved)} checkpoint{'s' if len(saved) > 1 else ''} up to {saved[-1]}")
    logs = Path(where.telemetry)
    ranks = {
        p.name.removeprefix("events-").split(".")[0]
        for p in (logs.glob("*.arrow") if logs.is_dir() else ())
    }
    if ranks:
        out.append(f"telemetry logs of {len(ranks)} rank{'s' if len(ranks) > 1 else ''}")
    return out


def refusal(run_dir: str | os.PathLike[str], what: list[str] | None = None) -> str:
    """Why a new run does not take `run_dir`, with the ways on; "" when it holds no run."""
    what = held(run_dir) if what is None else what
    if not what:
        return ""
    shown = str(run_dir).rstrip("/") or str(run_dir)
    return (
        f"{shown} already holds a run ({', '.join(what)}): continue it with --resume latest, "
        f"start a new one with another --run-dir, or pass --overwrite to move it aside to "
        f"{shown}{ASIDE}<time> first (nothing is deleted)"
    )


def aside_name(run_dir: str | os.PathLike[str], now: float | None = None) -> Path:
    """Where `move_aside` puts the run: RUN.old-YYYYmmdd-HHMMSS beside it, never a taken name."""
    root = Path(run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    dest, n = root.with_name(f"{root.name}{ASIDE}{stamp}"), 1
    while dest.exists():
        n += 1
        dest = root.with_name(f"{root.name}{ASIDE}{stamp}-{n}")
    return dest


def move_aside(run_dir: str | os.PathLike[str]) -> Path | None:
    """Rename the whole run folder to `aside_name` (nothing is deleted); returns where it went,
    or None when it was gone already (another rank of this host moved it first)."""
    root = Path(run_dir)
    dest = aside_name(root)
    try:
        os.rename(root, dest)
    except FileNotFoundError:
        return None
    return dest
