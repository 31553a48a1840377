"""One writer per run folder per host: `RUN/lock`, held by the ranks of one run on this host.

Two `fleet train` processes on one folder would save and prune the same steps and resume
each other's branches. The lock is `flock` on a file in the run folder (Linux and macOS
alike): the kernel releases it when its holder dies, however it dies, so a crash never leaves
a folder locked. The first rank of a run on this host to get it writes its pid, host and the
run's token inside; the other ranks of the same run (same token) find it held by their own
run and go on; any other process is refused, naming the owner.

The token: `FLEET_LAUNCH_ID`, one per attempt of `fleet launch`; under plain mlx.launch or
mpirun, a random number rank 0 hands to every rank in one tiny all-reduce.

The file is never renamed or removed (a new file would be a second lock); its contents are
rewritten in place by the holder.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from telemetry import rundir
from trainer.config import ConfigError

try:  # POSIX (Linux, macOS): the only platforms MLX trains on
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LAUNCH_ID_ENV = "FLEET_LAUNCH_ID"  # set by fleet launch for every rank of one attempt
# Locks held until the process ends (the lock lives with the descriptor): folder -> (fd, run
# token, rank), so that a folder removed mid-run can be locked again (trainer/keeper.py).
_HELD: dict[str, tuple[int, str, int]] = {}


class RunInUse(ConfigError):
    """The run folder is being written by another process."""


@dataclass(frozen=True)
class Owner:
    """Who holds a run folder's lock."""

    pid: int
    host: str
    run: str  # the token of the run it belongs to
    rank: int
    since: float

    def describe(self) -> str:
        if not self.pid:
            return "another process (it left no note of who it is)"
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} (rank {self.rank} of a run started {when})"


def token(all_sum: Callable[[list[float]], list[float]], is_root: bool) -> str:
    """The run's token, the same on every rank: FLEET_LAUNCH_ID, else rank 0's random
    number (two 24-bit halves: FP32 holds each exactly) summed with zeros from the others."""
    given = os.environ.get(LAUNCH_ID_ENV)
    if given:
        return given
    mine = [float(secrets.randbits(24)), float(secrets.randbits(24))] if is_root else [0.0, 0.0]
    hi, lo = (int(round(v)) for v in all_sum(mine))
    return f"{hi:06x}{lo:06x}"


def claim(run_dir: str | os.PathLike[str], run: str, rank: int) -> str:
    """Hold the lock for run `run` on this host, or find a rank of that run holding it;
    "" then, else the refusal in one line (naming the owner)."""
    if fcntl is None:  # pragma: no cover
        return ""
    path = Path(rundir.at(run_dir).lock)
    try:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        fd = _open(path)
    except OSError as e:
        return f"cannot lock {path}: {e.strerror or e}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return f"{path} is not a regular file: remove it"
        holder = _lock(fd)
    except OSError as e:
        os.close(fd)
        return f"cannot lock {path}: {e.strerror or e}"
    if holder is not None:
        os.close(fd)
        if holder.run == run:
            return ""  # another rank of this run, on this host
        return (
            f"run folder {run_dir} is in use by {holder.describe()}; stop that run first, or "
            "give another --run-dir"
        )
    me = Owner(os.getpid(), socket.gethostname(), run, rank, time.time())
    with contextlib.suppress(OSError):  # the lock holds without its note
        blob = json.dumps(me.__dict__).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, blob, 0)
    _HELD[os.path.abspath(run_dir)] = (fd, run, rank)
    return ""


def hold(
    run_dir: str | os.PathLike[str],
    rank: int,
    world: int,
    all_sum: Callable[[list[float]], list[float]],
) -> None:
    """Every rank's claim, agreed: RunInUse on every rank if any was refused (a collective
    when world > 1, so no rank trains on alone)."""
    run = token(all_sum, rank == 0)
    why = claim(run_dir, run, rank)
    refused = all_sum([1.0 if why else 0.0])[0] if world > 1 else float(bool(why))
    if why:
        raise RunInUse(why)
    if refused:
        raise RunInUse(f"another rank found run folder {run_dir} in use (its message says by whom)")


def release(run_dir: str | os.PathLike[str]) -> None:
    """Let go of this process's lock on `run_dir`: the end of a run that returns rather than
    exits (an in-process `fleet train`, as tests and benchmarks call it). A process that
    ends releases it anyway."""
    held = _HELD.pop(os.path.abspath(run_dir), None)
    if held is not None:
        with contextlib.suppress(OSError):
            os.close(held[0])  # closing the descriptor drops the flock


def intact(run_dir: str | os.PathLike[str]) -> bool:
    """Whether the lock this process holds on `run_dir` is still the folder's lock file
    (False once the file, or the whole folder, was removed or replaced)."""
    held = _HELD.get(os.path.abspath(run_dir))
    if held is None:
        return True  # held by another rank of this run, or never: nothing to check here
    try:
        mine, now = os.fstat(held[0]), os.stat(rundir.at(run_dir).lock)
    except OSError:
        return False
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def retake(run_dir: str | os.PathLike[str]) -> str:
    """Lock a folder again whose lock file went missing; "" or why it could not."""
    fd, run, rank = _HELD.pop(os.path.abspath(run_dir))
    os.close(fd)
    return claim(run_dir, run, rank)


def owner(run_dir: str | os.PathLike[str]) -> Owner | None:
    """Who holds the run folder now, or None (the lock is free, or was never made); for
    `fleet launch`, which refuses before starting anything. Takes nothing."""
    if fcntl is None:  # pragma: no cover
        return None
    path = Path(rundir.at(run_dir).lock)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _owner(fd, wait=2.0)
    finally:
        os.close(fd)  # a shared lock taken here goes with it
    return None


def _open(path: Path) -> int:
    # Never through a link (a planted `lock` pointing elsewhere), never into a child process
    # (an alert command that outlives the rank would keep the folder locked).
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o644)


def _lock(fd: int, wait: float = 2.0) -> Owner | None:
    """Take the lock (None), or the live holder that has it. A moment's hold by `owner()`
    elsewhere, or the note of a holder that has just died, is waited out."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            pass
        holder = _owner(fd, wait=0.5)
        if holder is not None and (holder.host != socket.gethostname() or _alive(holder.pid)):
            return holder
        if time.monotonic() > deadline:  # held, by whom it does not say
            return holder or Owner(0, "this host", "", -1, time.time())
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(fd: int, wait: float) -> Owner | None:
    """The holder's note; it writes it right after locking, so an empty file is waited for."""
    deadline = time.monotonic() + wait
    while True:
        with contextlib.suppress(OSError, ValueError, TypeError):
            raw = os.pread(fd, 4096, 0)
            if raw:
                return Owner(**json.loads(raw))
        if time.monotonic() > deadline:
            return None
        time.sleep(0.05)
