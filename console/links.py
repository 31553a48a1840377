"""One link per rank: connect, read its records, notice silence, reconnect with backoff.

A `RankLink.run` loop is blocking I/O; the app runs each in a thread worker and `--once` in a
plain thread. The loop reports through a `LinkSink` only (its phase changes and every message
it reads), so the UI thread never touches a socket. A lost console never disturbs the run: a
subscriber only reads, and the rank never waits for it.

Its phases are drawn in `console.link_phase`'s docstring; how it reaches the rank is a
`console.connectors.Connector`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from console.connectors import Connector, LinkRefused
from console.hostfile import RankTarget
from console.link_phase import UP, LinkPhase, LinkSink, LinkStatus
from telemetry.backoff import Backoff
from telemetry.errors import ConnectionLost, TelemetryError
from telemetry.records import Hello

CONNECT_TIMEOUT = 10.0
RECV_TIMEOUT = 0.5  # how often a quiet link checks for stop and staleness
STALE_AFTER = 10.0


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
        """Cut the wait before the next attempt short (the operator pressed l)."""
        self.backoff.reset()
        self._wake.set()

    def run(self, should_stop: Callable[[], bool] | None = None) -> None:
        """The loop: blocks until `stop()` (or `should_stop()` turns true)."""
        done = (lambda: self.stopped() or should_stop()) if should_stop else self.stopped
        while not done():
            # Cleared before the attempt, not after: a retry_now() that lands while it fails
            # (the operator saw "refused" and pressed l at once) still cuts the wait short.
            self._wake.clear()
            delay = self._session(done)
            if done():
                break
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
