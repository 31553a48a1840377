"""The sweep folder's layout, in one place.

SWEEP/
  spec.toml            the spec it runs (a resume must bring the same one)
  study.db             Optuna's SQLite storage (only the controller writes it)
  controller.json      the controller's pid and its last sign of life
  trials/0007/         trial 7's run folder (a real run: telemetry, checkpoints, report)
  trials/0007.log      its output (fleet launch's and the ranks')
  fleet/part-1.json    the hostfile's part 1, when trials run side by side
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from telemetry.files import atomic_write

SPEC = "spec.toml"
STUDY = "study.db"
CONTROLLER = "controller.json"
TRIALS = "trials"
FLEET = "fleet"


@dataclass(frozen=True)
class SweepDir:
    """A sweep folder and the paths inside it."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / SPEC

    @property
    def study(self) -> Path:
        return self.root / STUDY

    @property
    def storage_url(self) -> str:
        return f"sqlite:///{self.study.resolve()}"

    @property
    def controller(self) -> Path:
        return self.root / CONTROLLER

    def trial(self, number: int) -> Path:
        return self.root / TRIALS / f"{number:04d}"

    def log(self, number: int) -> Path:
        return self.root / TRIALS / f"{number:04d}.log"

    def part(self, index: int) -> Path:
        return self.root / FLEET / f"part-{index}.json"


def at(folder: str | os.PathLike[str]) -> SweepDir:
    return SweepDir(Path(folder))


def is_sweep(folder: str | os.PathLike[str]) -> bool:
    """Whether `folder` is a sweep folder (`fleet report` hands those over to the sweep's)."""
    d = at(folder)
    return d.spec.is_file() and d.study.is_file()


def beat(folder: Path, **extra: object) -> None:
    """The controller's sign of life, for `fleet sweep status`."""
    atomic_write(
        at(folder).controller,
        json.dumps({"pid": os.getpid(), "beat": time.time(), **extra}) + "\n",
    )


def controller_alive(folder: Path, stale_s: float = 30.0) -> dict | None:
    """The controller's record when it beat recently and its process exists, else None."""
    try:
        record = json.loads(at(folder).controller.read_text())
        pid, when = int(record["pid"]), float(record["beat"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if time.time() - when > stale_s:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return record
