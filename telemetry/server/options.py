"""How a rank's telemetry server serves: one value, handed from the trainer through the Hub to
the Server and its layers, instead of a list of keywords repeated at each."""

from __future__ import annotations

from dataclasses import dataclass, field

from telemetry import protocol
from telemetry.server.connection import ConnectionLimits


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Where a server listens and how much it keeps. The defaults are the product's."""

    bind: str = "127.0.0.1"  # loopback unless asked: telemetry is local by default
    allow_remote: bool = False  # a non-loopback bind must be asked for twice (--telemetry-remote)
    backlog: int = protocol.DEFAULT_BACKLOG  # update records a new subscriber gets as history
    event_backlog: int = protocol.DEFAULT_EVENT_BACKLOG  # event records after them
    queue_size: int = 1024  # records waiting for the server thread (and the Arrow log)
    subscriber_buffer: int = 512  # live records queued per subscriber before the oldest go
    flush_interval: float = 0.1  # records go out at most this often, batched (0: each at once)
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
