"""Fault trials for issue 11's figures: real ranks on this machine, real signals.

    python benchmarks/fault_trials.py --out /tmp/faults.json [--trials 3]

- SIGSTOP of each rank in turn (a hung or swapping Mac): is the stalled rank the one
  `fleet launch` names, and how long until every process of the run is gone?
- SIGTERM and SIGHUP to `fleet launch`: processes of the run left afterwards (target 0),
  and whether the stop left a verified checkpoint.
- `--restarts 2` with one rank SIGKILLed at a random checkpoint: updates completed, the
  largest weight difference to a run that never failed, and the time lost to the restart.
- Issue 19: SIGKILL of `fleet launch` after a random checkpoint, and SIGTERM at a random
  moment of its first 3 s (processes left 60 s later, updates lost: the newest update any
  rank logged minus the newest verified checkpoint); two `fleet train` on one run folder,
  4 s apart (`--only sigkill,startup,concurrent --kill-trials 20`).
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


def newest_update(run: Path) -> int:
    """The newest update any rank logged (the Arrow logs), 0 before the first."""
    from telemetry.arrowlog import read_updates

    steps = [0]
    for r in range(3):
        try:
            steps += [u["step"] for u in read_updates(run, r).to_pylist()]
        except (OSError, ValueError):
            continue
    return max(steps)


def saved_step(run: Path) -> int | None:
    try:
        path, _, _ = catalog.resolve(run, "latest")
        return catalog.read_json(path, catalog.STATE)["step"]
    except catalog.CheckpointError:
        return None


def wait_gone(run: Path, timeout: float) -> tuple[float, int]:
    """(seconds until no process of the run was left, or `timeout`; how many were left)."""
    t0 = time.monotonic()
    while left_over(run) and time.monotonic() - t0 < timeout:
        time.sleep(0.2)
    return time.monotonic() - t0, left_over(run)


def sigkill_trial(data: Path, tmp: Path) -> dict:
    """SIGKILL of fleet launch itself after a random checkpoint: nothing supervises the
    ranks any more; they must stop at their next update with a checkpoint."""
    run = tmp / f"kill-{random.getrandbits(16)}"
    proc = launch(
        data,
        run,
        "--local-batches",
        "2,2,2",
        "--updates",
        "100000",
        "--checkpoint-every",
        "1",
        "--log-every",
        "1000",
        opts=("--stop-grace", "30"),
    )
    at = random.choice(range(2, 8))
    deadline = time.monotonic() + 240
    while (saved_step(run) or 0) < at:
        assert proc.poll() is None and time.monotonic() < deadline, "never saved"
        time.sleep(0.1)
    proc.kill()
    proc.wait()
    gone_s, left = wait_gone(run, 60)
    newest, saved = newest_update(run), saved_step(run)
    return {
        "killed_after_checkpoint": at,
        "left_after_60_s": left,
        "all_gone_s": round(gone_s, 1),
        "newest_update": newest,
        "checkpoint_step": saved,
        "updates_lost": newest - (saved or 0),
    }


def startup_trial(data: Path, tmp: Path) -> dict:
    """SIGTERM to fleet launch at a random moment of its first 3 s."""
    run = tmp / f"early-{random.getrandbits(16)}"
    proc = launch(
        data,
        run,
        "--local-batches",
        "2,2,2",
        "--updates",
        "100000",
        "--checkpoint-every",
        "1",
        "--log-every",
        "1000",
        opts=("--stop-grace", "30"),
    )
    delay = random.uniform(0, 3)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        err = "(fleet launch still running 120 s later)"
    _, left = wait_gone(run, 60)
    newest, saved = newest_update(run), saved_step(run)
    return {
        "sigterm_after_s": round(delay, 2),
        "rc": proc.returncode,
        "stopped": "the ranks stopped" in err,
        "ended_after_grace": "did not stop in time" in err,
        "left_after_60_s": left,
        "newest_update": newest,
        "checkpoint_step": saved,
        "updates_lost": newest - (saved or 0),
    }


def concurrent_trial(data: Path, tmp: Path) -> dict:
    """Issue 19's trial: `fleet train --resume latest ... --checkpoint-every 1` twice, 4 s
    apart, on one run folder."""
    run = tmp / f"two-{random.getrandbits(16)}"
    run_fleet(
        *("train", "--data", str(data), "--run-dir", str(run), *TINY),
        *("--local-batch", "2", "--updates", "2", "--checkpoint-every", "1"),
    )
    again = ("train", "--resume", "latest", "--run-dir", str(run), "--updates", "3000")
    again += ("--checkpoint-every", "1", "--telemetry-port-base", "0", "--log-every", "1000")
    first = fleet(*again)
    time.sleep(4)
    second = fleet(*again)
    _, err2 = second.communicate(timeout=600)
    first.send_signal(signal.SIGTERM)  # (the issue ran both to the end: here the first stops)
    _, err1 = first.communicate(timeout=600)
    return {
        "second_rc": second.returncode,
        "second_refused": "is in use by pid" in err2,
        "second_said": (err2.strip().splitlines() or [""])[-1][:200],
        "first_rc": first.returncode,
        "tracebacks": err1.count("Traceback") + err2.count("Traceback"),
        "latest_step": saved_step(run),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3, help="trials per signal and restart")
    ap.add_argument(
        "--timeout", type=int, default=10, help="--collective-timeout of the SIGSTOP runs"
    )
    ap.add_argument("--updates", type=int, default=16, help="updates of the restart runs")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    ap.add_argument(
        "--only",
        default="sigstop,signals,restarts",
        help="trials to run, comma-separated: sigstop, signals, restarts, sigkill, startup, "
        "concurrent (default: %(default)s)",
    )
    ap.add_argument("--kill-trials", type=int, default=20, help="sigkill and startup trials")
    args = ap.parse_args()
    only = set(args.only.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="fleet-faults-"))
    data = tmp / "data"
    run_fleet("prepare", "--stdlib", "--max-files", "12", "--seq-len", "32", "--out", str(data))
    out: dict = {"sigstop": [], "signals": [], "restarts": []}
    for name, fn in (("sigkill", sigkill_trial), ("startup", startup_trial)):
        if name in only:
            out[name] = []
            for _ in range(args.kill_trials):
                out[name].append(trial(fn, data, tmp))
                print(name, out[name][-1], flush=True)
    if "concurrent" in only:
        out["concurrent"] = []
        for _ in range(args.trials):
            out["concurrent"].append(trial(concurrent_trial, data, tmp))
            print("concurrent", out["concurrent"][-1], flush=True)
    for n in range(args.trials if "sigstop" in only else 0):
        out["sigstop"].append(trial(sigstop_trial, data, tmp, n % 3, args.timeout))
        print(out["sigstop"][-1], flush=True)
    for signum in (signal.SIGTERM, signal.SIGHUP) if "signals" in only else ():
        for _ in range(args.trials):
            out["signals"].append(trial(signal_trial, data, tmp, signum))
            print(out["signals"][-1], flush=True)
    if "restarts" not in only:
        print(json.dumps(out, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
        return 0
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
