"""The autopilot against fixed splits (issue 14's figures), on real local ranks.

    python benchmarks/autopilot.py --out /tmp/autopilot.json   # wants >= 4 free cores

A 4-rank run whose simulated slowdown changes at update 50 (2,1,1,1, then 1,1,3,1), global
batch 8, three ways: with --autopilot from the even split; the even split fixed; and the
best fixed split in hindsight (predicted for the whole run from each rank's measured cost per
sample in the fixed run, then measured itself). Also equal ranks with the autopilot for
--noise-updates updates: the changes it made (target 0). Tokens/s counts from update 5 on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from telemetry.arrowlog import read_events, read_updates  # noqa: E402
from tests.support.fleet import launch_args, run_fleet  # noqa: E402

SLOW = "2,1,1,1@0;1,1,3,1@50"
PHASES = [(0, [2, 1, 1, 1]), (50, [1, 1, 3, 1])]


MODEL = ["--depth", "4", "--width", "128", "--heads", "2"]


def run(data: Path, out: Path, split: str, updates: int, *extra: str) -> dict:
    t0 = time.monotonic()
    train = ("--local-batches", split, "--updates", str(updates), *MODEL, "--device", "cpu")
    train += ("--telemetry-port-base", "0", "--log-every", "25", *extra)
    # CPU ranks meet over the ring backend (mlx.launch would pick NCCL on a CUDA host)
    run_fleet(*launch_args(4, data, out, *train, launch_opts=("--backend", "ring")), timeout=900)
    rows = read_updates(out, 0).to_pylist()[5:]
    moves = [e for e in read_events(out, 0) if e.kind == "rebalanced"]
    tokens = sum(r["update_tokens"] for r in rows)
    seconds = sum(r["update_s"] for r in rows)
    return {
        "split": split,
        "tokens_per_s": tokens / seconds,
        "wall_s": round(time.monotonic() - t0, 1),
        "changes": [(e.step, e.data.get("to"), e.data.get("reason")) for e in moves],
    }


def per_sample(out: Path, ranks: int = 4) -> list[float]:
    """Each rank's median compute per sample in phase 1 with its factor divided out."""
    costs = []
    for r in range(ranks):
        rows = [u for u in read_updates(out, r).to_pylist()[5:] if u["step"] <= 50]
        factor = PHASES[0][1][r]
        costs.append(statistics.median(u["compute_s"] / u["local_batch"] for u in rows) / factor)
    return costs


def best_in_hindsight(costs: list[float], updates: int) -> str:
    def total(split):
        t = 0.0
        for i, (start, factors) in enumerate(PHASES):
            end = PHASES[i + 1][0] if i + 1 < len(PHASES) else updates
            t += (end - start) * max(
                c * f * b for c, f, b in zip(costs, factors, split, strict=True)
            )
        return t

    splits = [s for s in itertools.product(range(1, 6), repeat=4) if sum(s) == 8]
    return ",".join(map(str, min(splits, key=total)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--noise-updates", type=int, default=200)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--model",
        default=" ".join(MODEL),
        help="model flags: a larger model makes compute, which the slowdown scales, a larger "
        "share of the update",
    )
    args = ap.parse_args()
    MODEL[:] = args.model.split()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-autopilot-"))
    data = tmp / "data"
    run_fleet("prepare", "--stdlib", "--max-files", "300", "--seq-len", "128", "--out", str(data))
    slow = ("--simulate-slowdown", SLOW)
    fixed = run(data, tmp / "fixed", "2,2,2,2", args.updates, *slow)
    best = best_in_hindsight(per_sample(tmp / "fixed"), args.updates)
    hindsight = run(data, tmp / "best", best, args.updates, *slow)
    pilot = run(data, tmp / "pilot", "2,2,2,2", args.updates, *slow, "--autopilot")
    noise = run(data, tmp / "noise", "2,2,2,2", args.noise_updates, "--autopilot")
    out = {
        "fixed_even": fixed,
        "best_fixed_in_hindsight": hindsight,
        "autopilot": pilot,
        "autopilot_vs_best": pilot["tokens_per_s"] / hindsight["tokens_per_s"],
        "autopilot_vs_fixed": pilot["tokens_per_s"] / fixed["tokens_per_s"] - 1,
        "noise_only_changes": len(noise["changes"]),
        "noise_only": noise,
    }
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
