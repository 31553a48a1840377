"""`fleet` as a user runs it: in a subprocess, this checkout first on the path, on free ports."""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

from telemetry.ports import free_loopback_base

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def free_port(count: int = 1) -> int:
    """A loopback port with `count` consecutive free ports from it."""
    return free_loopback_base(count)


def unread(pipe) -> int:
    """Bytes written to a pipe (a descriptor of either end, or its file) and not read yet."""
    fd = pipe if isinstance(pipe, int) else pipe.fileno()
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def fleet_env(**extra: str) -> dict[str, str]:
    """The environment for `fleet` subprocesses: this checkout first on the path, wherever
    they start. Without PYTHONSAFEPATH, `python -m` and `-c` put their working directory
    before PYTHONPATH: a benchmark of one checkout run from inside another ran the other's
    trainer (benchmarks/pilot_ab.py's two arms ran one pilot until session 15)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONSAFEPATH"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_fleet(
    *args: str, timeout: float = 300, check: bool = True, **kw
) -> subprocess.CompletedProcess:
    """`fleet ARGS` in a fresh interpreter, as a user would run it."""
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=fleet_env(),
        cwd=kw.get("cwd"),
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"fleet {' '.join(args)} exited {proc.returncode}:\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def launch_args(
    n: int, data: Path, run: Path, *train_args: str, launch_opts: tuple[str, ...] = ()
) -> list[str]:
    """`launch -n N -- train --data D --run-dir R ARGS` (fleet's arguments), free ring ports."""
    return [
        "launch",
        "-n",
        str(n),
        "--starting-port",
        str(free_port(n + 1)),
        *launch_opts,
        "--",
        "train",
        "--data",
        str(data),
        "--run-dir",
        str(run),
        *train_args,
    ]


def spawn_launch(
    n: int,
    data: Path,
    run: Path,
    *train_args: str,
    launch_opts: tuple[str, ...] = (),
    **popen,
) -> subprocess.Popen:
    """A run of N real local ranks in the background; stderr is piped for its diagnosis.
    End it with `communicate()`, not `wait()`: a pipe nobody reads holds the launch's last
    lines, and its exit with them (a progress line an update fills it in seconds)."""
    popen.setdefault("stdout", subprocess.PIPE)
    args = launch_args(n, data, run, *train_args, launch_opts=launch_opts)
    argv = [sys.executable, "-m", "fleet.cli", *args]
    return subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=fleet_env(), **popen)
