"""The event log's lines, in order: one per thing said, what several ranks said alike as one.

Pure (no Textual). `console.fleet` decides what is said (with the words from `console.events`)
and hands it here; the widget redraws when `version` moves, a line again when its `rev` does.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator

from console.events import LogLine, who

LINES = 2000
GROUPS = 256  # recent lines other ranks may still join


class Journal:
    """The log: `add` a line, or `alike` to join the same words another rank already said."""

    def __init__(self, clock: Callable[[], float] = time.time, limit: int = LINES) -> None:
        self.clock = clock
        self.lines: deque[LogLine] = deque(maxlen=limit)
        self.version = 0  # bumped when a line is added or another rank joins one
        self._groups: OrderedDict[tuple, LogLine] = OrderedDict()
        self._seq = 0

    def __iter__(self) -> Iterator[LogLine]:
        return iter(self.lines)

    def __len__(self) -> int:
        return len(self.lines)

    def add(
        self,
        text: str,
        level: str = "info",
        *,
        rank: int | None = None,
        step: int | None = None,
        kind: str = "",
        when: float | None = None,
    ) -> LogLine:
        """A new line (`when`: the record's own time, else now)."""
        self._seq += 1
        when = self.clock() if when is None else when
        ranks = () if rank is None else (rank,)
        line = LogLine(self._seq, when, level, text, rank, step, kind, ranks, who(ranks, 1))
        self.lines.append(line)
        self.version += 1
        return line

    def alike(
        self, rank: int, step: int, kind: str, level: str, text: str, when: float, world: int
    ) -> LogLine:
        """Rank `rank` says `text`: it joins the line of another rank that said the same at
        the same update, else it is a line of its own."""
        key = (kind, step, level, text)
        line = self._groups.get(key)
        if line is None or rank in line.ranks:
            line = self.add(text, level, rank=rank, step=step, kind=kind, when=when)
            self._groups[key] = line
            if len(self._groups) > GROUPS:
                self._groups.popitem(last=False)
            return line
        line.ranks = (*line.ranks, rank)
        line.who = who(line.ranks, world)
        line.rev += 1
        self.version += 1
        return line

    def new_run(self) -> None:
        """Another run's steps start again: never join its lines to the last run's."""
        self._groups.clear()
