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
from pathlib import Path

from console.hostfile import DEFAULT_PORT_BASE, HostfileError


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
    parser.add_argument("-n", type=int, default=0, help="with --local: number of ranks")
    parser.add_argument(
        "--run-dir",
        metavar="RUN",
        help="the run folder on rank 0's host (relative to the SSH home); its control.key "
        "signs commands. Without it the console only watches",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=DEFAULT_PORT_BASE,
        help="rank r serves on 127.0.0.1:(base + r) on its host",
    )
    parser.add_argument("--read-only", action="store_true", help="no key can change the run")
    parser.add_argument(
        "--once",
        action="store_true",
        help="gather one update from every rank, print a snapshot, exit "
        "(non-zero naming each rank that cannot be reached)",
    )
    parser.add_argument("--json", action="store_true", help="with --once: print JSON")
    parser.add_argument(
        "--timeout", type=float, default=15.0, help="with --once: seconds to wait for every rank"
    )
    parser.add_argument("--speed", type=float, default=1.0, help="with --replay: playback speed")
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
    feed = build_feed(args)
    if args.once:
        from console import once

        fleet = once.reach(feed, timeout=args.timeout)
        if args.json:
            once.print_json(fleet, sys.stdout)
        else:
            once.print_table(fleet)
        bad = once.unreachable(fleet)
        for line in bad:
            print(f"fleet console: cannot reach {line}", file=sys.stderr)
        return 1 if bad else 0
    from console.app import FleetApp

    return FleetApp(feed, read_only=args.read_only).run() or 0


def build_feed(args: argparse.Namespace):
    """The live feed the arguments describe (SSH for --hostfile, TCP for --local)."""
    from console import hostfile
    from console.connectors import TCPConnector
    from console.live import LiveFeed

    if args.local:
        if args.n < 1:
            raise ValueError("--local needs -n N, the number of ranks")
        targets = hostfile.local_targets(args.n, args.port_base)
        connector = TCPConnector()
    else:
        from console.connectors import SSHConnector

        targets = hostfile.rank_targets(hostfile.load_hostfile(args.hostfile), args.port_base)
        connector = SSHConnector(_ssh_pool(args))
    return LiveFeed(targets, connector, run_dir=args.run_dir, read_only=args.read_only)


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
    targets = hostfile.rank_targets(hostfile.load_hostfile(args.hostfile), args.port_base)
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
    size = sum(c.size for c in fetched) / 1024**2
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
        from console.feed import Inbox
        from console.fleet import Fleet

        fleet = Fleet(feed.targets, clock=lambda: feed.clock)
        inbox = Inbox()
        feed.attach(inbox)
        feed.start()
        feed.finish()
        fleet.absorb(inbox.drain())
        if args.json:
            once.print_json(fleet, sys.stdout)
        else:
            once.print_table(fleet)
        return 0
    from console.app import FleetApp

    return FleetApp(feed, read_only=True).run() or 0
