"""The progress bar of `fleet prepare`: rich on a terminal's stderr, a no-op otherwise."""

from __future__ import annotations

import sys


class ProgressBar:
    """A rich progress bar on stderr when wanted and stderr is a terminal; a no-op otherwise."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.bar = None

    def __enter__(self) -> ProgressBar:
        if self.wanted and sys.stderr.isatty():
            # imported here: rich costs import time that --quiet runs and tests need not pay
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description:>10}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def add(self, description: str, total: int) -> int:
        """A new task line; returns its id for `advance`."""
        return self.bar.add_task(description, total=total) if self.bar else 0

    def advance(self, task: int, n: int = 1) -> None:
        """Move task `task` on by `n` units."""
        if self.bar is not None:
            self.bar.advance(task, n)
