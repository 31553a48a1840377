"""What each operator command does when every rank applies it at an update boundary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from telemetry.records import COMMANDS
from trainer.controller import Action, Controller
from trainer.run import Run


def _pause(run: Run, action: Action) -> dict[str, Any]:
    run.event("paused", f"paused at update {run.state.step}")
    return {}


def _resume(run: Run, action: Action) -> dict[str, Any]:
    run.event("resumed", f"resumed at update {run.state.step}")
    return {}


def _checkpoint(run: Run, action: Action) -> dict[str, Any]:
    return {"path": str(run.save() or "")}


def _rebalance(run: Run, action: Action) -> dict[str, Any]:
    old, new = run.state.split, action.payload
    run.rebalance(new)
    why = {"reason": action.reason} if action.reason != "command" else {}
    run.event("rebalanced", f"split {old} -> {new}", **{"from": old, "to": new}, **why)
    return {"split": new}


def _autopilot(run: Run, action: Action) -> dict[str, Any]:
    on = bool(action.payload and action.payload[0])
    run.pilot.enabled = on
    run.event("autopilot", f"autopilot {'on' if on else 'off'}", on=on)
    return {"on": on}


def _stop(run: Run, action: Action) -> dict[str, Any]:
    by = "a stop command" if action.reason == "command" else action.reason
    run.stopping, run.stop_reason = True, f"by {by}"
    path = str(run.save() or "")
    run.event("stopped", f"stopped by {by}", checkpoint=path, reason=action.reason)
    return {"path": path, "resume": run.resume_command()}


# One handler per command of the one command table; "none" and "keepalive" do nothing.
HANDLERS: dict[str, Callable[[Run, Action], dict[str, Any]]] = {
    "pause": _pause,
    "resume": _resume,
    "checkpoint": _checkpoint,
    "rebalance": _rebalance,
    "stop": _stop,
    "autopilot": _autopilot,
}
assert HANDLERS.keys() == COMMANDS.keys(), "every command needs a handler"


def apply(run: Run, action: Action) -> None:
    """Apply the boundary's command on this rank; rank 0 answers whoever sent it."""
    handler = HANDLERS.get(action.name)
    if handler is not None:
        Controller.answer(action, run.state.step, **handler(run, action))
