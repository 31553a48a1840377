"""The terminal the console draws on, when stdout is not one (`fleet demo | tee log`).

Textual draws on stderr but measures stdout; piped stdout made it fall back to 80x24 inside
a larger terminal. While the app runs, `on_terminal()` points both at the controlling
terminal, so the frame has the terminal's real size and follows its resizes, and the pipe
gets only the lines printed before and after. With no terminal at all, `missing()` says why
the console cannot run.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO

TTY = "/dev/tty"


def _isatty(stream: IO[str] | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed or detached
        return False


def _open_tty() -> IO[str] | None:
    try:
        return open(TTY, "w", encoding="utf-8")  # noqa: SIM115 - closed by on_terminal
    except OSError:  # no controlling terminal (a service, CI, nohup)
        return None


def missing() -> str:
    """Why the console cannot be drawn here, or "" when a terminal is at hand."""
    if _isatty(sys.__stdout__) and _isatty(sys.__stderr__):
        return ""
    tty = _open_tty()
    if tty is not None:
        tty.close()
        return ""
    return (
        "the console needs a terminal: stdout and stderr are not one and there is no "
        "controlling terminal (run it from a terminal, or use --once for a snapshot)"
    )


@contextlib.contextmanager
def on_terminal() -> Iterator[None]:
    """While inside, stdout and stderr as Textual sees them are the controlling terminal
    (when they are not one already)."""
    if _isatty(sys.__stdout__) and _isatty(sys.__stderr__):
        yield
        return
    tty = _open_tty()
    if tty is None:
        yield
        return
    saved = sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr
    sys.__stdout__ = sys.__stderr__ = sys.stdout = sys.stderr = tty  # type: ignore[misc]
    try:
        yield
    finally:
        sys.__stdout__, sys.__stderr__, sys.stdout, sys.stderr = saved  # type: ignore[misc]
        tty.close()
