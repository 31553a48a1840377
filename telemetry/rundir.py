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

The same names serve a run folder on another host: `at(PurePosixPath(remote))` keeps the path
type it is given, so the console builds remote paths with them too.
"""

from __future__ import annotations

import os
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


def at(run_dir: str | os.PathLike[str]) -> RunDir:
    """The layout of the run folder `run_dir`: a local Path unless given a PurePath already."""
    root = run_dir if isinstance(run_dir, PurePath) else Path(run_dir)
    return RunDir(root)
