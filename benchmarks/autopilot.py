"""The autopilot against every fixed split and the oracle, on real local ranks (issue 19).

    python benchmarks/autopilot.py --repeats 3 --out /tmp/autopilot.json
    python benchmarks/autopilot.py --repeats 3 --cores 4-15 --out $OUT/autopilot.json  # 3 at once
    python benchmarks/autopilot.py --resume A.json --out B.json  # keeps A's whole repeats

--jobs runs that many runs at once (default: one per 4 of --cores), each run's ranks (4 or 2) pinned
to 4 cores of their own (taskset) with one BLAS thread a rank, so runs do not disturb each
other; the order of the runs still interleaves arms and repeats. Each rank is pinned to a core
of its own where the run's cores have one for each (`rank_cores`; two ranks on this 2-core
box, not four), as each rank of a fleet has a Mac; --no-pin pins nothing.

Four ranks on this machine, each slowed by --simulate-slowdown (a rank waits (f-1) x its
compute per microstep: spinning on its core where each rank has one, else asleep;
--slowdown), in four scenarios of 100 updates:

- `moving`   (issues 14 and 19): 2,1,1,1 then 1,1,3,1 from update 50, global batch 8 (as
  before) and 16;
- `transient`: rank 1 three times slower from update 30 to 60, then itself again (16);
- `gradual`:   rank 3 slower and slower: 1.5x from 25, 2x from 45, 3x from 65 (16);
- `equal`:     no slowdown, 500 updates (16): the changes the autopilot made (target 0);

and `pair-transient16`, `pair-gradual16`, `pair-equal`: the same on two ranks (the second is the
one slowed), one BLAS thread each. Where the ranks outnumber the cores (four on a 2-core box),
a rank that sleeps lends its core to its peers, and the split matters only through the
straggler; where each rank has a core, as each Mac of a fleet does, it matters fully.

Each against: the even split fixed; the best fixed split in hindsight (of the splits that the
slowdown schedule, known afterwards, makes fastest over the run or over a phase, for each fixed
part in --plan-fixed, each run fixed: the one that measured fastest); and the oracle (for each
phase, the fastest of those runs over that phase's updates, as if switched to at the right
update; the summary's `oracle_over_best_fixed` is the most a pilot could gain over the best
fixed split, the room there is). Throughput counts updates 5 on (the first compile is
nobody's), by the wall time from the end of one update to the end of the next (`step_s`): the
update, and the boundary before it, where the control exchanges run (two where the pilot
announced a decision), a move is applied and the pilot reads its figures. Files from before
session 32 kept only each update's own time (`update_s`, without the boundary) and are judged
by it. Reaction: updates run on the old split after a change of the schedule, or "kept" where
the split in place was already within 2% of the phase's best (by the schedule on this box's
model, `kept`, as the simulator judges). Moves between equal ranks: samples moved from a rank
to one whose (simulated) cost did not make it faster, under any fixed part of a rank's compute
(`unjustified`; the simulator knows its fixed part and counts by it); and judged by what the
ranks measured instead (`unmeasured`: the box can make a rank faster or slower than its
schedule says, as the H200 host's cores do).
--width sets the model's width (default 128). On this 2-core box an update of 16 samples then
takes about 0.13 s, and the box's blips (one update mostly, at most six: 0.8 s, session 40)
span updates as a blip of a Mac never spans a fleet's updates of seconds: the pilot meets them
as slowdowns of several updates. At --width 384 an update takes about 0.5 s.
Runs are interleaved across repeats, so a busy spell of the machine hits every arm alike. It
still moves one arm against the others: the summary says how fast each repeat's arms ran
before any slowdown or move (`ms_a_sample_before`, `pace`) and how far equal ranks drifted
apart (`rank_ratio_5_95`, `rank_band`); judge a repeat whose arms ran alike.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from telemetry.arrowlog import log_ranks, read_events, read_updates  # noqa: E402
from tests.support import pilot_sim  # noqa: E402
from tests.support.fleet import fleet_env, launch_args, run_fleet  # noqa: E402
from trainer.autopilot import Autopilot  # noqa: E402
from trainer.config import ConfigError, TrainConfig  # noqa: E402

MODEL = ["--depth", "2", "--width", "128", "--heads", "2"]
FROM = 5  # updates before this one are the first compile and warm-up
# Until session 16 the trainer applied `--simulate-slowdown ...@N` from update N + 1 as the
# log numbers them: a results file without "slowdown_lag" was run so, and is judged so.
LAG_BEFORE = 1
SIM_COST = 0.05  # the simulator's cost per sample (s): only ratios matter


def schedule(text: str):
    """--simulate-slowdown's text as (from update, factors) phases, and as a function."""
    phases = []
    for part in text.split(";"):
        factors, _, at = part.partition("@")
        phases.append((int(at or 0), [float(f) for f in factors.split(",")]))

    def factors_at(t: int) -> list[float]:
        return next(f for at, f in reversed(phases) if t >= at)

    return phases, factors_at


def world_of(phases) -> int:
    """The ranks a schedule's phases (`schedule(text)[0]`) name: its first phase's factors."""
    return len(phases[0][1])


SCENARIOS = {
    "moving8": ("2,1,1,1@0;1,1,3,1@50", 8, 100),
    "moving16": ("2,1,1,1@0;1,1,3,1@50", 16, 100),
    "transient16": ("1,1,1,1@0;1,3,1,1@30;1,1,1,1@60", 16, 100),
    "gradual16": ("1,1,1,1@0;1,1,1,1.5@25;1,1,1,2@45;1,1,1,3@65", 16, 100),
    # The same two on two ranks, a core each: on this 2-core box four ranks share the cores,
    # so a rank's sleep lends its core to its peers and the split matters only through the
    # straggler (3-6% of room above the best fixed split); a pair is two machines, as the
    # fleet's own two-Mac runs are.
    "pair-transient16": ("1,1@0;1,3@30;1,1@60", 16, 100),
    "pair-gradual16": ("1,1@0;1,1.5@25;1,2@45;1,3@65", 16, 100),
}
# Equal ranks, none slowed (--equal-updates, global batch 16): the changes the pilot makes.
EQUAL = {"equal": 4, "pair-equal": 2}
SLOWDOWNS = ("auto", "busy", "sleep")  # --slowdown's choices: see `spins`
RANK_CORES = Path(__file__).resolve().parent / "rank_cores"  # its sitecustomize pins a rank
# MLX's memory limit for every run (--memory-limit-gb; "0": none). Under the trainer's default
# (auto: the live set + 5%) MLX's eval waits on its CPU tasks whenever active memory passes the
# limit, and what a rank costs came to depend on how it reached its batch: on this box a rank
# of 11,5 started at 5 (a fixed arm) read 12.4-14.7 ms a sample, one moved there from 8 (as the
# pilot moves) 11.3-11.9; two ranks at 8,8 read 12.3-13.4 under auto, 10.2-10.7 without a limit
# or under 8 GiB (session 41, benchmarks/RESULTS.md). The benchmark compares splits, not limits.
MEMORY_LIMIT = "0"


def cores_of(text: str) -> list[int]:
    """ "4-15" or "0,2,4-7" as core numbers; "" as every core this process may use."""
    if not text:
        return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def model_at(width: int) -> list[str]:
    """MODEL at another width; ValueError where the model's heads do not divide it."""
    heads = int(MODEL[MODEL.index("--heads") + 1])
    if width < heads or width % heads:
        raise ValueError(f"a positive multiple of the model's {heads} heads")
    model = [*MODEL]
    model[model.index("--width") + 1] = str(width)
    return model


def run(
    data: Path,
    out: Path,
    split: list[int],
    updates: int,
    slow: str,
    *extra: str,
    cores: list[int] | None = None,
    busy: bool = False,
    model: list[str] = MODEL,
    pinned: list[int] | None = None,
    memory_limit: str = MEMORY_LIMIT,
) -> dict:
    """One run of local ranks, one a batch of `split`, of `model` (`fleet train`'s flags);
    on `cores` if given, rank r on core `pinned[r]` where given (`rank_env`); a slowed rank
    spins out its slowdown where `busy` (`slowdown_args`); under `memory_limit`
    (--memory-limit-gb, `MEMORY_LIMIT`)."""
    t0 = time.monotonic()
    train = ("--local-batches", ",".join(map(str, split)), "--updates", str(updates), *model)
    train += ("--device", "cpu", "--telemetry-port-base", "0", "--log-every", "1000")
    train += ("--memory-limit-gb", memory_limit)
    world = len(split)
    train += slowdown_args(slow, busy)
    args = launch_args(world, data, out, *train, *extra, launch_opts=("--backend", "ring"))
    # the launcher and mlx.launch mostly wait; the ranks spread over the cores
    pin = ["taskset", "-c", ",".join(map(str, cores))] if cores else []
    proc = subprocess.run(
        [*pin, sys.executable, "-m", "fleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=3600,
        env=rank_env(world, cores, pinned=pinned),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"run {out.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return {"split": split, **logged(out), "wall_s": round(time.monotonic() - t0, 1)}


def rank_env(
    world: int, cores: list[int] | None = None, env=None, pinned: list[int] | None = None
) -> dict[str, str]:
    """The environment of a run of `world` ranks (`env`, default fleet_env()), with one BLAS
    thread a rank where they are pinned to `cores` or each has a core of this machine: a
    rank's BLAS threads would fight its neighbours for cores, or take the core of a peer that
    sleeps its slowdown (four ranks on this 2-core box keep the default, as every run before
    session 35 did). Rank r is pinned to core `pinned[r]` where given (`rank_cores`), by
    benchmarks/rank_cores/sitecustomize.py."""
    env = dict(fleet_env() if env is None else env)
    if own_cores(world, cores):
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env[name] = "1"
    if pinned:
        env["FLEET_BENCH_RANK_CORES"] = ";".join(map(str, pinned))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(RANK_CORES), env.get("PYTHONPATH")]))
    return env


def rank_cores(world: int, cores: list[int] | None = None) -> list[int] | None:
    """The core each of `world` ranks is pinned to: the r-th of the run's `cores` (else this
    machine's), where there is one for each; else None. A fleet's ranks each have a Mac; here a
    rank that waits in the ring all-reduce spins two socket threads (MLX polls its sockets) on
    whichever core the scheduler gives them. Pinned, a pair's fixed arms scattered about two
    thirds as much from one update to the next (session 41, benchmarks/RESULTS.md)."""
    pool = cores or cores_of("")
    return pool[:world] if hasattr(os, "sched_setaffinity") and world <= len(pool) else None


def own_cores(world: int, cores: list[int] | None = None) -> bool:
    """Whether each of `world` ranks has a core: pinned to a run's own `cores` (4 a run), or
    no more of them than this machine has."""
    return bool(cores) or world <= len(cores_of(""))


def spins(mode: str, world: int, cores: list[int] | None = None) -> bool:
    """Whether a slowed rank spins out its slowdown under --slowdown `mode` (auto: where each
    of `world` ranks has a core, `own_cores`)."""
    return mode == "busy" or (mode == "auto" and own_cores(world, cores))


def slowdown_args(slow: str, busy: bool) -> tuple[str, ...]:
    """`fleet train`'s flags for the slowdown schedule `slow` ("" none). `busy`: a slowed
    rank spins out its slowdown, as a slower machine keeps its own core busy; where ranks
    share cores (four on this 2-core box) it sleeps, lending its core to its peers, as every
    run before session 37 did. With two ranks a core each, the scatter of their time ratio
    (log) was 0.02-0.05 at 1x and up to 0.16-0.24 while one slept a 3x slowdown (session 37,
    benchmarks/RESULTS.md)."""
    if not slow:
        return ()
    return ("--simulate-slowdown", slow, *(("--simulate-slowdown-busy",) if busy else ()))


def logged(out: Path) -> dict:
    """What a run's logs say for its results: rank 0's clocks and tokens (`timings`), every
    rank's batch and compute of each update (what the pilot saw, so that a run can be
    replayed: benchmarks/pilot_replay.py FILE --run NAME/ARM/REPEAT), and the moves."""
    ranks = {r: {x["step"]: x for x in read_updates(out, r).to_pylist()} for r in log_ranks(out)}
    steps = sorted(set.intersection(*(set(v) for v in ranks.values()))) if ranks else []
    moves = [e for e in read_events(out, 0) if e.kind == "rebalanced"]
    return {
        **timings(list(ranks[0].values())),  # rank 0's clock
        "figures": {
            t: [[ranks[r][t]["local_batch"], round(ranks[r][t]["compute_s"], 6)] for r in ranks]
            for t in steps
        },
        "changes": [(e.step, e.data.get("from"), e.data.get("to")) for e in moves],
    }


def timings(rows: list[dict]) -> dict:
    """From rank 0's logged updates: each one's own seconds (`update_s`), its wall seconds
    from the end of the update before (`step_s`: the boundary before it included), and its
    tokens, by update number."""
    ends = {r["step"]: r["time"] for r in rows}  # rank 0's clock as each update ended
    return {
        "update_s": {r["step"]: r["update_s"] for r in rows},
        "step_s": {s: round(end - ends[s - 1], 6) for s, end in ends.items() if s - 1 in ends},
        "tokens": {r["step"]: r["update_tokens"] for r in rows},
    }


def clock(result: dict) -> dict:
    """Each update's seconds as throughput counts them: from the end of the update before
    (`step_s`), or the update's own time where a file from before session 32 has only that."""
    return result.get("step_s") or result["update_s"]


def throughput(result: dict, steps) -> float:
    seconds = clock(result)
    steps = [s for s in steps if s in seconds]
    return sum(result["tokens"][s] for s in steps) / sum(seconds[s] for s in steps)


def unjustified(changes, factors_at, lag: int = 0) -> int:
    """Samples moved to a rank that the schedule did not make faster than the giver, whatever
    a rank's fixed compute (f samples: a rank costs factor x (f + batch), f >= 0 unknown):
    the giver was no slower per sample, and no slower at f = 0 either. A move is judged by
    the conditions of the update it is logged at (its last on the old split)."""
    n = 0
    for step, old, new in changes:
        f = factors_at(step - lag)
        for d in range(len(old)):
            for t in range(len(old)):
                moved = new[d] < old[d] and new[t] > old[t]
                if moved and f[d] <= f[t] and f[d] * old[d] <= f[t] * new[t]:
                    n += 1
    return n


def kept(changes, start: list[int], factors_at, phase: range, lag: int = 0) -> bool:
    """Whether the split in place at a phase's first (logged) update was already within 2% of
    the phase's best, so that there was nothing to answer: `pilot_sim.as_fast`, as the
    simulator's `reaction` judges, by the schedule on this box's model without noise
    (pilot_sim.BOX: its fixed part and its time after the slowest rank)."""
    split = start
    for step, _, new in changes:
        if step < phase.start:  # logged at its last update on the old split
            split = new

    def costs(t: int) -> list[float]:
        return factors_at(t - lag)

    return pilot_sim.as_fast(costs, split, phase, pilot_sim.BOX)


def unmeasured(changes, figures: dict, fixed_parts, window: int = 9) -> int:
    """Like `unjustified`, judged by what the ranks measured instead of the schedule (the box
    can make a rank faster than its slowdown says): moves from a giver whose last figures
    under the old split before the decision show it neither costlier per sample than the
    taker nor slower than the taker would be at its new batch, at every fixed part in
    `fixed_parts`. "Show" is a one-sided paired t-test at 1% on the log ratio over the last m
    updates, for some m from 3 to `window`: the figures since a change of conditions are what
    call for a move (the pilot may act on 3 of them when they lie far beyond the noise), not
    those from before it. Moves after fewer than 3 figures are not judged. On equal ranks with
    20% noise per update, the tests together call for a move 4% of the time (12 of 300); for
    a rank 1.3x costlier, 58%; 1.5x, 93%; 2x, always (tests/bench/test_autopilot_judge.py)."""
    assert window <= len(_T99) + 1
    figs = {int(t): row for t, row in figures.items()}
    n = 0
    for step, old, new in changes:
        # the pilot decided on the figures of update `step` and those before it, of the split
        # then in place (a move it announced is logged at the boundary where it was decided;
        # others, and every move in runs before session 15, a boundary later: their last
        # figure came after the decision, of the same split)
        seen = [t for t in sorted(figs) if t <= step and [b for b, _ in figs[t]] == old]
        rows = [figs[t] for t in seen[-window:]]
        if len(rows) < LEAST_FIGURES:
            continue
        for d in range(len(old)):
            for t in range(len(old)):
                if new[d] < old[d] and new[t] > old[t]:
                    n += not any(
                        _shows(rows[-m:], d, t, old, new, f)
                        for m in range(LEAST_FIGURES, len(rows) + 1)
                        for f in fixed_parts
                    )
    return n


def _judged(run: dict, fixed_parts) -> int | None:
    """`unmeasured` of a pilot's run; None for a run from before the figures were kept."""
    return unmeasured(run["changes"], run["figures"], fixed_parts) if "figures" in run else None


# One-sided 1% points of Student's t for 1..8 degrees of freedom (several windows and fixed
# parts are tried: at 5% each, equal ranks would be called for 13% of the time).
_T99 = (31.82, 6.965, 4.541, 3.747, 3.365, 3.143, 2.998, 2.896)
LEAST_FIGURES = 3  # the fewest a move is judged by: the pilot's fast path acts on 3


def _shows(rows, d: int, t: int, old, new, f: float) -> bool:
    """The test of `unmeasured` over `rows`: giver d costlier per sample than taker t, or
    slower than t would be at its new batch (fixed part: f samples)."""
    per_sample = [math.log(r[d][1] / (old[d] + f)) - math.log(r[t][1] / (old[t] + f)) for r in rows]
    at_new = [x + math.log((old[d] + f) / (new[t] + f)) for x in per_sample]
    return any(_t_stat(x) > _T99[len(x) - 2] for x in (per_sample, at_new))


def _t_stat(x: list[float]) -> float:
    mean, sd = statistics.mean(x), statistics.stdev(x)
    if sd == 0:
        return math.copysign(math.inf, mean) if mean else 0.0
    return mean / (sd / math.sqrt(len(x)))


def simulated_scenarios():
    """Each scenario as the simulator runs it: (name, global batch, updates, phases, each
    update's cost per sample of every rank; the ranks: world_of(phases))."""
    for name, (slow, total, updates) in SCENARIOS.items():
        phases, factors_at = schedule(slow)

        def costs(t: int, factors_at=factors_at) -> list[float]:
            return [SIM_COST * f for f in factors_at(t)]

        yield name, total, updates, phases, costs


def simulated(
    seeds: int, noise: pilot_sim.Noise, equal_updates: int, fixed_samples: float | None = None
) -> dict:
    """The same scenarios in tests/support/pilot_sim.py (no ranks): the pilot (told
    `fixed_samples` of fixed compute a rank, or reading it: None) against the best fixed
    split and the oracle under the same noise, each over updates FROM on."""
    out: dict = {}
    for name, total, updates, phases, costs in simulated_scenarios():
        whole, rows, world = range(FROM, updates), [], world_of(phases)
        bounds = [p for p, _ in phases] + [updates]
        for seed in range(seeds):
            pilot = Autopilot(world, enabled=True, fixed_samples=fixed_samples)
            flown = pilot_sim.fly(costs, [total // world] * world, updates, pilot, noise, seed)
            mine = sum(flown.times[FROM:])
            mult = pilot_sim.draws(world, updates, noise, seed)
            best = pilot_sim.best_split(costs, world, total, whole, noise)
            fixed = pilot_sim.measured(costs, best, whole, mult, noise)
            oracle = sum(
                pilot_sim.measured(
                    costs,
                    pilot_sim.best_split(costs, world, total, range(a, b), noise),
                    range(max(a, FROM), b),
                    mult,
                    noise,
                )
                for a, b in zip(bounds, bounds[1:], strict=False)
            )
            rows.append(
                {
                    "vs_best_fixed": fixed / mine,
                    "vs_oracle": oracle / mine,
                    "reactions": [
                        pilot_sim.reaction(flown, at, costs, end, noise)
                        for at, end in zip(bounds[1:], bounds[2:], strict=False)
                    ],
                    "changes": len(flown.changes),
                    "moves_between_equal_ranks": len(flown.unjustified),
                }
            )
        out[name] = {
            key: _spread([r[key] for r in rows]) for key in ("vs_best_fixed", "vs_oracle")
        } | {key: [r[key] for r in rows] for key in ("reactions", "moves_between_equal_ranks")}
    equal = [
        len(
            pilot_sim.fly(
                lambda t: [SIM_COST] * 4,
                [4] * 4,
                equal_updates,
                Autopilot(4, enabled=True, fixed_samples=fixed_samples),
                noise,
                seed,
            ).changes
        )
        for seed in range(seeds)
    ]
    out["equal"] = {"updates": equal_updates, "changes": equal}
    return out


def ceilings(plan_fixed, lags=(1, 3, 5)) -> dict:
    """What the best fixed split leaves to a pilot, without noise: for each scenario and
    fixed part, the time of the best fixed split over that of the best pilot that answers
    each change `lag` updates after it (pilot_sim.ceiling), and of the oracle (lag 0)."""
    out: dict = {}
    for name, total, updates, phases, costs in simulated_scenarios():
        steps, starts, world = range(FROM, updates), [p for p, _ in phases], world_of(phases)
        for fixed in plan_fixed:
            # BOX's recompile and time after the slowest rank, with no fixed part or this one
            noise = replace(pilot_sim.BOX, fixed_samples=fixed, shared=0.0, own=0.0, spikes=0.0)
            best = pilot_sim.best_split(costs, world, total, steps, noise)
            fixed_s = pilot_sim.expected(costs, best, steps, noise)
            out.setdefault(name, {})[f"fixed {fixed:g}"] = {
                "best_fixed": ",".join(map(str, best))
            } | {
                f"lag {lag}": fixed_s
                / pilot_sim.ceiling(costs, world, total, starts, steps, noise, lag)
                for lag in (0, *lags)
            }
    return out


def pace(run: dict, until: int) -> float | None:
    """The median ms a sample of a run's ranks over updates FROM to `until` (before any
    slowdown), and before its first move: how fast the machine ran it. The 2-core box read
    10.0-11.8 on quiet days and 12-18 on noisy ones (sessions 35-37), when a noisy spell in
    one arm moves its ratio to the others by 10-25%. None without figures (files from before
    session 12)."""
    if "figures" not in run:
        return None
    end = min([until, *(step for step, _, _ in run.get("changes", []))])
    figures = {int(t): row for t, row in run["figures"].items()}
    ms = [1e3 * c / b for t in range(FROM, end) for b, c in figures.get(t, [])]
    return statistics.median(ms) if ms else None


def rank_band(run: dict) -> list[float] | None:
    """The 5% and 95% quantiles of each rank's compute over rank 0's, at updates where all
    ranks ran equal batches: how far equal ranks drifted apart (an equal pair read 0.89-1.10
    on quiet days, 0.7-1.4 on noisy ones). None without figures."""
    ratios = [
        c / row[0][1]
        for row in run.get("figures", {}).values()
        if len({b for b, _ in row}) == 1
        for _, c in row[1:]
    ]
    if len(ratios) < 20:
        return None
    q = statistics.quantiles(ratios, n=20)
    return [q[0], q[-1]]


def _spread(values: list[float]) -> dict:
    """The median, the least and the most of `values`, and each (in repeat order)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "each": values,
    }


def plan(only, plan_fixed, lag: int = 0) -> dict:
    """Each scenario's (schedule, updates, factors_at, phases, parts, arms to run); `lag`:
    updates from a phase's `@N` to the first logged update it slowed (see LAG_BEFORE)."""
    plans = {}
    for name, (slow, total, updates) in SCENARIOS.items():
        if name not in only:
            continue
        phases, factors_at = schedule(slow)
        bounds = [p for p, _ in phases] + [updates]
        logged = [p + lag for p, _ in phases] + [updates]  # the updates each phase slowed
        parts = [range(max(a, FROM), b) for a, b in zip(logged, logged[1:], strict=False)]
        # The candidates for hindsight: for each fixed part planned with, the split best over
        # the whole run and each phase's best (noise-free). Each is run fixed; the best fixed
        # split is the one that measured fastest, each phase's oracle the fastest over it.
        world = world_of(phases)
        arms = {"pilot": [total // world] * world, "even": [total // world] * world}
        for fixed in plan_fixed:
            noise = pilot_sim.Noise(shared=0, own=0, spikes=0, recompile=0, fixed_samples=fixed)
            phase_spans = (range(a, b) for a, b in zip(bounds, bounds[1:], strict=False))
            spans = [range(FROM, updates), *phase_spans]
            for span in spans:
                split = list(pilot_sim.best_split(factors_at, world, total, span, noise))
                if split not in list(arms.values())[1:]:
                    arms[",".join(map(str, split))] = split
        plans[name] = (slow, updates, factors_at, phases, parts, arms)
    return plans


def loaded(path: Path) -> dict:
    """A results file's record, its runs' figures keyed by update again."""
    record = json.loads(path.read_text())
    for arms in record["runs"].values():
        for r in (r for reps in arms.values() for r in reps if r is not None):
            for key in ("tokens", "update_s", "step_s"):  # JSON made the update numbers strings
                if key in r:
                    r[key] = {int(s): v for s, v in r[key].items()}
    return record


def resumed(
    results: dict,
    earlier: dict,
    model: list[str] = MODEL,
    limit: str = MEMORY_LIMIT,
    pin_ranks: bool = True,
) -> int:
    """Fill `results` (scenario -> arm -> one run or None a repeat) with the whole repeats of
    an earlier results file's runs, first repeats first: a repeat cut short (by --deadline, or
    a call that ran out of time) is run again whole, so each repeat's arms ran on one machine
    at one time. Returns the runs kept; raises ValueError where the earlier file ran other arms
    or ran them otherwise (`unlike`)."""
    kept = 0
    for name, arms in results.items():
        old = earlier.get(name)
        if not old or not arms["pilot"]:  # not run before, or not chosen now
            continue
        if set(old) != set(arms):
            raise ValueError(
                f"{name}: the earlier file ran arms {sorted(old)}, this plan {sorted(arms)} "
                "(another --plan-fixed?)"
            )
        whole = [
            i for i in range(len(old["pilot"])) if all(i < len(old[a]) and old[a][i] for a in arms)
        ]
        for rep, i in enumerate(whole[: len(arms["pilot"])]):
            for arm in arms:
                if why := unlike(old[arm][i], model, limit, pin_ranks):
                    raise ValueError(f"{name}: the earlier file {why}")
                arms[arm][rep] = old[arm][i]
                kept += 1
    return kept


def unlike(run: dict, model: list[str], limit: str, pin_ranks: bool) -> str:
    """How a kept run ran otherwise than this benchmark would run it now ("" where alike): its
    model, its memory limit, its ranks pinned or not. A run that names none of them ran before
    they were recorded: MODEL, the trainer's auto limit, ranks unpinned (before session 41)."""
    ran = run.get("model", MODEL)
    if ran != model:
        return f"ran {' '.join(ran)} (another --width?)"
    if str(run.get("memory_limit_gb", "auto")) != limit:
        return f"ran --memory-limit-gb {run.get('memory_limit_gb', 'auto')} (another limit?)"
    pinned = bool(run.get("rank_cores"))
    if "split" in run and pinned != (pin_ranks and rank_cores(len(run["split"])) is not None):
        return f"ran its ranks {'pinned' if pinned else 'unpinned'} (--no-pin?)"
    return ""


def resummarized(path: Path, plan_fixed) -> dict:
    """A results file's summary made again by this judge (the file is left as it is)."""
    record = loaded(path)
    runs = record["runs"]
    told = record.get("summary", {})
    equal = next((told[e]["updates"] for e in EQUAL if e in told), 500)
    lag = record.get("slowdown_lag", LAG_BEFORE)
    return summarize(plan(set(runs), plan_fixed, lag), runs, equal, plan_fixed, lag)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--equal-updates", type=int, default=500)
    ap.add_argument("--only", default=",".join([*SCENARIOS, *EQUAL]))
    ap.add_argument(
        "--plan-fixed",
        type=lambda text: [float(f) for f in text.split(",")],
        default=[0.0, 6.0],
        help="fixed parts of a rank's compute (samples) to plan the hindsight splits with; "
        "each plan's splits are run fixed (default 0,6: none, and a large one, as session 7 "
        "read this box; it reads about 1 now, between the two)",
    )
    ap.add_argument("--out", default="", help="the results JSON (its folder is made)")
    ap.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="JSON",
        help="keep the whole repeats of this earlier results file (same scenarios and "
        "--plan-fixed) and run only the rest, up to --repeats (it may be --out itself)",
    )
    ap.add_argument(
        "--keep-runs",
        action="store_true",
        help="keep each run's folder (checkpoints, telemetry log) in a temporary folder, named "
        "at the end (default: removed; --out keeps the figures)",
    )
    ap.add_argument(
        "--width",
        type=int,
        default=128,
        help="the model's width (default 128: an update of 16 samples about 0.13 s on this "
        "2-core box; a fleet's take seconds, over which a blip of the machine averages out)",
    )
    ap.add_argument(
        "--memory-limit-gb",
        default=MEMORY_LIMIT,
        help="every run's --memory-limit-gb (default 0: none; the trainer's auto makes MLX's "
        "eval wait near it, and a rank's cost then depends on how it reached its batch)",
    )
    ap.add_argument("--cores", default="", help='cores the runs may use ("4-15"; "": all)')
    ap.add_argument("--jobs", type=int, default=0, help="runs at once (0: one per 4 cores)")
    ap.add_argument(
        "--no-pin",
        action="store_true",
        help="leave the runs and their ranks unpinned (default: a run on 4 cores of its own "
        "where --cores has 4 a run, and each rank on a core of its own where there is one)",
    )
    ap.add_argument(
        "--deadline", type=float, default=0, help="start no run after this many seconds (0: none)"
    )
    ap.add_argument(
        "--slowdown",
        choices=SLOWDOWNS,
        default="auto",
        help="how a slowed rank waits out its slowdown: spinning on its core (busy) or asleep; "
        "auto (the default): busy where each rank has a core, asleep where they share",
    )
    ap.add_argument(
        "--sim", type=int, default=0, help="no ranks: this many seeds in the simulator (0: off)"
    )
    ap.add_argument(
        "--fixed-samples",
        type=float,
        default=None,
        help="--sim: the pilot is told a rank's fixed compute, in samples (Autopilot's "
        "fixed_samples; pilot_sim.BOX has 1.1; default: it reads it from its moves)",
    )
    ap.add_argument(
        "--summarize",
        type=Path,
        default=None,
        metavar="JSON",
        help="run nothing: print the summary of this results file as this judge makes it",
    )
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="run nothing: print, for each scenario and --plan-fixed, the best fixed split's "
        "time over that of an ideal pilot answering each change 1, 3 or 5 updates after it "
        "(no noise; lag 0 is the oracle): above 1 where a pilot can beat every fixed split",
    )
    args = ap.parse_args()
    if args.ceiling:
        print(json.dumps(ceilings(args.plan_fixed), indent=1))
        return 0
    if args.summarize:
        try:
            summary = resummarized(args.summarize, args.plan_fixed)
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--summarize {args.summarize}: not a results file of this benchmark ({e})")
        print(json.dumps(summary, indent=2))
        return 0
    if args.sim:
        figures = {
            label: simulated(args.sim, noise, args.equal_updates, args.fixed_samples)
            for label, noise in (
                ("quiet", pilot_sim.QUIET),
                ("noisy", pilot_sim.Noise()),
                ("box", pilot_sim.BOX),  # measured on this box (pilot_sim.py says how)
                ("spells", pilot_sim.SPELLS),  # the same, with its fast spells
                ("curved", pilot_sim.CURVED),  # the same, its compute batch by batch
                ("six", pilot_sim.SIX),  # the same, with a fixed part of 6 samples
            )
        }
        print(json.dumps(figures, indent=1))
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            record = {"simulated": figures, "command": " ".join(["python", *sys.argv])}
            Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
        return 0
    only = args.only.split(",")
    unknown = set(only) - {*SCENARIOS, *EQUAL}
    if unknown:
        ap.error(f"--only: unknown scenario(s) {sorted(unknown)}")
    cores = cores_of(args.cores)
    try:
        model = model_at(args.width)
    except ValueError as e:
        ap.error(f"--width {args.width}: {e}")
    limit = args.memory_limit_gb
    try:
        TrainConfig(memory_limit_gb=limit).memory_limit(1, 0)
    except ConfigError as e:
        ap.error(str(e))
    jobs = args.jobs or max(1, len(cores) // 4)
    pinned = not args.no_pin and shutil.which("taskset") is not None and len(cores) >= 4 * jobs
    slots: queue.Queue[list[int] | None] = queue.Queue()
    for j in range(jobs):  # a run takes a slot of 4 cores, and gives it back when done
        slots.put(cores[4 * j : 4 * j + 4] if pinned else None)
    started = time.monotonic()
    plans = plan(only, args.plan_fixed)
    results: dict = {
        name: {arm: [None] * args.repeats for arm in plan[5]} for name, plan in plans.items()
    }
    for name in EQUAL:
        results[name] = {"pilot": [None] * args.repeats if name in only else []}
    if args.resume:
        try:
            kept = resumed(results, loaded(args.resume)["runs"], model, limit, not args.no_pin)
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--resume {args.resume}: {e}")
        print(f"--resume: {kept} runs kept from {args.resume}", flush=True)
    # The order interleaves arms and repeats, so a busy spell of the machine hits every arm
    # alike; each repeat's long equal-ranks run goes first, so it does not end the benchmark.
    tasks = []
    for rep in range(args.repeats):
        for name, world in EQUAL.items():
            if name in only:
                split, pilot = [16 // world] * world, ("--autopilot",)
                tasks.append((name, "pilot", rep, split, args.equal_updates, "", pilot))
        for name, (slow, updates, _, _, _, arms) in plans.items():
            for arm, split in arms.items():
                extra = ("--autopilot",) if arm == "pilot" else ()
                tasks.append((name, arm, rep, split, updates, slow, extra))
    tasks = [t for t in tasks if results[t[0]][t[1]][t[2]] is None]  # not those a --resume kept

    def record() -> dict:
        return {
            "summary": summarize(plans, results, args.equal_updates, args.plan_fixed),
            "command": " ".join(["python", *sys.argv]),
            "slowdown_lag": 0,  # `@N` slows the update the log numbers N (LAG_BEFORE)
            "machine": {
                "host": platform.node(),
                "system": f"{platform.system()} {platform.release()} {platform.machine()}",
                "cpus": os.cpu_count(),
                "cores": cores,
                "jobs": jobs,
                "pinned": pinned,
            },
            "wall_s": round(time.monotonic() - started, 1),
            "resumed_from": str(args.resume or ""),
            "runs": results,
        }

    def write() -> None:  # after every run: a call cut off still leaves what it measured
        if args.out:
            with lock:
                # compact: every rank's figures are kept (3.4 MB a run of 75, indented)
                text = json.dumps(record(), separators=(",", ":"), default=str) + "\n"
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(text)

    lock = threading.Lock()
    skipped = []

    def one(task) -> None:
        name, arm, rep, split, updates, slow, extra = task
        mine = slots.get()
        if args.deadline and time.monotonic() - started > args.deadline:
            slots.put(mine)
            skipped.append(task[:3])
            return
        try:
            out = tmp / f"{name}-{arm}-{rep}"
            busy = spins(args.slowdown, len(split), mine)
            pinned = None if args.no_pin else rank_cores(len(split), mine)
            how = {"cores": mine, "busy": busy, "model": model, "pinned": pinned}
            r = run(data, out, split, updates, slow, *extra, **how, memory_limit=limit)
        finally:
            slots.put(mine)
        r["cores"], r["slowdown"], r["host"] = mine, "busy" if busy else "sleep", platform.node()
        r["rank_cores"], r["model"], r["memory_limit_gb"] = pinned, model, limit
        results[name][arm][rep] = r
        rate = "" if name in EQUAL else f"{throughput(r, range(FROM, updates)):.0f} tok/s"
        moves = r["changes"] if arm == "pilot" else ""
        print(name, arm, rep, split, rate, moves, f"{r['wall_s']} s on {mine}", flush=True)
        write()

    tmp = Path(tempfile.mkdtemp(prefix="fleet-autopilot-"))
    data = tmp / "data"
    try:
        if tasks:
            run_fleet(
                "prepare", "--stdlib", "--max-files", "300", "--seq-len", "128", "--out", str(data)
            )
        with ThreadPoolExecutor(jobs) as pool:
            for f in [pool.submit(one, t) for t in tasks]:
                f.result()
    finally:  # each run's folder (7-30 MB a benchmark): what --out keeps is all it is read for
        if args.keep_runs:
            print(f"--keep-runs: the runs' folders are in {tmp}", flush=True)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    summary = summarize(plans, results, args.equal_updates, args.plan_fixed)
    print(json.dumps(summary, indent=2))
    wall = time.monotonic() - started
    print(f"{len(tasks)} runs, {jobs} at a time{' pinned' if pinned else ''}: {wall:.0f} s")
    if skipped:
        print(f"--deadline: {len(skipped)} runs not started: {skipped}")
    write()
    return 0


def summarize(plans, results, equal_updates, fixed_parts=(0.0, 6.0), lag: int = 0) -> dict:
    summary = {}
    for name, (slow, updates, factors_at, phases, parts, arms) in plans.items():
        whole = range(FROM, updates)
        rows = []
        for rep in range(len(results[name]["pilot"])):
            if any(runs[rep] is None for runs in results[name].values()):
                continue  # a repeat cut short by --deadline
            pilot = results[name]["pilot"][rep]
            mine = throughput(pilot, whole)

            def measured(arm: str, steps, name=name, rep=rep) -> tuple[float, float]:
                r = results[name][arm][rep]
                seconds = clock(r)
                steps = [s for s in steps if s in seconds]
                return sum(r["tokens"][s] for s in steps), sum(seconds[s] for s in steps)

            fixed_arms = [a for a in arms if a != "pilot"]
            best = max(fixed_arms, key=lambda a: throughput(results[name][a][rep], whole))
            tokens = seconds = 0.0
            for steps in parts:  # each phase's fastest fixed split, as if switched to in time
                phase = [measured(a, steps) for a in fixed_arms]
                t, s = max(phase, key=lambda ts: ts[0] / ts[1])
                tokens, seconds = tokens + t, seconds + s
            reactions = []  # updates on the old split: the first slowed, to the move's (logged)
            ends = [at + lag for at, _ in phases[2:]] + [updates]
            for (at, _), end in zip(phases[1:], ends, strict=True):
                first = at + lag
                if kept(pilot["changes"], arms["pilot"], factors_at, range(first, end), lag):
                    reactions.append("kept")
                    continue
                after = [step for step, _, _ in pilot["changes"] if step >= first]
                reactions.append(after[0] - first + 1 if after else None)
            oracle = tokens / seconds
            best_rate = throughput(results[name][best][rep], whole)
            slowed = phases[1][0] + lag if len(phases) > 1 else updates  # the first slowed update
            paces = [pace(results[name][a][rep], slowed) for a in arms]
            rows.append(
                {
                    "pace": None if None in paces else [min(paces), max(paces)],
                    "best_fixed": best,
                    "vs_best_fixed": mine / best_rate,
                    "vs_oracle": mine / oracle,
                    "oracle_over_best_fixed": oracle / best_rate,
                    "vs_even": mine / throughput(results[name]["even"][rep], whole),
                    "reactions": reactions,
                    "changes": len(pilot["changes"]),
                    "moves_between_equal_ranks": unjustified(pilot["changes"], factors_at, lag),
                    "moves_the_figures_did_not_call_for": _judged(pilot, fixed_parts),
                }
            )

        if not rows:
            summary[name] = {"schedule": slow, "repeats": 0}
            continue

        def spread(key: str, rows=rows) -> dict:
            return _spread([r[key] for r in rows])

        every = [r for runs in results[name].values() for r in runs if r is not None]
        summary[name] = {
            "schedule": slow,
            "clock": "step_s" if all("step_s" in r for r in every) else "update_s",
            "arms": {a: s for a, s in arms.items() if a != "pilot"},
            "best_fixed": [r["best_fixed"] for r in rows],
            "vs_best_fixed": spread("vs_best_fixed"),
            "vs_oracle": spread("vs_oracle"),
            # the most a pilot could gain over the best fixed split here (switching costs
            # nothing and reacts at once): where it is within a repeat's noise, no pilot can
            # be shown to beat that split (the 2-core box's transient16 and gradual16: 3-6%)
            "oracle_over_best_fixed": spread("oracle_over_best_fixed"),
            "vs_even": spread("vs_even"),
            "reactions": [r["reactions"] for r in rows],
            "changes": [r["changes"] for r in rows],
            "moves_between_equal_ranks": [r["moves_between_equal_ranks"] for r in rows],
            "moves_the_figures_did_not_call_for": [
                r["moves_the_figures_did_not_call_for"] for r in rows
            ],
            # how fast the machine ran each repeat's arms before any slowdown or move (the
            # least and the most of their ms a sample, `pace`): judge a repeat by the others
            # only where they ran alike
            "ms_a_sample_before": [r["pace"] for r in rows],
        }
    for name in EQUAL:
        done = [r for r in results.get(name, {}).get("pilot", []) if r is not None]
        if done:
            summary[name] = {
                "updates": equal_updates,
                "changes": [len(r["changes"]) for r in done],
                "moves_the_figures_did_not_call_for": [_judged(r, fixed_parts) for r in done],
                "rank_ratio_5_95": [rank_band(r) for r in done],
                "ms_a_sample_before": [pace(r, equal_updates) for r in done],
            }
    return summary


if __name__ == "__main__":
    sys.exit(main())
