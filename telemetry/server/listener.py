"""Where a rank listens: a TCP socket (loopback unless allowed) and a Unix socket, bound once."""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import socket
import sys
from pathlib import Path

from telemetry import protocol
from telemetry.errors import TelemetryError

log = logging.getLogger(__name__)

ANY_PORT = -1  # bind an ephemeral port (tests, benchmarks); read it back from `address`
# sun_path holds this many bytes including the terminating NUL.
UNIX_PATH_MAX = 104 if sys.platform == "darwin" or "bsd" in sys.platform else 108


class Listener:
    """The listening sockets of one rank: `open` binds them (TelemetryError says why not)."""

    def __init__(
        self,
        *,
        rank: int,
        port: int | None,
        bind: str = "127.0.0.1",
        allow_remote: bool = False,
        unix_path: Path | None = None,
    ) -> None:
        self.rank = rank
        self.port = port
        self.bind = bind
        self.allow_remote = allow_remote
        self.unix_path = unix_path
        self.sockets: list[socket.socket] = []
        self.address: tuple[str, int] | None = None  # the bound TCP (host, port)
        self._bound_unix = False  # only a socket file this listener made is removed on close

    def open(self) -> list[socket.socket]:
        """Bind the TCP and/or Unix socket, non-blocking; on failure nothing stays open."""
        try:
            if self.port:
                self.sockets.append(self._listen_tcp())
            if self.unix_path is not None:
                self.sockets.append(self._listen_unix(self.unix_path))
        except BaseException:
            self.close()
            raise
        return self.sockets

    def _listen_tcp(self) -> socket.socket:
        host = "127.0.0.1" if self.bind == "localhost" else self.bind
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            raise TelemetryError(f"telemetry bind address {self.bind!r} is not an IP") from None
        if not loopback:
            if not self.allow_remote:
                raise TelemetryError(
                    f"rank {self.rank}: refusing to serve telemetry on {host} (not loopback) "
                    "without allow_remote (fleet train --telemetry-remote); reach ranks "
                    "through SSH port forwarding instead"
                )
            log.warning(
                "rank %d: telemetry served on %s: anyone who can reach it sees the run "
                "(control still needs the key)",
                self.rank,
                host,
            )
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart after a crash
        port = 0 if self.port == ANY_PORT else self.port
        try:
            sock.bind((host, port))
            sock.listen(protocol.MAX_CLIENTS)
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise TelemetryError(
                    f"rank {self.rank}: telemetry port {port} on {host} is taken (another run "
                    "on this machine? leave out fleet train --telemetry-port-base to get a "
                    "free base, or give another; 0 turns the socket off)"
                ) from None
            raise TelemetryError(
                f"rank {self.rank}: cannot serve telemetry on {host}:{port}: {e.strerror}"
            ) from None
        sock.setblocking(False)
        self.address = sock.getsockname()[:2]
        return sock

    def _listen_unix(self, path: Path) -> socket.socket:
        size = len(os.fsencode(path))
        if size >= UNIX_PATH_MAX:
            raise TelemetryError(
                f"rank {self.rank}: unix socket path {path} is {size} bytes; this OS allows "
                f"{UNIX_PATH_MAX - 1}. Use a shorter run folder, or turn the unix socket off"
            )
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            if _answers(path):
                raise TelemetryError(f"rank {self.rank}: {path} is served by a live process")
            path.unlink()  # stale: left by a rank that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            self._bound_unix = True
            os.chmod(path, 0o600)  # owner only; control still needs the key
            sock.listen(protocol.MAX_CLIENTS)
        except OSError as e:
            sock.close()
            raise TelemetryError(f"rank {self.rank}: cannot serve on {path}: {e}") from None
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        """Close the sockets and remove the Unix socket file this listener made."""
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()
        path = self.unix_path
        if self._bound_unix and path is not None and path.is_socket():
            path.unlink(missing_ok=True)
        self._bound_unix = False


def _answers(path: Path) -> bool:
    """Whether a live process accepts connections on the Unix socket at `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def accept(lsock: socket.socket) -> tuple[socket.socket, str] | None:
    """A new non-blocking client socket and its peer's name, or None if it went away."""
    try:
        sock, addr = lsock.accept()
    except OSError:  # the client gave up already, or out of descriptors
        return None
    tcp = sock.family in (socket.AF_INET, socket.AF_INET6)
    try:
        sock.setblocking(False)
        if tcp:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # reset before we got to it
        sock.close()
        return None
    return sock, (f"{addr[0]}:{addr[1]}" if tcp else "unix")
