"""What the boundary's control exchange costs (trainer/controller.py): one tiny all-reduce, and
the second one that applies the autopilot's decision at the boundary it was made.

    python -c "from mlx._distributed_utils.launch import main; main()" -n 4 --backend ring \\
        benchmarks/control_exchange.py --iters 2000

Each rank calls `Cluster.broadcast_command` as the controller does: with the figures every
rank sends (7 a rank), and without (the second exchange). Rank 0 prints one JSON line: the
median and 90th percentile of each, in microseconds, over interleaved rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=1000, help="rounds of each (default: 1000)")
    p.add_argument("--warmup", type=int, default=50, help="rounds not timed (default: 50)")
    args = p.parse_args()
    from trainer.distributed import Cluster

    cluster = Cluster()
    figures = [1.0] * 7  # peak, stop, compute, swap, pressure, budget, the pilot may decide
    first, second = [], []
    for i in range(args.warmup + args.iters):
        t0 = time.perf_counter()
        cluster.broadcast_command("none", [], figures)
        t1 = time.perf_counter()
        cluster.broadcast_command("none", [])
        t2 = time.perf_counter()
        if i >= args.warmup:
            first.append(t1 - t0)
            second.append(t2 - t1)

    def us(x: list[float]) -> dict:
        q = statistics.quantiles(x, n=10)
        return {"median_us": round(statistics.median(x) * 1e6, 1), "p90_us": round(q[-1] * 1e6, 1)}

    if cluster.is_root:
        out = {"ranks": cluster.size, "backend": cluster.backend, "iters": args.iters}
        print(json.dumps(out | {"with_figures": us(first), "second": us(second)}))


if __name__ == "__main__":
    main()
