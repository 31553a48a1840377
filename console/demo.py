"""`fleet demo`: the product in one command.

Prepares the embedded corpus once (cached), starts four local ranks with an uneven split and
one rank slowed down, and opens the console on them: the straggler is marked, `r` proposes a
better split, and its wait time falls. Quitting asks whether to stop the run too.

The commands are built by pure functions (`prepare_command`, `launch_command`,
`console_args`) so they can be checked without running anything; `--dry-run` prints them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from console import terminal
from console.command import typed
from console.hostfile import DEFAULT_PORT_BASE
from telemetry import rundir

WORLD = 4
SPLIT = (3, 2, 2, 1)
# The slow machine holds the largest batch: its peers wait for it, and the balancer's split
# (about 1,2,2,3) cuts the update time by about a third, which `r` shows.
SLOWDOWN = (2.0, 1.0, 1.0, 1.0)
DATASET = "stdlib-128"
# A finite run that learns where a person can see it: 20 warm-up updates (1%) at a brisk
# rate take the loss from 5.8 to about 3.2 by update 40 (a few seconds on a Mac, under a
# minute on a loaded 2-core Linux box), an evaluation every 100 updates draws the dots.
UPDATES = 2000
TRAIN_ARGS = ("--warmup", "0.01", "--lr", "4e-3", "--eval-every", "100", "--eval-samples", "64")
START_TIMEOUT_S = 180.0  # first start compiles and loads; rank 0's key marks it serving
STOP_TIMEOUT_S = 120.0


def cache_dir(env: dict[str, str] | None = None) -> Path:
    """$XDG_CACHE_HOME/mlx-fleet, else ~/.cache/mlx-fleet."""
    env = dict(os.environ if env is None else env)
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")) / ".cache")
    return Path(base).expanduser() / "mlx-fleet"


def fleet(python: str = sys.executable) -> list[str]:
    """How to run the `fleet` dispatcher with this interpreter."""
    return [python, "-m", "fleet.cli"]


def prepare_command(cache: Path, python: str = sys.executable) -> list[str]:
    return [
        *fleet(python),
        "prepare",
        "--stdlib",
        "--max-files",
        "400",
        "--seq-len",
        "128",
        "--out",
        str(cache / DATASET),
    ]


def launch_command(
    data: Path,
    run_dir: Path,
    *,
    split: Sequence[int] = SPLIT,
    slowdown: Sequence[float] = SLOWDOWN,
    port_base: int = DEFAULT_PORT_BASE,
    python: str = sys.executable,
) -> list[str]:
    if len(split) != len(slowdown):
        raise ValueError(f"{len(split)} local batches but {len(slowdown)} slowdown factors")
    cmd = [
        *fleet(python),
        "launch",
        "-n",
        str(len(split)),
        "--",
        "train",
        "--data",
        str(data),
        "--depth",
        "2",
        "--width",
        "64",
        "--heads",
        "2",
        "--local-batches",
        ",".join(map(str, split)),
        "--simulate-slowdown",
        ",".join(f"{f:g}" for f in slowdown),
        "--updates",
        str(UPDATES),
        *TRAIN_ARGS,
        "--run-dir",
        str(run_dir),
        "--checkpoint-every",
        "200",
    ]
    if port_base != DEFAULT_PORT_BASE:
        cmd += ["--telemetry-port-base", str(port_base)]
    return cmd


def console_args(
    run_dir: Path, world: int = WORLD, port_base: int = DEFAULT_PORT_BASE
) -> list[str]:
    """What `fleet console` gets to watch the demo (also printed so it can be reopened)."""
    args = ["--local", "-n", str(world), "--run-dir", str(run_dir)]
    if port_base != DEFAULT_PORT_BASE:
        args += ["--port-base", str(port_base)]
    return args


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, help="run folder (default: runs/demo-<time>)")
    parser.add_argument("--cache", type=Path, help="dataset cache (default: ~/.cache/mlx-fleet)")
    parser.add_argument(
        "--port-base",
        type=int,
        default=DEFAULT_PORT_BASE,
        help="first telemetry port; the next free base when taken (default: %(default)s)",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")


def run(args: argparse.Namespace) -> int:
    cache = (args.cache or cache_dir()).expanduser()
    data = cache / DATASET
    run_dir = args.run_dir or Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    base = free_port_base(args.port_base, WORLD)
    if base is None:
        print(
            f"fleet demo: ports {args.port_base}+ are taken, and the next ones too; give "
            "--port-base",
            file=sys.stderr,
        )
        return 2
    if base != args.port_base:
        # Another run (an earlier demo?) serves there: never watch someone else's run.
        print(
            f"fleet demo: ports {args.port_base}-{args.port_base + WORLD - 1} are in use; "
            f"this run serves on {base}+",
            flush=True,
        )
        args.port_base = base
    prep = prepare_command(cache)
    launch = launch_command(data, run_dir, port_base=args.port_base)
    watch = typed(["console", *console_args(run_dir, port_base=args.port_base)])
    if args.dry_run:
        for cmd in (prep, launch):
            print(shlex.join(cmd))
        print(watch)
        return 0
    if problem := terminal.missing():
        print(f"fleet demo: {problem}", file=sys.stderr)
        return 2

    # --- the dataset, once
    if not (data / "dataset.json").exists():
        print(f"fleet demo: preparing the demo corpus in {data} (once)…", flush=True)
        rc = subprocess.call(prep)
        if rc != 0:
            print(
                f"fleet demo: preparing the corpus failed ({rc}): {shlex.join(prep)}",
                file=sys.stderr,
            )
            return rc or 1

    # --- the run, in its own session so ^C in the console never reaches it
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / "demo-launch.log"
    print(f"fleet demo: starting {WORLD} ranks (log: {log_path})…", flush=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            launch,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    if not _wait_for_start(proc, run_dir, log_path):
        return 1

    # --- the console
    from console.app import FleetApp
    from console.connectors import TCPConnector
    from console.hostfile import local_targets
    from console.live import LiveFeed

    feed = LiveFeed(local_targets(WORLD, args.port_base), TCPConnector(), run_dir=str(run_dir))
    with terminal.on_terminal():  # `fleet demo | tee log`: draw on the terminal, at its size
        app = FleetApp(feed, demo=True)
        app.run()
    if proc.poll() is not None:
        print(
            f"fleet demo: the run ended ({proc.returncode}); its folder: {run_dir}; "
            f"see it with: {typed(['report', str(run_dir)])}"
        )
        return 0
    if app.quit_choice == "stop":
        print("fleet demo: stopping the run (it checkpoints first)…", flush=True)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print("fleet demo: the run did not stop in time; terminating it", file=sys.stderr)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        print(f"fleet demo: stopped; to go on: {resume_command(run_dir)}")
        return 0
    print(
        f"fleet demo: the run goes on (pid {proc.pid}). Watch it again with:\n"
        f"  {watch}\nand stop it from there with s."
    )
    return 0


def resume_command(run_dir: Path, world: int = WORLD) -> str:
    """The exact command that continues the demo's run (its checkpoint keeps every setting)."""
    return typed(
        ["launch", "-n", str(world), "--", "train", "--resume", "latest", "--run-dir", str(run_dir)]
    )


def free_port_base(start: int, world: int, tries: int = 20) -> int | None:
    """The first base from `start` (in steps of 100) whose `world` loopback ports are free."""
    import socket

    for base in range(start, start + 100 * tries, 100):
        try:
            for port in range(base, base + world):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    return None


def _wait_for_start(proc: subprocess.Popen, run_dir: Path, log_path: Path) -> bool:
    """Wait until every rank has logged an update (all serve by then), or the launch failed."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last = rundir.at(run_dir).telemetry / f"rank-{WORLD - 1}.arrow"
    while time.monotonic() < deadline:
        if last.exists() and rundir.at(run_dir).control_key.exists():
            return True
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-20:]
            print(
                f"fleet demo: the run exited ({proc.returncode}) before serving:\n  "
                + "\n  ".join(tail),
                file=sys.stderr,
            )
            return False
        time.sleep(0.2)
    print(
        f"fleet demo: the run did not start within {START_TIMEOUT_S:.0f} s; see {log_path}",
        file=sys.stderr,
    )
    os.killpg(proc.pid, signal.SIGTERM)
    return False
