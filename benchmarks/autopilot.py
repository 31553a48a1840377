"""The autopilot against every fixed split and the oracle, on real local ranks (issue 19).

    python benchmarks/autopilot.py --repeats 3 --out /tmp/autopilot.json

Four ranks on this machine, each slowed by --simulate-slowdown (a rank sleeps (f-1) x its
compute per microstep), in four scenarios of 100 updates:

- `moving`   (issues 14 and 19): 2,1,1,1 then 1,1,3,1 from update 50, global batch 8 (as
  before) and 16;
- `transient`: rank 1 three times slower from update 30 to 60, then itself again (16);
- `gradual`:   rank 3 slower and slower: 1.5x from 25, 2x from 45, 3x from 65 (16);
- `equal`:     no slowdown, 500 updates (16): the changes the autopilot made (target 0).

Each against: the even split fixed; the best fixed split in hindsight (the split that the
slowdown schedule, known afterwards, makes fastest, measured in its own run); and the oracle
(the best split of each phase, switched at the right update: each phase's updates taken from
a run of that phase's split). Throughput counts updates 5 on (the first compile is nobody's).
Reaction: updates run on the old split after a change of the schedule. Moves between equal
ranks: samples moved from a rank to one whose (simulated) cost did not make it faster.
Runs are interleaved across repeats, so a busy spell of the machine hits every arm alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from telemetry.arrowlog import read_events, read_updates  # noqa: E402
from tests.support import pilot_sim  # noqa: E402
from tests.support.fleet import launch_args, run_fleet  # noqa: E402

MODEL = ["--depth", "2", "--width", "128", "--heads", "2"]
FROM = 5  # updates before this one are the first compile and warm-up


def schedule(text: str, world: int = 4):
    """--simulate-slowdown's text as (from update, factors) phases, and as a function."""
    phases = []
    for part in text.split(";"):
        factors, _, at = part.partition("@")
        phases.append((int(at or 0), [float(f) for f in factors.split(",")]))

    def factors_at(t: int) -> list[float]:
        return next(f for at, f in reversed(phases) if t >= at)

    return phases, factors_at


SCENARIOS = {
    "moving8": ("2,1,1,1@0;1,1,3,1@50", 8, 100),
    "moving16": ("2,1,1,1@0;1,1,3,1@50", 16, 100),
    "transient16": ("1,1,1,1@0;1,3,1,1@30;1,1,1,1@60", 16, 100),
    "gradual16": ("1,1,1,1@0;1,1,1,1.5@25;1,1,1,2@45;1,1,1,3@65", 16, 100),
}


def run(data: Path, out: Path, split: list[int], updates: int, slow: str, *extra: str) -> dict:
    t0 = time.monotonic()
    train = ("--local-batches", ",".join(map(str, split)), "--updates", str(updates), *MODEL)
    train += ("--device", "cpu", "--telemetry-port-base", "0", "--log-every", "1000")
    if slow:
        train += ("--simulate-slowdown", slow)
    run_fleet(
        *launch_args(4, data, out, *train, *extra, launch_opts=("--backend", "ring")),
        timeout=3600,
    )
    rows = read_updates(out, 0).to_pylist()
    moves = [e for e in read_events(out, 0) if e.kind == "rebalanced"]
    return {
        "split": split,
        "update_s": {r["step"]: r["update_s"] for r in rows},
        "tokens": {r["step"]: r["update_tokens"] for r in rows},
        "wall_s": round(time.monotonic() - t0, 1),
        "changes": [(e.step, e.data.get("from"), e.data.get("to")) for e in moves],
    }


def throughput(result: dict, steps) -> float:
    steps = [s for s in steps if s in result["update_s"]]
    return sum(result["tokens"][s] for s in steps) / sum(result["update_s"][s] for s in steps)


def unjustified(changes, factors_at) -> int:
    """Samples moved to a rank that the schedule did not make faster than the giver."""
    n = 0
    for step, old, new in changes:
        f = factors_at(step)
        for d in range(len(old)):
            for t in range(len(old)):
                if new[d] < old[d] and new[t] > old[t] and f[d] * old[d] <= f[t] * new[t]:
                    n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--equal-updates", type=int, default=500)
    ap.add_argument("--only", default=",".join([*SCENARIOS, "equal"]))
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    only = args.only.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="fleet-autopilot-"))
    data = tmp / "data"
    run_fleet("prepare", "--stdlib", "--max-files", "300", "--seq-len", "128", "--out", str(data))
    noise = pilot_sim.Noise(shared=0, own=0, spikes=0, recompile=0)
    plans = {}
    for name, (slow, total, updates) in SCENARIOS.items():
        if name not in only:
            continue
        phases, factors_at = schedule(slow)
        whole = range(FROM, updates)
        best = list(pilot_sim.best_split(factors_at, 4, total, whole, noise))
        bounds = [p for p, _ in phases] + [updates]
        arms = {"pilot": [total // 4] * 4, "even": [total // 4] * 4, "best": best}
        parts = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            steps = range(max(a, FROM), b)
            part = list(pilot_sim.best_split(factors_at, 4, total, range(a, b), noise))
            cost = pilot_sim.expected(factors_at, part, range(a, b), noise)
            for known in (arms["even"], best):  # a tie goes to a split that runs anyway
                if pilot_sim.expected(factors_at, known, range(a, b), noise) <= cost:
                    part = known
                    break
            parts.append((steps, part))
        for i, (_, split) in enumerate(parts):
            if split not in arms.values() or split == arms["pilot"]:
                arms[f"phase{i}"] = split
        plans[name] = (slow, updates, factors_at, phases, parts, arms)
    results: dict = {name: {arm: [] for arm in plan[5]} for name, plan in plans.items()}
    results["equal"] = {"pilot": []}
    for rep in range(args.repeats):
        for name, (slow, updates, _, _, _, arms) in plans.items():
            for arm, split in arms.items():
                extra = ("--autopilot",) if arm == "pilot" else ()
                out = tmp / f"{name}-{arm}-{rep}"
                results[name][arm].append(run(data, out, split, updates, slow, *extra))
                r = results[name][arm][-1]
                print(
                    name,
                    arm,
                    rep,
                    split,
                    f"{throughput(r, range(FROM, updates)):.0f} tok/s",
                    r["changes"] if arm == "pilot" else "",
                    flush=True,
                )
        if "equal" in only:
            out = tmp / f"equal-{rep}"
            r = run(data, out, [4] * 4, args.equal_updates, "", "--autopilot")
            results["equal"]["pilot"].append(r)
            print("equal", rep, r["changes"], flush=True)
    summary = summarize(plans, results, args.equal_updates)
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(
            json.dumps({"summary": summary, "runs": results}, indent=2, default=str) + "\n"
        )
    return 0


def summarize(plans, results, equal_updates) -> dict:
    summary = {}
    for name, (slow, updates, factors_at, phases, parts, arms) in plans.items():
        whole = range(FROM, updates)
        rows = []
        for rep in range(len(results[name]["pilot"])):
            pilot = results[name]["pilot"][rep]
            mine = throughput(pilot, whole)

            def measured(arm: str, steps, name=name, rep=rep) -> tuple[float, float]:
                r = results[name][arm][rep]
                steps = [s for s in steps if s in r["update_s"]]
                return sum(r["tokens"][s] for s in steps), sum(r["update_s"][s] for s in steps)

            tokens = seconds = 0.0
            for steps, split in parts:
                arm = next(a for a, s in arms.items() if s == split and a != "pilot")
                t, s = measured(arm, steps)
                tokens, seconds = tokens + t, seconds + s
            reactions = []
            for at, _ in phases[1:]:
                after = [step for step, _, _ in pilot["changes"] if step >= at]
                reactions.append(after[0] - at if after else None)
            rows.append(
                {
                    "vs_best_fixed": mine / throughput(results[name]["best"][rep], whole),
                    "vs_oracle": mine / (tokens / seconds),
                    "vs_even": mine / throughput(results[name]["even"][rep], whole),
                    "reactions": reactions,
                    "changes": len(pilot["changes"]),
                    "moves_between_equal_ranks": unjustified(pilot["changes"], factors_at),
                }
            )

        def spread(key: str, rows=rows) -> dict:
            values = [r[key] for r in rows]
            return {"median": statistics.median(values), "min": min(values), "max": max(values)}

        summary[name] = {
            "schedule": slow,
            "best_fixed": arms["best"],
            "oracle_splits": [s for _, s in parts],
            "vs_best_fixed": spread("vs_best_fixed"),
            "vs_oracle": spread("vs_oracle"),
            "vs_even": spread("vs_even"),
            "reactions": [r["reactions"] for r in rows],
            "changes": [r["changes"] for r in rows],
            "moves_between_equal_ranks": [r["moves_between_equal_ranks"] for r in rows],
        }
    if results["equal"]["pilot"]:
        summary["equal"] = {
            "updates": equal_updates,
            "changes": [len(r["changes"]) for r in results["equal"]["pilot"]],
        }
    return summary


if __name__ == "__main__":
    sys.exit(main())
