"""Keys, and how to read the bars and link phases."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
[b]Keys[/b]
  [b]c[/b]  checkpoint now               [b]p[/b]  pause / resume the run
  [b]r[/b]  rebalance the batch split    [b]s[/b]  stop the run (checkpoint, then exit)
  [b]l[/b]  reconnect links now          [b]q[/b]  quit this console; the run goes on
  [b]a[/b]  autopilot on / off: rebalance and guard memory by itself
  [b]↑ ↓[/b] choose a rank  [b]enter[/b] its timing and memory history  [b]esc[/b] close
  Keys that change the run ask first; the outcome appears in the event log.
{replay}
[b]A rank's line[/b]
  [green]█[/green] compute  [yellow]░[/yellow] waiting for the slowest rank  \
[blue]▒[/blue] all-reduce + optimizer
  [magenta]▓[/magenta] tensor parallelism: the per-block all-reduces inside compute (the
  [b]coll[/b] column); its split is fixed, so r and the autopilot say so and send nothing.
  Bars share one scale: a short bar is a rank that finished early.
  [bold red]»[/bold red][bold white on red]  3[/bold white on red] the straggler (here rank \
3), the rank everyone waits for: press r to rebalance.
  [on #0b4f80] blue band [/] the rank ↑ ↓ chose (the cursor), whatever its state.
  memory: █ active  ▓ peak above active  ░ allocator cache  · free
  [bold red]![/bold red] after memory: swap in use, or the OS reports memory pressure.

[b]Links[/b]
  [green]● live[/green]     records arriving       [green]● idle[/green]  run paused, link fine
  [yellow]◐ stale[/yellow]    connected, but silent for a while
  ◌ connecting         [red]○ lost 3s[/red]  dropped; retrying in 3 s on its own
  [bold red]✗ reason[/bold red]   refused: auth failed, host key unknown or changed,
             nothing listening (retried), wrong rank on that port;
             a refusal that retrying cannot help waits for [b]l[/b]
  ■ ended    a replay played its last record: the header says how the run ended

[b]Events[/b]
  What every rank says alike is one line ("all 4 ranks @42 paused ..."); the log stays
  at the newest line unless you scroll up (scroll to the end to follow again).
"""

REPLAY = """
[b]Replay[/b]
  [b]space[/b] play / pause   [b]n[/b] step one update   [b]+ -[/b] faster / slower
"""


class HelpScreen(ModalScreen[None]):
    """Any of escape, q or ? closes it."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
        background: $background 60%;
    }
    HelpScreen > VerticalScroll {
        width: 84;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [Binding("escape,q,question_mark", "dismiss(None)", "Close")]

    def __init__(self, replay: bool = False) -> None:
        super().__init__()
        self.replay = replay

    def compose(self) -> ComposeResult:
        with VerticalScroll() as v:
            v.border_title = "help"
            yield Static(HELP.format(replay=REPLAY if self.replay else ""))
