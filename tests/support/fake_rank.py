"""A fake rank for end-to-end console tests: a real telemetry Hub fed with synthetic updates.

    python tests/support/fake_rank.py --rank 0 --world 4 --port-base 47800 --run-dir RUN

Rank 0 makes RUN/control.key and resolves commands at its "update boundaries" (pause, resume,
checkpoint, rebalance, stop), sharing the outcome with the other ranks through
RUN/fake-state.json, so every rank pauses, rebalances and stops together, as a real run would.
Prints `ready <port>` once serving.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from telemetry import auth  # noqa: E402
from telemetry.control import CommandQueue, CommandResult  # noqa: E402
from telemetry.hub import Hub  # noqa: E402
from telemetry.records import Event, Hello, Update, run_id_of  # noqa: E402
from telemetry.units import GiB  # noqa: E402


def shared(run: Path) -> dict:
    try:
        return json.loads((run / "fake-state.json").read_text())
    except (OSError, ValueError):
        return {}


def publish(run: Path, state: dict) -> None:
    tmp = run / f".fake-state.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, run / "fake-state.json")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port-base", type=int, required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--interval", type=float, default=0.1)
    p.add_argument("--split", default="")
    p.add_argument("--slow", default="", help="per-rank per-sample slowdown factors")
    p.add_argument("--run-id", default="", help="default: the real id of --run-dir")
    p.add_argument(
        "--news",
        action="store_true",
        help="rank 0 also says, at update 3, what a console must show whole: a sample of "
        "several lines, an alert, and the autopilot's measured follow-up of a rebalance",
    )
    a = p.parse_args()

    run = Path(a.run_dir)
    run.mkdir(parents=True, exist_ok=True)
    split = [int(x) for x in a.split.split(",")] if a.split else [2] * a.world
    slow = [float(x) for x in a.slow.split(",")] if a.slow else [1.0] * a.world
    key = auth.ensure_key(run) if a.rank == 0 else None
    queue = CommandQueue() if a.rank == 0 else None
    if a.rank == 0:
        publish(run, {"paused": False, "split": split, "stopped": False, "step": 0})
    hello = Hello(
        protocol=1,
        run_id=a.run_id or run_id_of(run),
        rank=a.rank,
        world_size=a.world,
        host=f"fake-{a.rank}",
        platform="test",
        chip="fake",
        memory_total=16 * GiB,
        local_batch=split[a.rank],
        config_digest="fake",
    )
    hub = Hub(run_dir=run, hello=hello, port=a.port_base + a.rank, commands=queue, key=key)
    hub.start()
    print(f"ready {a.port_base + a.rank}", flush=True)
    step = 0
    if a.rank == 0:
        hub.on_event(
            Event("started", 0, 0, data={"world_size": a.world, "split": split, "updates": 100000})
        )
    try:
        while True:
            time.sleep(a.interval)
            st = shared(run) if a.rank else {"paused": False, "split": split, "stopped": False}
            if a.rank == 0:
                st = shared(run) or st
                while queue is not None and (cmd := queue.poll()) is not None:
                    st = apply(cmd, st, step, hub, a.world)
                    publish(run, st)
            split = st.get("split", split)
            if st.get("stopped"):
                return 0
            if st.get("paused"):
                continue
            step += 1
            if a.news and a.rank == 0 and step == 3:
                for e in news(step, split):
                    hub.on_event(e)
            b = split[a.rank]
            per = [0.01 * s for s in slow]
            compute = per[a.rank] * b
            slowest = max(x * y for x, y in zip(per, split, strict=True))
            wait = max(0.0, slowest - compute)
            hub.on_update(
                Update(
                    rank=a.rank,
                    step=step,
                    tokens=step * sum(split) * 128,
                    update_tokens=sum(split) * 128,
                    local_tokens=b * 128,
                    loss=4.0 / (1 + 0.01 * step) + 1,
                    lr=1e-3,
                    grad_norm=1.0,
                    local_batch=b,
                    microsteps=1,
                    compute_s=compute,
                    wait_s=wait,
                    transfer_s=0.002,
                    optimizer_s=0.001,
                    update_s=compute + wait + 0.003,
                    active_mem=GiB + b * GiB // 4,
                    peak_mem=GiB + b * GiB // 2,
                    cache_mem=GiB // 4,
                    tokens_per_s=b * 128 / (compute + wait + 0.003),
                )
            )
    finally:
        hub.close()


def news(step: int, split: list[int]) -> list[Event]:
    """What `--news` says at update `step`: each as the trainer would send it."""
    code = "def f(x):\n    return x + 1\n\nprint(f(2))"
    measured = {"from": split, "to": split[::-1], "after_s": 0.2, "before_s": 0.3}
    return [
        Event("sample", 0, step, code, {"prompt": "def ", "text": code}),
        Event("alert", 0, step, "memory: rank 1 swaps 2.0 GiB", {"alert": "memory"}),
        Event(
            "autopilot", 0, step, f"split {split} -> {split[::-1]}: slowest 300 -> 200", measured
        ),
    ]


def apply(cmd, st: dict, step: int, hub: Hub, world: int) -> dict:
    """Apply one command at this boundary, as the trainer would, and resolve it."""
    st = dict(st)
    ok, error, result = True, "", {}
    if cmd.cmd == "pause":
        st["paused"] = True
        hub.on_event(Event("paused", 0, step))
    elif cmd.cmd == "resume":
        st["paused"] = False
        hub.on_event(Event("resumed", 0, step))
    elif cmd.cmd == "checkpoint":
        path = f"ckpt-{step:06d}"
        result = {"path": path}
        hub.on_event(Event("checkpoint", 0, step, data={"path": path, "verified": True}))
    elif cmd.cmd == "rebalance":
        new = cmd.args.get("split")
        if not isinstance(new, list) or len(new) != world or sum(new) != sum(st["split"]):
            ok, error = False, f"bad split {new}"
        else:
            hub.on_event(Event("rebalanced", 0, step, data={"from": st["split"], "to": new}))
            st["split"] = new
    elif cmd.cmd == "stop":
        hub.on_event(
            Event("checkpoint", 0, step, data={"path": f"ckpt-{step:06d}", "verified": True})
        )
        hub.on_event(Event("stopped", 0, step, data={"checkpoint": f"ckpt-{step:06d}"}))
        st["stopped"] = True
    else:
        ok, error = False, f"unknown command {cmd.cmd}"
    cmd.resolve(CommandResult(ok=ok, step=step, result=result, error=error))
    return st


if __name__ == "__main__":
    sys.exit(main())
