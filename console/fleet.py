"""The fleet as the console sees it: each rank's view, the run's flags, the event log.

Pure (no Textual): links or a replay feed it through `apply` / `absorb`; the app, `--once`
and the benchmark read it. The log's wording is in `console.events`, its lines in
`console.journal`, the derived figures (header, straggler, balancer input, JSON snapshot) in
`console.snapshot`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from console import events
from console.events import LogLine
from console.hostfile import RankTarget
from console.journal import Journal
from console.link_phase import NOBODY, UP, LinkPhase, LinkStatus
from console.series import Series
from telemetry.parallelism import Parallelism
from telemetry.parallelism import parse as parse_parallelism
from telemetry.records import Dropped, Event, Hello, Message, Reply, Update

HISTORY = 1200  # updates kept per rank: the widest charts and the balancer read from these
LOG_LINES = 2000
LOSS_POINTS = 4000  # per series; older points are merged pairwise, so the whole run fits
SEEN_EVENTS = 4096  # events remembered, to drop the history a reconnect sends again
EARLY_REPLIES = 64  # replies kept that overtook the news that their command was sent


@dataclass(slots=True)
class SentCommand:
    """A command this console sent and has no reply for yet."""

    id: int
    cmd: str
    args: dict[str, Any]
    sent: float


@dataclass
class RankView:
    """Everything known about one rank."""

    target: RankTarget
    hello: Hello | None = None
    link: LinkStatus | None = None
    updates: deque[Update] = field(default_factory=lambda: deque(maxlen=HISTORY))
    dropped: int = 0
    last_seen: float | None = None  # wall time of the last record from it
    version: int = 0  # bumped on every change, so views redraw only what changed
    said: str = ""  # the last link line logged for it: a link retrying says it once
    refused: str = ""  # the kind of its last refusal, until it is live again

    @property
    def rank(self) -> int:
        return self.target.rank

    @property
    def last(self) -> Update | None:
        return self.updates[-1] if self.updates else None

    @property
    def host(self) -> str:
        return self.hello.host if self.hello and self.hello.host else self.target.host

    @property
    def local_batch(self) -> int | None:
        if self.updates:
            return self.updates[-1].local_batch
        return self.hello.local_batch if self.hello else None

    @property
    def memory_total(self) -> int | None:
        if self.hello and self.hello.memory_total:
            return self.hello.memory_total
        u = self.last
        if u is not None and u.sys_mem_used + u.sys_mem_available > 0:
            return u.sys_mem_used + u.sys_mem_available
        return None

    @property
    def phase(self) -> LinkPhase:
        return self.link.phase if self.link else LinkPhase.CONNECTING

    def recent(self, n: int) -> list[Update]:
        return list(self.updates)[-n:]


class Fleet:
    """The run as seen from the console; `apply` everything the links say, read the rest."""

    def __init__(
        self, targets: Sequence[RankTarget], clock: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.ranks = [RankView(t) for t in targets]
        self.journal = Journal(clock, LOG_LINES)
        self.loss = Series(LOSS_POINTS)
        self.evals = Series(LOSS_POINTS)
        self.run_id = ""
        self.world_size = len(self.ranks)
        self.paused = False
        self.stopped = False
        self.failed = ""  # the last error event's words: the run ended on it
        self.best: tuple[int, float] | None = None  # (update, val loss) of the best checkpoint
        self.autopilot: bool | None = None  # None until the run says
        self.alert = ""  # the newest alert's words
        self.last_time: float | None = None  # the newest record's own time (the run's clock)
        self.total_updates: int | None = None
        self.parallel = "data"  # as the hellos (or a replay's started event) name it
        self.pending: dict[int, SentCommand] = {}
        self._early: dict[int, Reply] = {}  # replies that arrived before their command_sent
        self.warning = ""
        self._seen_events: deque[tuple] = deque(maxlen=SEEN_EVENTS)
        self._seen_set: set[tuple] = set()
        self.version = 0

    # --- reading -----------------------------------------------------------------------------

    def live_count(self) -> int:
        return sum(1 for v in self.ranks if v.phase in UP)

    def step(self) -> int:
        return max((v.last.step for v in self.ranks if v.last), default=0)

    def nobody(self) -> bool:
        """No rank ever answered and every one was refused: nothing listens on their ports."""
        return all(
            v.hello is None and v.refused == NOBODY and v.phase not in UP for v in self.ranks
        )

    def ended(self) -> bool:
        """Every rank's record is over (a replay played its last one)."""
        return bool(self.ranks) and all(v.phase is LinkPhase.ENDED for v in self.ranks)

    def parallelism(self) -> Parallelism:
        """How the run's ranks share the work (data parallel until a record says otherwise)."""
        return parse_parallelism(self.parallel, self.world_size)

    def split(self) -> list[int] | None:
        """Every rank's local batch, once each has reported its own."""
        batches = [v.local_batch for v in self.ranks]
        return [b for b in batches if b is not None] if None not in batches else None

    # --- input -------------------------------------------------------------------------------

    def absorb(self, items: Iterable[tuple[int, Any]]) -> None:
        """Take what the links delivered: (rank, message or link status) pairs, in order."""
        for rank, item in items:
            if isinstance(item, LinkStatus):
                self.set_link(item)
            elif isinstance(item, Message):
                self.apply(rank, item)

    def apply(self, rank: int, msg: Message) -> None:
        """Take one message a link read from `rank`."""
        if not 0 <= rank < len(self.ranks):
            return
        view = self.ranks[rank]
        view.last_seen = self.clock()
        if isinstance(msg, Update):
            self._update(view, msg)
        elif isinstance(msg, Event):
            self._event(msg)
        elif isinstance(msg, Hello):
            self._hello(view, msg)
        elif isinstance(msg, Reply):
            self._reply(msg)
        elif isinstance(msg, Dropped):
            view.dropped = msg.total
            text = f"rank {rank}: {msg.count} record(s) dropped (console too slow)"
            self.log(text, "warning", rank=rank)
        view.version += 1
        self.version += 1

    def set_link(self, status: LinkStatus) -> None:
        """Take a link's phase change; refusals, losses and returns go to the log once each."""
        view = self.ranks[status.rank]
        old, view.link = view.link, status
        view.version += 1
        self.version += 1
        if status.phase is LinkPhase.LIVE:
            view.said = view.refused = ""  # back: the next trouble is news again
        elif status.phase is LinkPhase.REFUSED:
            view.refused = status.kind  # kept while it retries (connecting again)
        said = events.link_line(old, status)
        if said is None or said[1] == view.said:
            return  # a link retrying with the same refusal says it once
        view.said = said[1]
        self.log(said[1], said[0], rank=status.rank)
        # (A loss is news only from a connected link.) Replies go back on the connection a
        # command came in on: with rank 0's link, those of every command waiting are gone.
        if status.phase is LinkPhase.LOST and status.rank == 0 and self.pending:
            whats = [events.command_name(p.cmd, p.args) for p in self.pending.values()]
            self.log(events.unanswered_line(whats), "warning")
            self.pending.clear()
            self._early.clear()

    def command_sent(self, id: int, cmd: str, args: dict[str, Any]) -> None:
        """Record a command this console sent, so its reply can be told apart."""
        self.pending[id] = SentCommand(id, cmd, dict(args), self.clock())
        self.log(events.sent_line(id, events.command_name(cmd, args)), "command")
        early = self._early.pop(id, None)
        if early is not None:  # the reply overtook the news that the command was sent
            self._reply(early)

    @property
    def log_lines(self) -> deque[LogLine]:
        """The event log's lines, oldest first."""
        return self.journal.lines

    @property
    def log_version(self) -> int:
        return self.journal.version

    def log(self, text: str, level: str = "info", **where: Any) -> LogLine:
        """Add a line to the event log (`where`: rank, step, kind, when, as Journal.add)."""
        self.version += 1
        return self.journal.add(text, level, **where)

    # --- one message each --------------------------------------------------------------------

    def _hello(self, view: RankView, hello: Hello) -> None:
        if view.hello is not None and view.hello.run_id != hello.run_id:
            view.updates.clear()  # a new run on the same port: its steps start again
        view.hello = hello
        if self.run_id and hello.run_id != self.run_id and view.rank == 0:
            # Rank 0 restarted as another run (the ports were reused): follow it.
            self.log(f"rank 0 now serves run {hello.run_id} (was {self.run_id})", "warning")
            self.run_id = ""
            self.loss.clear()
            self.evals.clear()
            self.journal.new_run()
            self.paused = self.stopped = False
            self.failed = ""
        if not self.run_id:
            self.run_id = hello.run_id
            self.world_size = hello.world_size
            self.parallel = hello.parallel
        elif hello.run_id != self.run_id:
            self.warning = f"rank {view.rank} serves run {hello.run_id}, not {self.run_id}"
            self.log(self.warning, "error", rank=view.rank)
        if hello.world_size != len(self.ranks):
            self.warning = (
                f"the run has {hello.world_size} ranks; the console was given {len(self.ranks)}"
            )
            self.log(self.warning, "warning", rank=view.rank)

    def _update(self, view: RankView, u: Update) -> None:
        last = view.last
        if last is not None and u.step <= last.step:
            return  # history re-sent after a reconnect, or a resumed run replaying: seen already
        view.updates.append(u)
        if self.last_time is None or u.time > self.last_time:
            self.last_time = u.time
        if u.step > self.loss.last_x:
            self.loss.add(u.step, u.loss)

    def _event(self, e: Event) -> None:
        key = (e.rank, e.kind, e.step, e.time)
        if key in self._seen_set:
            return  # event history re-sent after a reconnect
        if len(self._seen_events) == self._seen_events.maxlen:
            self._seen_set.discard(self._seen_events[0])
        self._seen_events.append(key)
        self._seen_set.add(key)
        data = e.data or {}
        if self.last_time is None or e.time > self.last_time:
            self.last_time = e.time
        if e.kind == "started":
            self.paused = self.stopped = False
            self.failed = ""
            if isinstance(data.get("updates"), int):
                self.total_updates = data["updates"]
            if isinstance(data.get("parallel"), str):  # a replay's only word on the mode
                self.parallel = data["parallel"]
        elif e.kind in ("paused", "resumed"):
            self.paused = e.kind == "paused"
        elif e.kind == "stopped":
            self.stopped = True
        elif e.kind == "error":
            self.failed = e.message or "error"
        elif e.kind == "eval" and isinstance(v := data.get("val_loss"), int | float):
            self.evals.add(e.step, float(v))
            if isinstance(b := data.get("best_val_loss"), int | float):
                self.best = (int(data.get("best_step", e.step)), float(b))
        elif e.kind == "autopilot" and isinstance(data.get("on"), bool):
            self.autopilot = data["on"]
        elif e.kind == "alert":
            self.alert = e.message
        if e.kind == "started" and isinstance(data.get("autopilot"), bool):
            self.autopilot = data["autopilot"]
        level, text = events.event_line(e)
        self.journal.alike(e.rank, e.step, e.kind, level, text, e.time, self.world_size)
        self.version += 1

    def _reply(self, r: Reply) -> None:
        if r.id != 0 and r.id not in self.pending and len(self._early) < EARLY_REPLIES:
            self._early[r.id] = r  # replies on our link answer our commands: one is on its way
            return
        p = self.pending.pop(r.id, None)
        what = events.command_name(p.cmd, p.args) if p else f"command {r.id}"
        level, text = events.reply_line(r, what)
        self.log(text, level, step=(r.result or {}).get("step") if r.ok else None)
