"""The rebalance dialog: the balancer's split next to the current one, editable, checked live.

An impossible split (wrong length or sum, a rank under 1, over a rank's memory cap) cannot be
applied: the button stays disabled and the reason is shown under the field.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from console import fmt
from telemetry import balance
from telemetry.split import SplitError
from telemetry.split import parse as parse_split


class RebalanceScreen(ModalScreen[list[int] | None]):
    """Dismisses with the split to send, or None."""

    DEFAULT_CSS = """
    RebalanceScreen {
        align: center middle;
        background: $background 60%;
    }
    RebalanceScreen > Vertical {
        width: 92;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    RebalanceScreen #table {
        height: auto;
        max-height: 20;
        overflow-y: auto;
    }
    RebalanceScreen #summary, RebalanceScreen #problems {
        height: auto;
    }
    RebalanceScreen #problems {
        color: $error;
    }
    RebalanceScreen Input {
        margin: 0;
    }
    RebalanceScreen Horizontal {
        height: auto;
        align-horizontal: right;
    }
    RebalanceScreen Button {
        margin-left: 2;
    }
    """

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self,
        current: Sequence[int],
        proposal: balance.Proposal | None,
        models: Sequence[balance.RankModel],
        why: str = "",
        hosts: Sequence[str] = (),
        headroom: float = 0.15,
    ) -> None:
        super().__init__()
        self.current = list(current)
        self.proposal = proposal
        self.models = list(models)
        self.why = why
        self.hosts = list(hosts) or [""] * len(self.current)
        self.headroom = headroom
        self.global_batch = sum(self.current)
        self.split: list[int] | None = None

    def compose(self) -> ComposeResult:
        start = self.proposal.split if self.proposal else self.current
        with Vertical() as box:
            box.border_title = f"rebalance · global batch {self.global_batch}"
            yield Static(id="table")
            yield Static(id="summary")
            yield Input(",".join(map(str, start)), id="split", placeholder="e.g. 3,2,2,1")
            yield Static(id="problems")
            with Horizontal():
                yield Button("Apply at next update (enter)", variant="warning", id="apply")
                yield Button("Cancel (esc)", variant="primary", id="cancel")

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        self._check(self.query_one(Input).value)

    def on_input_changed(self, event: Input.Changed) -> None:
        self._check(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._apply()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "apply":
            self._apply()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def _apply(self) -> None:
        if self.split is not None:
            self.dismiss(self.split)

    # --- checking the edited split -----------------------------------------------------------

    def problems(self, text: str) -> tuple[list[int] | None, list[str]]:
        """The parsed split and everything wrong with it."""
        try:
            split = parse_split(text)
        except SplitError as e:
            return None, [str(e)]
        models = self.models if len(self.models) == len(self.current) else None
        errors = balance.validate(
            split, self.global_batch, len(self.current), models, self.headroom
        )
        if not errors and split == self.current:
            errors = ["this is the current split: nothing to change"]
        return (None if errors else split), errors

    def _check(self, text: str) -> None:
        split, errors = self.problems(text)
        self.split = split
        try:
            edited = parse_split(text)
        except SplitError:
            edited = None
        self.query_one("#table", Static).update(self._table(edited))
        self.query_one("#summary", Static).update(self._summary(edited))
        self.query_one("#problems", Static).update("\n".join(f"✗ {e}" for e in errors))
        self.query_one("#apply", Button).disabled = split is None

    def _table(self, edited: list[int] | None) -> Table:
        t = Table(box=None, pad_edge=False, expand=False, header_style="bold")
        for name, justify in [
            ("rank", "right"),
            ("host", "left"),
            ("now", "right"),
            ("new", "right"),
            ("compute now → new", "right"),
            ("peak new / limit", "right"),
            ("max batch", "right"),
        ]:
            t.add_column(name, justify=justify)  # type: ignore[arg-type]
        fit = len(self.models) == len(self.current)
        for r, now in enumerate(self.current):
            new = edited[r] if edited and r < len(edited) else None
            row = [str(r), self.hosts[r][:16], str(now), "—" if new is None else str(new)]
            if fit:
                m = self.models[r]
                t_now = fmt.secs(m.time(now))
                t_new = fmt.secs(m.time(new)) if new is not None else "—"
                cap = m.cap(self.headroom)
                over = new is not None and cap is not None and new > cap
                mem = Text("—")
                if new is not None:
                    mem = Text(
                        f"{fmt.nbytes(m.mem(new))} / {fmt.nbytes(m.mem_limit)}",
                        "bold red" if over else "",
                    )
                row += [f"{t_now} → {t_new}", mem, "∞" if cap is None else str(cap)]
            else:
                row += ["—", "—", "—"]
            t.add_row(*row)
        return t

    def _summary(self, edited: list[int] | None) -> Text:
        text = Text()
        p = self.proposal
        if p is None:
            text.append(f"No proposal: {self.why or 'not enough data'}. ", "yellow")
            text.append("You can still type a split; it is checked before it is sent.")
            text.append(
                f"\nmax batch: the largest local batch that fits a rank's memory limit with "
                f"{self.headroom:.0%} of it kept free (∞: no limit known)",
                "bright_black",
            )
            return text
        text.append("proposed ")
        text.append(",".join(map(str, p.split)), "bold")
        if p.current_s is not None:
            text.append(f"  compute {fmt.secs(p.current_s)} → {fmt.secs(p.predicted_s)}")
            if p.gain is not None:
                text.append(
                    f" (saves {p.gain:.0%})" if p.gain > 0 else " (no gain)",
                    "bold green" if p.gain and p.gain > 0 else "",
                )
        if edited is not None and edited != p.split and len(edited) == len(self.models):
            with contextlib.suppress(balance.BalanceError):
                text.append(
                    f"\nyour split predicts {fmt.secs(balance.predict(self.models, edited))}"
                )
        for note in p.notes:
            text.append(f"\n· {note}", "bright_black")
        if not p.confident:
            text.append(f"\n⚠ a guess: {p.reason}", "yellow")
        text.append(
            f"\nmax batch: the largest local batch that fits a rank's memory limit with "
            f"{self.headroom:.0%} of it kept free (∞: no limit known)",
            "bright_black",
        )
        return text
