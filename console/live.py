"""The live feed: every rank's link, and the control key for commands to rank 0.

It is what `fleet console` watches (the app runs its link loops on worker threads; `--once`
on plain ones) and implements `console.feed.Feed`, as the replay does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from console.connectors import Connector, same_run
from console.hostfile import RankTarget
from console.link_phase import UP, LinkSink, LinkStatus
from console.links import RankLink
from telemetry.errors import AuthError
from telemetry.records import Hello, Message


class LiveFeed:
    """Every rank's link plus the control key; the app and `--once` both drive this."""

    playback = None  # live: nothing to play

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
        """Why rank 0's run is not the one in --run-dir, or "" (then commands may go)."""
        if not self.run_dir:
            return ""
        expected = self.connector.expected_run(self.run_dir)
        if same_run(served, expected):
            return ""
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

    def loops(self) -> dict[str, Callable[[], None]]:
        return {f"link-{link.rank}": link.run for link in self.links}

    def start(self) -> None:
        pass  # the links deliver as soon as their loops run

    def start_threads(self) -> None:
        """Run every link on a daemon thread (for use without the app: `--once`)."""
        for name, loop in self.loops().items():
            t = threading.Thread(target=loop, name=name, daemon=True)
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

    def reconnect(self) -> None:
        for link in self.links:
            if link.phase not in UP:
                link.retry_now()

    def close(self) -> None:
        for link in self.links:
            link.stop()
        self.connector.close()
        for t in self._threads:
            t.join(timeout=2.0)
