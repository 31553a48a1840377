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
import signal
import sys
import time
import uuid
from dataclasses import replace
from functools import partial
from pathlib import Path

from telemetry import balance, rundir
from trainer import lock
from trainer.blas import preload_env
from trainer.checkpoint import catalog
from trainer.launch import lifeline, restart
from trainer.launch.plan import (
    LaunchError,
    Plan,
    mlx_launch_argv,
    plan_launch,
    rank_arguments,
    watched,
)
from trainer.launch.supervisor import Stops, Supervisor


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
        "--lifeline-timeout",
        type=float,
        default=lifeline.TIMEOUT_S,
        metavar="S",
        help="a rank that hears nothing from fleet launch for S seconds (fleet launch killed, "
        "an ssh connection gone silent) stops at its next update with a checkpoint "
        "(default: %(default)s)",
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


def main(args: argparse.Namespace) -> int:
    # Before anything starts: a signal from here on is an orderly stop, never a launcher that
    # dies and leaves its ranks behind.
    stops = Stops().install()
    try:
        return _launch(args, stops)
    finally:
        stops.restore()


def _launch(args: argparse.Namespace, stops: Stops) -> int:
    try:
        plan = plan_launch(args)
        if not plan.hosts and plan.run_dir and (holder := lock.owner(plan.run_dir)):
            raise LaunchError(
                f"run folder {plan.run_dir} is in use by {holder.describe()}; stop that run "
                "first, or give another --run-dir"
            )
    except LaunchError as e:
        print(f"fleet launch: error: {e}", file=sys.stderr)
        return 2
    say = partial(print, file=sys.stderr, flush=True)
    if plan.hosts and not args.no_check:  # ranks on other machines: check them first
        from trainer.launch.check import run_check

        ok, report = run_check(args, plan)
        if not ok:
            say(f"{report}\nfleet launch: the fleet check failed (--no-check to start anyway)")
            return 2
    restarts, last = 0, None
    while True:
        ssh_names = [h.get("ssh", "") for h in plan.hosts]
        argv = mlx_launch_argv(args, plan, tether=True, launch_id=uuid.uuid4().hex[:12])
        sup = Supervisor(
            argv,
            preload_env(),
            ssh_names,
            args.stop_grace,
            plan.run_dir,
            stops=stops,
            watched=watched(plan),
        )
        saved = catalog.newest_serial(plan.run_dir) if plan.run_dir else 0
        code = sup.run()
        if code == 0 or sup.signalled or not sup.failures or not args.restarts:
            return code
        rank, how, _ = sup.first_failure()
        failure = restart.failure_of(rank, how, plan.run_dir, saved_after=saved)
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
        _sleep(wait, stops)
        if stops.signalled:
            say(f"fleet launch: stopped on {stops.signalled} before restart {restarts}")
            return 128 + getattr(signal, stops.signalled).value
        try:
            plan = next_attempt(plan, restarts, failure, args.allow_shrink, say)
        except LaunchError as e:
            say(f"fleet launch: cannot restart: {e}")
            return code


def _sleep(seconds: float, stops: Stops) -> None:
    """The backoff before a restart, cut short by a signal."""
    end = time.monotonic() + seconds
    while not stops.signalled and time.monotonic() < end:
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


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
        folder = rundir.at(plan.run_dir).launch
        folder.mkdir(parents=True, exist_ok=True)
        hostfile = str(folder / f"hosts-restart-{number}.json")
        Path(hostfile).write_text(json.dumps(hosts, indent=2) + "\n")
    record = restart.restart_env(number, failure.describe(), old, new)
    return replace(
        plan,
        command=restart.relaunch_command(plan.command, plan.run_dir, new),
        world=len(keep),
        hosts=hosts,
        hostfile=hostfile,
        env=[f"FLEET_RESTART={record}"],
    )
