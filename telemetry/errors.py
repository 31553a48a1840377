"""Every exception the telemetry package raises, in one hierarchy (like redis-py's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from telemetry.records import Reply


class TelemetryError(Exception):
    """Base of all telemetry errors; also raised for setup problems (a port taken, a bad path)."""


class ProtocolError(TelemetryError):
    """The peer broke the protocol: bad bytes, a malformed message, another version."""


class ConnectionLost(TelemetryError):
    """The connection ended (EOF or a socket error); reconnect with a Backoff."""


class Unreachable(ConnectionLost):
    """A connection could not be made at all (refused, no route, timed out)."""


class AuthError(TelemetryError):
    """The control key is missing, malformed or readable by others, or a command needs a key."""


class CommandRefused(TelemetryError):
    """A command came back refused; `reply` holds the run's answer."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"command {reply.id} refused: {reply.error}")
        self.reply = reply


class TrackerError(TelemetryError):
    """A --report-to that cannot be served: an unknown tracker, or its extra not installed."""
