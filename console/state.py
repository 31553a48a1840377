"""What the console knows about the run: a pure model fed by links (or a replay), read by views.

No Textual here: `--once`, replay and the benchmark use it as is, and tests drive it directly.
Every figure shown is derived here, so the widgets only lay text out.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from console.hostfile import RankTarget
from console.model import UP, LinkPhase, LinkStatus
from telemetry import balance
from telemetry.records import Dropped, Event, Hello, Message, Reply, Update

HISTORY = 1200  # updates kept per rank: the widest charts and the balancer read from these
LOG_LINES = 2000
LOSS_POINTS = 4000  # per series; older points are merged pairwise, so the whole run fits
SMOOTH = 10  # updates averaged for rates, the update time and the straggler
STRAGGLER_SPREAD = 0.10  # a rank is called the straggler when compute times differ by > 10%
BALANCE_WINDOW = 200  # updates per rank handed to the balancer


class Series:
    """(x, y) points for a chart, bounded: when full, neighbours are averaged pairwise.

    So a long run keeps its whole shape at a coarser grain instead of losing its start.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(4, capacity)
        self.points: list[tuple[float, float]] = []
        self.stride = 1  # raw points per stored point
        self._pending: list[tuple[float, float]] = []
        self.last_x = float("-inf")
        self.last_y: float | None = None
        self.version = 0

    def add(self, x: float, y: float) -> None:
        self.last_x, self.last_y = x, y
        self.version += 1
        self._pending.append((x, y))
        if len(self._pending) < self.stride:
            return
        self.points.append(_mean(self._pending))
        self._pending = []
        if len(self.points) >= self.capacity:
            pts = self.points
            self.points = [_mean(pts[i : i + 2]) for i in range(0, len(pts), 2)]
            self.stride *= 2

    def all(self) -> list[tuple[float, float]]:
        """Stored points plus the partial bucket, so the newest value is always drawn."""
        return self.points + ([_mean(self._pending)] if self._pending else [])

    def clear(self) -> None:
        self.__init__(self.capacity)  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self.points) + (1 if self._pending else 0)

    def __bool__(self) -> bool:
        return len(self) > 0


def _mean(pts: list[tuple[float, float]]) -> tuple[float, float]:
    return (sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts))


@dataclass(slots=True)
class LogLine:
    """One line of the event log."""

    seq: int
    time: float
    level: str  # info, good, warning, error, command
    text: str
    rank: int | None = None
    step: int | None = None
    kind: str = ""


@dataclass(slots=True)
class PendingCommand:
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

    def recent(self, n: int = SMOOTH) -> list[Update]:
        return list(self.updates)[-n:]


@dataclass(slots=True)
class HeaderInfo:
    """The figures in the header."""

    run_id: str = ""
    step: int = 0
    total_updates: int | None = None
    tokens: int = 0
    tokens_per_s: float | None = None
    update_s: float | None = None
    loss: float | None = None
    val_loss: float | None = None
    eta_s: float | None = None
    status: str = "connecting"  # running, paused, stopped, connecting, replay
    live: int = 0
    world: int = 0
    straggler: int | None = None
    global_batch: int | None = None
    warning: str = ""


class FleetState:
    """The run as seen from the console; `apply` everything the links say, read the rest."""

    def __init__(
        self, targets: Sequence[RankTarget], clock: Callable[[], float] = time.time
    ) -> None:
        self.clock = clock
        self.ranks = [RankView(t) for t in targets]
        self.log_lines: deque[LogLine] = deque(maxlen=LOG_LINES)
        self._seq = 0
        self.loss = Series(LOSS_POINTS)
        self.evals = Series(LOSS_POINTS)
        self.run_id = ""
        self.world_size = len(self.ranks)
        self.paused = False
        self.stopped = False
        self.total_updates: int | None = None
        self.pending: dict[int, PendingCommand] = {}
        self._early: dict[int, Reply] = {}  # replies that arrived before their command_sent
        self.warning = ""
        self._seen_events: deque[tuple] = deque(maxlen=4096)
        self._seen_set: set[tuple] = set()
        self.version = 0

    # --- input -------------------------------------------------------------------------------

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
            self.log(
                f"rank {rank}: {msg.count} record(s) dropped (console too slow)",
                "warning",
                rank=rank,
            )
        view.version += 1
        self.version += 1

    def absorb(self, items: Iterable[tuple[int, Any]]) -> None:
        """Take what the links delivered: (rank, message or link status) pairs, in order."""
        for rank, item in items:
            if isinstance(item, LinkStatus):
                self.set_link(item)
            elif isinstance(item, Message):
                self.apply(rank, item)

    def set_link(self, status: LinkStatus) -> None:
        """Take a link state change; refusals and losses go to the log once each."""
        view = self.ranks[status.rank]
        old = view.link
        view.link = status
        view.version += 1
        self.version += 1
        if old is not None and old.phase == status.phase and old.detail == status.detail:
            return
        if status.phase is LinkPhase.REFUSED:
            self.log(f"rank {status.rank} refused: {status.detail}", "error", rank=status.rank)
        elif (
            status.phase is LinkPhase.LOST
            and old is not None
            and old.phase
            in (
                LinkPhase.LIVE,
                LinkPhase.STALE,
            )
        ):
            self.log(f"rank {status.rank} link lost: {status.detail}", "warning", rank=status.rank)
            if status.rank == 0 and self.pending:
                # Replies go back on the connection a command came in on: these are gone.
                names = ", ".join(_describe_cmd(p.cmd, p.args) for p in self.pending.values())
                self.log(
                    f"no reply to {names}: rank 0's link dropped; whether it was applied shows "
                    "in the events once the link is back",
                    "warning",
                )
                self.pending.clear()
                self._early.clear()
        elif (
            status.phase is LinkPhase.LIVE
            and old is not None
            and old.phase
            in (
                LinkPhase.LOST,
                LinkPhase.REFUSED,
            )
        ):
            self.log(f"rank {status.rank} link back", "good", rank=status.rank)

    def command_sent(self, id: int, cmd: str, args: dict[str, Any]) -> None:
        """Record a command this console sent, so its reply can be told apart."""
        self.pending[id] = PendingCommand(id, cmd, dict(args), self.clock())
        what = _describe_cmd(cmd, args)
        self.log(f"→ {what}: sent (id {id}), waiting for the next update boundary", "command")
        early = self._early.pop(id, None)
        if early is not None:  # the reply overtook the news that the command was sent
            self._reply(early)

    def log(
        self,
        text: str,
        level: str = "info",
        *,
        rank: int | None = None,
        step: int | None = None,
        kind: str = "",
        when: float | None = None,
    ) -> None:
        self._seq += 1
        self.log_lines.append(
            LogLine(
                self._seq, self.clock() if when is None else when, level, text, rank, step, kind
            )
        )
        self.version += 1

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
            self.paused = self.stopped = False
        if not self.run_id:
            self.run_id = hello.run_id
            self.world_size = hello.world_size
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
        level, text = "info", e.message
        if e.kind == "started":
            self.paused = self.stopped = False
            for name in ("updates", "total_updates", "max_updates"):
                if isinstance(data.get(name), int):
                    self.total_updates = data[name]
            split = data.get("split")
            text = (
                text or f"run started: {data.get('world_size', '?')} ranks, split {_split(split)}"
            )
            level = "good"
        elif e.kind == "checkpoint":
            verified = data.get("verified")
            text = text or f"checkpoint {data.get('path', '')}"
            text += " (verified)" if verified else " (NOT verified)" if verified is False else ""
            level = "good" if verified is not False else "warning"
        elif e.kind == "paused":
            self.paused = True
            text = text or "run paused"
            level = "warning"
        elif e.kind == "resumed":
            self.paused = False
            text = text or "run resumed"
            level = "good"
        elif e.kind == "rebalanced":
            text = text or f"rebalanced {_split(data.get('from'))} → {_split(data.get('to'))}"
            level = "good"
        elif e.kind == "stopped":
            self.stopped = True
            ck = data.get("checkpoint")
            text = text or ("run stopped" + (f", checkpoint {ck}" if ck else ""))
            level = "warning"
        elif e.kind == "eval":
            v = data.get("val_loss")
            if isinstance(v, int | float):
                self.evals.add(e.step, float(v))
                text = text or f"eval: val loss {v:.4f}"
        elif e.kind == "sample":
            sample = str(data.get("text", "")).replace("\n", "⏎")
            text = text or f"sample: {sample[:200]}"
        elif e.kind == "command":
            ok = data.get("ok")
            text = text or (
                f"command {_describe_cmd(str(data.get('cmd', '?')), data.get('args') or {})}"
                + ("" if ok is None else " applied" if ok else f" refused: {data.get('error', '')}")
            )
            level = "command"
        elif e.kind in ("warning", "error"):
            level = e.kind
        self.log(text or e.kind, level, rank=e.rank, step=e.step, kind=e.kind, when=e.time)

    def _reply(self, r: Reply) -> None:
        if r.id != 0 and r.id not in self.pending and len(self._early) < 64:
            self._early[r.id] = r  # replies on our link answer our commands: one is on its way
            return
        p = self.pending.pop(r.id, None)
        what = _describe_cmd(p.cmd, p.args) if p else f"command {r.id}"
        if r.ok:
            step = (r.result or {}).get("step")
            at = f" at update {step}" if step is not None else ""
            self.log(f"✓ {what}: applied{at}", "good", step=step)
        else:
            self.log(f"✗ {what}: refused: {r.error or 'no reason given'}", "error")

    # --- derived figures ---------------------------------------------------------------------

    def live_count(self) -> int:
        return sum(1 for v in self.ranks if v.phase in UP)

    def step(self) -> int:
        return max((v.last.step for v in self.ranks if v.last), default=0)

    def reference(self) -> RankView | None:
        """The rank with the newest update: the header's figures come from it."""
        best = None
        for v in self.ranks:
            if v.last is not None and (best is None or v.last.step > best.last.step):  # type: ignore[union-attr]
                best = v
        return best

    def straggler(self) -> int | None:
        """The rank the others wait for, when compute times differ enough to matter."""
        means = {}
        for v in self.ranks:
            recent = v.recent(SMOOTH)
            if recent and v.phase in UP:
                means[v.rank] = statistics.fmean(u.compute_s for u in recent)
        if len(means) < 2:
            return None
        slowest = max(means, key=means.__getitem__)
        top, bottom = means[slowest], min(means.values())
        return slowest if top > 0 and (top - bottom) / top > STRAGGLER_SPREAD else None

    def current_split(self) -> list[int | None]:
        return [v.local_batch for v in self.ranks]

    def header(self) -> HeaderInfo:
        info = HeaderInfo(
            run_id=self.run_id,
            step=self.step(),
            total_updates=self.total_updates,
            live=self.live_count(),
            world=len(self.ranks),
            straggler=self.straggler(),
            warning=self.warning,
        )
        split = self.current_split()
        info.global_batch = sum(split) if all(b is not None for b in split) else None  # type: ignore[arg-type]
        ref = self.reference()
        if ref is not None and ref.last is not None:
            recent = ref.recent(SMOOTH)
            wall = sum(u.update_s for u in recent)
            info.tokens = ref.last.tokens
            info.loss = ref.last.loss
            info.update_s = wall / len(recent)
            info.tokens_per_s = sum(u.update_tokens for u in recent) / wall if wall > 0 else None
            if self.total_updates and info.update_s:
                info.eta_s = max(0, self.total_updates - info.step) * info.update_s
        if self.evals:
            info.val_loss = self.evals.last_y
        if self.stopped:
            info.status = "stopped"
        elif self.paused:
            info.status = "paused"
        elif info.live == 0:
            info.status = "connecting" if not self.run_id else "no link"
        else:
            info.status = "running"
        return info

    def balance_samples(self) -> list[list[balance.RankSample]]:
        """Each rank's recent updates as the balancer's input."""
        out = []
        for v in self.ranks:
            total = v.memory_total
            out.append(
                [
                    balance.RankSample(u.local_batch, u.compute_s, u.peak_mem, total)
                    for u in list(v.updates)[-BALANCE_WINDOW:]
                ]
            )
        return out

    def proposal(
        self, headroom: float = 0.15
    ) -> tuple[balance.Proposal | None, list[balance.RankModel], str]:
        """The balancer's proposal for this run, the fitted models, and why not if none."""
        split = self.current_split()
        if any(b is None for b in split):
            return None, [], "not every rank has reported its local batch yet"
        samples = self.balance_samples()
        missing = [v.rank for v, s in zip(self.ranks, samples, strict=True) if not s]
        if missing:
            return None, [], f"no updates yet from rank(s) {', '.join(map(str, missing))}"
        try:
            models = balance.fit(samples)
            prop = balance.propose(
                models,
                sum(split),
                headroom=headroom,
                current=split,  # type: ignore[arg-type]
            )
        except balance.BalanceError as e:
            return None, [], str(e)
        return prop, models, ""

    # --- snapshot (--once --json, replay --once) ---------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready picture of the run now."""
        h = self.header()
        ranks = []
        for v in self.ranks:
            u = v.last
            ranks.append(
                {
                    "rank": v.rank,
                    "host": v.host,
                    "port": v.target.port,
                    "link": v.phase.value,
                    "link_detail": v.link.detail if v.link else "",
                    "local_batch": v.local_batch,
                    "memory_total": v.memory_total,
                    "chip": v.hello.chip if v.hello else None,
                    "straggler": v.rank == h.straggler,
                    "dropped": v.dropped,
                    "update": u.to_msg() if u else None,
                }
            )
        return {
            "run_id": h.run_id,
            "status": h.status,
            "step": h.step,
            "total_updates": h.total_updates,
            "tokens": h.tokens,
            "tokens_per_s": h.tokens_per_s,
            "update_s": h.update_s,
            "loss": h.loss,
            "val_loss": h.val_loss,
            "eta_s": h.eta_s,
            "live": h.live,
            "world": h.world,
            "straggler": h.straggler,
            "global_batch": h.global_batch,
            "ranks": ranks,
            "events": [
                {
                    "time": ln.time,
                    "level": ln.level,
                    "rank": ln.rank,
                    "step": ln.step,
                    "kind": ln.kind,
                    "text": ln.text,
                }
                for ln in list(self.log_lines)[-20:]
            ],
        }


def _split(split: Any) -> str:
    if isinstance(split, list | tuple):
        return ",".join(str(b) for b in split)
    return "?"


def _describe_cmd(cmd: str, args: dict[str, Any]) -> str:
    if cmd == "rebalance":
        return f"rebalance to {_split(args.get('split'))}"
    return cmd
