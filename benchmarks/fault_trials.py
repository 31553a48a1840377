"""Fault trials for issue 11's figures: real ranks on this machine, real signals.

    python benchmarks/fault_trials.py --out /tmp/faults.json [--trials 3]

- SIGSTOP of each rank in turn (a hung or swapping Mac): is the stalled rank the one
  `fleet launch` names, and how long until every process of the run is gone?
- SIGTERM and SIGHUP to `fleet launch`: processes of the run left afterwards (target 0),
  and whether the stop left a verified checkpoint.
- `--restarts 2` with one rank SIGKILLed at a random checkpoint: updates completed, the
  largest weight difference to a run that never failed, and the time lost to the restart.
Prints a table and writes JSON. Not a test: figures for NOTES.md and benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.fleet import fleet_env, free_port, run_fleet  # noqa: E402
from tests.support.ranks import TINY, rank_pid, wait_for_updates, weights  # noqa: E402
from trainer.checkpoint import catalog  # noqa: E402


def fleet(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", *args],
        env=fleet_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def launch(data: Path, run: Path, *train: str, opts: tuple[str, ...] = ()) -> subprocess.Popen:
    return fleet(
        *("launch", "-n", "3", "--starting-port", str(free_port(4)), *opts, "--"),
        *("train", "--data", str(data), "--run-dir", str(run), *TINY, *train),
    )


def trial(fn, *args) -> dict:
    """One trial; a trial that breaks (a loaded machine, a port taken) is recorded, and
    everything of its run is ended, not left behind."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - a benchmark records and goes on
        return {"trial": fn.__name__, "error": f"{type(e).__name__}: {e}"}
    finally:
        for p in psutil.process_iter(["cmdline"]):
            try:
                if "fleet-faults-" in " ".join(p.info["cmdline"] or []):
                    p.kill()
            except psutil.Error:
                continue


def left_over(run: Path) -> int:
    n = 0
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(run) in " ".join(p.info["cmdline"] or []) and p.status() != "zombie":
                n += 1
        except psutil.Error:
            continue
    return n


def sigstop_trial(data: Path, tmp: Path, victim_rank: int, timeout: int) -> dict:
    run = tmp / f"stop-{victim_rank}-{random.getrandbits(16)}"
    proc = launch(
        data,
        run,
        "--local-batches",
        "2,2,2",
        "--updates",
        "100000",
        "--collective-timeout",
        str(timeout),
        opts=("--stop-grace", "30"),
    )
    victim = rank_pid(run, victim_rank)
    wait_for_updates(run, timeout=240)
    t0 = time.monotonic()
    os.kill(victim, signal.SIGSTOP)
    _, err = proc.communicate(timeout=300)
    while left_over(run):
        time.sleep(0.1)
    gone = time.monotonic() - t0
    named = f"fleet launch: rank {victim_rank} stopped responding" in err
    return {
        "victim": victim_rank,
        "named": named,
        "all_gone_s": round(gone, 1),
        "rc": proc.returncode,
    }


def signal_trial(data: Path, tmp: Path, signum: int) -> dict:
    run = tmp / f"sig-{signum}-{random.getrandbits(16)}"
    proc = launch(data, run, "--local-batches", "2,2,2", "--updates", "100000")
    rank_pid(run, 2)
    wait_for_updates(run, timeout=240)
    t0 = time.monotonic()
    proc.send_signal(signum)
    proc.communicate(timeout=300)
    stopped_s = time.monotonic() - t0
    time.sleep(0.5)
    try:
        path, _, _ = catalog.resolve(run, "latest")
        saved = catalog.read_json(path, catalog.STATE)["step"]
    except catalog.CheckpointError:
        saved = None
    return {
        "signal": signal.Signals(signum).name,
        "rc": proc.returncode,
        "left_over": left_over(run),
        "checkpoint_step": saved,
        "stopped_s": round(stopped_s, 1),
    }


def restart_trial(data: Path, tmp: Path, whole: dict, base_s: float, updates: int) -> dict:
    run = tmp / f"restart-{random.getrandbits(16)}"
    at = random.choice(range(2, updates, 2))
    t0 = time.monotonic()
    proc = launch(
        data,
        run,
        "--local-batches",
        "3,2,1",
        "--updates",
        str(updates),
        "--checkpoint-every",
        "2",
        opts=("--restarts", "2", "--restart-backoff", "1", "--stop-grace", "10"),
    )
    victim = rank_pid(run, 2)
    while True:
        done = catalog.complete(run) if (run / "checkpoints").is_dir() else []
        if max((int(p.name.split("-")[1]) for p in done), default=0) >= at:
            break
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    _, err = proc.communicate(timeout=600)
    wall = time.monotonic() - t0
    final = weights(run, updates)
    diff = max(float(np.max(np.abs(final[k] - whole[k]))) for k in whole)
    return {
        "killed_after_checkpoint": at,
        "rc": proc.returncode,
        "restarts": err.count("fleet launch: rank"),
        "updates_completed": catalog.read_json(catalog.resolve(run, "latest")[0], catalog.STATE)[
            "step"
        ],
        "max_weight_diff": diff,
        "time_lost_s": round(wall - base_s, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3, help="trials per signal and restart")
    ap.add_argument(
        "--timeout", type=int, default=10, help="--collective-timeout of the SIGSTOP runs"
    )
    ap.add_argument("--updates", type=int, default=16, help="updates of the restart runs")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-faults-"))
    data = tmp / "data"
    run_fleet("prepare", "--stdlib", "--max-files", "12", "--seq-len", "32", "--out", str(data))
    out: dict = {"sigstop": [], "signals": [], "restarts": []}
    for n in range(args.trials):
        out["sigstop"].append(trial(sigstop_trial, data, tmp, n % 3, args.timeout))
        print(out["sigstop"][-1], flush=True)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        for _ in range(args.trials):
            out["signals"].append(trial(signal_trial, data, tmp, signum))
            print(out["signals"][-1], flush=True)
    t0 = time.monotonic()
    whole = tmp / "whole"
    p = launch(
        data,
        whole,
        "--local-batches",
        "3,2,1",
        "--updates",
        str(args.updates),
        "--checkpoint-every",
        "2",
    )
    p.communicate(timeout=600)
    base_s = time.monotonic() - t0
    ref = weights(whole, args.updates)
    out["unfailed_wall_s"] = round(base_s, 1)
    for _ in range(args.trials):
        out["restarts"].append(trial(restart_trial, data, tmp, ref, base_s, args.updates))
        print(out["restarts"][-1], flush=True)
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
