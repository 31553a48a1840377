"""A rank's telemetry server: one selector thread fans records out and takes signed commands.

Why one thread and a selector rather than a thread per connection: fan-out is then a loop
over in-memory buffers (each record is encoded once, whatever the number of subscribers), a
stalled subscriber costs a failed non-blocking send rather than a parked thread, and the
training thread shares the GIL with one extra thread, not with one per console.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import functools
import ipaddress
import logging
import os
import secrets
import selectors
import socket
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from telemetry import auth, protocol
from telemetry.control import CommandQueue, CommandResult
from telemetry.errors import ProtocolError, TelemetryError
from telemetry.framing import Decoder, FramingError
from telemetry.records import Dropped, Event, Hello, Reply, Update

log = logging.getLogger(__name__)

ANY_PORT = -1  # bind an ephemeral port (tests, benchmarks); read it back from `address`
_CHUNK = 64 << 10  # bytes handed to one send()
_CLOSE_GRACE_S = 2.0  # how long an error reply may take to drain before the socket closes
# sun_path holds this many bytes including the terminating NUL.
UNIX_PATH_MAX = 104 if sys.platform == "darwin" or "bsd" in sys.platform else 108
_LISTEN, _WAKE = object(), object()


class _Conn:
    """One client connection: its decoder and its two output queues."""

    def __init__(self, sock: socket.socket, peer: str, cap: int) -> None:
        self.sock = sock
        self.peer = peer
        self.decoder = Decoder()
        self.ctl: collections.deque[bytes] = collections.deque()  # hello, history, replies
        self.out: collections.deque[bytes] = collections.deque()  # live records, at most cap
        self.cap = cap
        self.pending = memoryview(b"")
        self.dropped_since = 0
        self.dropped_total = 0
        self.challenge = secrets.token_hex(16)
        self.inflight = 0
        self.closing_at: float | None = None
        self.partial_since: float | None = None
        self.interest = 0
        self.blocked = False  # its last send would block: wait for the selector to say writable
        self.closed = False

    def push(self, data: bytes) -> None:
        """Queue a live record; a full queue loses its oldest record, counted."""
        if len(self.out) >= self.cap:
            self.out.popleft()
            self.dropped_since += 1
            self.dropped_total += 1
        self.out.append(data)

    def has_output(self) -> bool:
        return bool(self.pending) or bool(self.ctl) or bool(self.out)

    def next_chunk(self) -> bytes:
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


class Server:
    """Serves one rank's records on TCP and/or a Unix socket, on one daemon thread.

    `publish` is the only method the training thread calls; it appends to a bounded queue
    (the oldest record is dropped and counted when full) and never blocks or raises.
    """

    def __init__(
        self,
        *,
        hello: Hello,
        port: int | None,
        bind: str = "127.0.0.1",
        allow_remote: bool = False,
        unix_path: Path | None = None,
        commands: CommandQueue | None = None,
        key: bytes | None = None,
        backlog: int = protocol.DEFAULT_BACKLOG,
        event_backlog: int = protocol.DEFAULT_EVENT_BACKLOG,
        queue_size: int = 1024,
        subscriber_buffer: int = 512,
        rank0_port: int | None = None,
        max_clients: int = protocol.MAX_CLIENTS,
        flush_interval: float = 0.1,
    ) -> None:
        self.hello = hello
        self.flush_interval = flush_interval
        self.rank = hello.rank
        self.port = port
        self.bind = bind
        self.allow_remote = allow_remote
        self.unix_path = unix_path
        self.commands = commands
        self.key = key
        self.rank0_port = rank0_port
        self.max_clients = max_clients
        self.subscriber_buffer = subscriber_buffer
        self.dropped = 0  # records lost because the server thread fell behind the trainer
        self.refused_clients = 0
        self.closed_on_error = 0
        self.cpu_s = 0.0
        self._inbox: collections.deque[Update | Event] = collections.deque(maxlen=queue_size)
        self._backlog: collections.deque[bytes] = collections.deque(maxlen=max(backlog, 0))
        self._event_backlog: collections.deque[bytes] = collections.deque(
            maxlen=max(event_backlog, 0)
        )
        self._replies: collections.deque[tuple[_Conn, int, Future]] = collections.deque()
        self._nonces: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._conns: dict[socket.socket, _Conn] = {}
        self._listeners: list[socket.socket] = []
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._wake_pending = False
        self._stop = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    # --- set-up and tear-down (caller's thread) ----------------------------------------------

    def start(self) -> Server:
        """Bind the sockets (raising TelemetryError with the reason) and start the thread."""
        try:
            if self.port:
                self._listeners.append(self._listen_tcp())
            if self.unix_path is not None:
                self._listeners.append(self._listen_unix(self.unix_path))
        except BaseException:
            self._close_all()
            raise
        for lsock in self._listeners:
            self._sel.register(lsock, selectors.EVENT_READ, _LISTEN)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._thread = threading.Thread(
            target=self._run, name=f"telemetry-server-{self.rank}", daemon=True
        )
        self._thread.start()
        return self

    def _listen_tcp(self) -> socket.socket:
        host = "127.0.0.1" if self.bind == "localhost" else self.bind
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            raise TelemetryError(f"telemetry bind address {self.bind!r} is not an IP") from None
        if not loopback:
            if not self.allow_remote:
                raise TelemetryError(
                    f"rank {self.rank}: refusing to serve telemetry on {host} (not loopback) "
                    "without allow_remote (fleet train --telemetry-remote); reach ranks "
                    "through SSH port forwarding instead"
                )
            log.warning(
                "rank %d: telemetry served on %s: anyone who can reach it sees the run "
                "(control still needs the key)",
                self.rank,
                host,
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart after a crash
        port = 0 if self.port == ANY_PORT else self.port
        try:
            sock.bind((host, port))
            sock.listen(protocol.MAX_CLIENTS)
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise TelemetryError(
                    f"rank {self.rank}: telemetry port {port} on {host} is taken (another run "
                    "on this machine? pick another --port-base, or 0 to turn the socket off)"
                ) from None
            raise TelemetryError(
                f"rank {self.rank}: cannot serve telemetry on {host}:{port}: {e.strerror}"
            ) from None
        sock.setblocking(False)
        self.address = sock.getsockname()[:2]
        return sock

    def _listen_unix(self, path: Path) -> socket.socket:
        size = len(os.fsencode(path))
        if size >= UNIX_PATH_MAX:
            raise TelemetryError(
                f"rank {self.rank}: unix socket path {path} is {size} bytes; this OS allows "
                f"{UNIX_PATH_MAX - 1}. Use a shorter run folder, or turn the unix socket off"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()  # stale: left by a rank that died
            else:
                raise TelemetryError(f"rank {self.rank}: {path} is served by a live process")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            os.chmod(path, 0o600)  # owner only; control still needs the key
            sock.listen(protocol.MAX_CLIENTS)
        except OSError as e:
            sock.close()
            raise TelemetryError(f"rank {self.rank}: cannot serve on {path}: {e}") from None
        sock.setblocking(False)
        return sock

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread (bounded wait); it closes every socket and the Unix socket file."""
        self._stop = True
        if self._thread is None:
            self._close_all()
            return
        self._kick()
        self._thread.join(timeout)
        if self._thread.is_alive():  # a daemon: it still closes its sockets when it gets here
            log.warning("rank %d: telemetry server thread did not stop in time", self.rank)

    def _close_all(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns.values()):
            self._drop(conn)
        for sock in self._listeners:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(sock)
            sock.close()
        self._listeners.clear()
        if self.unix_path is not None and self.unix_path.is_socket():
            self.unix_path.unlink(missing_ok=True)
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- the training thread's side ----------------------------------------------------------

    def publish(self, record: Update | Event) -> None:
        """Hand a record to the server thread; never blocks, never raises."""
        if len(self._inbox) == self._inbox.maxlen:
            self.dropped += 1  # deque drops the oldest itself; the count may race by one
        self._inbox.append(record)
        # One wake per batch, not per record: the server clears the flag just before it
        # drains the inbox, so a record appended after that drain always wakes it again.
        if not self._wake_pending:
            self._wake_pending = True
            self._kick()

    def _kick(self) -> None:
        with contextlib.suppress(OSError):  # full (the thread is awake anyway) or closed
            self._wake_w.send(b"\0")

    # --- the server thread --------------------------------------------------------------------

    def _run(self) -> None:
        last_sweep = time.monotonic()
        next_send = 0.0
        failures = 0
        while not self._stop:
            try:
                # Records wait until `flush_interval` after the last send, then go out
                # together: one send per subscriber per batch, however fast the run steps.
                timeout = 1.0
                if self._inbox:
                    timeout = max(0.0, next_send - time.monotonic())
                for key, mask in self._sel.select(timeout):
                    if key.data is _LISTEN:
                        self._accept(key.fileobj)  # type: ignore[arg-type]
                    elif key.data is _WAKE:
                        self._drain_wake()
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_READ and not conn.closed:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE and not conn.closed:
                            conn.blocked = False
                            self._flush(conn)
                now = time.monotonic()
                if self._inbox and now >= next_send:
                    self._fan_out()
                    next_send = now + self.flush_interval
                self._answer()
                for conn in list(self._conns.values()):
                    if conn.has_output() and not conn.blocked:  # a stalled one costs nothing
                        self._flush(conn)
                if now - last_sweep >= 0.5:
                    self._sweep(now)
                    last_sweep = now
                failures = 0
                self.cpu_s = time.thread_time()  # this thread's CPU so far (for benchmarks)
            except Exception:  # one bad turn must not end telemetry for the whole run
                failures += 1
                log.exception("rank %d: telemetry server error", self.rank)
                if failures >= 20:  # broken for good (a closed selector?): stop serving
                    log.error("rank %d: telemetry server stopped after repeated errors", self.rank)
                    break
                time.sleep(0.05)
        else:
            self._last_words()
        self._close_all()

    def _last_words(self, grace: float = 0.5) -> None:
        """On close, send what is queued (the run's `stopped` event, say) for up to `grace` s."""
        try:
            self._fan_out()
            self._answer()
            end = time.monotonic() + grace
            while time.monotonic() < end:
                waiting = [c for c in self._conns.values() if c.has_output()]
                if not waiting:
                    return
                for conn in waiting:
                    conn.blocked = False
                    self._flush(conn)
                self._sel.select(min(0.05, max(0.0, end - time.monotonic())))
        except Exception:  # closing anyway
            log.exception("rank %d: telemetry server error while closing", self.rank)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept(self, lsock: socket.socket) -> None:
        try:
            sock, addr = lsock.accept()
        except OSError:  # the client gave up already, or out of descriptors
            return
        if len(self._conns) >= self.max_clients:
            self.refused_clients += 1
            sock.close()
            return
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = f"{addr[0]}:{addr[1]}"
        else:
            peer = "unix"
        conn = _Conn(sock, peer, self.subscriber_buffer)
        hello = dataclasses.replace(
            self.hello,
            backlog=len(self._backlog),
            event_backlog=len(self._event_backlog),
            challenge=conn.challenge,
        )
        conn.ctl.append(protocol.encode(hello))
        conn.ctl.extend(self._backlog)
        conn.ctl.extend(self._event_backlog)
        self._conns[sock] = conn
        self._set_interest(conn)
        self._flush(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        if conn.closing_at is not None:
            return  # already failed: input is ignored until the socket closes
        try:
            messages = conn.decoder.feed(data)
        except FramingError as e:
            self._fail(conn, str(e))
            return
        for obj in messages:
            self._handle(conn, obj)
            if conn.closing_at is not None or conn.closed:
                return
        if conn.decoder.pending:
            conn.partial_since = conn.partial_since or time.monotonic()
        else:
            conn.partial_since = None

    def _handle(self, conn: _Conn, obj: Any) -> None:
        try:
            cmd = protocol.parse_command(obj)
        except ProtocolError as e:
            self._fail(conn, str(e))
            return
        why = self._refusal(conn, cmd)
        if why:
            self._reply(conn, Reply(id=cmd.id, ok=False, error=why))
            return
        assert self.commands is not None
        conn.inflight += 1
        future = self.commands.submit(cmd.cmd, cmd.args)
        # Resolves on the training thread: queue the reply for this thread, don't wait for it.
        future.add_done_callback(functools.partial(self._resolved, conn, cmd.id))

    def _refusal(self, conn: _Conn, cmd: Any) -> str:
        """Why this command is refused, or "" (checked in the order protocol.py documents)."""
        if self.rank != 0:
            where = f" (port {self.rank0_port})" if self.rank0_port else ""
            return f"control goes to rank 0{where}"
        if self.commands is None:
            return "this run takes no commands"
        if self.key is None:
            return "control is off: the run has no control key"
        if not cmd.mac:
            return "unsigned command: sign it with the run's key (RUN/control.key)"
        if not protocol.is_hex(cmd.nonce, protocol.NONCE_HEX):
            return f"bad nonce: expected {protocol.NONCE_HEX} lowercase hex digits"
        if not auth.verify(self.key, cmd.id, cmd.cmd, cmd.args, cmd.nonce, cmd.mac, conn.challenge):
            return "bad signature: wrong key, or signed for another connection"
        if cmd.nonce in self._nonces:
            return "replayed command: its nonce was used before"
        # Remembered only once the MAC is good, so strangers cannot flush the memory.
        self._nonces[cmd.nonce] = None
        if len(self._nonces) > protocol.NONCE_MEMORY:
            self._nonces.popitem(last=False)
        why = protocol.check_args(cmd.cmd, cmd.args)
        if why:
            return why
        if conn.inflight >= protocol.MAX_INFLIGHT:
            return f"too many commands in flight on this connection (max {protocol.MAX_INFLIGHT})"
        return ""

    def _resolved(self, conn: _Conn, cmd_id: int, future: Future) -> None:
        # Any thread (usually the training thread): hand over and wake, nothing more.
        self._replies.append((conn, cmd_id, future))
        self._kick()  # replies do not wait for the next batch

    def _fan_out(self) -> None:
        """Encode queued records once each, keep them as history, queue them to everyone."""
        self._wake_pending = False  # before draining: see publish()
        inbox = self._inbox
        while inbox:
            try:
                record = inbox.popleft()
            except IndexError:
                break
            try:
                if isinstance(record, Event):
                    data = protocol.encode_event(record)
                    self._event_backlog.append(data)
                else:
                    data = protocol.encode(record)
                    self._backlog.append(data)
            except Exception as e:  # a record the wire cannot carry is skipped, not fatal
                log.warning("rank %d: cannot send a %s record: %s", self.rank, record.type, e)
                continue
            for conn in self._conns.values():
                conn.push(data)

    def _answer(self) -> None:
        """Queue the replies of commands the training loop has resolved."""
        while self._replies:
            conn, cmd_id, future = self._replies.popleft()
            conn.inflight -= 1
            if not conn.closed:
                self._reply(conn, _reply_for(cmd_id, future), flush=False)

    def _reply(self, conn: _Conn, reply: Reply, flush: bool = True) -> None:
        conn.ctl.append(protocol.encode(reply))
        if flush:
            self._flush(conn)

    def _fail(self, conn: _Conn, why: str) -> None:
        """A protocol error: answer it (best effort), then close this connection only."""
        self.closed_on_error += 1
        conn.out.clear()
        conn.dropped_since = 0
        conn.ctl.append(protocol.encode(Reply(id=0, ok=False, error=f"protocol error: {why}")))
        conn.closing_at = time.monotonic() + _CLOSE_GRACE_S
        self._flush(conn)

    def _flush(self, conn: _Conn) -> None:
        while True:
            if not conn.pending:
                chunk = conn.next_chunk()
                if not chunk:
                    break
                conn.pending = memoryview(chunk)
            try:
                sent = conn.sock.send(conn.pending)
            except (BlockingIOError, InterruptedError):
                conn.blocked = True
                break
            except OSError:
                self._drop(conn)
                return
            conn.pending = conn.pending[sent:]
        if conn.closing_at is not None and not conn.has_output():
            self._drop(conn)
            return
        self._set_interest(conn)

    def _set_interest(self, conn: _Conn) -> None:
        want = selectors.EVENT_WRITE if conn.has_output() else 0
        if conn.closing_at is None:
            want |= selectors.EVENT_READ
        if want == conn.interest:
            return
        if conn.interest == 0:
            self._sel.register(conn.sock, want, conn)
        elif want == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, want, conn)
        conn.interest = want

    def _sweep(self, now: float) -> None:
        """Close connections whose error reply will not drain, or that stall mid-message."""
        for conn in list(self._conns.values()):
            if conn.closing_at is not None and now >= conn.closing_at:
                self._drop(conn)
            elif (
                conn.partial_since is not None
                and now - conn.partial_since > protocol.PARTIAL_TIMEOUT_S
            ):
                self._fail(conn, f"message unfinished for {protocol.PARTIAL_TIMEOUT_S:.0f} s")

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.sock, None)
        if conn.interest:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn.sock)
        conn.interest = 0
        conn.ctl.clear()
        conn.out.clear()
        conn.sock.close()

    def stats(self) -> dict[str, Any]:
        """Counters for benchmarks and the log (read from any thread; values may be a tick old)."""
        conns = list(self._conns.values())
        return {
            "subscribers": len(conns),
            "dropped_in_queue": self.dropped,
            "dropped_for_subscribers": sum(c.dropped_total for c in conns),
            "refused_clients": self.refused_clients,
            "closed_on_error": self.closed_on_error,
            "server_cpu_s": self.cpu_s,
        }


def _reply_for(cmd_id: int, future: Future) -> Reply:
    """The reply for a resolved command future (a CommandResult, or an exception)."""
    if future.cancelled():
        return Reply(id=cmd_id, ok=False, error="cancelled")
    exc = future.exception()
    if exc is not None:
        return Reply(id=cmd_id, ok=False, error=f"failed: {exc}")
    res = future.result()
    if not isinstance(res, CommandResult):
        return Reply(id=cmd_id, ok=True, result={"value": res})
    result = dict(res.result)
    result["step"] = res.step
    return Reply(id=cmd_id, ok=res.ok, result=result, error=res.error)
