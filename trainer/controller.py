"""Operator commands handed to every rank at the same update boundary."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from telemetry.control import CommandQueue, CommandResult, PendingCommand
from telemetry.records import COMMANDS
from telemetry.split import problems
from telemetry.units import MiB
from trainer.autopilot import Autopilot, RankFigures
from trainer.distributed import Cluster
from trainer.launch import lifeline
from trainer.launch.plan import LAUNCH_ENV

KEEPALIVE_S = 0.5  # while paused, ranks exchange a keepalive about twice a second

# (every rank's memory budget, split, every rank's peak bytes) -> the largest local batch each
# rank's memory allows
CapsModel = Callable[[list[float | None], list[int], list[float]], list[int | None]]


@dataclass
class Action:
    """The command every rank applies at this boundary ("none" most of the time)."""

    name: str
    payload: list[int]
    pending: PendingCommand | None = None  # rank 0 only: whom to answer
    reason: str = "command"  # what asked for it: an operator's command, or a signal


class Controller:
    """Rank 0 takes commands from a queue (telemetry, the autopilot); one tiny all-reduce per
    boundary (two where the autopilot may decide) hands the chosen one to every rank, so all
    apply it at the same update. The first all-reduce carries what every rank measured in its
    last update (peak memory, so the memory caps a rebalance is checked against are refreshed
    at every boundary; compute time and swap, for the autopilot) and any rank's request to
    stop (a signal it received, or what its lifeline to fleet launch says:
    trainer/launch/lifeline.py)."""

    def __init__(
        self,
        cluster: Cluster,
        queue: CommandQueue | None = None,
        caps_model: CapsModel | None = None,
        pilot: Autopilot | None = None,
        limits: list[float | None] | None = None,
        on_event: Callable[[str, str, dict], None] | None = None,
        fixed_split: str = "",
        watch: lifeline.Watch | None = None,
    ) -> None:
        self.cluster = cluster
        self.fixed_split = fixed_split  # why the split cannot change (tensor parallelism), or ""
        self.watch = watch
        self.queue = queue if queue is not None else CommandQueue()
        self.caps_model = caps_model
        self.pilot = pilot  # rank 0's; observes every boundary that is not a keepalive
        # Each rank's memory budget in bytes (--memory-limit-gb, or auto's share of its
        # machine): given, or as every rank reports it at each boundary.
        self.limits = limits or [None] * cluster.size
        self.on_event = on_event or (lambda kind, text, data: None)
        self.paused = False
        self.peaks: list[float] = [0.0] * cluster.size  # bytes, as of the last boundary
        self.stop_signal = 0  # a signal number once this rank was asked to stop
        self._lost_said = False

    def request_stop(self, signum: int) -> None:
        """Ask every rank to stop at the next boundary (safe to call from a signal handler)."""
        self.stop_signal = signum

    def _stop_code(self) -> int:
        """This rank's stop request: a signal it got, else what its lifeline says (0: none)."""
        if self.stop_signal or self.watch is None:
            return self.stop_signal
        code = self.watch.code()
        if code == lifeline.LOST_CODE and not self._lost_said:
            self._lost_said = True
            lifeline.say_lost(self.watch, self.cluster.rank)
        return code

    def exchange(
        self,
        split: list[int],
        peak: float = 0.0,
        compute_s: float = 0.0,
        swap: float = 0.0,
        pressure: float = 0.0,
        budget: float = 0.0,
    ) -> Action:
        """Called by every rank at every boundary (and as the keepalive while paused), with
        what this rank measured in its last update: peak memory and swap in bytes, compute
        seconds, memory pressure 0..1, and its memory budget in bytes (0: none or unknown)."""
        pending, name, payload, reason = self._next_command(split)
        if self.paused and name == "none":
            name = "keepalive"
        # FP32 holds whole numbers to 2**24: MiB for memory, microseconds for time (16 s).
        stop = float(self._stop_code())
        # rank 0: whether its pilot may decide on this boundary's figures (then a second
        # exchange applies the decision here)
        expect = float(self.cluster.is_root and self.pilot is not None and self.pilot.may_decide())
        mine = (peak / MiB, stop, compute_s * 1e6, swap / MiB, pressure * 1e3, budget / MiB, expect)
        name, payload, every = self.cluster.broadcast_command(name, payload, mine)
        self.peaks = [f[0] * MiB for f in every]
        self.limits = [
            f[5] * MiB if f[5] else limit for f, limit in zip(every, self.limits, strict=True)
        ]
        asked = [(r, int(round(f[1]))) for r, f in enumerate(every) if f[1]]
        if asked and name in ("none", "keepalive"):  # a stop outranks nothing but a command
            # fleet launch's own stop or its loss first: it speaks for every rank
            rank, code = max(asked, key=lambda a: a[1])
            # `fleet launch` passes its signal to every rank (some get it a boundary later):
            # naming one of them would say nothing. A rank signalled on its own is named.
            alone = len(asked) < self.cluster.size and not os.environ.get(LAUNCH_ENV)
            named = alone or code == lifeline.LOST_CODE  # a lifeline is lost one rank at a time
            name, payload, reason = "stop", [], lifeline.describe(code, rank if named else None)
        if self.pilot is not None and self.cluster.is_root and name != "keepalive":
            self._steer(split, every)
        if every[0][6] and name == "none":
            # What the pilot just decided on these figures is applied at this boundary, not
            # the next: every update on the old split costs the slowed rank's whole excess.
            # It takes a second tiny all-reduce, so only where rank 0 said that its pilot may
            # well decide (a rank's new cost is one figure from confirmation or read from few
            # yet, or a proposal awaits its second look): with more ranks than cores one costs
            # tens of ms (benchmarks/control_exchange.py).
            pending, name, payload, reason = self._next_command(split)
            name, payload, _ = self.cluster.broadcast_command(name, payload)
        self._follow(name)
        return Action(name, payload, pending, reason)

    def _next_command(self, split: list[int]) -> tuple[PendingCommand | None, str, list[int], str]:
        """Rank 0: the oldest queued command that can be applied (those that cannot are
        refused and answered); others: none. (pending, name, payload, reason)"""
        if self.cluster.is_root:
            while (pending := self.queue.poll()) is not None:
                why = self._refusal(pending, split)
                if why is None:
                    reason = pending.args.get("reason", "command")
                    return pending, pending.cmd, _payload(pending), reason
                pending.resolve(CommandResult(ok=False, error=why))
        return None, "none", [], "command"

    def _follow(self, name: str) -> None:
        """Keep the paused state every rank holds in step with the boundary's command."""
        if name == "pause":
            self.paused = True
        elif name in ("resume", "stop"):
            self.paused = False

    def _steer(self, split: list[int], every: list[list[float]]) -> None:
        """Show the autopilot this boundary; queue what it decides (applied at this boundary
        where it said it may decide and nothing else was chosen, else at the next)."""
        figures = [
            RankFigures(b, f[2] / 1e6, f[0] * MiB, f[3] * MiB, f[4] / 1e3, limit)
            for b, f, limit in zip(split, every, self.limits, strict=True)
        ]
        decision = self.pilot.observe(split, figures)
        for cmd, args in decision.commands:
            self.queue.submit(cmd, args)
        for kind, text, data in decision.events:
            self.on_event(kind, text, data)

    def caps(self, split: list[int]) -> list[int | None] | None:
        """Each rank's largest local batch within its memory limit, from the last peaks."""
        return self.caps_model(self.limits, split, self.peaks) if self.caps_model else None

    def _refusal(self, p: PendingCommand, split: list[int]) -> str | None:
        if p.cmd == "pause" and self.paused:
            return "already paused"
        if p.cmd == "resume" and not self.paused:
            return "not paused"
        if p.cmd == "rebalance" and self.fixed_split:
            return self.fixed_split
        if p.cmd == "autopilot" and self.fixed_split and p.args.get("on"):
            return self.fixed_split
        if p.cmd == "rebalance":
            why = problems(p.args.get("split"), sum(split), len(split), self.caps(split))
            return "; ".join(why) or None
        if p.cmd not in COMMANDS:
            return f"unknown command {p.cmd!r}"
        return None

    @staticmethod
    def answer(action: Action, step: int, ok: bool = True, error: str = "", **result) -> None:
        """Resolve rank 0's pending command: applied at `step`, or refused and why."""
        if action.pending is not None:
            action.pending.resolve(CommandResult(ok=ok, step=step, result=result, error=error))


def _payload(p: PendingCommand) -> list[int]:
    """A command's arguments as the integers every rank receives."""
    if p.cmd == "rebalance":
        return list(p.args.get("split", []))
    if p.cmd == "autopilot":
        return [int(bool(p.args.get("on")))]
    return []


@contextlib.contextmanager
def stop_on_signals(controller: Controller, say: Callable[[str], None]) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP (a closed SSH session) to any rank become a `stop` of every
    rank at the next boundary: a checkpoint and a clean exit. A second one interrupts at once
    (on this rank; the others then lose their peer)."""
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.getsignal(s) for s in signums}

    def _stop(signum, frame):
        signal.signal(signum, signal.default_int_handler)
        name = signal.Signals(signum).name
        say(f"fleet train: {name}: stopping at the next update (again to interrupt now)")
        controller.request_stop(signum)

    for s in signums:
        signal.signal(s, _stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
