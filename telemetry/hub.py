"""The trainer's telemetry object, one per rank: socket server and Arrow log behind a Reporter.

    hub = Hub(run_dir=run, hello=hello, port=47800 + rank, commands=queue, key=key).start()
    ...
    hub.on_update(record)  # once per update, from the training loop: never blocks
    ...
    hub.close()

Records handed to the hub are encoded and written later on its own threads: don't mutate a
record after handing it over.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from telemetry.arrowlog import ArrowLog, log_dir
from telemetry.control import CommandQueue
from telemetry.records import EVENT_KINDS, Event, Hello, Update
from telemetry.server import ANY_PORT, ConnectionLimits, Server, ServerOptions

__all__ = ["ANY_PORT", "ConnectionLimits", "Hub", "ServerOptions", "unix_socket_path"]


def unix_socket_path(run_dir: str | Path, rank: int) -> Path:
    """Where rank `rank` serves its Unix socket when asked to."""
    return log_dir(run_dir) / f"rank-{rank}.sock"


class Hub:
    """Serves a rank's telemetry and logs it; implements the Reporter protocol.

    `port`: None or 0 serves no socket (log only), ANY_PORT (-1) an ephemeral one (read it from
    `address`), else that port. Only rank 0 with `commands` and `key` applies commands.
    `options`: where and how the server serves (telemetry/server/options.py): records go out
    at most every `flush_interval` s, batched; a record after a quiet spell goes at once, and
    replies to commands never wait.
    """

    def __init__(
        self,
        *,
        run_dir: Path,
        hello: Hello,
        port: int | None,
        options: ServerOptions | None = None,
        unix_socket: bool = False,
        commands: CommandQueue | None = None,
        key: bytes | None = None,
        log: bool = True,
    ) -> None:
        options = options or ServerOptions()
        self.run_dir = Path(run_dir)
        self._hello = hello
        self.rank = hello.rank
        self.log: ArrowLog | None = (
            ArrowLog(self.run_dir, hello.rank, queue_size=options.queue_size) if log else None
        )
        self.server: Server | None = None
        if port or unix_socket:
            self.server = Server(
                hello=hello,
                port=port or None,
                options=options,
                unix_path=unix_socket_path(self.run_dir, hello.rank) if unix_socket else None,
                commands=commands,
                key=key,
                rank0_port=port - hello.rank if port and port > 0 else None,
            )

    def start(self) -> Hub:
        """Open the log folder, bind the sockets, start the threads; TelemetryError says why not."""
        if self.log is not None:
            self.log.start()
        if self.server is not None:
            try:
                self.server.start()
            except BaseException:
                if self.log is not None:
                    self.log.close()
                raise
        return self

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound TCP (host, port), or None without a TCP socket."""
        return self.server.address if self.server is not None else None

    @property
    def unix_path(self) -> Path | None:
        """The Unix socket served, or None."""
        return self.server.unix_path if self.server is not None else None

    @property
    def hello(self) -> Hello:
        return self._hello

    def on_update(self, record: Update) -> None:
        """Hand over one update; never blocks and never raises into the training loop."""
        self._put(record)

    def on_event(self, event: Event) -> None:
        """Hand over one event; never blocks. ValueError for a kind not in EVENT_KINDS.

        That one raises because it is a bug in the caller (kinds are literals in the code),
        found by the first test that emits it, rather than a kind no console knows.
        """
        kind = getattr(event, "kind", None)
        if kind not in EVENT_KINDS:
            known = ", ".join(sorted(EVENT_KINDS))
            raise ValueError(f"unknown event kind {kind!r}; a rank emits one of: {known}")
        self._put(event)

    def _put(self, record: Update | Event) -> None:
        try:
            if self.server is not None:
                self.server.publish(record)
            if self.log is not None:
                self.log.put(record)
        except Exception:  # telemetry must not be the reason a run stops
            pass

    def set_hello(self, **changes: Any) -> None:
        """Change what new connections are told (e.g. local_batch after a rebalance)."""
        self._hello = dataclasses.replace(self._hello, **changes)
        if self.server is not None:
            self.server.hello = self._hello

    def stats(self) -> dict[str, Any]:
        """Drop counters and subscriber count, for benchmarks and the end-of-run log."""
        out: dict[str, Any] = {}
        if self.server is not None:
            out.update(self.server.stats())
        if self.log is not None:
            out.update(
                log_written=self.log.written, log_dropped=self.log.dropped, log_cpu_s=self.log.cpu_s
            )
        return out

    def close(self) -> None:
        """Stop serving, write what is queued to the log and close it; bounded time."""
        if self.server is not None:
            self.server.close()
        if self.log is not None:
            self.log.close()

    def __enter__(self) -> Hub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
