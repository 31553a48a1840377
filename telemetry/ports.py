"""Which ports a run serves telemetry on: a free base when the default is taken, and its record.

Rank r serves on ``base + r``. With the default base, every rank of a run agrees on the first
candidate base whose port is free on every rank's host (one tiny all-reduce per candidate,
so ranks on several hosts agree), and rank 0 records it in ``RUN/telemetry/ports.json``::

    {"base": 47900, "world_size": 4, "bind": "127.0.0.1", "host": "studio", "run_id": "..."}

`fleet console --run-dir RUN`, `fleet telemetry send --run-dir RUN` and `tail --run-dir RUN`
read it, so no one types a port. An explicit base is used as given (and recorded too).
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telemetry import rundir
from telemetry.files import atomic_write, read_regular
from telemetry.protocol import DEFAULT_PORT_BASE

STEP = 100  # candidate bases go up in steps of this many ports
# 47800 + 13 steps keeps every candidate below 49152, where macOS's ephemeral range starts
# (Linux's is 32768-60999: there a short-lived outgoing connection may hold one for a while,
# which is one more reason to move on rather than fail).
CANDIDATES = 14


@dataclass(frozen=True, slots=True)
class RecordedPorts:
    """What rank 0 wrote in RUN/telemetry/ports.json."""

    base: int
    world_size: int
    bind: str = "127.0.0.1"
    host: str = ""
    run_id: str = ""

    def port(self, rank: int) -> int:
        return self.base + rank


def ports_path(run_dir: str | Path) -> Path:
    """RUN/telemetry/ports.json."""
    return rundir.at(run_dir).ports


def candidates(start: int, world_size: int, count: int = CANDIDATES) -> Iterator[int]:
    """Bases to try, `start` first; apart by at least `world_size`, so ranges never overlap."""
    step = max(STEP, -(-world_size // STEP) * STEP)
    for k in range(count):
        base = start + k * step
        if base + world_size - 1 > 65535:
            return
        yield base


def is_free(port: int, bind: str = "127.0.0.1") -> bool:
    """Whether a listening socket could bind `bind:port` now (as the server binds it)."""
    host = "127.0.0.1" if bind == "localhost" else bind
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener does
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def agree_base(
    start: int,
    world_size: int,
    rank: int,
    all_sum: Callable[[list[float]], list[float]],
    bind: str = "127.0.0.1",
    free: Callable[[int, str], bool] = is_free,
) -> int | None:
    """The first candidate base whose port `base + rank` is free on every rank, or None.

    Every rank of the run calls this at the same point: `all_sum` sums a list over the ranks
    (one small collective per candidate tried; every rank tries the same number).
    """
    for base in candidates(start, world_size):
        taken = 0.0 if free(base + rank, bind) else 1.0
        if all_sum([taken])[0] == 0:
            return base
    return None


def record(run_dir: str | Path, ports: RecordedPorts) -> Path:
    """Write RUN/telemetry/ports.json (rank 0, once its socket is bound)."""
    path = ports_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, encode(ports))
    return path


def encode(ports: RecordedPorts) -> str:
    """A ports record as RUN/telemetry/ports.json holds it."""
    fields = {
        "base": ports.base,
        "world_size": ports.world_size,
        "bind": ports.bind,
        "host": ports.host,
        "run_id": ports.run_id,
    }
    return json.dumps(fields, indent=2) + "\n"


def keep(run_dir: str | Path, served: RecordedPorts | None) -> Path | None:
    """Record what the run serves now, or forget an earlier record when it serves nothing."""
    if served is None:
        forget(run_dir)  # an earlier session's record would point at nothing
        return None
    return record(run_dir, served)


def forget(run_dir: str | Path) -> None:
    """Remove a record this run no longer serves (its telemetry socket is off)."""
    ports_path(run_dir).unlink(missing_ok=True)


def parse(data: bytes | str, where: str = rundir.PORTS) -> RecordedPorts:
    """A ports record from its JSON; ValueError saying what is wrong."""
    try:
        raw: Any = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object")
    base, world = raw.get("base"), raw.get("world_size")
    if not isinstance(base, int) or not 1 <= base <= 65535:
        raise ValueError(f"{where}: base must be a port number, got {base!r}")
    if not isinstance(world, int) or world < 1 or base + world - 1 > 65535:
        raise ValueError(f"{where}: world_size must be a positive count, got {world!r}")
    return RecordedPorts(
        base=base,
        world_size=world,
        bind=str(raw.get("bind") or "127.0.0.1"),
        host=str(raw.get("host") or ""),
        run_id=str(raw.get("run_id") or ""),
    )


def read(run_dir: str | Path) -> RecordedPorts | None:
    """The run's recorded ports, or None when it has none; ValueError if it is unreadable."""
    path = ports_path(run_dir)
    try:
        data = read_regular(path, 1 << 16)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror}") from None
    return parse(data, str(path))


# Where free_loopback_base looks: below Linux's ephemeral range (32768-60999) and macOS's
# (49152-65535), so an outgoing connection (an ssh session, a ring peer's connect) cannot take
# a port between the look and the bind, which a port from the kernel's own pick (bind to 0) can.
FREE_RANGE = (20000, 32000)


def free_loopback_base(count: int) -> int:
    """A port with `count` consecutive free loopback ports from it (for ranks started here:
    their ring ports, or their telemetry when the default base would not do)."""
    low, high = FREE_RANGE
    for _ in range(200):
        base = random.randrange(low, high - count)
        held = []
        try:
            for p in range(base, base + count):
                t = socket.socket()
                held.append(t)
                t.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for t in held:
                t.close()
    raise OSError(f"no {count} consecutive free loopback ports in {low}-{high}")


__all__ = [
    "DEFAULT_PORT_BASE",
    "RecordedPorts",
    "agree_base",
    "candidates",
    "forget",
    "free_loopback_base",
    "is_free",
    "keep",
    "parse",
    "ports_path",
    "read",
    "record",
]
