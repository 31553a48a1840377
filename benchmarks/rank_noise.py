"""What a real rank's compute figures look like to the autopilot: scatter, spikes, and how long
a slow spell lasts (issue 19: the simulator's noise did not predict real ranks).

    python benchmarks/rank_noise.py --out /tmp/rank-noise.json          # 4 ranks, 150 updates
    python benchmarks/rank_noise.py --updates 60 --ranks 2              # quicker

One run of --ranks local ranks on an even split with no slowdown and no autopilot (the model
and data of benchmarks/autopilot.py), then, from every rank's logged updates, what
trainer/costs.py reads: x = log(compute per sample) less the median of all ranks' at the same
update. Reported per rank and pooled: the robust scatter of x (1.4826 MAD), the spikes (|x| >
3 scatters), the autocorrelation of x at lags 1-5 (0 for the independent draws the simulator
in tests/support/pilot_sim.py makes), the longest run of figures on one side of the median,
and the scatter of what all ranks share (each update's median, against the run's). The
effective number of figures per figure, (1 - r1) / (1 + r1), is what an AR(1) process gives
a mean's standard error.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autopilot import FROM, MODEL  # noqa: E402  (the model and warm-up of its runs)

from telemetry.arrowlog import read_updates  # noqa: E402
from tests.support.fleet import launch_args, run_fleet  # noqa: E402


def mad(xs: list[float]) -> float:
    m = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - m) for x in xs)


def autocorrelation(xs: list[float], lag: int) -> float:
    n = len(xs)
    if n <= lag + 2:
        return float("nan")
    mean = statistics.fmean(xs)
    var = sum((x - mean) ** 2 for x in xs)
    cov = sum((xs[i] - mean) * (xs[i + lag] - mean) for i in range(n - lag))
    return cov / var if var > 0 else float("nan")


def longest_side_run(xs: list[float]) -> int:
    """The most figures in a row on one side of the median."""
    m = statistics.median(xs)
    best = run = 0
    side = 0
    for x in xs:
        s = 1 if x > m else -1
        run = run + 1 if s == side else 1
        side = s
        best = max(best, run)
    return best


def figures(rows: dict[int, list[dict]]) -> dict:
    """Per rank and pooled figures of x (see the module's docstring)."""
    steps = sorted(set.intersection(*(set(r["step"] for r in rs) for rs in rows.values())))
    steps = [s for s in steps if s >= FROM]
    by = {rank: {r["step"]: r for r in rs} for rank, rs in rows.items()}
    logs = {
        rank: [
            math.log(by[rank][s]["compute_s"] / max(1, by[rank][s]["local_batch"])) for s in steps
        ]
        for rank in by
    }
    shared = [statistics.median(logs[r][i] for r in logs) for i in range(len(steps))]
    x = {r: [v - shared[i] for i, v in enumerate(vs)] for r, vs in logs.items()}
    out: dict = {"updates": len(steps), "ranks": {}}
    for r, xs in x.items():
        sigma = mad(xs)
        centred = [v - statistics.median(xs) for v in xs]
        r1 = autocorrelation(centred, 1)
        out["ranks"][r] = {
            "scatter": sigma,
            "spikes": sum(abs(v) > 3 * sigma for v in centred) / len(xs),
            "autocorrelation": [autocorrelation(centred, k) for k in range(1, 6)],
            "longest_side_run": longest_side_run(xs),
            "effective_fraction": (1 - r1) / (1 + r1) if r1 == r1 else None,
        }
    ranks = list(out["ranks"].values())
    out["pooled"] = {
        "scatter": statistics.median(v["scatter"] for v in ranks),
        "spikes": statistics.fmean(v["spikes"] for v in ranks),
        "autocorrelation": [
            statistics.fmean(v["autocorrelation"][k] for v in ranks) for k in range(5)
        ],
        "longest_side_run": max(v["longest_side_run"] for v in ranks),
        "effective_fraction": statistics.fmean(v["effective_fraction"] for v in ranks),
        "shared_scatter": mad(shared),
        "shared_autocorrelation_1": autocorrelation(
            [v - statistics.fmean(shared) for v in shared], 1
        ),
    }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4, help="each rank's local batch")
    ap.add_argument("--updates", type=int, default=150)
    ap.add_argument("--out", default="", help="the figures as JSON (its folder is made)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-rank-noise-"))
    data, run = tmp / "data", tmp / "run"
    run_fleet("prepare", "--stdlib", "--max-files", "300", "--seq-len", "128", "--out", str(data))
    train = ("--local-batches", ",".join([str(a.batch)] * a.ranks), "--updates", str(a.updates))
    train += (*MODEL, "--device", "cpu", "--telemetry-port-base", "0", "--log-every", "1000")
    t0 = time.monotonic()
    args = launch_args(a.ranks, data, run, *train, launch_opts=("--backend", "ring"))
    run_fleet(*args, timeout=3600)
    rows = {r: read_updates(run, r).to_pylist() for r in range(a.ranks)}
    result = {
        "command": " ".join(["python", *sys.argv]),
        "wall_s": round(time.monotonic() - t0, 1),
        "config": vars(a),
        **figures(rows),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
