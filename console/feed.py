"""What a feed is (live links, a replay), and the coalescing inbox it hands records through.

Link threads fill the inbox; the UI thread drains it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from console.hostfile import RankTarget
from console.link_phase import LinkSink, LinkStatus
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


class Playback(Protocol):
    """A replay's transport: what space, n, + and - drive."""

    def tick(self, dt: float) -> None:
        """Advance by `dt` wall seconds (scaled by the speed), when playing."""
        ...

    def toggle(self) -> None: ...

    def step(self) -> None:
        """Deliver up to the next update, then pause."""
        ...

    def faster(self) -> None: ...

    def slower(self) -> None: ...

    def badge(self) -> str:
        """The header's badge: "REPLAY 2x 40%"."""
        ...


class Feed(Protocol):
    """What the app reads from: live links, a replay, or a test's fake; it never asks which."""

    targets: list[RankTarget]

    @property
    def playback(self) -> Playback | None:
        """A replay's transport; None when live (then the replay keys are off)."""
        ...

    @property
    def control_problem(self) -> str:
        """Why this console cannot send commands, or ""."""
        ...

    def attach(self, sink: LinkSink) -> None:
        """Where to report link phases and messages (before `loops` and `start`)."""
        ...

    def loops(self) -> dict[str, Callable[[], None]]:
        """Blocking loops, by name, to run on threads until `close`: one per live link."""
        ...

    def start(self) -> None:
        """Begin delivering (once the loops run)."""
        ...

    def send(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        """Send a command to rank 0 (blocking; called from a worker thread)."""
        ...

    def reconnect(self) -> None:
        """Links that are down try again now (one refused for good waits for this)."""
        ...

    def close(self) -> None: ...
