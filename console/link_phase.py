"""The words links, feeds and views share: a link's phase, its status report, and the sink.

Pure: no sockets, no Textual. Links (`console.links`) and replays produce these; the fleet
(`console.fleet`), the widgets and `--once` read them, without importing the network code.

Phases::

    connecting -> live <-> stale         (stale: connected, but no record for a while)
         ^          |
         +-- lost <-+                    (lost: dropped; retried with backoff)
    refused                               (auth, host key, nothing listening: with the reason;
                                           retried only when retrying can help, or when the
                                           operator asks: key l)
    ended                                 (a replay that has played its last record)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from telemetry.records import Message


class LinkPhase(StrEnum):
    """Where one rank's link is: the values are what the views print."""

    CONNECTING = "connecting"
    LIVE = "live"
    STALE = "stale"
    LOST = "lost"
    REFUSED = "refused"
    ENDED = "ended"  # a replay's log is over: the run's end, not a fault


UP = (LinkPhase.LIVE, LinkPhase.STALE)  # connected: records may still arrive, commands may go
NOBODY = "nothing listening"  # a refusal's kind when no process serves the port at all


@dataclass(slots=True)
class LinkStatus:
    """A link's phase as the UI shows it."""

    rank: int
    phase: LinkPhase
    detail: str = ""  # why: the error, or where it is connecting
    kind: str = ""  # short reason for a narrow column: "auth failed", "host key changed", ...
    retry_at: float | None = None  # wall time of the next attempt, when one is planned
    time: float = 0.0

    @property
    def refused_for_good(self) -> bool:
        """Refused, and no retry planned: only the operator's reconnect tries again."""
        return self.phase is LinkPhase.REFUSED and self.retry_at is None


class LinkSink(Protocol):
    """Where links report; called from link threads."""

    def link_status(self, status: LinkStatus) -> None: ...

    def link_message(self, rank: int, message: Message) -> None: ...
