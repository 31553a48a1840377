"""The hand-off from link threads to the UI thread: a coalescing inbox, and what a feed is."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from console.hostfile import RankTarget
from console.model import LinkStatus
from telemetry.records import Message

INBOX_LIMIT = 100_000  # items; beyond this the UI is hopelessly behind and the oldest go


class Inbox:
    """Thread-safe queue of link reports; `notify` fires only when it goes from empty to not.

    Link threads call `link_status` / `link_message`; the UI thread calls `drain`. However many
    records arrive between two drains, the UI is woken once.
    """

    def __init__(self, notify: Callable[[], Any] | None = None) -> None:
        self.notify = notify
        self._items: deque[tuple[int, LinkStatus | Message]] = deque(maxlen=INBOX_LIMIT)
        self._lock = threading.Lock()
        self._signalled = False
        self.overflowed = 0

    def _put(self, rank: int, item: LinkStatus | Message) -> None:
        with self._lock:
            if len(self._items) == self._items.maxlen:
                self.overflowed += 1
            self._items.append((rank, item))
            wake = not self._signalled
            self._signalled = True
        if wake and self.notify is not None:
            self.notify()

    def link_status(self, status: LinkStatus) -> None:
        self._put(status.rank, status)

    def link_message(self, rank: int, message: Message) -> None:
        self._put(rank, message)

    def drain(self) -> list[tuple[int, LinkStatus | Message]]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._signalled = False
        return items


class Feed(Protocol):
    """What the app reads from: live links, a replay, or a test's fake."""

    targets: list[RankTarget]
    replay: bool

    def attach(self, sink: Inbox) -> None: ...

    @property
    def control_problem(self) -> str:
        """Why this console cannot send commands, or ""."""
        ...

    def send(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        """Send a command to rank 0 (blocking; called from a worker thread)."""
        ...

    def close(self) -> None: ...
