"""`fleet console` and `fleet demo`.

fleet console --hostfile hosts.json --run-dir runs/x      # over SSH, one link per rank
fleet console --local -n 4 --run-dir runs/x               # ranks on this machine
fleet console --hostfile hosts.json --once --json         # one snapshot, then exit
fleet console --replay runs/x                             # the run again, from its logs
fleet console --hostfile hosts.json --run-dir runs/x --gather logs/x   # every host's logs here
fleet demo                                                # a local run and its console
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path, PurePosixPath

from console.hostfile import DEFAULT_PORT_BASE, HostfileError
from telemetry import rundir
from telemetry.units import MiB


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "demo":
        from console import demo

        demo.configure(parser)
        return
    where = parser.add_argument_group("which ranks (choose one)")
    where.add_argument(
        "--hostfile", metavar="FILE", help="mlx.launch JSON hostfile: reach ranks over SSH"
    )
    where.add_argument("--local", action="store_true", help="ranks on this machine, no SSH")
    where.add_argument("--replay", metavar="RUN", help="replay a run folder's telemetry logs")
    parser.add_argument(
        "-n",
        type=int,
        default=0,
        help="with --local: number of ranks (default: the run's, recorded in "
        "RUN/telemetry/ports.json when --run-dir is given)",
    )
    parser.add_argument(
        "--run-dir",
        metavar="RUN",
        help="the run folder on rank 0's host (relative to the SSH home); its control.key "
        "signs commands, and its telemetry/ports.json says where the ranks serve. Without it "
        "the console only watches",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="rank r serves on 127.0.0.1:(base + r) on its host (default: the base the run "
        f"recorded in RUN/telemetry/ports.json, else {DEFAULT_PORT_BASE})",
    )
    parser.add_argument("--read-only", action="store_true", help="no key can change the run")
    parser.add_argument(
        "--once",
        action="store_true",
        help="take every rank's newest update, print a snapshot, exit "
        "(non-zero naming each rank that cannot be reached)",
    )
    parser.add_argument("--json", action="store_true", help="with --once: print JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=15.0,
        help="with --once: seconds to wait for every rank (default: %(default)s)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="with --replay: playback speed (default: %(default)s)",
    )
    parser.add_argument(
        "--gather",
        metavar="DEST",
        help="with --hostfile and --run-dir: copy every rank's telemetry logs into DEST over "
        "SFTP, for `fleet report DEST` and `--replay DEST`, then exit",
    )
    ssh = parser.add_argument_group("ssh")
    ssh.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="add unknown host keys to known_hosts (like OpenSSH accept-new); "
        "a changed key is always refused",
    )
    ssh.add_argument("--ssh-config", metavar="FILE", help="ssh config file (default ~/.ssh/config)")
    ssh.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="known_hosts file (default: the config's UserKnownHostsFile or ~/.ssh/known_hosts)",
    )
    ssh.add_argument("--ssh-user", metavar="USER", help="log in as USER (overrides the config)")


def run(name: str, args: argparse.Namespace) -> int:
    if name == "demo":
        from console import demo

        return demo.run(args)
    try:
        return _console(args)
    except (HostfileError, ValueError) as e:
        print(f"fleet console: {e}", file=sys.stderr)
        return 2


def _console(args: argparse.Namespace) -> int:
    modes = [m for m in ("hostfile", "local", "replay") if getattr(args, m)]
    if len(modes) != 1:
        raise ValueError("choose one of --hostfile FILE, --local -n N, or --replay RUN")
    if args.json and not args.once:
        raise ValueError("--json goes with --once")
    if args.replay:
        return _replay(args)
    if args.gather:
        return _gather(args)
    feed = build_feed(args)  # (its mistakes first: a wrong hostfile is said without a terminal)
    if not args.once:
        from console import terminal

        if problem := terminal.missing():
            raise ValueError(problem)
    if args.once:
        from console import once

        fleet = once.reach(feed, timeout=args.timeout)
        advice = nobody_advice(args.run_dir if args.local else None) if fleet.nobody() else ""
        if args.json:
            once.print_json(fleet, sys.stdout, advice)
        elif not fleet.nobody():  # an empty table says nothing the error does not
            once.print_table(fleet)
        bad = once.unreachable(fleet, advice)
        for line in bad:
            reach = "" if fleet.nobody() else "cannot reach "  # that line says it all itself
            print(f"fleet console: {reach}{line}", file=sys.stderr)
        return 1 if bad else 0
    from console import terminal
    from console.app import FleetApp

    run_dir = args.run_dir if args.local else None
    with terminal.on_terminal():  # stdout piped (`| tee`): draw on the terminal, at its size
        app = FleetApp(feed, read_only=args.read_only, advice=lambda: nobody_advice(run_dir))
        return app.run() or 0


def nobody_advice(run_dir: str | None) -> str:
    """What to do when no rank answers: a run folder's finished run can be replayed."""
    from console.command import typed

    replay = typed(["console", "--replay", run_dir or "RUN"])
    if not run_dir:
        return f"start a run, or watch a finished one with: {replay}"
    end = run_end(run_dir)
    if end is None:
        return f"{run_dir} holds no telemetry logs yet: has its run started?"
    if end.how == "ended":
        resume = typed(["train", "--resume", "latest", "--run-dir", run_dir])
        return (
            f"its run {end.describe()} without a stop logged (killed, or crashed?): replay "
            f"it with: {replay}; resume it with: {resume}"
        )
    return f"its run {end.describe()}: replay it with: {replay}"


def run_end(run_dir: str):
    """How the run in `run_dir` ended, from its logs (a `snapshot.RunEnd`), or None."""
    from console.replay import ReplayError, ReplayFeed
    from console.snapshot import ending

    try:
        feed = ReplayFeed(run_dir)
    except ReplayError:
        return None
    return ending(replayed(feed))


def replayed(feed):
    """A fleet holding the whole of a replay's log (for --once and the end of a run)."""
    from console.feed import Inbox
    from console.fleet import Fleet

    fleet = Fleet(feed.targets, clock=lambda: feed.clock)
    inbox = Inbox()
    feed.attach(inbox)
    feed.start()
    feed.finish()
    fleet.absorb(inbox.drain())
    return fleet


def build_feed(args: argparse.Namespace):
    """The live feed the arguments describe (SSH for --hostfile, TCP for --local)."""
    from console import hostfile
    from console.connectors import TCPConnector
    from console.live import LiveFeed

    if args.local:
        if args.run_dir and not Path(args.run_dir).expanduser().is_dir():
            raise ValueError(
                f"--run-dir {args.run_dir}: no such run folder on this machine (the "
                "--run-dir of `fleet train` or `fleet launch`)"
            )
        recorded = _recorded_locally(args.run_dir) if args.run_dir else None
        n = args.n or (recorded.world_size if recorded else 0)
        if n < 1 and args.run_dir:
            raise ValueError(
                f"{args.run_dir} has recorded no telemetry ports yet "
                f"({rundir.at(args.run_dir).ports}): has its run started? Give -n N to wait "
                "for N ranks"
            )
        if n < 1:
            raise ValueError(
                "--local needs -n N, the number of ranks (or --run-dir RUN of a run that "
                "recorded its ports)"
            )
        targets = hostfile.local_targets(n, _base(args.port_base, recorded))
        connector = TCPConnector()
    else:
        from console.connectors import SSHConnector

        pool = _ssh_pool(args)
        hosts = hostfile.load_hostfile(args.hostfile)
        recorded = None
        if args.port_base is None and args.run_dir:
            recorded = _recorded_over_ssh(pool, hosts[0][0], args.run_dir)
        targets = hostfile.rank_targets(hosts, _base(args.port_base, recorded))
        connector = SSHConnector(pool)
    return LiveFeed(targets, connector, run_dir=args.run_dir, read_only=args.read_only)


def _base(given: int | None, recorded) -> int:
    """--port-base as given, else the run's recorded base, else the default."""
    if given is not None:
        return given
    return recorded.base if recorded is not None else DEFAULT_PORT_BASE


def _recorded_locally(run_dir: str):
    """The ports the run in `run_dir` recorded (telemetry.ports.RecordedPorts), or None."""
    from telemetry import ports

    return ports.read(Path(run_dir).expanduser())  # ValueError names an unreadable record


def _recorded_over_ssh(pool, host: str, run_dir: str):
    """The ports recorded in `run_dir` on rank 0's host, or None (an older run, or none)."""
    from console.ssh import SSHError
    from telemetry import ports

    path = str(rundir.at(PurePosixPath(run_dir)).ports)
    try:
        return ports.parse(pool.read_file(host, path), f"{host}:{path}")
    except (SSHError, OSError):
        return None  # no record there: the default base, as before records existed


def _ssh_pool(args: argparse.Namespace):
    from console.ssh import SSHOptions, SSHPool

    options = SSHOptions(
        config_path=_path(args.ssh_config),
        known_hosts=_path(args.known_hosts),
        accept_new=args.accept_new_host_keys,
        user=args.ssh_user,
    )
    return SSHPool(options)


def _gather(args: argparse.Namespace) -> int:
    from console import gather, hostfile

    if not args.hostfile:
        raise ValueError(
            "--gather fetches logs from a hostfile's hosts; with --local they are already in "
            "--run-dir (fleet report RUN)"
        )
    if not args.run_dir:
        raise ValueError("--gather needs --run-dir RUN, the run folder on the ranks' hosts")
    targets = hostfile.rank_targets(
        hostfile.load_hostfile(args.hostfile), _base(args.port_base, None)
    )
    dest = Path(args.gather)
    pool = _ssh_pool(args)
    try:
        copied, problems = gather.gather(
            pool, targets, args.run_dir, dest, say=lambda line: print(line, file=sys.stderr)
        )
    except gather.GatherError as e:
        raise ValueError(str(e)) from None
    finally:
        pool.close()
    fetched = [c for c in copied if c.fetched]
    size = sum(c.size for c in fetched) / MiB
    print(
        f"gathered {len(fetched)} log files ({size:.1f} MiB; {len(copied) - len(fetched)} "
        f"unchanged) from {len({c.host for c in copied})} hosts into {dest}: "
        f"fleet report {dest}"
    )
    for p in problems:
        print(f"fleet console: {p}", file=sys.stderr)
    return 1 if problems else 0


def _path(p: str | None) -> Path | None:
    return Path(p).expanduser() if p else None


def _replay(args: argparse.Namespace) -> int:
    from console.replay import ReplayError, ReplayFeed

    try:
        feed = ReplayFeed(args.replay, speed=args.speed)
    except ReplayError as e:
        print(f"fleet console: {e}", file=sys.stderr)
        return 2
    if args.once:
        from console import once

        fleet = replayed(feed)
        end = fleet.last_time  # ages are measured from the end of the log
        if args.json:
            once.print_json(fleet, sys.stdout, now=end)
        else:
            once.print_table(fleet, now=end)
        return 0
    from console import terminal
    from console.app import FleetApp

    if problem := terminal.missing():
        raise ValueError(problem)
    with terminal.on_terminal():
        return FleetApp(feed, read_only=True).run() or 0
