"""Typed messages of the telemetry protocol: what a rank says and what it is told."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

PROTOCOL_VERSION = 1

# The control commands a run understands, each with the code ranks broadcast it by (trainer/
# distributed.py). The one list: anything else is refused before it reaches the trainer.
COMMANDS: dict[str, int] = {
    "pause": 1,
    "resume": 2,
    "checkpoint": 3,
    "rebalance": 4,
    "stop": 5,
    "autopilot": 6,
}

# Event kinds a rank may emit (Hub.on_event refuses any other).
EVENT_KINDS = frozenset(
    {
        "started",
        "checkpoint",
        "paused",
        "resumed",
        "rebalanced",
        "stopped",
        "restarted",
        "autopilot",
        "alert",
        "eval",
        "sample",
        "command",
        "warning",
        "error",
    }
)


class Message:
    """Base of every protocol message: a dataclass with a fixed `type` tag."""

    type: ClassVar[str]

    def to_msg(self) -> dict[str, Any]:
        """The msgpack-ready mapping, with its `type` tag."""
        out = dataclasses.asdict(self)  # type: ignore[call-overload]
        out["type"] = self.type
        return out

    @classmethod
    def from_msg(cls, msg: dict[str, Any]):
        """Build from a decoded mapping; unknown keys are ignored (newer peers may add fields)."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in msg.items() if k in names})


def run_id_of(run_dir: str | Path) -> str:
    """A run's id: its folder's name and a short hash of the folder's absolute path.

    The name lets a console on another host check that the ranks it reached serve the run
    folder it was given; the hash tells apart two runs of the same name on one machine.
    """
    path = Path(run_dir)
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:6]
    return f"{path.name}-{digest}"


@dataclass(slots=True)
class Hello(Message):
    """First message on every connection: who this rank is."""

    type: ClassVar[str] = "hello"
    protocol: int
    run_id: str
    rank: int
    world_size: int
    host: str
    platform: str
    chip: str
    memory_total: int
    local_batch: int
    config_digest: str
    backlog: int = 0  # how many `update` records follow as history
    event_backlog: int = 0  # how many `event` records follow the updates, as history
    challenge: str = ""  # per-connection random hex; commands on this connection sign it
    parallel: str = "data"  # data, tensor, or tensor:K (trainer/parallel.py)


@dataclass(slots=True)
class Update(Message):
    """One rank's account of one optimizer update."""

    type: ClassVar[str] = "update"
    rank: int
    step: int  # updates completed, counting this one
    tokens: int  # global tokens seen by the run after this update
    update_tokens: int  # global tokens in this update (all ranks)
    local_tokens: int  # this rank's tokens in this update
    loss: float  # global token-weighted mean loss of this update
    lr: float
    grad_norm: float
    local_batch: int
    microsteps: int
    compute_s: float  # this rank's microsteps, until its accumulators are materialized
    wait_s: float  # barrier before the gradient all-reduce: waiting for the slowest rank
    transfer_s: float  # the gradient all-reduce itself
    optimizer_s: float
    update_s: float  # wall time of the whole update on this rank
    active_mem: int  # bytes, after the update
    peak_mem: int  # bytes, peak during the update (reset before it)
    cache_mem: int
    sys_mem_used: int = 0
    sys_mem_available: int = 0
    swap_used: int = 0
    mem_pressure: float | None = None  # 0..1 where the OS reports it (macOS), else None
    tokens_per_s: float = 0.0  # this rank's tokens / update_s
    simulated: bool = False  # a simulated slowdown was applied on this rank
    # Memory policy (trainer/memory.py); 0 where unknown (older peers and logs)
    mem_budget: int = 0  # bytes this rank may use: --memory-limit-gb, or auto's machine share
    mem_limit: int = 0  # MLX's memory limit in force, bytes (0 = none: MLX's default)
    live_mem: int = 0  # the update's live set as last measured (peak under a tight limit)
    # Optimizer sharding (trainer/shard.py); an unsharded rank holds all of it (share 1.0)
    opt_share: float = 1.0  # fraction of the parameters this rank steps (--shard-optimizer)
    resident_mem: int = 0  # bytes of master weights + optimizer state this rank holds
    # Tensor parallelism: the update's per-block all-reduces (inside compute_s), from a probe
    # of the same transfers at the run's start; 0 in data parallelism.
    collective_s: float = 0.0
    time: float = field(default_factory=time.time)


@dataclass(slots=True)
class Event(Message):
    """Something that happened on a rank: a checkpoint, a pause, an eval, a warning."""

    type: ClassVar[str] = "event"
    kind: str
    rank: int
    step: int
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)


@dataclass(slots=True)
class Command(Message):
    """A signed control request from a client (see telemetry.auth for the MAC)."""

    type: ClassVar[str] = "command"
    id: int
    cmd: str
    args: dict[str, Any]
    nonce: str
    mac: str = ""


@dataclass(slots=True)
class Reply(Message):
    """The answer to a command: applied (with its result) or refused (with why)."""

    type: ClassVar[str] = "reply"
    id: int
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass(slots=True)
class Dropped(Message):
    """Told to a slow subscriber: this many records were dropped from its buffer."""

    type: ClassVar[str] = "dropped"
    count: int
    total: int


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.type: cls for cls in (Hello, Update, Event, Command, Reply, Dropped)
}
