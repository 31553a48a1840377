"""The event log: checkpoints, pauses, rebalances, commands and their outcome, link trouble."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from console import fmt
from console.events import LogLine

LEVEL_STYLE = {
    "info": "",
    "good": "green",
    "warning": "yellow",
    "error": "bold red",
    "command": "cyan",
}


def format_line(line: LogLine) -> Text:
    """`14:03:07 r0 @1200 checkpoint runs/x/ckpt (verified)`."""
    text = Text()
    text.append(fmt.clock(line.time), "bright_black")
    text.append(" ")
    if line.rank is not None:
        text.append(f"r{line.rank} ", "bright_black")
    if line.step is not None:
        text.append(f"@{line.step} ", "bright_black")
    text.append(line.text, LEVEL_STYLE.get(line.level, ""))
    return text


class EventLog(RichLog):
    """Newest last; follows the end unless the operator scrolled up."""

    DEFAULT_CSS = """
    EventLog {
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        background: $surface;
        scrollbar-size-vertical: 1;
    }
    EventLog:focus {
        border: round $accent;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(
            max_lines=1000, min_width=20, wrap=True, markup=False, highlight=False, **kwargs
        )
        self.border_title = "events"
        self.last_seq = 0

    def add(self, lines: list[LogLine]) -> None:
        """Append the lines not shown yet (by sequence number)."""
        for line in lines:
            if line.seq > self.last_seq:
                self.write(format_line(line))
                self.last_seq = line.seq
