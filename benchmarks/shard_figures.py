"""--shard-optimizer's figures on local CPU ranks over ring (issue 20): what each rank holds,
what an update costs, how deep a model a memory-limited rank trains, and the weights' match.

    python benchmarks/shard_figures.py --json > shard.json     # 5 ranks, shares 4,4,1,1,1

1. Interleaved pairs (--pairs, the order turned each pair), unsharded and sharded, the same
   run (synthetic tokens, mixed precision, --accum, --updates): each rank's resident bytes of
   master weights + optimizer state (telemetry's resident_mem) against the unsharded run's;
   the update time (rank 0's median over the updates after the first two: the first runs
   under the tight limit that measures the live set) against the unsharded run's; the largest
   weight difference between the two final checkpoints (0.0: bit-identical).
2. The deepest model whose update fits a rank limited to --budget-gb: the live set (peak under
   a tight limit, telemetry's live_mem) of the smallest share's rank, measured at two depths
   for each arm, the depth where it reaches the budget predicted from the line through them,
   then checked at that depth and one deeper (fits: live set <= budget). An MLX memory limit
   below the live set makes a rank wait, never fail: "fits" is the live set, not the limit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

from telemetry.arrowlog import read_updates
from telemetry.units import GiB, MiB
from tests.support.fleet import free_port, run_fleet
from trainer.checkpoint import catalog


def launch(run: Path, n: int, args: list[str]) -> list[dict]:
    """One run of `n` local ranks; every rank's update records."""
    shutil.rmtree(run, ignore_errors=True)
    run_fleet(
        *("launch", "-n", str(n), "--starting-port", str(free_port(n + 1)), "--", "train"),
        *("--synthetic", "--run-dir", str(run), "--telemetry-port-base", "0", *args),
        timeout=3600,
    )
    return read_updates(run).to_pylist()


def max_weight_diff(a: Path, b: Path) -> float:
    wa, wb = (mx.load(str(catalog.resolve(r, "latest")[0] / catalog.WEIGHTS)) for r in (a, b))
    return max(float(mx.abs(wa[k].astype(mx.float32) - wb[k].astype(mx.float32)).max()) for k in wa)


def pairs(a: argparse.Namespace, work: Path) -> dict:
    n, model = a.ranks, a.model.split()
    common = [*model, "--local-batches", ",".join(["1"] * n), "--accum", str(a.accum)]
    common += ["--updates", str(a.updates), "--precision", a.precision]
    sharded = ["--shard-optimizer", "--optimizer-shares", a.shares]
    out = []
    for p in range(1, a.pairs + 1):
        order = ("unsharded", "sharded") if p % 2 else ("sharded", "unsharded")
        rows = {}
        for arm in order:
            print(f"pair {p}: {arm}", file=sys.stderr, flush=True)
            rows[arm] = launch(work / arm, n, common + (sharded if arm == "sharded" else []))
        figures = {}
        for arm, recs in rows.items():
            last = {r["rank"]: r for r in recs if r["step"] == a.updates}
            times = [r["update_s"] for r in recs if r["rank"] == 0 and r["step"] > 2]
            figures[arm] = {
                "resident_mib": [last[r]["resident_mem"] / MiB for r in range(n)],
                "opt_share": [last[r]["opt_share"] for r in range(n)],
                "update_s_median": statistics.median(times),
                "update_s_range": [min(times), max(times)],
            }
        u, s = figures["unsharded"], figures["sharded"]
        figures["resident_over_unsharded"] = [
            x / y for x, y in zip(s["resident_mib"], u["resident_mib"], strict=True)
        ]
        figures["update_time_over_unsharded"] = s["update_s_median"] / u["update_s_median"]
        figures["max_weight_diff"] = max_weight_diff(work / "unsharded", work / "sharded")
        out.append(figures)
    ratios = [f["update_time_over_unsharded"] for f in out]
    small = min(range(n), key=lambda r: out[0]["sharded"]["opt_share"][r])
    return {
        "pairs": out,
        "update_time_ratio_median": statistics.median(ratios),
        "update_time_ratio_range": [min(ratios), max(ratios)],
        "smallest_share_rank": small,
        "resident_ratio_smallest_share": max(f["resident_over_unsharded"][small] for f in out),
        "max_weight_diff": max(f["max_weight_diff"] for f in out),
    }


def deepest(a: argparse.Namespace, work: Path) -> dict:
    n, budget = a.ranks, a.budget_gb * GiB
    model = a.deep_model.split()
    common = [*model, "--local-batches", ",".join(["1"] * n), "--accum", "1", "--updates", "1"]
    common += ["--precision", a.precision, "--allreduce-bucket-mb", str(a.bucket_mb)]
    arms = {"unsharded": [], "sharded": ["--shard-optimizer", "--optimizer-shares", a.shares]}
    shares = [float(s) for s in a.shares.split(",")]
    small = shares.index(min(shares))
    out = {"budget_gib": a.budget_gb, "rank": small}
    for arm, extra in arms.items():
        live: dict[int, int] = {}

        def measure(depth: int, arm=arm, extra=extra, live=live) -> int:
            if depth not in live:
                print(f"deepest: {arm} depth {depth}", file=sys.stderr, flush=True)
                recs = launch(work / f"{arm}-d{depth}", n, [*common, "--depth", str(depth), *extra])
                live[depth] = next(r["live_mem"] for r in recs if r["rank"] == small)
            return live[depth]

        lo, hi = a.depths
        per = (measure(hi) - measure(lo)) / (hi - lo)
        guess = max(1, int(lo + (budget - measure(lo)) / per))
        while guess > 1 and measure(guess) > budget:  # step down to one that fits
            guess -= 1
        while measure(guess + 1) <= budget:  # and up to the last that does
            guess += 1
        out[arm] = {
            "deepest": guess,
            "live_mib_by_depth": {d: v / MiB for d, v in sorted(live.items())},
            "per_block_mib": per / MiB,
        }
    out["sharded_over_unsharded"] = out["sharded"]["deepest"] / out["unsharded"]["deepest"]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=5)
    p.add_argument("--shares", default="4,4,1,1,1")
    p.add_argument("--model", default="--depth 2 --width 128 --heads 2 --vocab 8192 --seq-len 64")
    p.add_argument("--precision", default="mixed", choices=("fp32", "bf16", "mixed"))
    p.add_argument("--accum", type=int, default=8)
    p.add_argument("--updates", type=int, default=20)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument(
        "--deep-model",
        default="--width 256 --heads 4 --vocab 8192 --seq-len 32",
        help="the depth search's model (its depth is searched)",
    )
    p.add_argument("--budget-gb", type=float, default=0.25, help="the limited rank's memory")
    p.add_argument("--depths", type=int, nargs=2, default=(2, 8), help="two depths to fit")
    p.add_argument(
        "--bucket-mb",
        type=float,
        default=4.0,
        help="all-reduce buckets of the depth search (--allreduce-bucket-mb): small, so that "
        "the gradients' flat copies (8 bytes a parameter of a bucket) do not hide the state",
    )
    p.add_argument("--only", choices=("pairs", "deepest"), default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shard-figures-"))
    out: dict = {"config": vars(a)}
    try:
        if a.only in (None, "pairs"):
            out["pairs"] = pairs(a, work)
        if a.only in (None, "deepest"):
            out["deepest"] = deepest(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(out, indent=2 if a.json else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
