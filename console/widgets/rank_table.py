"""One line per rank: batch, compute-vs-wait, update time, memory, tokens/s, history, link.

A line-API ScrollView: only the lines on screen are rendered, so 64 ranks at 10 updates/s cost
what the visible rows cost. Columns widen with the terminal; a wait-history sparkline appears
when there is room for it, and a `coll` column (the per-block collectives of tensor
parallelism) when some rank reports them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from console import fmt, render
from console.fleet import Fleet, RankView
from console.link_phase import UP
from console.messages import RankSelected
from console.snapshot import straggler


@dataclass(frozen=True, slots=True)
class Columns:
    """Cell widths for one table width."""

    host: int
    bar: int
    mem: int
    history: int
    coll: int = 0  # the collectives' column (with its leading space); 0: not shown


FIXED = (
    1 + 3 + 1 + 1 + 3 + 1 + 1 + 7 + 1 + 1 + 9 + 1 + 1 + 6 + 1 + 13
)  # every column but the flexible


COLL = 6  # " 340ms": the widest that fmt.secs writes below ten seconds


def layout(width: int, coll: bool = False) -> Columns:
    """Share the width: bars first, then a wider host, then the history sparkline; `coll`
    takes its cells from the bars (tensor parallelism: the figure says more than a cell)."""
    host = 8
    extra_coll = COLL if coll else 0
    flex = max(8, width - FIXED - host - extra_coll)
    history = 0
    if flex >= 40:
        history = min(60, (flex - 1) * 2 // 5)
        flex -= history + 1
    if flex >= 40:
        extra = min(8, flex - 40)
        host += extra
        flex -= extra
    bar = max(4, flex * 3 // 5)
    mem = max(4, flex - bar - 1)
    return Columns(host, bar, mem, history, extra_coll)


def header_text(cols: Columns) -> Text:
    t = Text(no_wrap=True, style="bold")
    t.append(f" {'rk':>3} {'host':<{cols.host}} {'b':>3} ")
    if cols.coll and cols.bar >= 26:
        bar = "█compute ▓coll ░wait ▒sync"
    else:
        bar = "█compute ░wait ▒sync" if cols.bar >= 20 else "compute░wait"
    t.append(f"{bar:<{cols.bar}}"[: cols.bar])
    t.append(f" {'update':>7}")
    if cols.coll:
        t.append(f" {'coll':>{cols.coll - 1}}")
    t.append(" ")
    mem = "█active ▓peak ░cache" if cols.mem >= 20 else "memory"
    t.append(f"{mem:<{cols.mem}}"[: cols.mem])
    t.append(f" {'peak/tot':>9}  {'tok/s':>6} ")
    if cols.history:
        t.append(f"{'wait history':<{cols.history}} ")
    t.append("link")
    return t


def row_text(
    view: RankView,
    cols: Columns,
    *,
    straggler: bool,
    scale_s: float | None,
    wait_hi: float,
    now: float,
    paused: bool,
) -> Text:
    """One rank's line."""
    u = view.last
    t = Text(no_wrap=True, overflow="ellipsis")
    # The straggler is red on its own cells (a marker and a badge on its rank); the cursor is a
    # blue band across the whole row: the two never look alike.
    t.append("»" if straggler else " ", "bold red")
    t.append(f"{view.rank:>3}", "bold white on red" if straggler else "bold")
    t.append(" ")
    host = view.host if len(view.host) <= cols.host else view.host[: cols.host - 1] + "…"
    t.append(f"{host:<{cols.host}} ")
    b = view.local_batch
    t.append(f"{'—' if b is None else b:>3} ", "bold")
    t.append_text(render.time_bar(u, cols.bar, scale_s))
    t.append(f" {fmt.secs(u.update_s) if u else '—':>7}")
    if cols.coll:  # tensor parallelism: the update's per-block all-reduces (inside compute)
        coll = fmt.secs(u.collective_s) if u and u.collective_s > 0 else "—"
        t.append(f" {coll:>{cols.coll - 1}}", render.STYLE_COLLECTIVE)
    t.append(" ")
    total = view.memory_total
    t.append_text(render.mem_bar(u, total, cols.mem))
    if u is not None and total:
        peak = max(u.peak_mem, u.active_mem)
        t.append(
            f" {fmt.nbytes(peak) + '/' + fmt.nbytes(total):>9}",
            render.mem_style((peak + u.cache_mem) / total),
        )
    else:
        t.append(f" {'—':>9}")
    # Swap in use or OS memory pressure: the first sign a batch is too big for this machine.
    if u is not None and (u.swap_used > 0 or (u.mem_pressure or 0) >= 0.5):
        t.append("!", "bold red")
    else:
        t.append(" ")
    t.append(f" {fmt.count(u.tokens_per_s) if u else '—':>6} ")
    if cols.history:
        waits = [x.wait_s for x in view.recent(cols.history)]
        t.append(render.spark(waits, cols.history, 0.0, wait_hi), render.STYLE_WAIT)
        t.append(" ")
    if view.phase not in UP:
        t.stylize("dim", 5)  # figures from before the link went: shown, but as old news
    t.append_text(render.link_text(view.link, now, paused))
    return t


class RankTable(ScrollView, can_focus=True):
    """The fleet, one rank per line; Enter opens the highlighted rank's detail."""

    DEFAULT_CSS = """
    RankTable {
        height: auto;
        max-height: 60%;
        overflow-x: hidden;
        background: $surface;
        scrollbar-size-vertical: 1;
    }
    RankTable > .rank-table--header {
        background: $panel;
        text-style: bold;
    }
    RankTable > .rank-table--cursor {
        background: $primary 45%;
    }
    """

    COMPONENT_CLASSES = {"rank-table--header", "rank-table--cursor"}

    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "cursor(-10)", show=False),
        Binding("pagedown", "cursor(10)", show=False),
        Binding("home", "cursor(-100000)", show=False),
        Binding("end", "cursor(100000)", show=False),
        # Not in the footer: 80 columns hold the run's keys and ? Help, which lists this one.
        Binding("enter", "select", "Detail", show=False),
    ]

    cursor: reactive[int] = reactive(0)
    """The highlighted rank."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fleet: Fleet | None = None
        self.now = 0.0
        self._straggler: int | None = None
        self._scale: float | None = None
        self._wait_hi = 0.0
        self._coll = False

    def show(self, fleet: Fleet, now: float) -> None:
        """Redraw from the fleet (only the visible lines are rendered)."""
        self.fleet = fleet
        self.now = now
        self._straggler = straggler(fleet)
        lasts = [v.last for v in fleet.ranks if v.last is not None]
        self._scale = max((u.update_s for u in lasts), default=None)
        self._wait_hi = max((u.update_s for v in fleet.ranks for u in v.recent(10)), default=0.0)
        self._coll = any(u.collective_s > 0 for u in lasts)
        self.virtual_size = Size(self.size.width, len(fleet.ranks) + 1)
        self.refresh()

    def get_content_height(self, container, viewport, width: int) -> int:
        return (len(self.fleet.ranks) if self.fleet else 0) + 1

    def action_cursor(self, delta: int) -> None:
        if self.fleet:
            self.cursor = max(0, min(len(self.fleet.ranks) - 1, self.cursor + delta))

    def watch_cursor(self, cursor: int) -> None:
        # Line 0 is the header, pinned; keep the cursor's line inside the rest.
        top = self.scroll_offset.y
        visible = max(1, self.scrollable_content_region.height - 1)
        if cursor < top:
            self.scroll_to(y=cursor, animate=False)
        elif cursor >= top + visible:
            self.scroll_to(y=cursor - visible + 1, animate=False)
        self.refresh()

    def action_select(self) -> None:
        if self.fleet and self.fleet.ranks:
            self.post_message(RankSelected(self.cursor))

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        cols = layout(width, self._coll)
        if y == 0:
            style = self.get_component_rich_style("rank-table--header")
            return self._strip(header_text(cols), width, style)
        fleet = self.fleet
        index = self.scroll_offset.y + y - 1
        if fleet is None or index >= len(fleet.ranks):
            return Strip.blank(width, self.rich_style)
        view = fleet.ranks[index]
        text = row_text(
            view,
            cols,
            straggler=view.rank == self._straggler,
            scale_s=self._scale,
            wait_hi=self._wait_hi,
            now=self.now,
            paused=fleet.paused,
        )
        style = self.rich_style
        if index == self.cursor and self.has_focus:
            style = style + self.get_component_rich_style("rank-table--cursor")
        elif index == self.cursor:
            style = style + Style(underline=True)
        return self._strip(text, width, style)

    def _strip(self, text: Text, width: int, style: Style) -> Strip:
        segments = [
            Segment(s.text, style + s.style if s.style else style)
            for s in text.render(self.app.console)
            if s.text != "\n"
        ]
        return Strip(segments).adjust_cell_length(width, style)
