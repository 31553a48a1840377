"""The hand-off of control commands from any thread of rank 0 to the training loop."""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class CommandResult:
    """What became of a command: applied at an update, or refused and why."""

    ok: bool
    step: int | None = None  # the update boundary at which it was applied
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "step": self.step, "result": self.result, "error": self.error}


@dataclass(slots=True)
class PendingCommand:
    """A command waiting for the next update boundary."""

    id: int
    cmd: str
    args: dict[str, Any]
    future: Future = field(default_factory=Future)

    def resolve(self, result: CommandResult) -> None:
        if not self.future.done():
            self.future.set_result(result)


class CommandQueue:
    """Thread-safe FIFO: `submit` from any thread, `poll` from the loop at a boundary."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[PendingCommand] = queue.SimpleQueue()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def submit(self, cmd: str, args: dict[str, Any] | None = None) -> Future:
        """Queue a command; the future resolves to a CommandResult once applied or refused."""
        with self._lock:
            pending = PendingCommand(next(self._ids), cmd, dict(args or {}))
        self._q.put(pending)
        return pending.future

    def poll(self) -> PendingCommand | None:
        """The oldest waiting command, or None; never blocks."""
        try:
            return self._q.get_nowait()
        except queue.Empty:
            return None

    def refuse_all(self, why: str) -> None:
        """Refuse whatever is still queued (the run is ending)."""
        while (p := self.poll()) is not None:
            p.resolve(CommandResult(ok=False, error=why))
