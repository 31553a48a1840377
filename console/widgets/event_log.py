"""The event log: checkpoints, pauses, rebalances, commands and their outcome, link trouble.

A line-API ScrollView over the fleet's log lines: each line is wrapped once per width (and
again only when another rank joins it), and only the rows on screen are drawn. It stays at
the newest line, through new lines and resizes, unless the operator scrolls up; scrolling
back to the end follows again.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.events import Resize
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console import fmt
from console.events import LogLine

LEVEL_STYLE = {
    "info": "",
    "good": "green",
    "warning": "yellow",
    "error": "bold red",
    "command": "cyan",
}
SHOWN = 1000  # the newest lines kept on screen (the fleet keeps more for --once)


def format_line(line: LogLine) -> Text:
    """`14:03:07 r0 @1200 checkpoint runs/x/ckpt (verified)`, `… all 4 ranks @42 paused …`."""
    text = Text()
    text.append(fmt.clock(line.time), "bright_black")
    text.append(" ")
    who = line.who or (f"r{line.rank}" if line.rank is not None else "")
    if who:
        text.append(f"{who} ", "bright_black")
    if line.step is not None:
        text.append(f"@{line.step} ", "bright_black")
    text.append(line.text, LEVEL_STYLE.get(line.level, ""))
    if line.kind == "sample":  # generated text is the least of the news: one row, cut
        text.no_wrap, text.overflow = True, "ellipsis"
    return text


class EventLog(ScrollView, can_focus=True):
    """Newest last; follows the end unless the operator scrolled up."""

    DEFAULT_CSS = """
    EventLog {
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        background: $surface;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    EventLog:focus {
        border: round $accent;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.border_title = "events"
        self.follow = True  # at the newest line; False once the operator scrolls up
        self._lines: list[LogLine] = []
        self._wrapped: dict[int, tuple[int, int, list[Strip]]] = {}  # seq -> (rev, width, rows)
        self._rows: list[Strip] = []
        self._version = -1
        self._width = 0

    @property
    def last_seq(self) -> int:
        """The newest line's sequence number (0 before any)."""
        return self._lines[-1].seq if self._lines else 0

    def show(self, lines: Sequence[LogLine], version: int) -> None:
        """Show the fleet's log lines; `version` (the fleet's log_version) skips a no-op."""
        if version == self._version:
            return
        self._version = version
        self._lines = list(lines)[-SHOWN:]
        self._layout()

    def add(self, lines: Sequence[LogLine]) -> None:
        """Show `lines` (the whole log; kept for callers without a version)."""
        self._version = -1
        self.show(lines, -2)

    def on_resize(self, event: Resize) -> None:
        self._layout()

    def _layout(self) -> None:
        width = self.scrollable_content_region.width
        if width <= 0 or not self.is_mounted:
            return  # laid out once the size is known (on_resize)
        self._width = width
        console = self.app.console
        options = console.options.update_width(width)
        wrapped: dict[int, tuple[int, int, list[Strip]]] = {}
        rows: list[Strip] = []
        for line in self._lines:
            cached = self._wrapped.get(line.seq)
            if cached is None or cached[0] != line.rev or cached[1] != width:
                strips = [
                    Strip(segments, width)
                    for segments in console.render_lines(format_line(line), options, pad=True)
                ]
                cached = (line.rev, width, strips)
            wrapped[line.seq] = cached
            rows.extend(cached[2])
        self._wrapped = wrapped
        self._rows = rows
        self.virtual_size = Size(width, len(rows))
        if self.follow:
            self.scroll_end(animate=False, x_axis=False)
        self.refresh()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        # Whatever moved it (a key, the wheel, the scrollbar), the end means "follow again".
        self.follow = new >= self.max_scroll_y

    def render_line(self, y: int) -> Strip:
        row = self.scroll_offset.y + y
        width = self.scrollable_content_region.width
        if row >= len(self._rows):
            return Strip.blank(width, self.rich_style)
        return self._rows[row].crop_extend(0, width, self.rich_style).apply_style(self.rich_style)
