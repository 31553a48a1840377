"""The server thread's event loop: one selector, a wake-up socket pair, and a failure budget.

The bottom of the server: it knows sockets and callbacks, nothing of the protocol. Each
registered socket carries the callable its readiness is handed to.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
Handler = Callable[[int], None]  # called with the ready mask (READ | WRITE)
_MAX_FAILURES = 20  # turns in a row that raised: the loop is broken for good


class EventLoop:
    """Select and dispatch on one thread until `stop`; any thread may `wake` it."""

    def __init__(self, label: str) -> None:
        self.label = label  # "rank N", for the log
        self.selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.selector.register(self._wake_r, READ, self._drain_wake)
        self.stopping = False
        self.cpu_s = 0.0  # the loop thread's CPU time so far (for benchmarks)

    def watch(self, sock: socket.socket, handler: Handler) -> None:
        """Hand `sock`'s readability to `handler` (for a listening socket)."""
        self.selector.register(sock, READ, handler)

    def wake(self) -> None:
        """Make the current or next `select` return at once; from any thread, never raises."""
        with contextlib.suppress(OSError):  # full (the thread is awake anyway) or closed
            self._wake_w.send(b"\0")

    def stop(self) -> None:
        """Ask the loop to end after its current turn."""
        self.stopping = True
        self.wake()

    def run(self, timeout: Callable[[], float], turn: Callable[[], None]) -> bool:
        """Select for `timeout()` s, dispatch, `turn()`; again until stopped.

        True when it ended because `stop` was called, False when it gave up after repeated
        errors. One turn that raises is logged and skipped: it must not end telemetry for
        the whole run.
        """
        failures = 0
        while not self.stopping:
            try:
                for key, mask in self.selector.select(timeout()):
                    key.data(mask)
                turn()
                failures = 0
                self.cpu_s = time.thread_time()
            except Exception:
                failures += 1
                log.exception("%s: telemetry server error", self.label)
                if failures >= _MAX_FAILURES:  # broken for good (a closed selector?)
                    log.error("%s: telemetry server stopped after repeated errors", self.label)
                    return False
                time.sleep(0.05)
        return True

    def _drain_wake(self, mask: int) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def close(self) -> None:
        """Close the selector and the wake-up pair (sockets registered stay open)."""
        self.selector.close()
        self._wake_r.close()
        self._wake_w.close()
