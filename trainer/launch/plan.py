"""What one attempt of a launch starts: the hostfile, the ranks' arguments checked, and
mlx.launch's command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.launch import lifeline
from trainer.lock import LAUNCH_ID_ENV

BACKENDS = ("ring", "jaccl", "mpi", "nccl", "any")
LAUNCH_ENV = "FLEET_LAUNCH"  # `fleet launch -n 3`: how ranks were started (their resume hint)


class LaunchError(ValueError):
    """Something to fix before any rank starts."""


def rank_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the ranks run and how mlx.launch starts them: `fleet launch`'s and `fleet
    check`'s flags alike."""
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
        help="ring backend: first port, one more per rank and IP (default: %(default)s)",
    )
    parser.add_argument(
        "--nccl-port",
        type=int,
        default=12345,
        help="nccl backend: rank 0 port (default: %(default)s)",
    )
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
        _known_keys(data, HOSTFILE_KEYS, f"hostfile {path}")
        backend = data.get("backend", "") or ""
        if "hosts" not in data:
            raise LaunchError(f"hostfile {path}: an object needs a `hosts` list")
        data = data["hosts"]
    if not isinstance(data, list) or not data:
        raise LaunchError(f"hostfile {path}: expected a non-empty list of hosts")
    for i, h in enumerate(data):
        if isinstance(h, dict):
            _known_keys(h, HOST_KEYS, f"hostfile {path}: entry {i}")
        if not isinstance(h, dict) or not isinstance(h.get("ssh"), str) or not h["ssh"]:
            raise LaunchError(f"hostfile {path}: entry {i} needs an `ssh` host name, got {h!r}")
        ips = h.get("ips", [])
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            raise LaunchError(
                f"hostfile {path}: entry {i} ({h['ssh']}): `ips` must be a list of strings"
            )
    return data, backend


HOSTFILE_KEYS = ("hosts", "backend", "envs")  # mlx.launch's hostfile object, and each host's
HOST_KEYS = ("ssh", "ips", "rdma")


def _known_keys(obj: dict, known: tuple[str, ...], where: str) -> None:
    """Refuse a key mlx.launch would ignore silently (a typo of `ips` means no ips)."""
    from telemetry.typos import did_you_mean

    for key in obj:
        if key not in known:
            raise LaunchError(
                f"{where}: unknown key {key!r}{did_you_mean(str(key), known, quote=True)}; "
                f"the keys are {', '.join(known)}"
            )


def check_train_args(argv: list[str], world: int):
    """Parse the rank's `train` arguments here, so mistakes surface before any rank starts;
    returns the TrainConfig they give."""
    from telemetry.typos import Parser  # a typo: one usage line and the nearest flag
    from trainer.config import FIELDS, ConfigError, TrainConfig, add_arguments, from_args

    parser = Parser(prog="fleet train", add_help=False)
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
            cfg = from_args(args)
            cfg.split(world)
        for name in ("cache_limit_gb", "memory_limit_gb", "wired_limit_gb", "simulate_peak_gb"):
            cfg.per_rank(name, world, 0)
        cfg.slowdown(world, 0)
        if cfg.data and not Path(cfg.data).is_dir() and not cfg.synthetic:
            raise ConfigError(f"--data {cfg.data}: no such dataset folder on this machine")
    except ConfigError as e:
        raise LaunchError(str(e)) from None
    return cfg


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
        lib = _mpi_libname() or "<your libmpi.so.N>"
        raise LaunchError(
            f"mlx.launch's MPI mode needs Open MPI 5; this mpirun is Open MPI "
            f"{m.group(1)}.{m.group(2)}. Start the ranks with mpirun itself instead: "
            f"mpirun -np {world} -x MLX_MPI_LIBNAME={lib} {sys.executable} -m fleet.cli "
            "train ... (fleet train joins MPI when mpirun starts it)"
        )


def _mpi_libname() -> str:
    """mlx.launch's own guess at libmpi's name, asked of a child: the launcher imports no mlx
    (mlx._distributed_utils loads mlx.core)."""
    code = "from mlx._distributed_utils.launch import get_mpi_libname as f; print(f() or '')"
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


@dataclass
class Plan:
    """One attempt of a launch: where the ranks run and what each of them runs."""

    command: list[str]  # the rank's fleet subcommand and its arguments
    world: int
    hosts: list[dict]  # hostfile entries ([] for -n ranks on this machine)
    hostfile: str | None
    backend: str | None
    cfg: Any = None  # the parsed TrainConfig when the command is `train`
    env: list[str] = field(default_factory=list)  # extra KEY=VALUE for every rank

    @property
    def run_dir(self) -> str | None:
        return self.cfg.run_dir if self.cfg is not None else None

    def split(self) -> list[int]:
        """The split in force: the newest checkpoint's (rebalances included), else the flags'."""
        from trainer.checkpoint import catalog

        try:
            path, _, _ = catalog.resolve(self.run_dir, catalog.LATEST)
            return list(catalog.read_json(path, catalog.STATE)["split"])
        except (catalog.CheckpointError, OSError, KeyError, ValueError):
            return self.cfg.split(self.world)


def check_flags(args: argparse.Namespace) -> None:
    """fleet launch's own numbers: finite, and not below what each can mean."""
    import math

    for name, low, strict in (
        ("stop_grace", 0.0, False),
        ("restart_backoff", 0.0, False),
        ("lifeline_timeout", 0.0, True),
        ("restarts", 0, False),
    ):
        value = getattr(args, name, None)
        if value is None:
            continue  # fleet check has none of these
        flag = f"--{name.replace('_', '-')}"
        if not math.isfinite(value):
            raise LaunchError(f"{flag} must be a finite number, got {value}")
        if value < low or (strict and value == low):
            need = f"more than {low:g}" if strict else f"at least {low:g}"
            raise LaunchError(f"{flag} must be {need}, got {value:g}")


def plan_launch(args: argparse.Namespace) -> Plan:
    """Check everything that can be checked before any rank starts; LaunchError if not."""
    check_flags(args)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
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
    cfg = check_train_args(command[1:], world) if command[0] == "train" else None
    if backend is None and cfg is not None and cfg.device == "cpu":
        # CPU ranks talk over TCP: left to choose, mlx.launch would take NCCL on a CUDA
        # machine and pin each rank to a GPU of its own (ranks beyond the GPUs: none at all).
        backend = "ring"
    splits = cfg is not None and backend in ("ring", "jaccl")
    if splits and (why := cfg.needs_split_groups(world, backend)) is not None:
        raise LaunchError(why)
    if cfg is not None and not hosts and not cfg.resume and not cfg.overwrite:
        # A new run on this machine: refused here, before any rank starts (with --hostfile,
        # `fleet check` asks each host, and every rank refuses on its own as well).
        from telemetry import rundir

        if why := rundir.refusal(cfg.run_dir):
            raise LaunchError(why)
    if args.restarts and cfg is None:
        raise LaunchError("--restarts needs a `train` command (it resumes from checkpoints)")
    return Plan(command, world, hosts, args.hostfile, backend, cfg)


def watched(plan: Plan) -> bool:
    """Whether the ranks of `plan` read the lifeline: `train` ranks that mlx.launch starts
    itself (under mpirun only rank 0 would get its input)."""
    return plan.command[:1] == ["train"] and plan.backend != "mpi"


def mlx_launch_argv(
    args: argparse.Namespace, plan: Plan, tether: bool = False, launch_id: str = ""
) -> list[str]:
    """The command line of mlx.launch for one attempt of `plan`. With `tether`, mlx.launch
    holds fleet launch's lifeline (trainer/launch/lifeline.py) and `train` ranks watch it;
    `launch_id` names the attempt's ranks as one run (the run folder's lock)."""
    mlx_argv = [
        "--python",
        args.python,
        "--starting-port",
        str(args.starting_port),
        "--nccl-port",
        str(args.nccl_port),
    ]
    mlx_argv += ["--hostfile", plan.hostfile] if plan.hostfile else ["-n", str(plan.world)]
    if plan.backend and plan.backend != "any":
        mlx_argv += ["--backend", plan.backend]
    if args.verbose:
        mlx_argv.append("--verbose")
    threads = max(1, (os.cpu_count() or 1) // plan.world) if not plan.hostfile else None
    rank_env = [*args.env, *plan.env]
    where = f"--hostfile {shlex.quote(plan.hostfile)}" if plan.hostfile else f"-n {plan.world}"
    rank_env.append(f"{LAUNCH_ENV}=fleet launch {where}")
    if tether and watched(plan):
        timeout = getattr(args, "lifeline_timeout", lifeline.TIMEOUT_S)
        rank_env.append(f"{lifeline.ENV}={timeout:g}")
    if launch_id:
        rank_env.append(f"{LAUNCH_ID_ENV}={launch_id}")
    if plan.backend and plan.backend != "any":
        rank_env.append(f"FLEET_BACKEND={plan.backend}")  # the ranks join exactly this backend
    if threads and not any(e.startswith("OPENBLAS_NUM_THREADS=") for e in rank_env):
        # N ranks on one machine each default to every core: oversubscription would make
        # every rank look slow. Give each its share.
        rank_env.append(f"OPENBLAS_NUM_THREADS={threads}")
    for e in rank_env:
        mlx_argv += ["--env", e]
    start = "from mlx._distributed_utils.launch import main; main()"
    if tether:  # in mlx.launch's process, before it starts anything
        start = f"from trainer.launch.lifeline import tether; tether(); {start}"
    return [
        sys.executable,
        "-c",
        start,
        *mlx_argv,
        "--",
        "-m",
        "fleet.cli",
        *plan.command,
    ]
