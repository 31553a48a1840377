"""What a rebalance costs under `--memory-limit-gb auto`: the live set measured again at the new
batch (an update with no run-ahead, as until session 23) against the limit set from the estimate.

    python benchmarks/rebalance_memory.py --out /tmp/rebalance.json          # CPU, small
    python benchmarks/rebalance_memory.py --device gpu --depth 12 --width 768 --heads 12 \\
        --vocab 32768 --seq-len 1024 --sizes 16,8,24 --out $OUT/rebalance.json   # issue 12's

One process, one model: the first update at `--sizes`' first batch measures the live set (as a
run's first update does), then for each other batch, `--repeats` times and alternating which
goes first, from the first batch: (a) this trainer's `Limit` (an estimate at or above the live
set at more samples; at fewer, a lower bound whose update's peak measures it), (b) a tight
update that measures the live set (the old way) and the limit 5% above it. Each side's first
update at the batch and the median of the `--steady` after it, in seconds; the estimate against
the live set measured; each side's peak. Every batch size is compiled once before any of it is
timed.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.update import synthetic_stepper  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--precision", default="mixed")
    ap.add_argument("--sizes", default="4,2,8,16", help="first: measured; others: rebalanced to")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steady", type=int, default=4, help="updates timed after the first")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import mlx.core as mx

    from telemetry.units import GiB
    from trainer import memory

    mx.set_default_device(mx.gpu if args.device == "gpu" else mx.cpu)
    _, _, stepper = synthetic_stepper(
        depth=args.depth,
        width=args.width,
        heads=args.heads,
        vocab=args.vocab,
        seq_len=args.seq_len,
        precision=args.precision,
    )
    sizes = [int(s) for s in args.sizes.split(",")]
    first, others = sizes[0], sizes[1:]

    def batch(rows: int) -> mx.array:
        x = mx.random.randint(0, args.vocab, (rows, args.seq_len + 1))
        mx.eval(x)
        return x

    def timed(rows: int) -> tuple[float, int]:
        x = batch(rows)
        t = time.perf_counter()
        stepper.update([x], 1e-4)
        return time.perf_counter() - t, mx.get_peak_memory()

    # compile every size first (no limit): no side pays a size's first trace
    stepper.limit = memory.Limit("none", None)
    for rows in sizes:
        timed(rows)
    budget = memory.machine_budget()
    settled = memory.Limit("auto", budget)
    settled.apply()
    stepper.limit = settled
    for _ in range(3):
        timed(first)
    measured_at = settled.live
    none = memory.Limit("none", None)
    rows_out = []
    for rows in others:
        for rep in range(args.repeats):
            for side in ("estimate", "measure") if rep % 2 == 0 else ("measure", "estimate"):
                auto = stepper.limit = copy.deepcopy(settled)  # one measurement, at the first
                mx.set_memory_limit(auto.limit)
                for _ in range(2):
                    timed(first)
                if side == "estimate":  # this trainer: the limit from the estimate
                    first_s, first_peak = timed(rows)
                    live = auto.live
                else:  # the old way: a tight update measures the live set, the limit 5% over
                    stepper.limit = none
                    with memory.tight():
                        first_s, first_peak = timed(rows)
                    live = first_peak
                    mx.set_memory_limit(min(budget, int(live * (1 + memory.AUTO_HEADROOM))))
                steady = [timed(rows) for _ in range(args.steady)]
                rows_out.append(
                    {
                        "rows": rows,
                        "side": side,
                        "repeat": rep,
                        "first_s": first_s,
                        "steady_s": statistics.median(s for s, _ in steady),
                        "live_set": live,
                        "peak": max([first_peak, *(p for _, p in steady)]),
                    }
                )

    summary = {}
    for rows in others:
        mine = {
            s: [r for r in rows_out if r["rows"] == rows and r["side"] == s]
            for s in ("estimate", "measure")
        }
        live = statistics.median(r["live_set"] for r in mine["measure"])
        estimate = statistics.median(r["live_set"] for r in mine["estimate"])
        summary[str(rows)] = {
            side: {
                "first_s": statistics.median(r["first_s"] for r in rs),
                "first_s_range": [min(r["first_s"] for r in rs), max(r["first_s"] for r in rs)],
                "steady_s": statistics.median(r["steady_s"] for r in rs),
                "peak_gib": max(r["peak"] for r in rs) / GiB,
            }
            for side, rs in mine.items()
        } | {
            # fewer samples than the first: the first update's peak under a lower bound
            "how": "measured under a lower bound" if rows < first else "estimated",
            "live_set_gib": live / GiB,
            "estimate_gib": estimate / GiB,
            "estimate_over_live": estimate / live,
        }
    record = {
        "command": " ".join(["python", *sys.argv]),
        "device": memory.device_name(),
        "measured_at": {"rows": first, "live_set_gib": measured_at / GiB},
        "summary": summary,
        "runs": rows_out,
    }
    text = json.dumps(record, indent=1)
    print(json.dumps({"measured_at": record["measured_at"], "summary": summary}, indent=1))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
