"""`fleet telemetry tail|send` and `fleet report`: a rank's feed, its control, a run's summary."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from telemetry import auth, ports
from telemetry.client import TelemetryClient
from telemetry.errors import AuthError, ConnectionLost, TelemetryError, Unreachable
from telemetry.protocol import DEFAULT_PORT_BASE
from telemetry.records import COMMANDS, Dropped, Event, Hello, Message, Reply, Update
from telemetry.split import parse as parse_split
from telemetry.units import gib_text


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """Add the options of `fleet telemetry` or `fleet report` to `parser`."""
    if name == "report":
        parser.add_argument(
            "run_dirs",
            metavar="RUN",
            nargs="+",
            help="a run folder; several put the runs side by side with their val-loss curves",
        )
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument(
            "--plot",
            metavar="FILE",
            default="",
            help="also draw each run's validation loss and smoothed train loss into FILE "
            "(.png or .svg; needs matplotlib: the `plot` extra); refused when no run has "
            "anything to draw",
        )
        parser.add_argument(
            "--x",
            choices=("updates", "tokens"),  # telemetry.compare.AXES (imports pyarrow)
            default="updates",
            help="the curves' x axis: updates, or tokens seen (runs with different batches "
            "compare per token, not per update) (default: %(default)s)",
        )
        return
    sub = parser.add_subparsers(dest="action", required=True, metavar="{tail,send}")
    tail = sub.add_parser("tail", help="print a rank's messages as they come")
    tail.add_argument(
        "target",
        nargs="?",
        metavar="HOST:PORT",
        help="the rank's address (HOST:PORT, or PORT for 127.0.0.1, or a rank-N.sock path); "
        "with --run-dir instead, the port the run recorded",
    )
    tail.add_argument(
        "--run-dir", metavar="RUN", help="find the rank's port in RUN/telemetry/ports.json"
    )
    tail.add_argument(
        "--rank", type=int, default=0, help="with --run-dir: which rank (default: %(default)s)"
    )
    tail.add_argument(
        "--count",
        type=int,
        default=0,
        help="print the newest N updates (history first, then live ones) and stop "
        "(default: %(default)s = print everything, never stop)",
    )
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        help="connect timeout, seconds (default: %(default)s)",
    )

    send = sub.add_parser("send", help="send a signed command to rank 0 and print its reply")
    send.add_argument("--run-dir", required=True, metavar="RUN", help="run folder (control.key)")
    send.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="the run's port base (rank 0's) (default: the one recorded in "
        f"RUN/telemetry/ports.json, else {DEFAULT_PORT_BASE})",
    )
    send.add_argument(
        "--host", default="127.0.0.1", help="where rank 0 serves (default: %(default)s)"
    )
    send.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds to wait for the command to apply (default: %(default)s)",
    )
    send.add_argument(
        "cmd", choices=sorted(COMMANDS), metavar="CMD", help=", ".join(sorted(COMMANDS))
    )
    send.add_argument(
        "args",
        nargs="?",
        metavar="ARGS",
        help="rebalance: the new split, e.g. 2,2,2; autopilot: on or off; any command: a "
        "JSON object",
    )
    send.add_argument(
        "--json", action="store_true", help="print the rank's reply as JSON, as it came"
    )


def run(name: str, args: argparse.Namespace) -> int:
    """Run `fleet telemetry ...` or `fleet report`; returns the exit status."""
    if name == "report":
        return _report(args)
    if args.action == "tail":
        return _tail(args)
    return _send(args)


def _err(message: str) -> None:
    print(f"fleet: {message}", file=sys.stderr)


# --- report -----------------------------------------------------------------------------------


def _report(args: argparse.Namespace) -> int:
    from telemetry import compare
    from telemetry.report import render, summarize

    several = len(args.run_dirs) > 1
    drawn = ""
    try:
        summary = compare.compare(args.run_dirs) if several else summarize(args.run_dirs[0])
        if args.plot:
            drawn = compare.plot(
                summary if several else compare.compare(args.run_dirs), args.plot, args.x
            )
    except TelemetryError as e:
        _err(str(e))
        return 1
    if args.json:
        print(json.dumps(summary, indent=2))
    elif several:
        compare.render(summary, x=args.x)
    else:
        render(summary)
    if drawn:
        print(f"{args.plot}: drew {drawn}")
    return 0


# --- tail -------------------------------------------------------------------------------------


def _connect(target: str, timeout: float, key: bytes | None = None) -> TelemetryClient:
    if "/" in target or target.endswith(".sock"):
        return TelemetryClient.connect_unix(target, key=key, timeout=timeout)
    host, _, port = target.rpartition(":")
    try:
        port_n = int(port)
    except ValueError:
        raise TelemetryError(
            f"bad address {target!r}: expected HOST:PORT, PORT or a .sock path"
        ) from None
    return TelemetryClient.connect(
        host.strip("[]") or "127.0.0.1", port_n, key=key, timeout=timeout
    )


def recorded_base(run_dir: str) -> int:
    """The port base a run recorded in RUN/telemetry/ports.json, else the default."""
    recorded = ports.read(run_dir)  # ValueError when the record is unreadable
    return recorded.base if recorded is not None else DEFAULT_PORT_BASE


def _tail_target(args: argparse.Namespace) -> str:
    if args.target:
        return args.target
    if not args.run_dir:
        raise ValueError("give the rank's HOST:PORT, or --run-dir RUN (and --rank N)")
    return str(recorded_base(args.run_dir) + args.rank)


def not_running(e: Unreachable, run_dir: str | None, what: str) -> str:
    """A refused connection, said as what it means: the run is not running (finished, or
    not started), and where a finished run is read back instead."""
    run = run_dir or "RUN"
    return (
        f"{e}: no rank serves there, so the run is not running (finished, or not started "
        f"yet); {what}. A finished run reads back with `fleet report {run}` or "
        f"`fleet console --replay {run}`"
    )


def _tail(args: argparse.Namespace) -> int:
    try:
        client = _connect(_tail_target(args), args.timeout)
    except Unreachable as e:
        _err(not_running(e, args.run_dir, "tail reads a running rank"))
        return 1
    except (TelemetryError, ValueError) as e:
        _err(str(e))
        return 1
    updates = 0
    # The hello says how many updates of history follow, oldest first: with --count N, the
    # newest N of them are what was asked for, not the oldest.
    skip = max(0, client.hello.backlog - args.count) if args.count > 0 else 0
    try:
        _emit(client.hello, args.json)
        while args.count <= 0 or updates < args.count:
            msg = client.recv()
            if msg is None:
                continue
            if isinstance(msg, Update) and skip:
                skip -= 1
                continue
            _emit(msg, args.json)
            updates += isinstance(msg, Update)
    except ConnectionLost as e:
        _err(str(e))
        return 0 if args.count <= 0 else 1
    except TelemetryError as e:
        _err(str(e))
        return 1
    except BrokenPipeError:  # `| head`: the reader left, which is fine
        sys.stderr.close()
        return 0
    finally:
        client.close()
    return 0


def _emit(msg: Message, as_json: bool) -> None:
    if as_json:
        print(json.dumps(msg.to_msg(), default=str), flush=True)
    else:
        print(describe(msg), flush=True)


def describe(msg: Message) -> str:
    """One human line for a message."""
    if isinstance(msg, Hello):
        return (
            f"hello: rank {msg.rank}/{msg.world_size} of run {msg.run_id} on {msg.host} "
            f"({msg.chip}, {gib_text(msg.memory_total)}), local batch {msg.local_batch}; "
            f"history: {msg.backlog} updates, {msg.event_backlog} events"
        )
    if isinstance(msg, Update):
        ms = lambda s: f"{s * 1000:.0f}ms"  # noqa: E731
        return (
            f"step {msg.step} r{msg.rank} loss {msg.loss:.4f} lr {msg.lr:.2e} | "
            f"compute {ms(msg.compute_s)} wait {ms(msg.wait_s)} xfer {ms(msg.transfer_s)} "
            f"update {ms(msg.update_s)} | {msg.tokens_per_s / 1000:.1f}k tok/s | "
            f"peak {gib_text(msg.peak_mem)}" + (" (simulated)" if msg.simulated else "")
        )
    if isinstance(msg, Event):
        data = f" {json.dumps(msg.data, default=str)}" if msg.data else ""
        text = f": {msg.message}" if msg.message else ""
        return f"event step {msg.step} r{msg.rank} {msg.kind}{text}{data}"
    if isinstance(msg, Dropped):
        return f"dropped {msg.count} records (total {msg.total}): reading slower than the run"
    if isinstance(msg, Reply):
        if msg.ok:
            return f"reply {msg.id}: applied {json.dumps(msg.result, default=str)}"
        return f"reply {msg.id}: refused: {msg.error}"
    return repr(msg)


# --- send -------------------------------------------------------------------------------------


USAGE = {  # what the commands that take an argument need, said as a person would type it
    "rebalance": "rebalance needs the new split, one local batch per rank with the same "
    "global batch: fleet telemetry send --run-dir RUN rebalance 2,2,2",
    "autopilot": "autopilot needs on or off: fleet telemetry send --run-dir RUN autopilot on",
}


def parse_args(cmd: str, text: str | None) -> dict[str, Any]:
    """The args map of a command from its command-line form; ValueError says what is wrong."""
    if not text:
        if cmd in USAGE:
            raise ValueError(USAGE[cmd])
        return {}
    if text.lstrip().startswith("{"):
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("ARGS must be a JSON object")
        return value
    if cmd == "rebalance":
        return {"split": parse_split(text)}  # SplitError is a ValueError
    if cmd == "autopilot":
        if text.strip().lower() not in ("on", "off"):
            raise ValueError(f"autopilot takes on or off (got {text!r})")
        return {"on": text.strip().lower() == "on"}
    raise ValueError(f"{cmd} takes no arguments (got {text!r})")


def applied(cmd: str, result: dict[str, Any]) -> str:
    """An applied command's reply as a sentence: "rebalance 2,2,2 applied at update 10"."""
    at = f"at update {result['step']}" if result.get("step") is not None else "(update unknown)"
    if cmd == "rebalance" and result.get("split"):
        return f"rebalance {','.join(map(str, result['split']))} applied {at}"
    if cmd == "autopilot":
        return f"autopilot {'on' if result.get('on') else 'off'} {at}"
    if cmd == "checkpoint":
        path = result.get("path")
        return f"checkpoint saved {at}: {path}" if path else f"checkpoint {at}: not written"
    if cmd == "stop":
        text = f"stopped {at}" + (f", checkpoint {result['path']}" if result.get("path") else "")
        return text + (f"; to go on: {result['resume']}" if result.get("resume") else "")
    done = {"pause": "paused", "resume": "resumed"}.get(cmd, f"{cmd} applied")
    return f"{done} {at}"


def _send(args: argparse.Namespace) -> int:
    try:
        cmd_args = parse_args(args.cmd, args.args)
    except ValueError as e:
        _err(str(e))
        return 2
    try:
        key = auth.read_key(args.run_dir)
    except AuthError as e:
        _err(str(e))
        return 2
    try:
        base = args.port_base if args.port_base is not None else recorded_base(args.run_dir)
    except ValueError as e:
        _err(str(e))
        return 2
    try:
        with TelemetryClient.connect(args.host, base, key=key, timeout=10.0) as client:
            if client.hello.rank != 0:
                _err(f"{args.host}:{base} is rank {client.hello.rank}, not rank 0")
                return 2
            reply = client.command(args.cmd, cmd_args, timeout=args.timeout)
    except Unreachable as e:
        _err(not_running(e, args.run_dir, "commands reach a run while it runs"))
        return 2
    except TelemetryError as e:
        _err(str(e))
        return 2
    if args.json:
        raw = {"id": reply.id, "ok": reply.ok, "result": reply.result, "error": reply.error}
        print(json.dumps(raw))
    elif reply.ok:
        print(applied(args.cmd, reply.result))
    if not reply.ok:
        _err(f"{args.cmd} refused: {reply.error}")
        return 1
    return 0
