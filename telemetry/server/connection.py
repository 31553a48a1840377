"""One client connection: bytes in through a Decoder, queued bytes out, and backpressure.

The thread never waits for a peer: a send that would block leaves the rest queued for the
selector's next "writable", and a subscriber that reads slower than the run produces loses
its oldest live records (counted and told), never the hello, history or replies. A peer
that takes nothing for `idle_timeout`, or sits in a reserved slot without signing a command,
is closed by `sweep`. Who gets a slot is the pool's to decide (pool.py); a connection knows
only its selector, its limits and whom to tell when it fails or closes.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from telemetry import protocol
from telemetry.framing import Decoder, FramingError
from telemetry.records import Dropped, Reply

_CHUNK = 64 << 10  # bytes handed to one send()
_RECV = 16 << 10  # bytes taken from one recv() (a buffer of this size is allocated for each)
CLOSE_GRACE_S = 2.0  # how long an error reply may take to drain before the socket closes


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections a rank serves, and how long one may sit without doing its part."""

    max_clients: int = protocol.MAX_CLIENTS
    reserved: int = protocol.RESERVED_SLOTS  # of those, kept for a connection that signs
    idle_timeout: float = protocol.IDLE_TIMEOUT_S  # output untaken this long: it does not read
    command_timeout: float = protocol.COMMAND_TIMEOUT_S  # in a reserved slot, to sign a command
    partial_timeout: float = protocol.PARTIAL_TIMEOUT_S  # a message left unfinished this long


class Connection:
    """One client socket. Two output queues: `ctl` (hello, history, replies) always goes
    first and whole; `out` holds at most `cap` live records and loses its oldest when full."""

    def __init__(
        self,
        sock: socket.socket,
        peer: str,
        cap: int,
        selector: selectors.BaseSelector,
        limits: ConnectionLimits,
        *,
        probation: bool,
        on_failed: Callable[[], None] = lambda: None,
        on_closed: Callable[[Connection], None] = lambda conn: None,
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.trusted = False  # it sent a command that carried a good MAC: a key holder
        # In a reserved slot: until when it has to sign a command (None: a plain reader).
        self.probation_until: float | None = None
        if probation:
            self.probation_until = time.monotonic() + limits.command_timeout
        self.stalled_since: float | None = None  # output waiting, untaken by the peer, since
        self.decoder: Decoder | None = None  # made when the peer first sends something
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
        self._selector, self._limits = selector, limits
        self._on_failed, self._on_closed = on_failed, on_closed
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
        if self.decoder is None:
            self.decoder = Decoder()
        try:
            messages = self.decoder.feed(data)
        except FramingError as e:
            self.fail(str(e))
            return
        for obj in messages:
            self._on_message(obj)
            if self.closing_at is not None or self.closed:
                return
        if self.decoder is not None and self.decoder.pending:
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
        moved = False
        self.blocked = False
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
            moved = moved or sent > 0
            self.pending = self.pending[sent:]
        if not self.blocked:
            self.stalled_since = None
        elif moved or self.stalled_since is None:
            self.stalled_since = time.monotonic()  # waiting for the peer from now on
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
        selector = self._selector
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
        self._on_failed()
        self._close_after(f"protocol error: {why}")

    def _close_after(self, text: str) -> None:
        """Send `text` as an error reply (id 0), then close once sent or after the grace."""
        self.out.clear()
        self.dropped_since = 0
        self.ctl.append(protocol.encode_reply(Reply(id=0, ok=False, error=text)))
        self.closing_at = time.monotonic() + CLOSE_GRACE_S
        self.flush()

    def evict(self, why: str) -> None:
        """Close at once to free its slot; say why if that can go in one non-blocking send."""
        if not self.pending:  # never in the middle of a message already under way
            with contextlib.suppress(OSError):
                self.sock.send(protocol.encode_reply(Reply(id=0, ok=False, error=why)))
        self.close()

    def trust(self) -> None:
        """It proved it holds the key: never evicted, never timed out for not signing."""
        self.trusted = True
        self.probation_until = None

    def sweep(self, now: float) -> bool:
        """Close or fail it if it has not done its part in time; True if it timed out.

        Its part: take what is sent (within idle_timeout), finish a message it started
        (partial_timeout), and, in a reserved slot, sign a command (command_timeout).
        """
        limits = self._limits
        if self.closing_at is not None:
            if now >= self.closing_at:
                self.close()  # its error reply will not drain
            return False
        if self.stalled_since is not None and now - self.stalled_since > limits.idle_timeout:
            self.close()  # it does not read: an error reply would not reach it either
            return True
        if self.probation_until is not None and now > self.probation_until:
            self._close_after(
                f"the server is full and this slot is kept for control: no signed command "
                f"came within {limits.command_timeout:g} s"
            )
            return True
        if self.partial_since is not None and now - self.partial_since > limits.partial_timeout:
            self.fail(f"message unfinished for {limits.partial_timeout:.0f} s")
            return True
        return False

    def close(self) -> None:
        """Close the socket and forget what was queued; idempotent."""
        if self.closed:
            return
        self.closed = True
        self._on_closed(self)
        if self.interest:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.sock)
        self.interest = 0
        self.ctl.clear()
        self.out.clear()
        self.pending = memoryview(b"")
        self.decoder = None  # its buffer goes now, not when the pool forgets this object
        self.sock.close()
