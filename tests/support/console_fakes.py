"""Deterministic fake telemetry for console tests: records, and a feed the test drives by hand."""

from __future__ import annotations

import threading
import time
from typing import Any

from console.hostfile import RankTarget
from console.link_phase import LinkPhase, LinkStatus
from telemetry.parallelism import parse as parse_parallelism
from telemetry.records import Event, Hello, Message, Reply, Update
from telemetry.units import GiB

T0 = 1_700_000_000.0  # a fixed wall time, so clocks shown are the same on every run
HOSTS = ["studio", "mini-1", "mini-2", "air"]


def log_text(app) -> str:
    """The console's event log as plain text."""
    return "\n".join(line.text for line in app.fleet.log_lines)


async def until(pilot, pred, timeout: float = 30.0) -> None:
    """Let the app run until `pred()` holds; fail with the event log after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in time; log:\n{log_text(pilot.app)}")
        await pilot.pause(0.02)


def hello(
    rank: int, world: int = 4, *, batch: int = 2, run_id: str = "demo-run", parallel: str = "data"
) -> Hello:
    return Hello(
        protocol=1,
        run_id=run_id,
        rank=rank,
        world_size=world,
        host=HOSTS[rank % len(HOSTS)],
        platform="macOS-15",
        chip="Apple M2",
        memory_total=16 * GiB,
        local_batch=batch,
        config_digest="abc",
        challenge="0" * 32,
        parallel=parallel,
    )


def update(
    rank: int,
    step: int,
    *,
    batch: int = 2,
    per_sample: float = 0.05,
    slowest: float = 0.3,
    world: int = 4,
    loss: float | None = None,
    seq_len: int = 128,
    swap: int = 0,
    collective: float = 0.0,
) -> Update:
    """Rank `rank`'s update `step`: compute proportional to its batch, waiting for the slowest;
    `collective`: seconds of that compute in tensor parallelism's per-block all-reduces."""
    compute = per_sample * batch
    wait = max(0.0, slowest - compute)
    update_s = compute + wait + 0.02
    return Update(
        rank=rank,
        step=step,
        tokens=step * 8 * seq_len,
        update_tokens=8 * seq_len,
        local_tokens=batch * seq_len,
        loss=4.0 - 0.01 * step if loss is None else loss,
        lr=1e-3,
        grad_norm=1.0,
        local_batch=batch,
        microsteps=1,
        compute_s=compute,
        wait_s=wait,
        transfer_s=0.015,
        optimizer_s=0.005,
        update_s=update_s,
        active_mem=(1 + batch) * GiB // 2,
        peak_mem=(2 + batch) * GiB // 2,
        cache_mem=GiB // 2,
        sys_mem_used=8 * GiB,
        sys_mem_available=8 * GiB,
        swap_used=swap,
        collective_s=collective,
        tokens_per_s=batch * seq_len / update_s,
        time=T0 + step * update_s,
    )


def straggler_fleet(
    steps: int = 20, split=(2, 2, 2, 2), slow=(1, 1, 1, 3)
) -> list[tuple[int, Message]]:
    """Hellos then `steps` updates of 4 ranks, rank 3 slowed: (rank, message) in arrival order."""
    out: list[tuple[int, Message]] = [(r, hello(r, batch=split[r])) for r in range(len(split))]
    per = [0.05 * s for s in slow]
    slowest = max(p * b for p, b in zip(per, split, strict=True))
    for step in range(1, steps + 1):
        for r in range(len(split)):
            out.append((r, update(r, step, batch=split[r], per_sample=per[r], slowest=slowest)))
    out.append(
        (
            0,
            Event(
                "started",
                0,
                0,
                data={"world_size": 4, "split": list(split), "updates": 1000},
                time=T0,
            ),
        )
    )
    return out


def tensor_fleet(
    steps: int = 20, world: int = 2, parallel: str = "tensor", collective: float = 0.012
) -> list[tuple[int, Message]]:
    """Hellos then `steps` updates of a tensor-parallel run: every rank reads the same batch
    (4 rows), and `collective` s of each rank's compute is its per-block all-reduces."""
    out: list[tuple[int, Message]] = [
        (r, hello(r, world, batch=4, parallel=parallel)) for r in range(world)
    ]
    for step in range(1, steps + 1):
        for r in range(world):
            # Rank r a little slower than r - 1: the group waits for its slowest slice.
            per = 0.05 * (1 + 0.1 * r)
            out.append(
                (r, update(r, step, batch=4, per_sample=per, world=world, collective=collective))
            )
    split = [4] * parse_parallelism(parallel, world).replicas  # one local batch per group
    started = {"world_size": world, "split": split, "updates": 1000, "parallel": parallel}
    out.append((0, Event("started", 0, 0, data=started, time=T0)))
    return out


class FakeFeed:
    """A feed the test pushes messages into; commands are recorded and answered on request."""

    playback = None

    def __init__(self, n: int = 4, *, control_problem: str = "", auto_reply: bool = True) -> None:
        self.targets = [RankTarget(r, HOSTS[r % len(HOSTS)], 47800 + r) for r in range(n)]
        self._control_problem = control_problem
        self.auto_reply = auto_reply
        self.sink: Any = None
        self.sent: list[tuple[str, dict]] = []
        self.sent_event = threading.Event()
        self.closed = False
        self.reconnects = 0
        self._ids = 0
        self.step = 20

    @property
    def control_problem(self) -> str:
        return self._control_problem

    def attach(self, sink: Any) -> None:
        self.sink = sink

    def loops(self) -> dict:
        return {}  # the test pushes by hand

    def start(self) -> None:
        pass

    def live(self) -> None:
        for t in self.targets:
            self.sink.link_status(LinkStatus(t.rank, LinkPhase.LIVE, "fake", time=T0))

    def push(self, items: list[tuple[int, Message]]) -> None:
        for rank, msg in items:
            self.sink.link_message(rank, msg)

    def link(
        self, rank: int, phase: LinkPhase, detail: str = "", kind: str = "", retry_at=None
    ) -> None:
        self.sink.link_status(LinkStatus(rank, phase, detail, kind, retry_at, T0))

    def send(self, cmd: str, args: dict | None = None) -> int:
        self._ids += 1
        self.sent.append((cmd, dict(args or {})))
        self.sent_event.set()
        if self.auto_reply:
            if cmd == "rebalance" and len(args["split"]) != len(self.targets):
                reply = Reply(self._ids, False, error="split has the wrong length")
            else:
                reply = Reply(self._ids, True, result={"step": self.step + 1})
            self.sink.link_message(0, reply)
        return self._ids

    def reconnect(self) -> None:
        self.reconnects += 1

    def close(self) -> None:
        self.closed = True


def write_finished_run(run_dir, world: int = 2, steps: int = 12) -> None:
    """The telemetry logs of a run that reached its planned end: `steps` of `steps` updates."""
    from telemetry.arrowlog import ArrowLog

    for r in range(world):
        log = ArrowLog(run_dir, r)
        log.directory.mkdir(parents=True, exist_ok=True)
        started = {"world_size": world, "split": [2] * world, "updates": steps}
        records: list = [Event("started", r, 0, "run started", started, time=T0)]
        records += [update(r, step, world=world) for step in range(1, steps + 1)]
        if r == 0:
            done = {"path": f"ckpt-{steps:06d}", "verified": True}
            records.append(Event("checkpoint", 0, steps, data=done, time=T0 + steps))
        log.write(records)
        log.close()
