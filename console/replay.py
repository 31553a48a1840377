"""Replay a run from its Arrow logs through the same screens: play, pause, step, speed.

Records are played in the order they were written, against a replay clock; long quiet gaps
(a pause, a crash and resume) are shortened to `MAX_GAP_S` so nothing stalls.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from console.hostfile import RankTarget
from console.link_phase import LinkPhase, LinkSink, LinkStatus
from telemetry import arrowlog, rundir
from telemetry.errors import TelemetryError
from telemetry.records import Event, Hello, Message, Update

MAX_GAP_S = 2.0
MIN_SPEED, MAX_SPEED = 0.25, 256.0  # playback speeds, halved or doubled by - and +


class ReplayError(ValueError):
    """The folder has no telemetry to replay."""


def load(run_dir: str | Path) -> tuple[list[Hello], list[tuple[float, int, Message]]]:
    """Hellos (one per rank, reconstructed) and the records in order: (time, rank, record)."""
    run = Path(run_dir).expanduser()
    if not run.is_dir():
        raise ReplayError(f"{run}: no such run folder")
    ranks = arrowlog.log_ranks(run)
    if not ranks:
        raise ReplayError(f"{run}: no telemetry logs under {arrowlog.log_dir(run)}")
    try:
        table = arrowlog.read_updates(run)
        events = arrowlog.read_events(run)
    except TelemetryError as e:
        raise ReplayError(str(e)) from None
    names = set(Update.__dataclass_fields__)
    updates = [Update(**{k: v for k, v in row.items() if k in names}) for row in table.to_pylist()]
    records: list[tuple[float, int, Message]] = [(u.time, u.rank, u) for u in updates]
    records += [(e.time, e.rank, e) for e in events]
    records.sort(key=lambda r: (r[0], 0 if isinstance(r[2], Event) else 1, r[1]))
    world = max(ranks) + 1
    run_id = _run_id(run)
    hellos = []
    for r in range(world):
        first = next((u for u in updates if u.rank == r), None)
        total = (first.sys_mem_used + first.sys_mem_available) if first else 0
        hellos.append(
            Hello(
                protocol=1,
                run_id=run_id,
                rank=r,
                world_size=world,
                host="(replay)",
                platform="",
                chip="",
                memory_total=total,
                local_batch=first.local_batch if first else 0,
                config_digest="",
            )
        )
    return hellos, records


def _run_id(run: Path) -> str:
    """The run's id from its config when it has one, else the folder name."""
    try:
        data = json.loads(rundir.at(run).config.read_text())
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict) and isinstance(data.get("run_id"), str):
        return data["run_id"]
    return run.resolve().name


class ReplayFeed:
    """A feed that plays logged records into the app, under the operator's control.

    It is its own `playback` (the transport the replay keys drive).
    """

    control_problem = "replay: the run is not live, commands are off"

    def __init__(self, run_dir: str | Path, speed: float = 1.0) -> None:
        self.hellos, records = load(run_dir)
        self.targets = [RankTarget(h.rank, h.host, 0) for h in self.hellos]
        # Replay time: real gaps, but none longer than MAX_GAP_S.
        self.timeline: list[tuple[float, int, Message]] = []
        t = 0.0
        prev = records[0][0] if records else 0.0
        for when, rank, msg in records:
            t += min(max(0.0, when - prev), MAX_GAP_S)
            prev = when
            self.timeline.append((t, rank, msg))
        self.position = 0  # records delivered
        self.clock = 0.0
        self.speed = speed
        self.playing = True
        self._ended = False
        self.sink: LinkSink | None = None

    @property
    def playback(self) -> ReplayFeed:
        return self

    def attach(self, sink: LinkSink) -> None:
        self.sink = sink

    def loops(self) -> dict[str, Callable[[], None]]:
        return {}  # played from the app's timer (`tick`), not from threads

    def start(self) -> None:
        assert self.sink is not None
        for h in self.hellos:
            self.sink.link_status(LinkStatus(h.rank, LinkPhase.LIVE, "replay"))
            self.sink.link_message(h.rank, h)

    def _deliver(self, upto: int) -> None:
        assert self.sink is not None
        while self.position < min(upto, len(self.timeline)):
            t, rank, msg = self.timeline[self.position]
            self.sink.link_message(rank, msg)
            self.clock = max(self.clock, t)
            self.position += 1
        if self.done and not self._ended:
            # The log is over: the run ended here (not a lost link), and the views say how.
            self._ended = True
            for h in self.hellos:
                self.sink.link_status(LinkStatus(h.rank, LinkPhase.ENDED, "end of the log"))

    def tick(self, dt: float) -> None:
        """Advance the replay clock by `dt` wall seconds (scaled by the speed) when playing."""
        if not self.playing or self.done:
            return
        self.clock += dt * self.speed
        upto = self.position
        while upto < len(self.timeline) and self.timeline[upto][0] <= self.clock:
            upto += 1
        self._deliver(upto)

    def step(self) -> None:
        """Deliver up to and including the next update step (all ranks), then pause."""
        self.playing = False
        tl = self.timeline
        i = self.position
        while i < len(tl) and not isinstance(tl[i][2], Update):
            i += 1
        if i < len(tl):
            step = tl[i][2].step  # type: ignore[union-attr]
            while i < len(tl) and not (isinstance(tl[i][2], Update) and tl[i][2].step > step):
                i += 1
        self._deliver(i)

    def toggle(self) -> None:
        self.playing = not self.playing

    def faster(self) -> None:
        self.speed = min(MAX_SPEED, self.speed * 2)

    def slower(self) -> None:
        self.speed = max(MIN_SPEED, self.speed / 2)

    def finish(self) -> None:
        self._deliver(len(self.timeline))

    @property
    def done(self) -> bool:
        return self.position >= len(self.timeline)

    def badge(self) -> str:
        pct = 100 * self.position / max(1, len(self.timeline))
        mode = "END" if self.done else f"{self.speed:g}x" if self.playing else "PAUSED"
        return f"REPLAY {mode} {pct:.0f}%"

    def send(self, cmd: str, args: dict[str, Any] | None = None) -> int:
        raise TelemetryError(self.control_problem)

    def reconnect(self) -> None:
        pass  # nothing to connect to

    def close(self) -> None:
        pass
