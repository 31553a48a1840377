"""mlx.launch's output held in memory while nothing reads it, so that its loop never blocks.

mlx.launch's main loop both copies the ranks' output to its own and relays fleet launch's
lifeline to the ranks. Output that nobody reads (Ctrl-S in the terminal, `| less` left
alone, a stalled ssh terminal) fills the pipe within seconds at a line per update, the
loop blocks in its write, the lifeline stops, and every rank stops for "a lost lifeline"
although fleet launch is there. A `Spool` puts a pipe of its own in front of a descriptor:
one thread reads it into memory, another writes that on, blocking as long as the reader
of the output does; what came last is kept (up to `CAP_BYTES`) and a line says how much
of the oldest was left out.

No mlx here: the tether (trainer/launch/lifeline.py) installs it inside mlx.launch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from collections import deque

CAP_BYTES = 8 << 20  # about 60,000 progress lines (130 bytes): most of a day at 1 update/s
CLOSE_WAIT_S = 2.0  # at exit, how long the last bytes in the pipe may take to be read


class Spool:
    """A pipe in front of `fd`, drained into memory and written on to what `fd` was."""

    def __init__(self, fd: int, cap: int = CAP_BYTES) -> None:
        self.fd, self.cap = fd, cap
        self.target = os.dup(fd)  # the terminal, file or pipe the output goes to
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)  # inheritable, as `fd` was: a child may write to it
        os.close(write_end)
        self._read_end = read_end
        self._chunks: deque[bytes] = deque()
        self._held = 0  # bytes in _chunks
        self._dropped = 0  # bytes left out since the last note
        self._ended = False  # nothing more will be read
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="fleet-spool-in", daemon=True)
        self._writer = threading.Thread(target=self._write, name="fleet-spool-out", daemon=True)
        self._reader.start()
        self._writer.start()

    def close(self) -> None:
        """At exit: `fd` writes straight to its target again, and everything held reaches it
        (this waits as long as the target's reader does, as any program's output would)."""
        os.dup2(self.target, self.fd)  # closes the pipe's write end: the reader sees its end
        self._reader.join(CLOSE_WAIT_S)  # (a child that kept the write end: don't wait on it)
        with self._cond:
            self._ended = True
            self._cond.notify_all()
        self._writer.join()
        os.close(self.target)

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._read_end, 1 << 16)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    with contextlib.suppress(OSError):
                        os.close(self._read_end)
                    self._ended = True
                    self._cond.notify_all()
                    return
                self._chunks.append(data)
                self._held += len(data)
                while self._held > self.cap and len(self._chunks) > 1:
                    old = self._chunks.popleft()  # the oldest goes: the newest says where it is
                    self._held -= len(old)
                    self._dropped += len(old)
                self._cond.notify_all()

    def _write(self) -> None:
        while True:
            with self._cond:
                while not self._chunks and not self._ended:
                    self._cond.wait()
                if not self._chunks:
                    return
                data = self._chunks.popleft()
                self._held -= len(data)
                dropped, self._dropped = self._dropped, 0
            if dropped:
                data = left_out(dropped) + data
            self._write_all(data)

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.target, view) :]
            except InterruptedError:
                continue
            except OSError:  # the reader is gone (fleet launch killed): nothing to write to
                return


def left_out(size: int) -> bytes:
    """The line that stands for output dropped while nothing read it."""
    return (
        f"\nfleet launch: {size / (1 << 20):.1f} MiB of the run's output left out here: "
        "nothing read it for a while\n"
    ).encode()


def install(fds: tuple[int, ...] = (1, 2)) -> None:
    """A spool in front of each of `fds` (1 and 2: stdout and stderr), closed (its output
    delivered) at exit. A descriptor that is closed (`fleet launch >&-`) becomes /dev/null:
    output nobody wants, where mlx.launch would otherwise fail on a missing sys.stdout."""
    for fd in fds:
        _open_or_null(fd)
    if sys.stdout is None:
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's own, kept open
    if sys.stderr is None:
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    spools = [Spool(fd) for fd in fds]

    def deliver() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for spool in spools:
            spool.close()

    atexit.register(deliver)


def _open_or_null(fd: int) -> None:
    """Leave `fd` as it is if open, else point it at /dev/null."""
    try:
        os.fstat(fd)
    except OSError:
        null = os.open(os.devnull, os.O_WRONLY)  # the lowest free descriptor: maybe `fd`
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
