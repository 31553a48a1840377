"""Two lines at the top: is the run healthy, how far along, how fast."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from console import fmt
from console.snapshot import HeaderInfo

STATUS_STYLE = {
    "running": ("▶ RUNNING", "bold black on green"),
    "paused": ("‖ PAUSED", "bold black on yellow"),
    "stopped": ("■ STOPPED", "bold white on red"),
    "connecting": ("◌ CONNECTING", "bold black on white"),
    "no link": ("✗ NO LINK", "bold white on red"),
    "no run": ("✗ NO RUN", "bold white on red"),
    # A replay that is over: how the run ended, never "running"
    "finished": ("■ FINISHED", "bold black on green"),
    "ended": ("■ ENDED", "bold black on yellow"),
    "failed": ("✗ FAILED", "bold white on red"),
}


class RunHeader(Widget):
    """Run id, status, step, tokens, rates, loss, ETA, live ranks, the mode and the straggler."""

    DEFAULT_CSS = """
    RunHeader {
        height: 2;
        padding: 0 1;
        background: $panel;
        text-wrap: nowrap;
        text-overflow: ellipsis;
    }
    """

    info: reactive[HeaderInfo] = reactive(HeaderInfo, layout=False)
    """The figures shown; set a new HeaderInfo to redraw."""
    badges: reactive[tuple[str, ...]] = reactive(tuple)
    """Extra tags such as READ-ONLY or REPLAY 4x."""

    def render(self) -> Text:
        h = self.info
        label, style = STATUS_STYLE.get(h.status, (h.status.upper(), "bold"))
        top = Text()
        top.append(f" {label} ", style)
        for badge in self.badges:
            top.append(" ")
            top.append(f" {badge} ", "bold black on cyan")
        # Most telling first: what is cut at 80 columns is what matters least.
        if h.ended:  # a replay that is over: nothing is live, and nothing is wrong
            top.append(f"  {h.world} ranks", "bold")
        else:
            live_style = "bold green" if h.live == h.world and h.world else "bold red"
            top.append(f"  {h.live}/{h.world} live", live_style)
        if h.parallel:  # tensor parallelism: the split is fixed and the panes show collectives
            top.append(f"  {h.parallel}", "bold cyan")
        total = f"/{h.total_updates:,}" if h.total_updates else ""
        top.append("  step ")
        top.append(f"{h.step:,}{total}", "bold")
        top.append("  tokens ")
        top.append(fmt.count(h.tokens), "bold")
        run_id = h.run_id if len(h.run_id) <= 24 else h.run_id[:23] + "…"
        top.append(f"  {run_id or '—'}", "bright_black")

        # The second line, most telling first, since 80 columns cut its end: how a replay
        # ended, then what needs a person (an alert, the straggler), then the figures.
        low = Text()
        if h.ended:
            low.append(h.ended, "bold")
            low.append("  ")
        if h.alert:
            low.append(f"⚠ {h.alert}  ", "bold red")
        if h.straggler is not None:
            low.append("straggler ")
            low.append(f"» rank {h.straggler}", "bold red")
            low.append("  ")
        if h.warning:
            low.append(f"⚠ {h.warning}  ", "yellow")
        low.append("loss ")
        low.append("—" if h.loss is None else f"{h.loss:.4f}", "bold")
        if h.val_loss is not None:
            low.append("  val ")
            low.append(f"{h.val_loss:.4f}", "bold magenta")
        if h.best is not None:
            low.append(f"  best {h.best[1]:.4f} @{h.best[0]:,}", "magenta")
        # Rates and the ETA only while updates come: a paused or stopped run has neither.
        if h.status == "running" or h.ended:
            low.append("  ")
            low.append(fmt.count(h.tokens_per_s), "bold")
            low.append(" tok/s  update ")
            low.append(fmt.secs(h.update_s), "bold")
        if h.status == "running" and not h.ended:
            low.append("  ETA ")
            low.append(fmt.duration(h.eta_s), "bold")
        if h.autopilot:
            low.append("  autopilot", "bold cyan")
        out = Text("\n").join([top, low])
        out.no_wrap, out.overflow = True, "ellipsis"  # two lines, always: cut, never wrap
        return out
