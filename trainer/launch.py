"""`fleet launch`: start every rank of a run with `mlx.launch`, and say which rank failed first.

    fleet launch -n 3 -- train --data D --local-batches 3,2,1 --run-dir R
    fleet launch --hostfile hosts.json --backend ring -- train ...

mlx.launch does the starting (ring over TCP, JACCL over Thunderbolt, MPI, NCCL on CUDA);
this wrapper checks the hostfile and the train arguments before anything starts, passes
every rank's output through, and turns "some rank failed" into a non-zero exit naming the
first one (mlx.launch itself exits 0 when ranks fail).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainer.blas import preload_env

BACKENDS = ("ring", "jaccl", "mpi", "nccl", "any")
_FAILED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


class LaunchError(ValueError):
    """Something to fix before any rank starts."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start a data-parallel run with mlx.launch: -n ranks on this machine, or one rank per "
        "entry of an mlx.launch hostfile. Everything after `--` is the rank's command, "
        "normally `train ARGS` (the arguments of `fleet train`)."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("-n", type=int, default=0, metavar="N", help="ranks on this machine")
    where.add_argument("--hostfile", help="mlx.launch's JSON hostfile: one rank per host entry")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="distributed backend (default: the hostfile's, else nccl on CUDA, else ring)",
    )
    parser.add_argument(
        "--starting-port",
        type=int,
        default=32323,
        help="ring backend: first port, one more per rank and IP",
    )
    parser.add_argument("--nccl-port", type=int, default=12345, help="nccl backend: rank 0 port")
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter on every host (default: this one's path)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment variable for every rank (repeatable)",
    )
    parser.add_argument(
        "--stop-grace",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds the other ranks get to stop on their own after one fails, before "
        "fleet launch ends them (a rank that never started can leave its peers waiting)",
    )
    parser.add_argument("--verbose", action="store_true", help="mlx.launch's debug output")
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- train ARGS (the rank's fleet subcommand)"
    )


def read_hostfile(path: str | Path) -> tuple[list[dict], str]:
    """Hosts and backend from mlx.launch's format (a list, or {hosts, backend, envs})."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise LaunchError(f"hostfile {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LaunchError(f"cannot read hostfile {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise LaunchError(f"hostfile {path} is not valid JSON: {e}") from None
    backend = ""
    if isinstance(data, dict):
        backend = data.get("backend", "") or ""
        if "hosts" not in data:
            raise LaunchError(f"hostfile {path}: an object needs a `hosts` list")
        data = data["hosts"]
    if not isinstance(data, list) or not data:
        raise LaunchError(f"hostfile {path}: expected a non-empty list of hosts")
    for i, h in enumerate(data):
        if not isinstance(h, dict) or not isinstance(h.get("ssh"), str) or not h["ssh"]:
            raise LaunchError(f"hostfile {path}: entry {i} needs an `ssh` host name, got {h!r}")
        ips = h.get("ips", [])
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            raise LaunchError(
                f"hostfile {path}: entry {i} ({h['ssh']}): `ips` must be a list of strings"
            )
    return data, backend


def check_train_args(argv: list[str], world: int) -> None:
    """Parse the rank's `train` arguments here, so mistakes surface before any rank starts."""
    from trainer.config import FIELDS, ConfigError, TrainConfig, add_arguments, resolve

    parser = argparse.ArgumentParser(prog="fleet train", add_help=False)
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        raise LaunchError("the train arguments above are not valid") from None
    try:
        if getattr(args, "resume", ""):
            # The checkpoint supplies the rest; check only what was given here.
            cfg = TrainConfig(**{k: v for k, v in vars(args).items() if k in FIELDS})
            if cfg.local_batches:
                cfg.split(world)
        else:
            cfg = resolve(args)
            cfg.split(world)
        for name in ("cache_limit_gb", "memory_limit_gb", "wired_limit_gb", "simulate_slowdown"):
            cfg.per_rank(name, world, 0)
        if cfg.data and not Path(cfg.data).is_dir() and not cfg.synthetic:
            raise ConfigError(f"--data {cfg.data}: no such dataset folder on this machine")
    except ConfigError as e:
        raise LaunchError(str(e)) from None


def check_mpirun(world: int) -> None:
    """mlx.launch's MPI mode runs `mpirun --output :raw`, an Open MPI 5 option: say so up front
    (Open MPI 4, as Debian 12 ships, stops with "unknown option") and how to run without it."""
    import shutil

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise LaunchError("--backend mpi needs mpirun on PATH (Open MPI 5)")
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout + out.stderr
    except (OSError, subprocess.TimeoutExpired):
        return  # let mlx.launch say what is wrong
    m = re.search(r"Open MPI\)?\s+(\d+)\.(\d+)", version)
    if m and int(m.group(1)) < 5:
        from mlx._distributed_utils.launch import get_mpi_libname

        lib = get_mpi_libname() or "<your libmpi.so.N>"
        raise LaunchError(
            f"mlx.launch's MPI mode needs Open MPI 5; this mpirun is Open MPI "
            f"{m.group(1)}.{m.group(2)}. Start the ranks with mpirun itself instead: "
            f"mpirun -np {world} -x MLX_MPI_LIBNAME={lib} {sys.executable} -m fleet.cli "
            "train ... (fleet train joins MPI when mpirun starts it)"
        )


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        if not command:
            raise LaunchError("give the rank's command after `--`, e.g. -- train --data D ...")
        if args.hostfile:
            hosts, file_backend = read_hostfile(args.hostfile)
            world = len(hosts)
        else:
            if args.n < 1:
                raise LaunchError("give -n N (ranks on this machine) or --hostfile")
            world, file_backend, hosts = args.n, "", []
        backend = args.backend or file_backend or None
        if backend == "ring" and hosts and any(not h.get("ips") for h in hosts):
            raise LaunchError("the ring backend needs `ips` for every host in the hostfile")
        if backend == "mpi":
            check_mpirun(world)
        if command[0] == "train":
            check_train_args(command[1:], world)
    except LaunchError as e:
        print(f"fleet launch: error: {e}", file=sys.stderr)
        return 2

    mlx_argv = [
        "--python",
        args.python,
        "--starting-port",
        str(args.starting_port),
        "--nccl-port",
        str(args.nccl_port),
    ]
    mlx_argv += ["--hostfile", args.hostfile] if args.hostfile else ["-n", str(world)]
    if backend and backend != "any":
        mlx_argv += ["--backend", backend]
    if args.verbose:
        mlx_argv.append("--verbose")
    env = preload_env()
    threads = max(1, (os.cpu_count() or 1) // world) if not args.hostfile else None
    rank_env = list(args.env)
    if backend and backend != "any":
        rank_env.append(f"FLEET_BACKEND={backend}")  # the ranks join exactly this backend
    if threads and not any(e.startswith("OPENBLAS_NUM_THREADS=") for e in rank_env):
        # N ranks on one machine each default to every core: oversubscription would make
        # every rank look slow. Give each its share.
        rank_env.append(f"OPENBLAS_NUM_THREADS={threads}")
    for e in rank_env:
        mlx_argv += ["--env", e]
    argv = [
        sys.executable,
        "-c",
        "from mlx._distributed_utils.launch import main; main()",
        *mlx_argv,
        "--",
        "-m",
        "fleet.cli",
        *command,
    ]
    hosts_ssh = [h.get("ssh", "") for h in hosts]
    return supervise(argv, env, hosts_ssh, grace=args.stop_grace)


def supervise(
    argv: list[str],
    env: dict[str, str],
    hosts: list[str] | None = None,
    grace: float = 30.0,
) -> int:
    """Run mlx.launch, pass its output through, and report the first rank that failed.

    `hosts`: each rank's ssh name, for hostfile runs: an exit code of 255 there is ssh's own.
    mlx.launch's own thread tracebacks (it cannot clean up a rank that never started) are
    not the operator's business and are left out; the ranks' messages all pass through.
    `grace`: after a failure, the others normally notice the lost peer within a second and
    exit; ranks still running `grace` seconds later (waiting for a peer that never came up)
    are ended with mlx.launch, its ssh sessions and everything under them.
    """
    failures: list[tuple[int, str]] = []
    proc = subprocess.Popen(
        argv, env=env, stdout=None, stderr=subprocess.PIPE, text=True, bufsize=1
    )

    def watch() -> None:
        assert proc.stderr is not None
        in_launcher_traceback = False
        for line in proc.stderr:
            if line.startswith("Exception in thread") and "(_thread_fn)" in line:
                in_launcher_traceback = True  # mlx.launch's own rank thread, not a rank's
            if in_launcher_traceback:
                # Frames and code are indented; the block ends with the exception's own line.
                if not line[:1].isspace() and not line.startswith(("Exception in", "Traceback")):
                    in_launcher_traceback = False
                continue
            m = _FAILED.search(line)
            if m:
                rank = int(m.group(1))
                how = f"exited with code {m.group(2)}" if m.group(2) else "was killed"
                if m.group(2) == "255" and hosts and rank < len(hosts) and hosts[rank]:
                    host = hosts[rank]
                    how += (
                        f": ssh could not start it on {host} (unreachable, login refused, or "
                        f"host key unknown; try `ssh {host} true`)"
                    )
                failures.append((rank, how))
            sys.stderr.write(line)
            sys.stderr.flush()

    reader = threading.Thread(target=watch, daemon=True)
    reader.start()
    ended = False
    try:
        code, ended = _wait(proc, failures, grace)
    except KeyboardInterrupt:
        # Ranks received the interrupt too; rank 0 checkpoints and stops them. Wait for it.
        print(
            "fleet launch: interrupted; waiting for the ranks to stop (again to kill)",
            file=sys.stderr,
            flush=True,
        )
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.kill()
            code = proc.wait()
    reader.join(timeout=5)
    if failures:
        rank, how = failures[0]
        others = sorted({r for r, _ in failures[1:] if r != rank})
        tail = f"; then rank(s) {others} stopped too" if others else ""
        if ended:
            tail += f"; the rest were still running {grace:g} s later and were ended"
        print(
            f"fleet launch: rank {rank} failed first ({how}){tail}. Its messages are above.",
            file=sys.stderr,
        )
        return 1
    if code != 0:
        print(f"fleet launch: mlx.launch exited with code {code}", file=sys.stderr)
        return code if code > 0 else 1
    return 0


def _wait(
    proc: subprocess.Popen, failures: list[tuple[int, str]], grace: float
) -> tuple[int, bool]:
    """mlx.launch's exit code, and whether the ranks had to be ended after `grace` seconds."""
    deadline = None
    while True:
        try:
            return proc.wait(timeout=0.5), False
        except subprocess.TimeoutExpired:
            pass
        if failures and deadline is None:
            deadline = time.monotonic() + grace
        if deadline is not None and time.monotonic() > deadline:
            _end_tree(proc)
            return proc.wait(), True


def _end_tree(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """Terminate mlx.launch and every process under it (local ranks, ssh clients, whose
    remote ranks then lose their terminal), then kill what is left."""
    import psutil

    try:
        parent = psutil.Process(proc.pid)
        family = [*parent.children(recursive=True), parent]
    except psutil.NoSuchProcess:
        return
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(family, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
