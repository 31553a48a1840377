"""Read mlx.launch's JSON hostfile and number its ranks.

The format is a list of ``{"ssh": "hostname", "ips": ["..."]}`` entries; rank r is entry r (one
rank per entry, a host may appear several times). Rank r serves telemetry on its own host's
loopback, at ``127.0.0.1:(port_base + r)``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from telemetry.typos import did_you_mean

DEFAULT_PORT_BASE = 47800
LOCALHOST = "localhost"


class HostfileError(ValueError):
    """The hostfile cannot be used; the message says where and why."""


@dataclass(frozen=True, slots=True)
class RankTarget:
    """Where one rank's telemetry is served: a host (an ssh name) and a loopback port on it."""

    rank: int
    host: str  # as written in the hostfile's "ssh"; `localhost` for --local
    port: int
    ips: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """`rank 2 (mac-mini)` for messages."""
        return f"rank {self.rank} ({self.host})"


HOSTFILE_KEYS = ("hosts", "backend", "envs")  # mlx.launch's object form, and each entry's
HOST_KEYS = ("ssh", "ips", "rdma")


def _known_keys(obj: dict, known: tuple[str, ...], where: str) -> None:
    """Refuse a key mlx.launch would ignore (a typo of `ips` would mean no ips)."""
    for key in obj:
        if key not in known:
            hint = did_you_mean(str(key), known, quote=True)
            raise HostfileError(
                f"{where}: unknown key {key!r}{hint}; the keys are {', '.join(known)}"
            )


def parse_hostfile(data: Any, source: str = "hostfile") -> list[tuple[str, tuple[str, ...]]]:
    """Validate decoded JSON (a list of hosts, or mlx.launch's {"hosts": [...], "backend": ...}
    object); return (ssh host, ips) per rank, in rank order."""
    if isinstance(data, dict) and "ssh" not in data:  # not one host written without its list
        _known_keys(data, HOSTFILE_KEYS, source)
        if not isinstance(data.get("hosts"), list):
            raise HostfileError(f'{source}: an object needs a "hosts" list')
        data = data["hosts"]
    if not isinstance(data, list):
        raise HostfileError(
            f'{source}: expected a JSON list of {{"ssh": ..., "ips": [...]}} entries (or '
            f'{{"hosts": [...]}}), got {type(data).__name__}'
        )
    if not data:
        raise HostfileError(f"{source}: the list is empty; give one entry per rank")
    hosts: list[tuple[str, tuple[str, ...]]] = []
    for i, entry in enumerate(data):
        where = f"{source}: entry {i} (rank {i})"
        if not isinstance(entry, dict):
            raise HostfileError(f"{where}: expected an object, got {type(entry).__name__}")
        _known_keys(entry, HOST_KEYS, where)
        ssh = entry.get("ssh")
        if not isinstance(ssh, str) or not ssh.strip():
            raise HostfileError(f'{where}: "ssh" must be a non-empty host name')
        if any(c.isspace() for c in ssh.strip()) or ssh.startswith("-"):
            raise HostfileError(f'{where}: "ssh" is not a valid host name: {ssh!r}')
        ips = entry.get("ips", [])
        if not isinstance(ips, list) or not all(isinstance(ip, str) and ip for ip in ips):
            raise HostfileError(f'{where}: "ips" must be a list of address strings')
        hosts.append((ssh.strip(), tuple(ips)))
    return hosts


def load_hostfile(path: str | Path) -> list[tuple[str, tuple[str, ...]]]:
    """Read and validate a hostfile; errors name the file and the problem."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise HostfileError(f"{p}: no such hostfile") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HostfileError(f"{p}: cannot read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HostfileError(
            f"{p}: not valid JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    return parse_hostfile(data, str(p))


def rank_targets(
    hosts: Sequence[tuple[str, Sequence[str]]], port_base: int = DEFAULT_PORT_BASE
) -> list[RankTarget]:
    """One target per rank, rank r at port_base + r on its host."""
    check_ports(port_base, len(hosts))
    return [RankTarget(r, h, port_base + r, tuple(ips)) for r, (h, ips) in enumerate(hosts)]


def local_targets(n: int, port_base: int = DEFAULT_PORT_BASE) -> list[RankTarget]:
    """N ranks on this machine (--local)."""
    if n < 1:
        raise HostfileError(f"-n must be at least 1, got {n}")
    check_ports(port_base, n)
    return [RankTarget(r, LOCALHOST, port_base + r) for r in range(n)]


def check_ports(port_base: int, world_size: int) -> None:
    if not port_base >= 1 or port_base + world_size - 1 > 65535:
        raise HostfileError(
            f"ports {port_base}..{port_base + world_size - 1} are outside 1..65535; "
            "choose another --port-base"
        )
