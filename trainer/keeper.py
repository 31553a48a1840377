"""What rank 0 keeps of its run folder while it trains, and puts back when it goes missing.

A run folder removed mid-run (`rm -rf RUN`, a cleanup job, a disk swapped) leaves the rank
training on files that no longer have names: `fleet telemetry send --run-dir RUN` then finds
"no control key" for the rest of the run, and a second process could take the folder. Rank
0 holds the control key in memory, and a copy of the small files it wrote (the ports
record, the resolved config) taken as it wrote them; about every CHECK_S seconds its
watchdog thread (never the loop) writes back what is missing, takes the folder's lock
again, and says so once.
Checkpoints need nothing here: the next save makes its folder again. What was logged
before the removal is lost with it.

A key that cannot be written at all (a full disk at start) is kept in memory too: the run
goes on, and the key is written as soon as the disk lets it.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

from telemetry import auth, rundir
from telemetry.files import atomic_write

CHECK_S = 5.0  # how often rank 0 looks (one stat of the key file)


class Keeper:
    """Rank 0's memory of its run folder's small files (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike[str], warn: Callable[[str], None]) -> None:
        self.run_dir = Path(run_dir)
        self.warn = warn
        self.key: bytes | None = None
        self.copies: dict[Path, bytes] = {}  # path -> bytes, as this run wrote them
        self._next = 0.0
        self._lock = threading.Lock()
        self.restored = 0  # times something was written back (for tests and the log)

    def control_key(self) -> bytes:
        """The run's key: the folder's (kept across resumes, checked as auth.read_key checks
        it), else a new one, written if the disk allows (AuthError for a bad key file)."""
        path = Path(rundir.at(self.run_dir).control_key)
        if path.exists():
            self.key = auth.read_key(path)
            return self.key
        self.key = secrets.token_bytes(auth.KEY_BYTES)
        try:
            atomic_write(path, self.key, mode=0o600)
        except OSError as e:
            self.warn(
                f"could not write {path} ({e.strerror or e}): commands wait until it can be "
                "written (the run goes on)"
            )
        return self.key

    def keep(self, path: str | os.PathLike[str], blob: bytes) -> None:
        """Keep a copy of a small file this run writes, as it writes it (read back later, a
        folder removed in between would leave nothing to keep)."""
        self.copies[Path(path)] = blob

    def check(self, now: float | None = None) -> list[Path]:
        """Every CHECK_S s: write back what is missing; returns what was written."""
        now = time.monotonic() if now is None else now
        if now < self._next or not self._lock.acquire(blocking=False):
            return []
        try:
            self._next = now + CHECK_S
            return self._restore()
        finally:
            self._lock.release()

    def _restore(self) -> list[Path]:
        from trainer import lock

        written = []
        key_path = Path(rundir.at(self.run_dir).control_key)
        missing = [] if key_path.exists() or self.key is None else [(key_path, self.key, 0o600)]
        missing += [(p, b, 0o644) for p, b in self.copies.items() if not p.exists()]
        for path, blob, mode in missing:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(path, blob, mode=mode)
            except OSError:
                continue  # a full disk: tried again at the next check
            written.append(path)
        gone = not lock.intact(self.run_dir)
        if gone and (why := lock.retake(self.run_dir)):
            self.warn(why)
        if written or gone:
            self.restored += 1
            names = ", ".join(p.name for p in written) or "its lock"
            self.warn(
                f"{names} went missing from {self.run_dir} (the run folder removed?): written "
                "again; what was logged before now is lost"
            )
        return written
