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
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from telemetry import balance
from trainer import heartbeat, restart
from trainer.blas import preload_env
from trainer.proctree import ProcessTree

BACKENDS = ("ring", "jaccl", "mpi", "nccl", "any")
_FAILED = re.compile(r"Node with rank (\d+) (?:exited with code (-?\d+)|was killed)")


class LaunchError(ValueError):
    """Something to fix before any rank starts."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from trainer.config import DefaultsHelp

    parser.formatter_class = DefaultsHelp  # every default in --help
    parser.description = (
        "Start a data-parallel run with mlx.launch: -n ranks on this machine, or one rank per "
        "entry of an mlx.launch hostfile. Everything after `--` is the rank's command, "
        "normally `train ARGS` (the arguments of `fleet train`)."
    )
    rank_arguments(parser)
    parser.add_argument(
        "--stop-grace",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds the ranks get to stop on their own after one fails, or after fleet "
        "launch gets SIGINT, SIGTERM or SIGHUP (they checkpoint first), before fleet launch "
        "ends them (default: %(default)s)",
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=0,
        metavar="N",
        help="when a rank dies or stalls, stop every rank and relaunch from the newest "
        "verified checkpoint, up to N times (default: %(default)s)",
    )
    parser.add_argument(
        "--restart-backoff",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds before the first restart, doubling for each next one, at most 300 "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--allow-shrink",
        action="store_true",
        help="on a restart, go on without hosts ssh cannot reach, with the same global batch "
        "split over the others by the balancer (the math does not change)",
    )
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="with --hostfile, start without `fleet check`'s checks of the hosts and the group",
    )
    parser.add_argument("--verbose", action="store_true", help="mlx.launch's debug output")
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="-- train ARGS (the rank's fleet subcommand)"
    )


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


def check_train_args(argv: list[str], world: int):
    """Parse the rank's `train` arguments here, so mistakes surface before any rank starts;
    returns the TrainConfig they give."""
    from trainer.config import FIELDS, ConfigError, TrainConfig, add_arguments, from_args

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
        from mlx._distributed_utils.launch import get_mpi_libname

        lib = get_mpi_libname() or "<your libmpi.so.N>"
        raise LaunchError(
            f"mlx.launch's MPI mode needs Open MPI 5; this mpirun is Open MPI "
            f"{m.group(1)}.{m.group(2)}. Start the ranks with mpirun itself instead: "
            f"mpirun -np {world} -x MLX_MPI_LIBNAME={lib} {sys.executable} -m fleet.cli "
            "train ... (fleet train joins MPI when mpirun starts it)"
        )


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
        from trainer import checkpoint

        try:
            path, _, _ = checkpoint.resolve(self.run_dir, checkpoint.LATEST)
            return list(checkpoint.read_json(path, checkpoint.STATE)["split"])
        except (checkpoint.CheckpointError, OSError, KeyError, ValueError):
            return self.cfg.split(self.world)


def plan_launch(args: argparse.Namespace) -> Plan:
    """Check everything that can be checked before any rank starts; LaunchError if not."""
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
    if args.restarts and cfg is None:
        raise LaunchError("--restarts needs a `train` command (it resumes from checkpoints)")
    return Plan(command, world, hosts, args.hostfile, backend, cfg)


def mlx_launch_argv(args: argparse.Namespace, plan: Plan) -> list[str]:
    """The command line of mlx.launch for one attempt of `plan`."""
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
    if plan.backend and plan.backend != "any":
        rank_env.append(f"FLEET_BACKEND={plan.backend}")  # the ranks join exactly this backend
    if threads and not any(e.startswith("OPENBLAS_NUM_THREADS=") for e in rank_env):
        # N ranks on one machine each default to every core: oversubscription would make
        # every rank look slow. Give each its share.
        rank_env.append(f"OPENBLAS_NUM_THREADS={threads}")
    for e in rank_env:
        mlx_argv += ["--env", e]
    return [
        sys.executable,
        "-c",
        "from mlx._distributed_utils.launch import main; main()",
        *mlx_argv,
        "--",
        "-m",
        "fleet.cli",
        *plan.command,
    ]


def main(args: argparse.Namespace) -> int:
    try:
        plan = plan_launch(args)
    except LaunchError as e:
        print(f"fleet launch: error: {e}", file=sys.stderr)
        return 2
    say = partial(print, file=sys.stderr, flush=True)
    if plan.hosts and not args.no_check:  # ranks on other machines: check them first
        from trainer.check import run_check

        ok, report = run_check(args, plan)
        if not ok:
            say(f"{report}\nfleet launch: the fleet check failed (--no-check to start anyway)")
            return 2
    restarts, last = 0, None
    while True:
        ssh_names = [h.get("ssh", "") for h in plan.hosts]
        sup = Supervisor(
            mlx_launch_argv(args, plan), preload_env(), ssh_names, args.stop_grace, plan.run_dir
        )
        code = sup.run()
        if code == 0 or sup.signalled or not sup.failures or not args.restarts:
            return code
        failure = restart.failure_of(sup.failures[0][0], sup.failures[0][1], plan.run_dir)
        if restarts == args.restarts:
            say(f"fleet launch: {failure.describe()}; no restarts left (--restarts {restarts})")
            return code
        if failure == last:
            say(
                f"fleet launch: the same failure twice ({failure.describe()}): restarting "
                "again would repeat it; stopping"
            )
            return code
        restarts, last = restarts + 1, failure
        wait = restart.backoff(restarts, args.restart_backoff)
        say(
            f"fleet launch: {failure.describe()}; restart {restarts} of {args.restarts} in "
            f"{wait:g} s from the newest verified checkpoint"
        )
        time.sleep(wait)
        try:
            plan = next_attempt(plan, restarts, failure, args.allow_shrink, say)
        except LaunchError as e:
            say(f"fleet launch: cannot restart: {e}")
            return code


def next_attempt(
    plan: Plan, number: int, failure: restart.Failure, allow_shrink: bool, say
) -> Plan:
    """The plan of restart `number`: the reachable hosts (all of them, or with --allow-shrink
    the ones ssh still reaches), the same global batch over them, resuming."""
    keep = list(range(plan.world))
    if plan.hosts:
        lost = [i for i, h in enumerate(plan.hosts) if not restart.reachable(h["ssh"])]
        if lost:
            names = ", ".join(plan.hosts[i]["ssh"] for i in lost)
            if not allow_shrink:
                raise LaunchError(
                    f"{names} cannot be reached over ssh; --allow-shrink would go on without it"
                )
            keep = [i for i in keep if i not in lost]
            if not keep:
                raise LaunchError("no host can be reached")
            say(f"fleet launch: {names} cannot be reached: going on with {len(keep)} rank(s)")
    old = plan.split()
    try:
        new = old if len(keep) == plan.world else restart.shrunk_split(old, keep, plan.run_dir)
    except balance.BalanceError as e:
        raise LaunchError(str(e)) from None
    hosts, hostfile = plan.hosts, plan.hostfile
    if plan.hosts and len(keep) < plan.world:
        hosts = [plan.hosts[i] for i in keep]
        folder = Path(plan.run_dir) / "launch"
        folder.mkdir(parents=True, exist_ok=True)
        hostfile = str(folder / f"hosts-restart-{number}.json")
        Path(hostfile).write_text(json.dumps(hosts, indent=2) + "\n")
    note = restart.restart_env(number, failure.describe(), old, new)
    return replace(
        plan,
        command=restart.relaunch_command(plan.command, plan.run_dir, new),
        world=len(keep),
        hosts=hosts,
        hostfile=hostfile,
        env=[f"FLEET_RESTART={note}"],
    )


class Supervisor:
    """Runs mlx.launch, passes its output through, names the rank that failed, and makes sure
    that nothing of the run outlives it.

    `hosts`: each rank's ssh name, for hostfile runs: an exit code of 255 there is ssh's own.
    `grace`: after a failure, the others normally notice the lost peer within a second and
    exit; ranks still running `grace` seconds later (waiting for a peer that never came up)
    are ended, with mlx.launch and everything under it. Ranks that the heartbeats in
    `run_dir` show stalled are ended at once: waiting for them is waiting forever.
    SIGINT, SIGTERM and SIGHUP to `fleet launch` ask every rank to stop at its next update
    (checkpoint, clean exit); after `grace` seconds, or a second signal, all is ended.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        hosts: list[str] | None = None,
        grace: float = 30.0,
        run_dir: str | Path | None = None,
    ) -> None:
        self.argv, self.env, self.hosts = argv, env, hosts or []
        self.grace, self.run_dir = grace, run_dir
        self.failures: list[tuple[int, str, int | None]] = []  # rank, how, exit code
        self.signalled: str | None = None
        self.deadline: float | None = None
        self.end_now = False
        self.stalled = ""  # what the heartbeats said of a rank that stopped, while it did

    def run(self) -> int:
        # Its own session: a terminal's Ctrl-C reaches fleet launch alone, which turns it into
        # one orderly stop instead of every process dying at its own moment.
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=None,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        self.tree = ProcessTree(self.proc.pid)
        reader = threading.Thread(target=self._relay, daemon=True)
        reader.start()
        signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {s: signal.getsignal(s) for s in signums}
        for s in signums:
            signal.signal(s, self._on_signal)
        try:
            ended, code = self._wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            left = self.tree.end()  # nothing of the run outlives it, ever
        reader.join(timeout=5)
        return self._verdict(code, ended, left)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signalled is not None:
            self.end_now = True
            print(f"fleet launch: {name} again: ending every rank now", file=sys.stderr, flush=True)
            return
        self.signalled = name
        n = self.tree.signal_ranks(signal.SIGTERM)
        self.deadline = time.monotonic() + self.grace
        print(
            f"fleet launch: {name}: asked {n} rank process(es) to stop at the next update "
            f"(checkpoint); ending them in {self.grace:g} s (again to end now)",
            file=sys.stderr,
            flush=True,
        )

    def _wait(self) -> tuple[bool, int]:
        """(whether the ranks had to be ended, mlx.launch's exit code)."""
        while True:
            try:
                return False, self.proc.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
            self.tree.refresh()
            if self.failures and self.deadline is None:
                self.deadline = time.monotonic() + self.grace
            if self.failures and not self.stalled:
                self.stalled = self._stalled()
                self.end_now = self.end_now or bool(self.stalled)
            if self.end_now or (self.deadline is not None and time.monotonic() > self.deadline):
                self.tree.end()
                return True, self.proc.wait()

    def _stalled(self) -> str:
        """What the heartbeats say about a rank that stopped, once a peer has failed."""
        if self.run_dir is None:
            return ""
        beats = heartbeat.read_all(self.run_dir)
        live = [b for r, b in beats.items() if r not in {f[0] for f in self.failures}]
        now = time.time()
        if live and all(now - b.beat > heartbeat.STALE_S for b in live):
            return heartbeat.culprit(beats, now)
        return ""

    def _relay(self) -> None:
        """Pass mlx.launch's stderr through, noting its "Node with rank N ..." lines; its own
        thread tracebacks (it cannot clean up a rank that never started) are left out."""
        assert self.proc.stderr is not None
        in_launcher_traceback = False
        for line in self.proc.stderr:
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
                code = int(m.group(2)) if m.group(2) else None
                how = f"exited with code {code}" if code is not None else "was killed"
                if code == 255 and rank < len(self.hosts) and self.hosts[rank]:
                    host = self.hosts[rank]
                    how += (
                        f": ssh could not start it on {host} (unreachable, login refused, or "
                        f"host key unknown; try `ssh {host} true`)"
                    )
                self.failures.append((rank, how, code))
            sys.stderr.write(line)
            sys.stderr.flush()

    def _verdict(self, code: int, ended: bool, left: int) -> int:
        say = partial(print, file=sys.stderr, flush=True)
        stalled = self.stalled
        if not stalled and self.run_dir is not None:
            stalled = heartbeat.culprit(heartbeat.read_all(self.run_dir))
        if self.signalled:
            how = "ranks that did not stop in time were ended" if ended else "the ranks stopped"
            say(f"fleet launch: stopped on {self.signalled}: {how}")
            return 128 + getattr(signal, self.signalled).value
        if self.failures:
            rank, how, rc = self.failures[0]
            others = sorted({r for r, _, _ in self.failures[1:] if r != rank})
            blamed = re.match(r"rank (\d+) ", stalled)
            if blamed and rc in (1, 3) and int(blamed.group(1)) != rank:
                # The first to exit was a healthy rank whose watchdog fired, or that lost
                # its peer: the heartbeats name the rank that really stopped.
                say(
                    f"fleet launch: {stalled}; rank {rank} exited first ({how}) waiting for "
                    f"it{f', then rank(s) {others}' if others else ''}"
                    + ("; the stalled rank was ended" if ended else "")
                )
                return 1
            tail = f"; then rank(s) {others} stopped too" if others else ""
            if ended:
                tail += f"; the rest were still running {self.grace:g} s later and were ended"
            say(f"fleet launch: rank {rank} failed first ({how}){tail}. Its messages are above.")
            return 1
        if code != 0:
            say(f"fleet launch: mlx.launch exited with code {code}")
            return code if code > 0 else 1
        if left:
            say(f"fleet launch: ended {left} process(es) of the run still running after it")
        return 0
