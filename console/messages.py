"""Messages the console's workers and widgets post; handlers in the app change the UI."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class FeedReady(Message):
    """New records wait in the inbox; one pending at a time, so bursts never queue stale frames."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, FeedReady)


@dataclass
class CommandSent(Message):
    """A command left for rank 0; its reply will come through rank 0's link."""

    id: int
    cmd: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class CommandFailed(Message):
    """A command could not be sent at all (no key, rank 0's link down)."""

    cmd: str
    args: dict[str, Any]
    error: str


@dataclass
class RankSelected(Message):
    """The operator asked for one rank's detail."""

    rank: int
