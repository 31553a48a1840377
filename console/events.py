"""The event log's lines and their prose: what ranks' events, replies, commands and links say.

Pure functions from a record to (level, text); `console.fleet` decides when a line is due and
keeps the log. Levels: info, good, warning, error, command (the widget colours them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from console.link_phase import UP, LinkPhase, LinkStatus
from telemetry.records import Event, Reply

# The level of each kind of event the trainer emits; any other kind is info.
LEVEL = {
    "started": "good",
    "checkpoint": "good",
    "paused": "warning",
    "resumed": "good",
    "rebalanced": "good",
    "stopped": "warning",
    "error": "error",
    "restarted": "warning",
    "autopilot": "good",
    "alert": "error",
}


@dataclass(slots=True)
class LogLine:
    """One line of the event log; what several ranks said alike is one line with their ranks."""

    seq: int
    time: float
    level: str
    text: str
    rank: int | None = None  # the first rank that said it
    step: int | None = None
    kind: str = ""
    ranks: tuple[int, ...] = ()  # every rank that said it, in arrival order
    who: str = ""  # "r2", "r0,1,3", "all 4 ranks": who said it, as the log shows it
    rev: int = 0  # bumped when another rank joins the line, so views redraw it


def who(ranks: tuple[int, ...], world: int) -> str:
    """The ranks that said a line: "r2", "r0,1,3", or "all 4 ranks" once every one has."""
    if not ranks:
        return ""
    if len(ranks) == world and world > 1:
        return f"all {world} ranks"
    return "r" + ",".join(str(r) for r in sorted(ranks))


def event_line(e: Event) -> tuple[str, str]:
    """An event's level and text: the rank's own words when it sent some, else ours."""
    data = e.data or {}
    level = LEVEL.get(e.kind, "info")
    text = e.message or _said(e.kind, data)
    if e.kind == "sample" and not text.startswith("sample"):  # the trainer sends the text
        text = f"sample: {text}"
    if e.kind == "autopilot" and "after_s" in data:  # the measured effect of its own change
        text = measured_line(data) or text
    if e.kind == "checkpoint":
        verified = data.get("verified")
        text += " (verified)" if verified else " (NOT verified)" if verified is False else ""
        level = "warning" if verified is False else level
    # One log line per event: a multi-line message (a sample of code) shows its newlines as ⏎
    return level, (text or e.kind).replace("\r", "").replace("\n", "⏎")


def measured_line(data: dict[str, Any]) -> str:
    """The autopilot's follow-up on a rebalance it made, said as a measurement of that one
    change (not as another split): "autopilot measured its rebalance to 1,2,2,3: ..."."""
    after, before = data.get("after_s"), data.get("before_s")
    if not isinstance(after, int | float):
        return ""
    what = f"autopilot measured its rebalance to {_split(data.get('to'))}"
    if isinstance(before, int | float) and before > 0:
        change = after / before - 1
        return (
            f"{what}: the slowest rank's compute went {before * 1e3:.0f} → {after * 1e3:.0f} ms "
            f"({change:+.0%})"
        )
    return f"{what}: the slowest rank's compute is now {after * 1e3:.0f} ms"


def _said(kind: str, data: dict[str, Any]) -> str:
    """Words for an event that came without any ("" when its data says nothing either)."""
    match kind:
        case "started":
            world, split = data.get("world_size", "?"), _split(data.get("split"))
            return f"run started: {world} ranks, split {split}"
        case "checkpoint":
            return f"checkpoint {data.get('path', '')}"
        case "paused":
            return "run paused"
        case "resumed":
            return "run resumed"
        case "rebalanced":
            return f"rebalanced {_split(data.get('from'))} → {_split(data.get('to'))}"
        case "stopped":
            ck = data.get("checkpoint")
            return "run stopped" + (f", checkpoint {ck}" if ck else "")
        case "eval":
            v = data.get("val_loss")
            return f"eval: val loss {v:.4f}" if isinstance(v, int | float) else ""
        case "restarted":
            fleet = f"{_split(data.get('from'))} → {_split(data.get('to'))}"
            return f"restart {data.get('attempt', '?')} after {data.get('reason', '?')}: {fleet}"
        case "autopilot":
            return "autopilot " + ("on" if data.get("on") else "off")
        case "sample":
            return "sample: " + str(data.get("text", "")).replace("\n", "⏎")[:200]
    return ""


def link_line(old: LinkStatus | None, new: LinkStatus) -> tuple[str, str] | None:
    """What a link's change says, or None: refusals, losses and returns are news, once each."""
    if old is not None and old.phase == new.phase and old.detail == new.detail:
        return None
    was = old.phase if old is not None else None
    if new.phase is LinkPhase.REFUSED:
        return "error", f"rank {new.rank} refused: {new.detail}"
    if new.phase is LinkPhase.LOST and was in UP:
        return "warning", f"rank {new.rank} link lost: {new.detail}"
    if new.phase is LinkPhase.LIVE and was in (LinkPhase.LOST, LinkPhase.REFUSED):
        return "good", f"rank {new.rank} link back"
    return None


def nobody_line(places: list[tuple[str, int]], advice: str = "") -> str:
    """Every rank refused with nothing listening: no run serves there (and what to do).

    `places`: each rank's (host, port); "localhost" is the console's own machine.
    """
    hosts = sorted({h for h, _ in places})
    ports = [p for _, p in places]
    span = f"{ports[0]}" if len(ports) == 1 else f"{min(ports)}-{max(ports)}"
    if len(hosts) == 1:
        host = "127.0.0.1" if hosts == ["localhost"] else hosts[0]
        where = f"{host}:{span}"
    else:
        where = f"ports {span} of {', '.join(dict.fromkeys(h for h, _ in places))}"
    text = f"nothing listening on {where}: no run serves there"
    return f"{text}; {advice}" if advice else text


def command_name(cmd: str, args: dict[str, Any]) -> str:
    """A command as the log names it: "pause", "rebalance to 3,2,2,1"."""
    if cmd == "rebalance":
        return f"rebalance to {_split(args.get('split'))}"
    if cmd == "autopilot":
        return "autopilot " + ("on" if args.get("on") else "off")
    return cmd


def sent_line(id: int, what: str) -> str:
    return f"→ {what}: sent (id {id}), waiting for the next update boundary"


def reply_line(r: Reply, what: str) -> tuple[str, str]:
    """The outcome of the command named `what`."""
    if r.ok:
        step = (r.result or {}).get("step")
        at = f" at update {step}" if step is not None else ""
        resume = (r.result or {}).get("resume")  # a stop says how the run goes on
        return "good", f"✓ {what}: applied{at}" + (f"; to go on: {resume}" if resume else "")
    return "error", f"✗ {what}: refused: {r.error or 'no reason given'}"


def unanswered_line(whats: list[str]) -> str:
    """Commands whose replies went with rank 0's dropped link."""
    return (
        f"no reply to {', '.join(whats)}: rank 0's link dropped; whether it was applied shows "
        "in the events once the link is back"
    )


def _split(split: Any) -> str:
    if isinstance(split, list | tuple):
        return ",".join(str(b) for b in split)
    return "?"
