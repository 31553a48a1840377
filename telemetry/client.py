"""The blocking client for one rank's telemetry: read its records, send it signed commands.

Works over anything socket-like (`recv`, `sendall`, `settimeout`, `close`): a TCP or Unix
socket, or a paramiko `direct-tcpip` Channel to the rank's loopback port. Thread-safe: one
thread may iterate the feed while another calls `command`; replies awaited by `command` are
kept away from `recv`, and everything else received meanwhile is kept for `recv`.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from telemetry import auth, protocol
from telemetry.errors import (
    AuthError,
    CommandRefused,
    ConnectionLost,
    ProtocolError,
    TelemetryError,
    Unreachable,
)
from telemetry.framing import Decoder, FramingError
from telemetry.records import MESSAGE_TYPES, Command, Hello, Message, Reply

_FROM_SERVER = frozenset({"hello", "update", "event", "dropped", "reply"})
_UNSET = object()
_SLICE_S = 0.5  # longest one socket read waits, so other threads can take their turn
_INBOX = 8192  # messages kept for recv()


class SocketLike(Protocol):
    def recv(self, n: int) -> bytes: ...
    def sendall(self, data: bytes) -> Any: ...
    def settimeout(self, timeout: float | None) -> Any: ...
    def close(self) -> Any: ...


class TelemetryClient:
    """A connection to one rank. The rank's `hello` is read (and checked) on construction."""

    def __init__(
        self, sock: SocketLike, *, key: bytes | None = None, timeout: float = 10.0, peer: str = ""
    ) -> None:
        self._sock = sock
        self.key = key
        self.timeout = timeout
        self.peer = peer or "the rank"
        self.invalid = 0  # well-framed messages skipped because they were not valid
        self.last_invalid = ""
        self.server_error = ""  # the rank's last protocol-error reply, if any
        self._decoder = Decoder()
        # Bounded: a script that only sends commands must not pile up the feed forever.
        self._inbox: collections.deque[Message] = collections.deque(maxlen=_INBOX)
        self.overflow = 0  # messages lost because nobody called recv for a long while
        self._replies: dict[int, Reply] = {}
        self._waiting: set[int] = set()
        self._cond = threading.Condition()
        self._rlock = threading.Lock()
        self._wlock = threading.Lock()
        self._ids = itertools.count(1)
        self._error: TelemetryError | None = None
        self._first: Any = _UNSET  # the first object received: must be the hello
        try:
            self.hello = self._read_hello()
        except BaseException:
            self.close()
            raise

    @classmethod
    def connect(
        cls, host: str, port: int, *, key: bytes | None = None, timeout: float = 5.0
    ) -> TelemetryClient:
        """Connect over TCP; Unreachable (a ConnectionLost) if nothing answers."""
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise Unreachable(f"cannot reach telemetry at {host}:{port}: {_why(e)}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, key=key, timeout=timeout, peer=f"{host}:{port}")

    @classmethod
    def connect_unix(
        cls, path: str | Path, *, key: bytes | None = None, timeout: float = 5.0
    ) -> TelemetryClient:
        """Connect to a rank's Unix socket (RUN/telemetry/rank-N.sock)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError as e:
            sock.close()
            raise Unreachable(f"cannot reach telemetry at {path}: {_why(e)}") from None
        return cls(sock, key=key, timeout=timeout, peer=str(path))

    # --- reading ------------------------------------------------------------------------------

    def _read_hello(self) -> Hello:
        deadline = time.monotonic() + self.timeout
        while self._first is _UNSET:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProtocolError(f"{self.peer} sent no hello within {self.timeout} s")
            with self._rlock:
                self._read_chunk(remaining)
        obj = self._first
        if not isinstance(obj, dict) or obj.get("type") != "hello":
            raise ProtocolError(f"{self.peer} did not start with a hello: is it a fleet rank?")
        version = obj.get("protocol")
        if version != protocol.VERSION:
            raise ProtocolError(
                f"{self.peer} speaks telemetry protocol {protocol.short(version)}; this client "
                f"speaks {protocol.VERSION}: run the same mlx-fleet version on both sides"
            )
        hello = protocol.decode(obj, accept={"hello"})
        assert isinstance(hello, Hello)
        return hello

    def _read_chunk(self, timeout: float | None) -> None:
        """One socket read (caller holds _rlock); decoded messages go where they belong."""
        try:
            # Never 0 (non-blocking): the same timeout also governs sendall on this socket.
            self._sock.settimeout(None if timeout is None else max(timeout, 0.001))
            data = self._sock.recv(65536)
        except (TimeoutError, BlockingIOError):
            return
        except OSError as e:
            raise self._fail(ConnectionLost(f"connection to {self.peer} lost: {_why(e)}")) from None
        if not data:
            why = f" ({self.server_error})" if self.server_error else ""
            raise self._fail(ConnectionLost(f"{self.peer} closed the connection{why}"))
        try:
            objects = self._decoder.feed(data)
        except FramingError as e:
            raise self._fail(ProtocolError(f"{self.peer} sent bad data: {e}")) from None
        if self._first is _UNSET and objects:
            self._first = objects.pop(0)
        messages = []
        for obj in objects:
            kind = obj.get("type") if isinstance(obj, dict) else None
            if isinstance(kind, str) and kind not in MESSAGE_TYPES:
                continue  # a newer rank's message type: ignore it
            try:
                messages.append(protocol.decode(obj, accept=_FROM_SERVER))
            except ProtocolError as e:
                self.invalid += 1
                self.last_invalid = str(e)
        with self._cond:
            for msg in messages:
                if isinstance(msg, Reply) and msg.id in self._waiting:
                    self._replies[msg.id] = msg
                    continue
                if isinstance(msg, Reply) and msg.id == 0 and not msg.ok:
                    self.server_error = msg.error
                if len(self._inbox) == _INBOX:
                    self.overflow += 1
                self._inbox.append(msg)
            self._cond.notify_all()

    def _fail(self, error: TelemetryError) -> TelemetryError:
        with self._cond:
            if self._error is None:
                self._error = error
            self._cond.notify_all()
        return self._error

    def _turn(self, remaining: float | None) -> None:
        """Read once if no other thread is reading; else wait for what that thread reads."""
        if self._rlock.acquire(blocking=False):
            try:
                self._read_chunk(_SLICE_S if remaining is None else min(remaining, _SLICE_S))
            finally:
                self._rlock.release()
        else:
            with self._cond:
                self._cond.wait(_SLICE_S if remaining is None else min(remaining, _SLICE_S))

    def recv(self, timeout: float | None = None) -> Message | None:
        """The next message (Update, Event, Dropped or Reply); None after `timeout` seconds.

        `timeout=None` waits as long as it takes. Raises ConnectionLost at the end of the
        connection and ProtocolError if the rank sent bytes that are not the protocol.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        tried = False
        while True:
            with self._cond:
                if self._inbox:
                    return self._inbox.popleft()
                if self._error is not None:
                    raise self._error
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0 and tried:
                return None
            self._turn(remaining if remaining is None else max(remaining, 0.0))
            tried = True

    def __iter__(self) -> Iterator[Message]:
        """Every message until the connection ends (the loop then just stops)."""
        while True:
            try:
                msg = self.recv()
            except ConnectionLost:
                return
            if msg is not None:
                yield msg

    # --- commands -----------------------------------------------------------------------------

    def _send(self, cmd: str, args: dict[str, Any] | None, track: bool) -> int:
        if self.key is None:
            raise AuthError("commands need the run's control key (RUN/control.key); none given")
        args = dict(args or {})
        cmd_id = next(self._ids)
        nonce = auth.new_nonce()
        mac = auth.sign(self.key, cmd_id, cmd, args, nonce, self.hello.challenge)
        data = protocol.encode(Command(id=cmd_id, cmd=cmd, args=args, nonce=nonce, mac=mac))
        if track:
            with self._cond:
                self._waiting.add(cmd_id)
        with self._wlock:
            try:
                self._sock.sendall(data)
            except OSError as e:
                raise self._fail(
                    ConnectionLost(f"sending to {self.peer} failed: {_why(e)}")
                ) from None
        return cmd_id

    def send_command(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        """Sign and send a command without waiting; its Reply arrives through `recv`."""
        return self._send(cmd, args, track=False)

    def command(
        self,
        cmd: str,
        args: dict[str, Any] | None = None,
        timeout: float = 60.0,
        *,
        check: bool = False,
    ) -> Reply:
        """Send a command and wait for its reply (applied or refused).

        Other messages that arrive meanwhile are kept for `recv`. `check=True` raises
        CommandRefused for a refused reply. TelemetryError if no reply within `timeout`.
        """
        cmd_id = self._send(cmd, args, track=True)
        deadline = time.monotonic() + timeout
        try:
            while True:
                with self._cond:
                    reply = self._replies.pop(cmd_id, None)
                    if reply is None and self._error is not None:
                        raise self._error
                if reply is not None:
                    if check and not reply.ok:
                        raise CommandRefused(reply)
                    return reply
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TelemetryError(
                        f"no reply from {self.peer} to {cmd!r} (id {cmd_id}) within {timeout} s"
                    )
                self._turn(remaining)
        finally:
            with self._cond:
                self._waiting.discard(cmd_id)

    def close(self) -> None:
        """Close the connection; threads blocked in `recv` get ConnectionLost."""
        self._fail(ConnectionLost(f"connection to {self.peer} closed"))
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> TelemetryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _why(e: OSError) -> str:
    return e.strerror or str(e) or type(e).__name__
