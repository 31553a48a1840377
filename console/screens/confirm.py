"""Yes or no before anything that changes the run; No has the focus, so Enter is safe."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

# What is asked before each command is sent: the question, then what will happen.
QUESTIONS = {
    "checkpoint": (
        "Checkpoint now?",
        "Every rank saves at the next update boundary; training goes on.",
    ),
    "pause": (
        "Pause the run?",
        "Every rank stops at the next update boundary and waits (press p again to resume).",
    ),
    "resume": ("Resume the run?", "Training continues from where it paused."),
    "autopilot on": (
        "Turn the autopilot on?",
        "Rank 0 rebalances by itself when a better split holds, and moves samples off a rank "
        "under memory pressure. The global batch, and so the math, never changes.",
    ),
    "autopilot off": ("Turn the autopilot off?", "The split stays as it is until you change it."),
    "stop": (
        "Stop the run?",
        "The run checkpoints at the next update boundary, then every rank exits. "
        "It can be resumed from that checkpoint.",
    ),
}


class ConfirmScreen(ModalScreen[bool]):
    """Ask one question; dismiss with True only on an explicit yes."""

    DEFAULT_CSS = """
    ConfirmScreen {
        align: center middle;
        background: $background 60%;
    }
    ConfirmScreen > Vertical {
        width: 60;
        max-width: 95%;
        height: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    ConfirmScreen .title {
        text-style: bold;
        margin-bottom: 1;
    }
    ConfirmScreen Horizontal {
        height: auto;
        align-horizontal: right;
        margin-top: 1;
    }
    ConfirmScreen Button {
        margin-left: 2;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, title: str, body: str, yes: str = "Yes") -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.yes = yes

    @classmethod
    def before(cls, cmd: str) -> ConfirmScreen:
        """What is asked before `cmd` (a key of QUESTIONS) is sent."""
        title, body = QUESTIONS[cmd]
        return cls(title, body, yes=cmd.split()[-1].capitalize())

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, classes="title")
            yield Static(self.body)
            with Horizontal():
                yield Button(f"{self.yes} (y)", variant="warning", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
