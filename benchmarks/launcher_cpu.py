"""What the launcher costs the machine it runs on: the CPU time of `fleet launch`'s mlx.launch
process over a short run of local ranks, against its wall time (issue 19's figure).

    python benchmarks/launcher_cpu.py --code /tmp/old --pairs 3 --out /tmp/launcher.json

mlx.launch keeps a thread per rank whose loop selects on the rank's standard input for
writing; a pipe is always writable, so the loop never sleeps. Each pair runs the same
`fleet launch -n N -- train --synthetic ...` from this checkout and from `--code` (an older
one, exported with `git archive`), the order turned each pair. Reported: mlx.launch's CPU
seconds, the run's wall seconds, their ratio (1.0 = one core for the whole run), and rank
0's median update time. Not a test: the figure for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from telemetry.arrowlog import read_updates  # noqa: E402
from tests.support.fleet import fleet_env, free_port  # noqa: E402

TRAIN = ("--synthetic", "--depth", "2", "--width", "64", "--heads", "2", "--seq-len", "64")


def launcher_of(proc: psutil.Process) -> psutil.Process | None:
    """fleet launch's child that runs mlx.launch (its cmdline names mlx's launcher)."""
    for child in proc.children(recursive=True):
        try:
            if "_distributed_utils.launch" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def one(code: Path, run: Path, n: int, updates: int) -> dict:
    """One launch from `code`: mlx.launch's CPU seconds and the wall seconds it lived."""
    argv = [sys.executable, "-m", "fleet.cli", "launch", "-n", str(n)]
    argv += ["--starting-port", str(free_port(n + 1)), "--", "train", *TRAIN]
    argv += ["--updates", str(updates), "--run-dir", str(run), "--telemetry-port-base", "0"]
    env = {**fleet_env(), "PYTHONPATH": str(code)}
    proc = subprocess.Popen(argv, cwd=code, env=env, stdout=subprocess.DEVNULL)
    p = psutil.Process(proc.pid)
    launcher, cpu, born = None, 0.0, None
    while proc.poll() is None:
        launcher = launcher or launcher_of(p)
        if launcher is not None:
            try:
                t = launcher.cpu_times()
                cpu, born = t.user + t.system, born or launcher.create_time()
            except psutil.Error:
                pass  # it ended between two looks: the last reading stands
        time.sleep(0.2)
    wall = time.time() - born if born else float("nan")
    rows = read_updates(run).to_pylist()
    times = [r["update_s"] for r in rows if r["rank"] == 0 and r["step"] > 2]
    return {
        "rc": proc.returncode,
        "launcher_cpu_s": cpu,
        "wall_s": wall,
        "cores": cpu / wall if wall else None,
        "update_s_median": statistics.median(times) if times else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", required=True, help="the older checkout to compare with")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--updates", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-launcher-"))
    arms = {"before": Path(args.code).resolve(), "after": ROOT}
    out: dict = {"ranks": args.ranks, "updates": args.updates, "pairs": []}
    for i in range(args.pairs):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        pair = {}
        for arm in order:
            pair[arm] = one(arms[arm], tmp / f"{arm}-{i}", args.ranks, args.updates)
            print(f"pair {i + 1} {arm}: {pair[arm]}", file=sys.stderr, flush=True)
        out["pairs"].append(pair)
    for arm in arms:
        cores = [p[arm]["cores"] for p in out["pairs"]]
        ups = [p[arm]["update_s_median"] for p in out["pairs"] if p[arm]["update_s_median"]]
        out[arm] = {
            "cores_median": statistics.median(cores),
            "cores_range": [min(cores), max(cores)],
            "update_s_median": statistics.median(ups) if ups else None,
        }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
