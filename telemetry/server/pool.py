"""Every open connection of one server: who gets a slot, who makes room, and their counters.

Slots: `max_clients` in all, of which `reserved` are kept for connections that sign a
command. When the others are taken, a newcomer makes room by evicting the oldest idle
reader (idle: it has not taken its output) that has not signed; failing that, it takes a
reserved slot, where it must sign a command within `command_timeout`; with the reserve taken
too, it evicts the oldest connection that has not signed. Only a server full of key holders
refuses a connection. So idle local connections never lock out the key holder.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Callable, Iterator

from telemetry.server.connection import Connection, ConnectionLimits


class Connections:
    """Every open connection of one server and the counters they share."""

    def __init__(
        self, selector: selectors.BaseSelector, *, cap: int, limits: ConnectionLimits
    ) -> None:
        self.selector = selector
        self.cap = cap  # live records each connection may hold
        self.limits = limits
        self.refused = 0  # connections closed at once: every slot held by a key holder
        self.evicted = 0  # closed to make room for a newer connection
        self.timed_out = 0  # closed for not doing their part in time (see Connection.sweep)
        self.closed_on_error = 0
        # Timeouts are checked this often; a quarter of the shortest keeps them within 25 %.
        shortest = min(limits.idle_timeout, limits.command_timeout, limits.partial_timeout)
        self.sweep_every = min(0.5, shortest / 4)
        self._open: dict[socket.socket, Connection] = {}  # in order of arrival
        self._last_sweep = time.monotonic()

    def add(self, sock: socket.socket, peer: str) -> Connection | None:
        """A Connection for a new socket, making room if needed; None (socket closed) if full."""
        limits = self.limits
        probation = False
        if len(self._open) >= limits.max_clients - limits.reserved:
            idle = self._oldest(_idle_reader)
            if idle is not None:
                idle.evict("evicted to make room: this connection was not reading")
                self.evicted += 1
            elif len(self._open) < limits.max_clients:
                probation = True  # a reserved slot
            else:
                victim = self._oldest(lambda c: True)
                if victim is None:
                    self.refused += 1
                    sock.close()
                    return None
                victim.evict("evicted to make room for a newer connection (the server is full)")
                self.evicted += 1
                probation = True
        conn = Connection(
            sock,
            peer,
            self.cap,
            self.selector,
            self.limits,
            probation=probation,
            on_failed=self._count_error,
            on_closed=self.forget,
        )
        self._open[sock] = conn
        return conn

    def _oldest(self, pred: Callable[[Connection], bool]) -> Connection | None:
        """The oldest open connection that has not signed a command and satisfies `pred`."""
        for conn in self._open.values():  # insertion order: oldest first
            if not conn.trusted and pred(conn):
                return conn
        return None

    def _count_error(self) -> None:
        self.closed_on_error += 1

    def forget(self, conn: Connection) -> None:
        self._open.pop(conn.sock, None)

    def __iter__(self) -> Iterator[Connection]:
        return iter(list(self._open.values()))  # a copy: a connection may close meanwhile

    def __len__(self) -> int:
        return len(self._open)

    def push(self, data: bytes) -> None:
        """Queue one live record to every connection."""
        for conn in self._open.values():
            conn.push(data)

    def flush(self) -> None:
        """Send what each has queued; a stalled one costs nothing until it is writable."""
        for conn in self:
            if conn.has_output() and not conn.blocked:
                conn.flush()

    def sweep(self, now: float) -> None:
        """Close connections that have not done their part in time (every `sweep_every` s)."""
        if now - self._last_sweep < self.sweep_every:
            return
        self._last_sweep = now
        for conn in self:
            if conn.sweep(now):
                self.timed_out += 1

    def drain(self, grace: float) -> None:
        """Send what is queued for up to `grace` s, waiting on the selector (when closing)."""
        end = time.monotonic() + grace
        while time.monotonic() < end:
            waiting = [c for c in self if c.has_output()]
            if not waiting:
                return
            for conn in waiting:
                conn.flush()
            self.selector.select(min(0.05, max(0.0, end - time.monotonic())))

    def close(self) -> None:
        for conn in self:
            conn.close()


def _idle_reader(conn: Connection) -> bool:
    """A reader (not in a reserved slot) that is not taking its output, or is closing anyway."""
    if conn.probation_until is not None:
        return False
    return conn.stalled_since is not None or conn.closing_at is not None
