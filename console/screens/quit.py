"""Leaving the demo: stop the run too, or leave it training."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class QuitScreen(ModalScreen[str | None]):
    """Dismisses with "stop", "leave", or None to stay."""

    DEFAULT_CSS = """
    QuitScreen {
        align: center middle;
        background: $background 60%;
    }
    QuitScreen > Vertical {
        width: 64;
        max-width: 95%;
        height: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    QuitScreen Horizontal {
        height: auto;
        margin-top: 1;
    }
    QuitScreen Button {
        margin-right: 1;
    }
    """

    BINDINGS = [
        Binding("s", "choose('stop')", "Stop run"),
        Binding("l", "choose('leave')", "Leave running"),
        Binding("escape,c", "choose(None)", "Cancel"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "[b]Quit the console[/b]\n\nStop the run as well (it checkpoints, then "
                "exits), or leave it training in the background?"
            )
            with Horizontal():
                yield Button("Stop run (s)", variant="error", id="stop")
                yield Button("Leave running (l)", variant="primary", id="leave")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)
