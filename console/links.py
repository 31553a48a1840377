"""One link per rank: connect, read its records, notice silence, reconnect with backoff.

A `RankLink.run` loop is blocking I/O; the app runs each in a thread worker and `--once` in a
plain thread. The loop reports through a `LinkSink` only (its phase changes and every message
it reads), so the UI thread never touches a socket. A lost console never disturbs the run: a
subscriber only reads, and the rank never waits for it.

Its phases (`console.model.LinkPhase`) are drawn in `console.model`'s docstring.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath
from typing import Any, Protocol

from console.hostfile import RankTarget
from console.model import UP, LinkPhase, LinkSink, LinkStatus
from telemetry.backoff import Backoff
from telemetry.errors import AuthError, ConnectionLost, TelemetryError
from telemetry.records import Hello, Message, run_id_of

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
RECV_TIMEOUT = 0.5  # how often a quiet link checks for stop and staleness
STALE_AFTER = 10.0

# console/bench.py (leaving the package on another branch) still imports the old name here.
LinkState = LinkPhase


class LinkRefused(Exception):
    """The far side said no; `kind` is a short reason, `retry` whether trying again may help."""

    def __init__(self, message: str, kind: str, retry: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry = retry


class Connector(Protocol):
    """How to reach ranks: plain loopback TCP (--local) or SSH channels."""

    def open(self, target: RankTarget, timeout: float) -> Any:
        """A connected socket-like (recv/sendall/settimeout/close); LinkRefused or OSError."""
        ...

    def describe(self, target: RankTarget) -> str: ...

    def read_control_key(self, target: RankTarget, run_dir: str) -> bytes:
        """The control key from `run_dir` on the target's host; AuthError with the reason."""
        ...

    def close(self) -> None: ...


# --- connectors --------------------------------------------------------------------------------


class TCPConnector:
    """Ranks on this machine: TCP to 127.0.0.1:port, key read from the local run folder."""

    def open(self, target: RankTarget, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection(("127.0.0.1", target.port), timeout=timeout)
        except ConnectionRefusedError:
            raise LinkRefused(
                f"nothing listening on 127.0.0.1:{target.port}", "nothing listening"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def describe(self, target: RankTarget) -> str:
        return f"127.0.0.1:{target.port}"

    def read_control_key(self, target: RankTarget, run_dir: str) -> bytes:
        from telemetry.auth import read_key

        return read_key(run_dir)

    def close(self) -> None:
        pass


class SSHConnector:
    """Ranks behind SSH: a direct-tcpip channel per rank over one connection per host."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool  # console.ssh.SSHPool; untyped so this module does not import paramiko

    def open(self, target: RankTarget, timeout: float) -> Any:
        from console.ssh import SSHError

        try:
            return self.pool.open_forward(target.host, target.port, timeout=timeout)
        except SSHError as e:
            raise LinkRefused(str(e), e.kind, e.retry) from None

    def describe(self, target: RankTarget) -> str:
        return f"{target.host} → 127.0.0.1:{target.port}"

    def read_control_key(self, target: RankTarget, run_dir: str) -> bytes:
        from console.ssh import SSHError
        from telemetry.auth import KEY_BYTES, KEY_FILE

        path = str(PurePosixPath(run_dir) / KEY_FILE)
        try:
            data = self.pool.read_file(target.host, path, private=True)
        except (SSHError, OSError) as e:
            raise AuthError(f"cannot read the control key {target.host}:{path}: {e}") from None
        if len(data) != KEY_BYTES:
            raise AuthError(
                f"control key {target.host}:{path} holds {len(data)} bytes, expected {KEY_BYTES}"
            )
        return data

    def close(self) -> None:
        self.pool.close()


# --- one rank's link ---------------------------------------------------------------------------


def _default_client(sock: Any, key: bytes | None, timeout: float, peer: str = "") -> Any:
    from telemetry.client import TelemetryClient

    return TelemetryClient(sock, key=key, timeout=timeout, peer=peer)


class RankLink:
    """Keeps one rank's telemetry flowing into a sink until stopped."""

    def __init__(
        self,
        target: RankTarget,
        connector: Connector,
        sink: LinkSink,
        *,
        backoff: Backoff | None = None,
        stale_after: float = STALE_AFTER,
        recv_timeout: float = RECV_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
        client_factory: Callable[..., Any] = _default_client,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.target = target
        self.connector = connector
        self.sink = sink
        self.backoff = backoff or Backoff(0.5, 2.0, 15.0, 0.2)
        self.stale_after = stale_after
        self.recv_timeout = recv_timeout
        self.connect_timeout = connect_timeout
        self.client_factory = client_factory
        self.clock = clock
        self.key: bytes | None = None
        self.phase = LinkPhase.CONNECTING
        self.hello: Hello | None = None
        self._client: Any = None
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()

    @property
    def rank(self) -> int:
        return self.target.rank

    def _set(
        self, phase: LinkPhase, detail: str = "", kind: str = "", retry_in: float | None = None
    ) -> None:
        self.phase = phase
        now = self.clock()
        retry_at = None if retry_in is None else now + retry_in
        self.sink.link_status(LinkStatus(self.rank, phase, detail, kind, retry_at, now))

    def stopped(self) -> bool:
        return self._stop.is_set()

    def stop(self) -> None:
        """Ask the loop to end and unblock it (safe from any thread)."""
        self._stop.set()
        self._wake.set()
        client = self._client
        if client is not None:
            _close(client)  # from another thread this may race the reader; harmless

    def retry_now(self) -> None:
        """Cut a backoff wait short (the operator asked to reconnect)."""
        self.backoff.reset()
        self._wake.set()

    def run(self, should_stop: Callable[[], bool] | None = None) -> None:
        """The loop: blocks until `stop()` (or `should_stop()` turns true)."""
        done = (lambda: self.stopped() or should_stop()) if should_stop else self.stopped
        while not done():
            delay = self._session(done)
            if done():
                break
            self._wake.clear()
            if delay is None:  # refused for good: wait for retry_now() or stop
                while not done() and not self._wake.wait(1.0):
                    pass
            else:
                deadline = time.monotonic() + delay
                while not done() and (left := deadline - time.monotonic()) > 0:
                    if self._wake.wait(min(left, 1.0)):
                        break
        self._set(LinkPhase.LOST, "console closed")

    def _session(self, done: Callable[[], bool]) -> float | None:
        """Connect and read until the link drops; return the delay before retrying (None: never)."""
        self._set(LinkPhase.CONNECTING, self.connector.describe(self.target))
        try:
            sock = self.connector.open(self.target, self.connect_timeout)
        except LinkRefused as e:
            delay = self.backoff.next() if e.retry else None
            self._set(LinkPhase.REFUSED, str(e), e.kind, delay)
            return delay
        except (OSError, TelemetryError) as e:
            delay = self.backoff.next()
            self._set(LinkPhase.LOST, _why(e), "unreachable", delay)
            return delay
        try:
            client = self.client_factory(
                sock, self.key, self.connect_timeout, self.connector.describe(self.target)
            )
        except (OSError, TelemetryError, EOFError) as e:
            _close(sock)
            delay = self.backoff.next()
            self._set(LinkPhase.LOST, f"no hello: {_why(e)}", "no hello", delay)
            return delay
        hello = client.hello
        if hello.rank != self.rank:
            _close(client)
            delay = self.backoff.next()
            self._set(
                LinkPhase.REFUSED,
                f"{self.connector.describe(self.target)} serves rank {hello.rank} of run "
                f"{hello.run_id}, not rank {self.rank}: check --port-base and the hostfile order",
                "wrong rank",
                delay,
            )
            return delay
        self.hello = hello
        self._client = client
        if done():  # stop() raced the connect and missed this client
            _close(client)
            return 0.0
        self.sink.link_message(self.rank, hello)
        self._set(LinkPhase.LIVE, self.connector.describe(self.target))
        last = time.monotonic()
        try:
            while not done():
                msg = client.recv(timeout=self.recv_timeout)
                now = time.monotonic()
                if msg is None:
                    if self.phase is LinkPhase.LIVE and now - last > self.stale_after:
                        self._set(LinkPhase.STALE, f"no record for {self.stale_after:.0f} s")
                    continue
                if self.phase is not LinkPhase.LIVE:
                    self._set(LinkPhase.LIVE, self.connector.describe(self.target))
                    self.backoff.reset()
                last = now
                self.sink.link_message(self.rank, msg)
        except (ConnectionLost, TelemetryError, OSError, EOFError) as e:
            if done():
                return 0.0
            delay = self.backoff.next()
            self._set(LinkPhase.LOST, _why(e), "lost", delay)
            return delay
        finally:
            self._client = None
            _close(client)
        return 0.0

    def send_command(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        """Send a signed command on this link; returns its id (the reply comes through the sink)."""
        client = self._client
        if client is None or self.phase not in UP:
            raise ConnectionLost(f"rank {self.rank} link is {self.phase.value}")
        with self._send_lock:
            if self.key is not None:
                client.key = self.key  # the key may have been fetched after this link connected
            return client.send_command(cmd, args or {})


def _why(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) < 300 else text[:297] + "..."


def _close(obj: Any) -> None:
    with contextlib.suppress(Exception):  # best effort: the peer may be gone already
        obj.close()


# --- the whole fleet's links -------------------------------------------------------------------


class LiveFeed:
    """Every rank's link plus the control key; the app and `--once` both drive this."""

    replay = False

    def __init__(
        self,
        targets: Sequence[RankTarget],
        connector: Connector,
        *,
        run_dir: str | None = None,
        read_only: bool = False,
        link_options: dict[str, Any] | None = None,
    ) -> None:
        self.targets = list(targets)
        self.connector = connector
        self.run_dir = run_dir
        self.read_only = read_only
        self.sink: LinkSink | None = None
        self.links = [RankLink(t, connector, self, **(link_options or {})) for t in self.targets]
        self._key_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.wrong_run = ""  # set when rank 0 turns out to serve another run than --run-dir

    # LinkSink: links report here, the feed forwards to whoever attached.
    def link_status(self, status: LinkStatus) -> None:
        if self.sink is not None:
            self.sink.link_status(status)

    def link_message(self, rank: int, message: Message) -> None:
        if rank == 0 and isinstance(message, Hello):
            self.wrong_run = self.check_run(message.run_id)
        if self.sink is not None:
            self.sink.link_message(rank, message)

    def check_run(self, served: str) -> str:
        """Why rank 0's run is not the one in --run-dir, or "" (then commands may go).

        On this machine the whole id is known; on another host only the folder's name is
        (the id's hash is of the absolute path there).
        """
        if not self.run_dir:
            return ""
        if isinstance(self.connector, TCPConnector):
            expected = run_id_of(self.run_dir)
            if served == expected:
                return ""
        else:
            name = PurePosixPath(self.run_dir.rstrip("/")).name
            if served.rsplit("-", 1)[0] == name:
                return ""
            expected = f"{name}-…"
        return (
            f"rank 0 serves run {served}, but --run-dir {self.run_dir} is run {expected}: "
            "commands are off (check --port-base)"
        )

    def attach(self, sink: LinkSink) -> None:
        self.sink = sink

    @property
    def control_problem(self) -> str:
        """Why commands cannot be sent from this console, or ""."""
        if self.read_only:
            return "this console is read-only (--read-only)"
        if self.run_dir is None:
            return "no --run-dir given, so no control key: commands are off"
        return self.wrong_run

    def start_threads(self) -> None:
        """Run every link on a daemon thread (for use without the app)."""
        for link in self.links:
            t = threading.Thread(target=link.run, name=f"link-{link.rank}", daemon=True)
            t.start()
            self._threads.append(t)

    def ensure_key(self) -> bytes:
        """The control key, fetched once (over SFTP for SSH); AuthError with the reason."""
        if problem := self.control_problem:
            raise AuthError(problem)
        link0 = self.links[0]
        with self._key_lock:
            if link0.key is None:
                assert self.run_dir is not None
                link0.key = self.connector.read_control_key(self.targets[0], self.run_dir)
            return link0.key

    def send(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        """Send a command to rank 0 (blocking: call from a worker); returns the command id."""
        self.ensure_key()
        return self.links[0].send_command(cmd, args)

    def close(self) -> None:
        for link in self.links:
            link.stop()
        self.connector.close()
        for t in self._threads:
            t.join(timeout=2.0)
