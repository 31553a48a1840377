"""Two checkouts' autopilots on real local ranks, interleaved, in benchmarks/autopilot.py's
scenarios (default `moving16`), and its equal ranks (`equal`, `pair-equal`: none slowed, 500
updates).

    git worktree add /tmp/old <commit>
    python benchmarks/pilot_ab.py --trees . /tmp/old --repeats 2
    python benchmarks/pilot_ab.py --trees . /tmp/old --repeats 3 --scenarios moving16,transient16

CPU ranks over ring, as many as the scenario's schedule names (as benchmarks/autopilot.py:
depth 2, width 128, its slowdown schedules, no memory limit, each rank on a core of its own
where it can have one), `--autopilot` on, each tree running its own
trainer; the trees alternate in each repeat so a busy spell of the machine hits both. Prints
one JSON line a run: tokens/s from update 5 on (by the wall time from the end of one update
to the end of the next, boundaries included: `tok_s`; by the updates' own time alone, as
before session 32: `tok_s_updates_alone`), the moves, the samples moved between ranks that
the schedule did not make faster (autopilot.unjustified), and every rank's batch and compute
of each update (`figures`, as benchmarks/autopilot.py keeps them: what the pilot saw, to
replay a run).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autopilot import (
    EQUAL,
    FROM,
    MEMORY_LIMIT,
    MODEL,
    SCENARIOS,
    SLOWDOWNS,
    logged,
    rank_cores,
    rank_env,
    schedule,
    slowdown_args,
    spins,
    throughput,
    unjustified,
    world_of,
)

# as benchmarks/autopilot.py runs its equal ranks: a schedule that slows no rank
RUNS = {**SCENARIOS, **{name: (",".join("1" * w) + "@0", 16, 500) for name, w in EQUAL.items()}}


def one(tree: Path, data: Path, out: Path, scenario: str, slowdown: str = "auto") -> dict:
    """One pilot run with `tree`'s trainer (a child process importing from that tree); a
    slowed rank waits as autopilot.py's `--slowdown` says."""
    slow, total, updates = RUNS[scenario]
    world = world_of(schedule(slow)[0])
    busy = spins(slowdown, world)
    split = ",".join([str(total // world)] * world)
    code = f"""
import sys
sys.path.insert(0, {str(tree)!r})
from tests.support.fleet import launch_args, run_fleet
train = ("--local-batches", {split!r}, "--updates", "{updates}", *{MODEL!r},
         "--device", "cpu", "--telemetry-port-base", "0", "--log-every", "1000",
         "--memory-limit-gb", {MEMORY_LIMIT!r},
         *{slowdown_args(slow, busy)!r}, "--autopilot")
run_fleet(*launch_args({world}, {str(data)!r}, {str(out)!r}, *train,
                      launch_opts=("--backend", "ring")), timeout=900)
"""
    t0 = time.monotonic()
    env = rank_env(world, env=os.environ, pinned=rank_cores(world))  # the child sets its path
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    head = {"scenario": scenario, "tree": str(tree)}
    if proc.returncode != 0:
        return {**head, "error": proc.stderr[-1500:]}
    log, steps = logged(out), range(FROM, updates)  # its logs, read here as autopilot.py does
    alone = {"update_s": log["update_s"], "tokens": log["tokens"]}
    return {
        **head,
        "tok_s": throughput(log, steps),
        "tok_s_updates_alone": throughput(alone, steps),
        "moves": log["changes"],
        "unjustified": unjustified(log["changes"], schedule(slow)[1]),
        "wall_s": round(time.monotonic() - t0, 1),
        "figures": log["figures"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs=2, required=True, help="two checkouts to compare")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--scenarios", default="moving16", help=f"of {', '.join(RUNS)}")
    p.add_argument(
        "--slowdown",
        choices=SLOWDOWNS,
        default="auto",
        help="as autopilot.py's (sleep for a tree from before session 37: it has no busy one)",
    )
    a = p.parse_args(argv)
    scenarios = a.scenarios.split(",")
    if set(scenarios) - set(RUNS):
        p.error(f"--scenarios: unknown {sorted(set(scenarios) - set(RUNS))}")
    trees = [Path(t).resolve() for t in a.trees]
    tmp = Path(tempfile.mkdtemp(prefix="fleet-pilot-ab-"))
    data = tmp / "data"
    subprocess.run(
        [sys.executable, "-m", "fleet.cli", "prepare", "--stdlib", "--max-files", "300",
         "--seq-len", "128", "--out", str(data)],
        check=True, capture_output=True, cwd=trees[0],
    )  # fmt: skip
    for rep in range(a.repeats):
        for name in scenarios:
            for i, tree in enumerate(trees if rep % 2 == 0 else trees[::-1]):
                out = tmp / f"run-{name}-{rep}-{i}"
                print(json.dumps(one(tree, data, out, name, a.slowdown)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
