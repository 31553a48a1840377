"""Synthetic hellos, updates, events and whole run logs: for tests, benchmarks and fake feeds."""

from __future__ import annotations

import random
import time
from pathlib import Path

from telemetry.arrowlog import ArrowLog
from telemetry.protocol import VERSION
from telemetry.records import Event, Hello, Update


def hello(rank: int = 0, world_size: int = 1, *, local_batch: int = 4) -> Hello:
    """A plausible Hello for a fake rank."""
    return Hello(
        protocol=VERSION,
        run_id="synthetic",
        rank=rank,
        world_size=world_size,
        host=f"mac-{rank}",
        platform="darwin",
        chip="Apple M2",
        memory_total=16 << 30,
        local_batch=local_batch,
        config_digest="0" * 12,
    )


def update(
    step: int,
    rank: int = 0,
    *,
    compute_s: float = 0.2,
    wait_s: float = 0.02,
    transfer_s: float = 0.01,
    local_batch: int = 4,
    update_tokens: int = 4096,
    loss: float | None = None,
    t: float | None = None,
) -> Update:
    """One rank's update with the given timings; the other figures follow from them."""
    update_s = compute_s + wait_s + transfer_s + 0.005
    local_tokens = local_batch * 256
    return Update(
        rank=rank,
        step=step,
        tokens=step * update_tokens,
        update_tokens=update_tokens,
        local_tokens=local_tokens,
        loss=loss if loss is not None else 4.0 / (1 + 0.05 * step) + 1.0,
        lr=3e-4,
        grad_norm=1.0,
        local_batch=local_batch,
        microsteps=1,
        compute_s=compute_s,
        wait_s=wait_s,
        transfer_s=transfer_s,
        optimizer_s=0.005,
        update_s=update_s,
        active_mem=1 << 30,
        peak_mem=(2 << 30) + rank * (1 << 28),
        cache_mem=1 << 28,
        tokens_per_s=local_tokens / update_s,
        time=t if t is not None else time.time(),
    )


def write_run(
    run_dir: Path,
    *,
    world_size: int = 3,
    steps: int = 60,
    slow_rank: int | None = 2,
    slowdown: float = 1.5,
    rebalance_at: int | None = 30,
    eval_every: int = 20,
    seed: int = 0,
) -> None:
    """Log a fake run: `slow_rank` computes `slowdown` times slower until `rebalance_at`, where
    it is given a smaller share and the others wait less."""
    rng = random.Random(seed)
    split = [4] * world_size
    after = list(split)
    if slow_rank is not None:
        after[slow_rank] = 3
        after[(slow_rank + 1) % world_size] = 5
    t0 = 1_700_000_000.0
    for rank in range(world_size):
        log = ArrowLog(run_dir, rank)
        log.directory.mkdir(parents=True, exist_ok=True)
        records: list[Update | Event] = [
            Event("started", rank, 0, data={"world_size": world_size, "split": split}, time=t0)
        ]
        t = t0
        for step in range(1, steps + 1):
            moved = rebalance_at is not None and step > rebalance_at
            batch = (after if moved else split)[rank]
            per_sample = 0.05 * (slowdown if rank == slow_rank else 1.0)
            compute = per_sample * batch * rng.uniform(0.97, 1.03)
            slowest = max(
                0.05 * (slowdown if r == slow_rank else 1.0) * b
                for r, b in enumerate(after if moved else split)
            )
            wait = max(0.0, slowest - compute) + 0.002
            t += compute + wait + 0.02
            records.append(
                update(step, rank, compute_s=compute, wait_s=wait, local_batch=batch, t=t)
            )
            if rebalance_at is not None and step == rebalance_at:
                records.append(
                    Event("rebalanced", rank, step, data={"from": split, "to": after}, time=t)
                )
            if eval_every and step % eval_every == 0:
                val = {"val_loss": 4.0 / (1 + 0.05 * step) + 1.1, "val_tokens": 8192}
                records.append(Event("eval", rank, step, data=val, time=t))
        log.write(records)
        log.close()
