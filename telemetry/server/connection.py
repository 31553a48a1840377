"""Client connections: bytes in through a Decoder, queued bytes out, and backpressure.

The thread never waits for a peer: a send that would block leaves the rest queued for the
selector's next "writable", and a subscriber that reads slower than the run produces loses
its oldest live records (counted and told), never the hello, history or replies.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

from telemetry import protocol
from telemetry.framing import Decoder, FramingError
from telemetry.records import Dropped, Reply

_CHUNK = 64 << 10  # bytes handed to one send()
_RECV = 64 << 10  # bytes taken from one recv()
_SWEEP_S = 0.5  # how often stalled and expired connections are looked for
CLOSE_GRACE_S = 2.0  # how long an error reply may take to drain before the socket closes


class Connection:
    """One client socket. Two output queues: `ctl` (hello, history, replies) always goes
    first and whole; `out` holds at most `cap` live records and loses its oldest when full."""

    def __init__(self, sock: socket.socket, peer: str, cap: int, pool: Connections) -> None:
        self.sock = sock
        self.peer = peer
        self.decoder = Decoder()
        self.ctl: collections.deque[bytes] = collections.deque()
        self.out: collections.deque[bytes] = collections.deque()
        self.cap = cap
        self.pending = memoryview(b"")  # the rest of a chunk a send() took only part of
        self.dropped_since = 0
        self.dropped_total = 0
        self.closing_at: float | None = None  # set once failed: close when drained, or then
        self.partial_since: float | None = None  # an unfinished message arrived at
        self.interest = 0  # the selector events registered for
        self.blocked = False  # its last send would block: wait for the selector to say writable
        self.closed = False
        self._pool = pool
        self._on_message: Callable[[Any], None] = lambda obj: None

    # --- in -------------------------------------------------------------------------------

    def start(self, on_message: Callable[[Any], None]) -> None:
        """Send what is queued and start reading: each decoded object goes to `on_message`."""
        self._on_message = on_message
        self.flush()

    def _ready(self, mask: int) -> None:
        if mask & selectors.EVENT_READ and not self.closed:
            self._read()
        if mask & selectors.EVENT_WRITE and not self.closed:
            self.blocked = False
            self.flush()

    def _read(self) -> None:
        try:
            data = self.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        if self.closing_at is not None:
            return  # already failed: input is ignored until the socket closes
        try:
            messages = self.decoder.feed(data)
        except FramingError as e:
            self.fail(str(e))
            return
        for obj in messages:
            self._on_message(obj)
            if self.closing_at is not None or self.closed:
                return
        if self.decoder.pending:
            self.partial_since = self.partial_since or time.monotonic()
        else:
            self.partial_since = None

    # --- out ------------------------------------------------------------------------------

    def queue(self, data: bytes) -> None:
        """Queue a control message (hello, history, a reply): never dropped, sent first."""
        self.ctl.append(data)

    def push(self, data: bytes) -> None:
        """Queue a live record; a full queue loses its oldest record, counted."""
        if len(self.out) >= self.cap:
            self.out.popleft()
            self.dropped_since += 1
            self.dropped_total += 1
        self.out.append(data)

    def has_output(self) -> bool:
        return bool(self.pending) or bool(self.ctl) or bool(self.out)

    def _next_chunk(self) -> bytes:
        """Up to _CHUNK bytes of whole messages: control first, then a drop notice, then records."""
        parts: list[bytes] = []
        size = 0
        while self.ctl and size < _CHUNK:
            parts.append(self.ctl.popleft())
            size += len(parts[-1])
        if self.dropped_since and size < _CHUNK:
            notice = protocol.encode(Dropped(self.dropped_since, self.dropped_total))
            parts.append(notice)
            size += len(notice)
            self.dropped_since = 0
        while self.out and size < _CHUNK and self.closing_at is None:
            parts.append(self.out.popleft())
            size += len(parts[-1])
        return b"".join(parts)

    def flush(self) -> None:
        """Send until done or the socket would block; then wait for the selector."""
        while True:
            if not self.pending:
                chunk = self._next_chunk()
                if not chunk:
                    break
                self.pending = memoryview(chunk)
            try:
                sent = self.sock.send(self.pending)
            except (BlockingIOError, InterruptedError):
                self.blocked = True
                break
            except OSError:
                self.close()
                return
            self.pending = self.pending[sent:]
        if self.closing_at is not None and not self.has_output():
            self.close()
            return
        self._set_interest()

    def _set_interest(self) -> None:
        want = selectors.EVENT_WRITE if self.has_output() else 0
        if self.closing_at is None:
            want |= selectors.EVENT_READ
        if want == self.interest:
            return
        selector = self._pool.selector
        if self.interest == 0:
            selector.register(self.sock, want, self._ready)
        elif want == 0:
            selector.unregister(self.sock)
        else:
            selector.modify(self.sock, want, self._ready)
        self.interest = want

    # --- the end --------------------------------------------------------------------------

    def fail(self, why: str) -> None:
        """A protocol error: answer it (best effort), then close this connection only."""
        self._pool.closed_on_error += 1
        self.out.clear()
        self.dropped_since = 0
        error = Reply(id=0, ok=False, error=f"protocol error: {why}")
        self.ctl.append(protocol.encode_reply(error))
        self.closing_at = time.monotonic() + CLOSE_GRACE_S
        self.flush()

    def sweep(self, now: float) -> None:
        """Close it if its error reply will not drain, or fail it if it stalls mid-message."""
        if self.closing_at is not None and now >= self.closing_at:
            self.close()
        elif (
            self.partial_since is not None and now - self.partial_since > protocol.PARTIAL_TIMEOUT_S
        ):
            self.fail(f"message unfinished for {protocol.PARTIAL_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        """Close the socket and forget what was queued; idempotent."""
        if self.closed:
            return
        self.closed = True
        self._pool.forget(self)
        if self.interest:
            with contextlib.suppress(KeyError, ValueError):
                self._pool.selector.unregister(self.sock)
        self.interest = 0
        self.ctl.clear()
        self.out.clear()
        self.sock.close()


class Connections:
    """Every open connection of one server (at most `limit`) and the counters they share."""

    def __init__(self, selector: selectors.BaseSelector, *, cap: int, limit: int) -> None:
        self.selector = selector
        self.cap = cap  # live records each connection may hold
        self.limit = limit
        self.refused = 0  # connections closed at once: the server was full
        self.closed_on_error = 0
        self._open: dict[socket.socket, Connection] = {}
        self._last_sweep = time.monotonic()

    def add(self, sock: socket.socket, peer: str) -> Connection | None:
        """A Connection for a new socket, or None (the socket closed) when full."""
        if len(self._open) >= self.limit:
            self.refused += 1
            sock.close()
            return None
        conn = Connection(sock, peer, self.cap, self)
        self._open[sock] = conn
        return conn

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
        """Close or fail connections that stall (looked for every _SWEEP_S, not every turn)."""
        if now - self._last_sweep < _SWEEP_S:
            return
        self._last_sweep = now
        for conn in self:
            conn.sweep(now)

    def drain(self, grace: float) -> None:
        """Send what is queued for up to `grace` s, waiting on the selector (when closing)."""
        end = time.monotonic() + grace
        while time.monotonic() < end:
            waiting = [c for c in self if c.has_output()]
            if not waiting:
                return
            for conn in waiting:
                conn.blocked = False
                conn.flush()
            self.selector.select(min(0.05, max(0.0, end - time.monotonic())))

    def close(self) -> None:
        for conn in self:
            conn.close()
