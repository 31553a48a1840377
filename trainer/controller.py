"""Operator commands applied by every rank at the same update boundary."""

from __future__ import annotations

from dataclasses import dataclass

from telemetry.control import CommandQueue, CommandResult, PendingCommand
from telemetry.records import COMMANDS
from telemetry.split import problems
from trainer.distributed import Cluster

HEARTBEAT_S = 0.5  # while paused, ranks exchange a heartbeat about twice a second


@dataclass
class Action:
    """The command every rank applies at this boundary ("none" most of the time)."""

    name: str
    payload: list[int]
    pending: PendingCommand | None = None  # rank 0 only: whom to answer


class Controller:
    """Rank 0 takes commands from a queue (telemetry, signals); one tiny all-reduce per
    boundary hands the chosen one to every rank, so all apply it at the same update."""

    def __init__(self, cluster: Cluster, queue: CommandQueue | None = None) -> None:
        self.cluster = cluster
        self.queue = queue if queue is not None else CommandQueue()
        self.paused = False

    def exchange(self, split: list[int], mem_caps: list[int | None] | None = None) -> Action:
        """Called by every rank at every boundary (and as the heartbeat while paused)."""
        pending, name, payload = None, "none", []
        if self.cluster.is_root:
            while (pending := self.queue.poll()) is not None:
                why = self._refusal(pending, split, mem_caps)
                if why is None:
                    name = pending.cmd
                    payload = list(pending.args.get("split", [])) if name == "rebalance" else []
                    break
                pending.resolve(CommandResult(ok=False, error=why))
        if self.paused and name == "none":
            name = "heartbeat"
        name, payload = self.cluster.broadcast_command(name, payload)
        if name == "pause":
            self.paused = True
        elif name in ("resume", "stop"):
            self.paused = False
        return Action(name, payload, pending)

    def _refusal(
        self, p: PendingCommand, split: list[int], mem_caps: list[int | None] | None
    ) -> str | None:
        if p.cmd == "pause" and self.paused:
            return "already paused"
        if p.cmd == "resume" and not self.paused:
            return "not paused"
        if p.cmd == "rebalance":
            return (
                "; ".join(problems(p.args.get("split"), sum(split), len(split), mem_caps)) or None
            )
        if p.cmd not in COMMANDS:
            return f"unknown command {p.cmd!r}"
        return None

    @staticmethod
    def answer(action: Action, step: int, ok: bool = True, error: str = "", **result) -> None:
        """Resolve rank 0's pending command: applied at `step`, or refused and why."""
        if action.pending is not None:
            action.pending.resolve(CommandResult(ok=ok, step=step, result=result, error=error))
