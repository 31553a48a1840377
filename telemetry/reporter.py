"""The interface the training loop reports through; it must never block the loop."""

from __future__ import annotations

from typing import Any, Protocol

from telemetry.records import Event, Update


class Reporter(Protocol):
    """What the trainer calls once per update and on each event."""

    def on_update(self, record: Update) -> None: ...

    def on_event(self, event: Event) -> None: ...

    def set_hello(self, **changes: Any) -> None: ...

    def close(self) -> None: ...


class NullReporter:
    """Reports nowhere; keeps `if telemetry:` out of the training loop."""

    def on_update(self, record: Update) -> None:
        pass

    def on_event(self, event: Event) -> None:
        pass

    def set_hello(self, **changes: Any) -> None:
        pass

    def close(self) -> None:
        pass


class FanOut:
    """Hands each record to several reporters in order."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = list(reporters)

    def on_update(self, record: Update) -> None:
        for r in self.reporters:
            r.on_update(record)

    def on_event(self, event: Event) -> None:
        for r in self.reporters:
            r.on_event(event)

    def set_hello(self, **changes: Any) -> None:
        """What a late subscriber is told about this rank (e.g. its local batch)."""
        for r in self.reporters:
            r.set_hello(**changes)

    def close(self) -> None:
        for r in self.reporters:
            r.close()
