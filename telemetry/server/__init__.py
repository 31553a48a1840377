"""A rank's telemetry server: one selector thread fans records out and takes signed commands.

Layers, each wrapping only the one below (as pynvim's msgpack_rpc):

    loop.py        the thread's selector, its wake-up pair, its failure budget
    listener.py    bind address and loopback policy, the Unix socket and its stale probe
    connection.py  one socket over telemetry.framing: read, queued writes, backpressure,
                   and the time it may take to do its part
    pool.py        the open connections: who gets a slot, who makes room for whom
    options.py     how a server serves (bind, backlogs, buffers, limits): one value
    session.py     a connection's challenge and commands in flight; the run's checks
    broadcast.py   the training thread's records, encoded once, kept as history

`Server` below only composes them. Why one thread and a selector rather than a thread per
connection: fan-out is then a loop over in-memory buffers (each record is encoded once,
whatever the number of subscribers), a stalled subscriber costs a failed non-blocking send
rather than a parked thread, and the training thread shares the GIL with one extra thread,
not with one per console.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

from telemetry.control import CommandQueue
from telemetry.records import Event, Hello, Update
from telemetry.server.broadcast import Broadcast
from telemetry.server.connection import ConnectionLimits
from telemetry.server.listener import ANY_PORT, UNIX_PATH_MAX, Listener, accept
from telemetry.server.loop import EventLoop
from telemetry.server.options import ServerOptions
from telemetry.server.pool import Connections
from telemetry.server.session import CommandGate, Session

__all__ = ["ANY_PORT", "UNIX_PATH_MAX", "ConnectionLimits", "Server", "ServerOptions"]

log = logging.getLogger(__name__)


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
        options: ServerOptions | None = None,
        unix_path: Path | None = None,
        commands: CommandQueue | None = None,
        key: bytes | None = None,
        rank0_port: int | None = None,
    ) -> None:
        o = options or ServerOptions()
        self.hello = hello  # what new connections are told (Hub.set_hello replaces it)
        self.rank = hello.rank
        self.unix_path = unix_path
        label = f"rank {self.rank}"
        self._listener = Listener(
            rank=self.rank,
            port=port,
            bind=o.bind,
            allow_remote=o.allow_remote,
            unix_path=unix_path,
        )
        self._loop = EventLoop(label)
        self._records = Broadcast(
            label=label,
            queue_size=o.queue_size,
            backlog=o.backlog,
            event_backlog=o.event_backlog,
            flush_interval=o.flush_interval,
            wake=self._loop.wake,
        )
        self._gate = CommandGate(
            rank=self.rank, commands=commands, key=key, rank0_port=rank0_port, wake=self._loop.wake
        )
        self._conns = Connections(self._loop.selector, cap=o.subscriber_buffer, limits=o.limits)
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound TCP (host, port), or None without a TCP socket."""
        return self._listener.address

    # --- the caller's thread ------------------------------------------------------------------

    def start(self) -> Server:
        """Bind the sockets (raising TelemetryError with the reason) and start the thread."""
        try:
            for lsock in self._listener.open():
                self._loop.watch(lsock, functools.partial(self._accept, lsock))
        except BaseException:
            self._close_all()
            raise
        self._thread = threading.Thread(
            target=self._serve, name=f"telemetry-server-{self.rank}", daemon=True
        )
        self._thread.start()
        return self

    def publish(self, record: Update | Event) -> None:
        """Hand a record to the server thread; never blocks, never raises."""
        self._records.publish(record)

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread (bounded wait); it closes every socket and the Unix socket file."""
        self._loop.stop()
        if self._thread is None:
            self._close_all()
            return
        self._thread.join(timeout)
        if self._thread.is_alive():  # a daemon: it still closes its sockets when it gets here
            log.warning("rank %d: telemetry server thread did not stop in time", self.rank)

    def stats(self) -> dict[str, Any]:
        """Counters for benchmarks and the log (read from any thread; values may be a tick old)."""
        conns = list(self._conns)
        return {
            "subscribers": len(conns),
            "dropped_in_queue": self._records.dropped,
            "dropped_for_subscribers": sum(c.dropped_total for c in conns),
            "stalled_subscribers": sum(c.stalled_since is not None for c in conns),
            "refused_clients": self._conns.refused,
            "evicted_clients": self._conns.evicted,
            "timed_out_clients": self._conns.timed_out,
            "closed_on_error": self._conns.closed_on_error,
            "server_cpu_s": self._loop.cpu_s,
        }

    # --- the server thread --------------------------------------------------------------------

    def _serve(self) -> None:
        if self._loop.run(self._timeout, self._turn):
            self._last_words()
        self._close_all()

    def _timeout(self) -> float:
        return self._records.wait(idle=self._conns.sweep_every)  # timeouts need a tick

    def _turn(self) -> None:
        now = time.monotonic()
        for data in self._records.due(now):
            self._conns.push(data)
        self._gate.answer()
        self._conns.flush()
        self._conns.sweep(now)

    def _accept(self, lsock: socket.socket, mask: int) -> None:
        accepted = accept(lsock)
        conn = self._conns.add(*accepted) if accepted else None
        if conn is None:
            return
        session = Session(conn, self._gate)
        hello = dataclasses.replace(self.hello, challenge=session.challenge)
        for data in self._records.greeting(hello):  # hello, then history
            conn.queue(data)
        conn.start(session.handle)

    def _last_words(self, grace: float = 0.5) -> None:
        """On close, send what is queued (the run's `stopped` event, say) for up to `grace` s."""
        try:
            for data in self._records.drain():
                self._conns.push(data)
            self._gate.answer()
            self._conns.drain(grace)
        except Exception:  # closing anyway
            log.exception("rank %d: telemetry server error while closing", self.rank)

    def _close_all(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conns.close()
        self._listener.close()
        self._loop.close()
