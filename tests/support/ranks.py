"""Real ranks of tiny runs: launched, found by pid, waited for, and their weights compared."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import numpy as np
import psutil

from tests.support.fleet import launch_args, run_fleet, spawn_launch, unread
from trainer.checkpoint import catalog

TINY = [
    "--depth",
    "2",
    "--width",
    "64",
    "--heads",
    "2",
    "--accum",
    "2",
    "--seed",
    "4",
    "--telemetry-port-base",
    "0",
]


def launch(n: int, data: Path, run: Path, *train_args: str, check: bool = True):
    return run_fleet(*launch_args(n, data, run, *TINY, *train_args), check=check)


def single(data: Path, run: Path, *train_args: str):
    return run_fleet("train", "--data", str(data), "--run-dir", str(run), *TINY, *train_args)


def weights(run: Path, step: int) -> dict[str, np.ndarray]:
    path = catalog.step_dir(run, step) / catalog.WEIGHTS
    return {k: np.array(v) for k, v in mx.load(str(path)).items()}


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], atol=1e-5, rtol=1e-4, err_msg=name)


def rank_pid(run: Path, rank: int, timeout: float = 60) -> int:
    """The pid of rank `rank` of the run in `run` (found by its MLX_RANK and run folder)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            try:
                cmd = p.info["cmdline"] or []
                if str(run) in cmd and "train" in cmd and p.environ().get("MLX_RANK") == str(rank):
                    return p.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} of {run} never started")


def start(tiny_data: Path, run: Path, *extra: str, grace: str = "30") -> subprocess.Popen:
    return spawn_launch(
        *(3, tiny_data, run, *TINY, "--local-batches", "2,2,2", "--updates", "100000", *extra),
        launch_opts=("--stop-grace", grace),
    )


def wait_for_updates(run: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not list((run / "telemetry").glob("rank-2*.arrow")):
        assert time.monotonic() < deadline, "the run never started updating"
        time.sleep(0.2)
    time.sleep(1.0)


def newest_step(run) -> int:
    done = catalog.complete(run) if (run / "checkpoints").is_dir() else []
    return max((int(p.name.split("-")[1]) for p in done), default=0)


def wait_for_checkpoint(run, step: int, proc, timeout: float = 120) -> None:
    """Until the run has saved `step` (a random point of the run, for the kill that follows)."""
    deadline = time.monotonic() + timeout
    while newest_step(run) < step:
        assert proc.poll() is None, _why(proc.stderr.read())
        assert time.monotonic() < deadline, f"no checkpoint {step} in {timeout} s"
        time.sleep(0.1)


# A lifeline timeout short enough for a quick test, long enough for a loaded 2-core box: at 2 s
# the lifeline was lost in 4 of 12 runs beside 3 busy loops, the output read all along (fleet
# launch's sender, meant to say "alive" once a second, waited up to 2.26 s for a core); at 5 s
# in none of 6.
LIFELINE_S = 5


@contextlib.contextmanager
def nothing_left(proc, run) -> Iterator[None]:
    """Whatever the block does (a failing assertion too), nothing of the run runs after it."""
    try:
        yield
    finally:
        proc.kill()
        wait_until_gone(run, timeout=0)


def sigterm(proc) -> tuple[str, str]:
    """SIGTERM to fleet launch, and what it printed (stdout, stderr) until it ended by it."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    return out, err


def hold_output(proc: subprocess.Popen, seconds: float, timeout: float = 120) -> None:
    """Read nothing of `proc`'s stdout until its pipe is full, then `seconds` more: Ctrl-S
    in the terminal, or `| less` left alone (a progress line an update fills it in seconds)."""
    deadline, held = time.monotonic() + timeout, -1
    while (now := unread(proc.stdout)) < 16_384 or now != held:
        assert proc.poll() is None, _why(proc.stderr.read())
        assert time.monotonic() < deadline, "the pipe never filled"
        held = now
        time.sleep(1.0)
    time.sleep(seconds)


def stop_cause(out: str, updates: int) -> str:
    """What stopped the run, by its "stopped at update N of `updates` (by ...)" line, once
    `out` is found to hold every progress line from 1 to N, in order (nothing printed lost)."""
    stopped = re.search(rf"stopped at update (\d+) of {updates} \(by (.*?)\)", out)
    assert stopped, out[-2000:]
    steps = [int(m) for m in re.findall(rf"^step +(\d+)/{updates}", out, re.M)]
    assert steps == list(range(1, int(stopped.group(1)) + 1))
    return stopped.group(2)


def _why(err: str) -> str:
    """A dead launch's cause: every rank's own `fleet train` lines (they come first, and a long
    tail of mlx.launch's clean-up can push them out of view), then the tail."""
    ours = [line for line in err.splitlines() if line.startswith("fleet train")]
    return "\n".join([*ours[:20], "...", err[-2000:]])


def run_processes(run: Path) -> list[psutil.Process]:
    """Every process on this machine that belongs to the run (its folder is in the command),
    this one excepted."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid == os.getpid() or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if str(run) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_until_gone(run: Path, timeout: float) -> list[psutil.Process]:
    """Until no process of the run is left, or `timeout` s; what is left (then killed)."""
    deadline = time.monotonic() + timeout
    while (left := run_processes(run)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return left


def last_update(run: Path, rank: int = 0) -> int:
    """The step of the newest update rank `rank` logged."""
    from telemetry.arrowlog import read_updates

    rows = read_updates(run, rank).to_pylist()
    return max((r["step"] for r in rows), default=0)


def assert_close_weights(a: dict, b: dict, rel: float = 1e-5) -> float:
    """Each tensor of `b` equals `a`'s within `rel` of its norm; returns the largest such
    difference (tensor parallelism sums in another order: FP32 rounding, amplified by AdamW in
    the weights that start at zero)."""
    assert a.keys() == b.keys()
    worst = 0.0
    for name in a:
        assert a[name].shape == b[name].shape, name
        diff = float(np.linalg.norm(b[name] - a[name]) / max(np.linalg.norm(a[name]), 1e-30))
        assert diff <= rel, f"{name}: {diff:.2e} of its norm"
        worst = max(worst, diff)
    return worst
