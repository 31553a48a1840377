"""One rank up close: who it is, its link, and its timing and memory history."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from console import fmt, render
from console.fleet import Fleet, RankView

LABEL = 14
FIGURES = 26


def _series(
    name: str, values: list[float], width: int, show, style: str, lo: float | None = None
) -> Text:
    t = Text(no_wrap=True)
    t.append(f"{name:<{LABEL}}", "bold")
    t.append(render.spark(values, width, lo), style)
    if values:
        t.append(
            f"  now {show(values[-1])}  min {show(min(values))}  max {show(max(values))}",
            "bright_black",
        )
    return t


def _share(r: float | None) -> str:
    return "—" if r is None else f"{r:.1%}"


def detail_text(view: RankView, fleet: Fleet, width: int, now: float) -> Text:
    """Everything shown for one rank, laid out for `width` columns."""
    out = Text()
    h = view.hello
    out.append(f"rank {view.rank}", "bold")
    out.append(f"  {view.host}")
    if h:
        out.append(f"  {h.chip or '?'} · {h.platform or '?'} · {fmt.nbytes(h.memory_total)}")
    mode = fleet.parallelism()
    if mode.fixed_split:  # which slice of the model it holds, and that its split is fixed
        out.append(f"\n{mode.describe()}: {mode.slice_of(view.rank)}; split fixed", "cyan")
    out.append("\nlink ")
    out.append_text(render.link_text(view.link, now, fleet.paused))
    if view.link and view.link.detail:
        out.append(f"  {view.link.detail}", "bright_black")
    if view.dropped:
        out.append(f"\n{view.dropped} record(s) dropped on the way (console too slow)", "yellow")
    u = view.last
    if u is None:
        out.append("\n\nno updates yet", "bright_black")
        return out
    out.append(
        f"\n\nupdate {u.step:,}  local batch {u.local_batch} × {u.microsteps} microsteps  "
        f"{fmt.count(u.tokens_per_s)} tok/s  lr {u.lr:.2e}  grad norm {u.grad_norm:.3g}"
    )
    if u.simulated:
        out.append("  (slowdown simulated)", "yellow")
    out.append("\n\n")
    out.append_text(render.time_bar(u, max(10, width - 2)))
    out.append(
        f"\ncompute {fmt.secs(u.compute_s)}  wait {fmt.secs(u.wait_s)}  "
        f"all-reduce {fmt.secs(u.transfer_s)}  optimizer {fmt.secs(u.optimizer_s)}  "
        f"update {fmt.secs(u.update_s)}"
    )
    if u.collective_s > 0:  # tensor parallelism: the wait its per-block all-reduces add
        of_compute, of_update = render.collective_share(u)
        out.append("\ncollective ", render.STYLE_COLLECTIVE)
        out.append(f"{fmt.secs(u.collective_s)}", "bold")
        out.append(
            f"  {_share(of_compute)} of compute, {_share(of_update)} of the update  "
            f"(the per-block all-reduces, inside compute)",
        )
    spark_w = max(8, width - LABEL - FIGURES - 14)
    hist = view.recent(spark_w)
    out.append("\n\n")
    rows = [
        ("compute", [x.compute_s for x in hist], fmt.secs, render.STYLE_COMPUTE, 0.0),
        ("wait", [x.wait_s for x in hist], fmt.secs, render.STYLE_WAIT, 0.0),
        ("update", [x.update_s for x in hist], fmt.secs, "white", 0.0),
        ("tokens/s", [x.tokens_per_s for x in hist], fmt.count, "cyan", None),
        ("active mem", [float(x.active_mem) for x in hist], fmt.nbytes, "green", None),
        ("peak mem", [float(x.peak_mem) for x in hist], fmt.nbytes, "green", None),
        ("cache mem", [float(x.cache_mem) for x in hist], fmt.nbytes, "bright_black", None),
    ]
    if any(x.collective_s for x in hist):  # tensor parallelism: just under compute
        colls = [x.collective_s for x in hist]
        rows.insert(1, ("collective", colls, fmt.secs, render.STYLE_COLLECTIVE, 0.0))
    if any(x.swap_used for x in hist):
        rows.append(("swap", [float(x.swap_used) for x in hist], fmt.nbytes, "red", 0.0))
    out.append(Text("\n").join(_series(n, v, spark_w, s, st, lo) for n, v, s, st, lo in rows))
    total = view.memory_total
    out.append("\n\nmemory ")
    out.append_text(render.mem_bar(u, total, max(10, width - 9)))
    out.append(
        f"\nactive {fmt.nbytes(u.active_mem)}  peak {fmt.nbytes(u.peak_mem)}  cache "
        f"{fmt.nbytes(u.cache_mem)}  of {fmt.nbytes(total)}"
    )
    if u.mem_budget or u.live_mem:  # issue 20: the memory limit and what it is made of
        out.append(
            f"\nlive set {fmt.nbytes(u.live_mem or 0)}  limit {fmt.nbytes(u.mem_limit or 0)}  "
            f"budget {fmt.nbytes(u.mem_budget or 0)}"
        )
    if u.resident_mem:  # the optimizer's share this rank steps, and what it holds for it
        out.append(
            f"\noptimizer share {(u.opt_share or 1.0):.1%}  master weights + state "
            f"{fmt.nbytes(u.resident_mem)}"
        )
    if u.sys_mem_used or u.sys_mem_available:
        out.append(
            f"\nsystem: used {fmt.nbytes(u.sys_mem_used)}  available "
            f"{fmt.nbytes(u.sys_mem_available)}  swap {fmt.nbytes(u.swap_used)}"
        )
    if u.mem_pressure is not None:
        out.append(f"  pressure {u.mem_pressure:.0%}", "red" if u.mem_pressure >= 0.5 else "")
    return out


class RankDetailScreen(ModalScreen[None]):
    """Escape or q closes; ↑/↓ move to the neighbouring rank."""

    DEFAULT_CSS = """
    RankDetailScreen {
        align: center middle;
        background: $background 60%;
    }
    RankDetailScreen > VerticalScroll {
        width: 100%;
        max-width: 140;
        height: auto;
        max-height: 100%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    """

    BINDINGS = [
        Binding("escape,q,enter", "dismiss(None)", "Close"),
        Binding("up,k", "move(-1)", "Previous rank"),
        Binding("down,j", "move(1)", "Next rank"),
    ]

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self._fleet: Fleet | None = None
        self._now = 0.0

    def compose(self) -> ComposeResult:
        with VerticalScroll() as box:
            box.border_title = f"rank {self.rank}"
            yield Static(id="detail")

    def show(self, fleet: Fleet, now: float) -> None:
        """Redraw from the fleet (the app calls this on every frame while it is open)."""
        self._fleet, self._now = fleet, now
        if not self.is_mounted:
            return
        box = self.query_one(VerticalScroll)
        box.border_title = f"rank {self.rank}"
        width = max(40, box.content_size.width or self.app.size.width - 4)
        self.query_one("#detail", Static).update(
            detail_text(fleet.ranks[self.rank], fleet, width, now)
        )

    def on_mount(self) -> None:
        if self._fleet is not None:
            self.call_after_refresh(self.show, self._fleet, self._now)

    def action_move(self, delta: int) -> None:
        if self._fleet is not None:
            self.rank = max(0, min(len(self._fleet.ranks) - 1, self.rank + delta))
            self.show(self._fleet, self._now)
