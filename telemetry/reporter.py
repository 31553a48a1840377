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
