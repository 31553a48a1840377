"""Records from the training thread to every subscriber: each encoded once, kept as history."""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator

from telemetry import protocol
from telemetry.records import Event, Hello, Update

log = logging.getLogger(__name__)


class Broadcast:
    """A bounded inbox the training thread fills (`publish`), the loop thread drains.

    Records go out in batches at most every `flush_interval` s (0: each at once); a record
    after a quiet spell goes at once. The last `backlog` updates and `event_backlog` events
    stay encoded as history, sent to each new subscriber after its hello.
    """

    def __init__(
        self,
        *,
        label: str,
        queue_size: int,
        backlog: int,
        event_backlog: int,
        flush_interval: float,
        wake: Callable[[], None],
    ) -> None:
        self.label = label  # "rank N", for the log
        self.flush_interval = flush_interval
        self.dropped = 0  # records lost because the loop thread fell behind the trainer
        self.updates: collections.deque[bytes] = collections.deque(maxlen=max(backlog, 0))
        self.events: collections.deque[bytes] = collections.deque(maxlen=max(event_backlog, 0))
        self._inbox: collections.deque[Update | Event] = collections.deque(maxlen=queue_size)
        self._wake = wake
        self._wake_pending = False
        self._next_send = 0.0

    def publish(self, record: Update | Event) -> None:
        """Hand a record to the loop thread; never blocks, never raises."""
        if len(self._inbox) == self._inbox.maxlen:
            self.dropped += 1  # deque drops the oldest itself; the count may race by one
        self._inbox.append(record)
        # One wake per batch, not per record: the loop clears the flag just before it
        # drains the inbox, so a record appended after that drain always wakes it again.
        if not self._wake_pending:
            self._wake_pending = True
            self._wake()

    def wait(self, idle: float = 1.0) -> float:
        """Seconds the loop may sleep: until the next batch is due, or `idle` if none waits."""
        if self._inbox:
            return max(0.0, self._next_send - time.monotonic())
        return idle

    def due(self, now: float) -> Iterable[bytes]:
        """The batch due at `now` (see `drain`), or nothing before `flush_interval` has passed.

        Batching makes it one send per subscriber per batch, however fast the run steps.
        """
        if not self._inbox or now < self._next_send:
            return ()
        self._next_send = now + self.flush_interval
        return self.drain()

    def drain(self) -> Iterator[bytes]:
        """The wire bytes of each queued record, oldest first, each also kept as history."""
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
                    self.events.append(data)
                else:
                    data = protocol.encode(record)
                    self.updates.append(data)
            except Exception as e:  # a record the wire cannot carry is skipped, not fatal
                kind = getattr(record, "type", type(record).__name__)
                log.warning("%s: cannot send a %s record: %s", self.label, kind, e)
                continue
            yield data

    def greeting(self, hello: Hello) -> list[bytes]:
        """`hello` with its history counts, then the history: updates, then events (encoded)."""
        hello = dataclasses.replace(
            hello, backlog=len(self.updates), event_backlog=len(self.events)
        )
        return [protocol.encode(hello), *self.updates, *self.events]
