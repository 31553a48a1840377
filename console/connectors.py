"""How the console reaches a rank's telemetry port: loopback TCP (--local) or an SSH channel.

A connector opens a socket-like to one rank, reads the run's control key where the run is,
and says which run id ranks serving a folder report. `console.links` uses one per fleet.
"""

from __future__ import annotations

import socket
from pathlib import PurePosixPath
from typing import Any, Protocol

from console.hostfile import RankTarget
from telemetry.errors import AuthError
from telemetry.records import run_id_of


def same_run(served: str, expected: str) -> bool:
    """Whether run id `served` is `expected`: an id, or `NAME-…` (that name, any hash)."""
    name, _, tail = expected.rpartition("-")
    if tail == "…":
        return served.rsplit("-", 1)[0] == name
    return served == expected


class LinkRefused(Exception):
    """The far side said no; `kind` is a short reason, `retry` whether trying again may help."""

    def __init__(self, message: str, kind: str, retry: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry = retry


class Connector(Protocol):
    """How to reach ranks: plain loopback TCP (--local) or SSH channels."""

    def open(self, target: RankTarget, timeout: float) -> Any:
        """A connected socket-like (recv/sendall/settimeout/close); LinkRefused or OSError."""
        ...

    def describe(self, target: RankTarget) -> str: ...

    def read_control_key(self, target: RankTarget, run_dir: str) -> bytes:
        """The control key from `run_dir` on the target's host; AuthError with the reason."""
        ...

    def expected_run(self, run_dir: str) -> str:
        """The run id ranks serving `run_dir` report, or `NAME-…` where only its name is known."""
        ...

    def close(self) -> None: ...


class TCPConnector:
    """Ranks on this machine: TCP to 127.0.0.1:port, key read from the local run folder."""

    def open(self, target: RankTarget, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection(("127.0.0.1", target.port), timeout=timeout)
        except ConnectionRefusedError:
            raise LinkRefused(
                f"nothing listening on 127.0.0.1:{target.port}", "nothing listening"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def describe(self, target: RankTarget) -> str:
        return f"127.0.0.1:{target.port}"

    def read_control_key(self, target: RankTarget, run_dir: str) -> bytes:
        from telemetry.auth import read_key

        return read_key(run_dir)

    def expected_run(self, run_dir: str) -> str:
        return run_id_of(run_dir)  # the folder is on this machine: its whole id is known

    def close(self) -> None:
        pass


class SSHConnector:
    """Ranks behind SSH: a direct-tcpip channel per rank over one connection per host."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool  # console.ssh.SSHPool; untyped so this module does not import paramiko

    def open(self, target: RankTarget, timeout: float) -> Any:
        from console.ssh import SSHError

        try:
            return self.pool.open_forward(target.host, target.port, timeout=timeout)
        except SSHError as e:
            raise LinkRefused(str(e), e.kind, e.retry) from None

    def describe(self, target: RankTarget) -> str:
        return f"{target.host} → 127.0.0.1:{target.port}"

    def read_control_key(self, target: RankTarget, run_dir: str) -> bytes:
        from console.ssh import SSHError
        from telemetry import rundir
        from telemetry.auth import KEY_BYTES

        path = str(rundir.at(PurePosixPath(run_dir)).control_key)
        try:
            data = self.pool.read_file(target.host, path, private=True)
        except (SSHError, OSError) as e:
            raise AuthError(f"cannot read the control key {target.host}:{path}: {e}") from None
        if len(data) != KEY_BYTES:
            raise AuthError(
                f"control key {target.host}:{path} holds {len(data)} bytes, expected {KEY_BYTES}"
            )
        return data

    def expected_run(self, run_dir: str) -> str:
        # The id's hash is of the folder's absolute path on the far host: only its name is known.
        return f"{PurePosixPath(run_dir.rstrip('/')).name}-…"

    def close(self) -> None:
        self.pool.close()
