"""SSH for the console: one verified connection per host, a forwarded channel per rank.

OpenSSH's rules, via paramiko: ``~/.ssh/config`` (HostName, User, Port, IdentityFile,
IdentitiesOnly, ProxyJump, ProxyCommand, UserKnownHostsFile, StrictHostKeyChecking accept-new),
the ssh-agent and default keys. Host keys are checked against known_hosts: an unknown host is
refused with its fingerprint unless accept-new is on (then it is appended to known_hosts, as
OpenSSH does); a changed key is always refused. Paths are explicit so tests never touch ~/.ssh.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

log = logging.getLogger(__name__)

MAX_JUMPS = 8  # ProxyJump chains longer than this are a loop in the config
MAX_REMOTE_FILE = 64 * 1024  # the control key is 32 bytes; refuse to slurp anything big


class SSHError(Exception):
    """Base of the console's SSH failures; `retry` says whether trying again may help."""

    kind = "ssh error"
    retry = True


class HostKeyUnknown(SSHError):
    """The host is not in known_hosts (and accept-new is off)."""

    kind = "host key unknown"
    retry = False


class HostKeyChanged(SSHError):
    """The host presented a different key than known_hosts holds: refused, always."""

    kind = "host key changed"
    retry = False


class AuthFailed(SSHError):
    """No offered key or agent identity was accepted."""

    kind = "auth failed"
    retry = False


class SSHConfigError(SSHError):
    """The ssh config cannot be read or names something impossible."""

    kind = "ssh config"
    retry = False


class HostUnreachable(SSHError):
    """No SSH connection could be made, or it dropped: worth retrying."""

    kind = "unreachable"


class ForwardRefused(SSHError):
    """The host refused the forwarded channel: usually nothing listening on that port yet."""

    kind = "nothing listening"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class SSHOptions:
    """Where to find ssh config and known hosts, and how strict to be."""

    config_path: Path | None = None  # None: ~/.ssh/config when it exists
    known_hosts: Path | None = (
        None  # None: UserKnownHostsFile from the config, or ~/.ssh/known_hosts
    )
    system_known_hosts: Path | None = Path("/etc/ssh/ssh_known_hosts")
    accept_new: bool = False  # OpenSSH's StrictHostKeyChecking=accept-new
    allow_agent: bool = True
    connect_timeout: float = 10.0
    keepalive_s: float = 10.0  # also how a silent dead link gets noticed
    user: str | None = None  # overrides the config's User

    def ssh_config(self) -> paramiko.SSHConfig:
        path = self.config_path or Path("~/.ssh/config").expanduser()
        if not path.exists():
            if self.config_path is not None:
                raise SSHConfigError(f"ssh config {path} does not exist")
            return paramiko.SSHConfig()
        try:
            return paramiko.SSHConfig.from_path(str(path))
        except Exception as e:  # paramiko raises assorted errors for bad configs
            raise SSHConfigError(f"cannot parse ssh config {path}: {e}") from None


@dataclass
class HostSettings:
    """One host alias resolved through the ssh config."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: list[str] = field(default_factory=list)
    identities_only: bool = False
    proxy_jump: str | None = None
    proxy_command: str | None = None
    known_hosts: Path = Path("~/.ssh/known_hosts")
    accept_new: bool = False


def host_settings(
    alias: str, options: SSHOptions, config: paramiko.SSHConfig | None = None
) -> HostSettings:
    """Apply the ssh config to a host alias, as `ssh -G alias` would."""
    cfg = (config or options.ssh_config()).lookup(alias)
    try:
        port = int(cfg.get("port", 22))
    except ValueError:
        raise SSHConfigError(f"{alias}: Port {cfg.get('port')!r} is not a number") from None
    if options.known_hosts is not None:
        known = options.known_hosts
    else:
        # UserKnownHostsFile may list several files; new keys go to the first, as in OpenSSH.
        files = cfg.get("userknownhostsfile", "~/.ssh/known_hosts").split()
        known = Path(files[0] if files else "~/.ssh/known_hosts").expanduser()
    strict = cfg.get("stricthostkeychecking", "").lower()
    jump = cfg.get("proxyjump")
    return HostSettings(
        alias=alias,
        hostname=cfg.get("hostname", alias),
        port=port,
        user=options.user or cfg.get("user") or getpass.getuser(),
        identity_files=[os.path.expanduser(p) for p in cfg.get("identityfile", [])],
        identities_only=cfg.get("identitiesonly", "no").lower() == "yes",
        proxy_jump=None if jump is None or jump.lower() == "none" else jump,
        proxy_command=cfg.get("proxycommand")
        if cfg.get("proxycommand", "none") != "none"
        else None,
        known_hosts=known,
        accept_new=options.accept_new or strict == "accept-new",
    )


def _hostkey_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown host: refuse with the fingerprint, or (accept-new) append it to known_hosts."""

    _lock = threading.Lock()

    def __init__(self, settings: HostSettings) -> None:
        self.settings = settings

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        kh = self.settings.known_hosts
        fp = fingerprint(key)
        if not self.settings.accept_new:
            raise HostKeyUnknown(
                f"{self.settings.alias}: host key for {hostname} is not in {kh} "
                f"({key.get_name()} {fp}). Check that fingerprint with the host's owner, then "
                f"run `ssh {self.settings.alias}` once to accept it, or rerun with "
                "--accept-new-host-keys"
            )
        with self._lock:
            kh.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(kh, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                if f.tell() > 0 and not kh.read_bytes().endswith(b"\n"):
                    f.write("\n")
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        log.warning("added %s (%s %s) to %s", hostname, key.get_name(), fp, kh)


def _parse_hop(hop: str) -> tuple[str | None, str, int | None]:
    """`[user@]host[:port]` of a ProxyJump entry (ssh:// URIs included)."""
    hop = hop.strip().removeprefix("ssh://")
    user, _, rest = hop.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [v6addr]:port
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return user or None, host, port


class _HostConn:
    """The client for one host plus the jump clients it rides on."""

    def __init__(self, client: paramiko.SSHClient, jumps: list[paramiko.SSHClient]) -> None:
        self.client = client
        self.jumps = jumps

    def active(self) -> bool:
        t = self.client.get_transport()
        return t is not None and t.is_active()

    def close(self) -> None:
        for c in [self.client, *reversed(self.jumps)]:
            # Closing a half-dead client may raise; there is nothing to do about it.
            with contextlib.suppress(Exception):
                c.close()


class SSHPool:
    """One SSH connection per host, shared by its ranks; thread-safe, reconnects on demand."""

    def __init__(self, options: SSHOptions | None = None) -> None:
        self.options = options or SSHOptions()
        self._config: paramiko.SSHConfig | None = None
        self._conns: dict[str, _HostConn] = {}
        self._refused: dict[str, SSHError] = {}  # non-retryable failures, not retried per rank
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._closed = False

    def settings(self, alias: str) -> HostSettings:
        if self._config is None:
            self._config = self.options.ssh_config()
        return host_settings(alias, self.options, self._config)

    def _host_lock(self, host: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(host, threading.Lock())

    def client(self, host: str) -> paramiko.SSHClient:
        """The live client for `host`, connecting (or reconnecting) if needed."""
        with self._host_lock(host):
            if self._closed:
                raise HostUnreachable(f"{host}: console is closing")
            if host in self._refused:
                raise self._refused[host]
            conn = self._conns.get(host)
            if conn is not None and conn.active():
                return conn.client
            if conn is not None:
                conn.close()
                del self._conns[host]
            try:
                conn = self._connect(host, depth=0)
            except SSHError as e:
                if not e.retry:
                    self._refused[host] = e
                raise
            self._conns[host] = conn
            return conn.client

    def hosts(self) -> list[str]:
        """Hosts with a live connection now (one per host, whatever its number of ranks)."""
        with self._lock:
            return sorted(h for h, c in self._conns.items() if c.active())

    def forget(self, host: str) -> None:
        """Drop a host's connection (and any refusal) so the next use connects afresh."""
        with self._host_lock(host):
            self._refused.pop(host, None)
            conn = self._conns.pop(host, None)
        if conn is not None:
            conn.close()

    def open_forward(self, host: str, port: int, timeout: float = 10.0) -> paramiko.Channel:
        """A direct-tcpip channel to 127.0.0.1:port on `host`."""
        client = self.client(host)
        transport = client.get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout
            )
        except paramiko.ChannelException as e:
            if e.code == paramiko.common.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED:
                err = ForwardRefused(
                    f"{host}: sshd refuses port forwarding (set AllowTcpForwarding yes)"
                )
                err.retry = False
                raise err from None
            raise ForwardRefused(f"{host}: nothing listening on 127.0.0.1:{port}") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.forget(host)
            raise HostUnreachable(f"{host}: connection dropped: {e or type(e).__name__}") from None

    @contextlib.contextmanager
    def _sftp(self, host: str, path: str, verb: str) -> Iterator[paramiko.SFTPClient]:
        """An SFTP session on `host` for work on `path`; its failures say host, path and why."""
        client = self.client(host)
        try:
            with client.open_sftp() as sftp:
                yield sftp
        except FileNotFoundError:
            raise FileNotFoundError(f"{host}:{path} does not exist") from None
        except PermissionError as e:
            too_open = "too open" in str(e)
            raise PermissionError(str(e) if too_open else f"{host}:{path} cannot be read") from None
        except (paramiko.SSHException, OSError, EOFError) as e:
            self.forget(host)
            raise HostUnreachable(f"{host}: cannot {verb} {path}: {e}") from None

    def read_file(self, host: str, path: str, *, private: bool = False) -> bytes:
        """A small file from `host` over SFTP; `~/` and relative paths are under the home.

        `private`: refuse a file that others may read (a secret left open is not trusted).
        """
        remote = path.removeprefix("~/")
        with self._sftp(host, path, "read") as sftp:
            st = sftp.stat(remote)
            size = st.st_size or 0
            if size > MAX_REMOTE_FILE:
                raise SSHError(f"{host}:{path} is {size} bytes; expected a small file")
            mode = (st.st_mode or 0) & 0o777
            if private and mode & 0o077:
                raise PermissionError(
                    f"permissions {mode:04o} for {host}:{path} are too open; refusing it "
                    f"(fix with: chmod 600 {path})"
                )
            with sftp.open(remote, "rb") as f:
                return f.read()

    def list_dir(self, host: str, path: str) -> dict[str, int]:
        """The plain files in a folder on `host` and their sizes (home-relative like read_file)."""
        with self._sftp(host, path, "list") as sftp:
            return {
                a.filename: a.st_size or 0
                for a in sftp.listdir_attr(path.removeprefix("~/"))
                if a.st_mode is not None and stat.S_ISREG(a.st_mode)
            }

    def download(self, host: str, path: str, local: Path) -> int:
        """Copy one file from `host` to `local` (streamed; all or nothing); returns its bytes."""
        partial = local.with_name(f".{local.name}.part")
        try:
            with self._sftp(host, path, "copy") as sftp:
                sftp.get(path.removeprefix("~/"), str(partial))
            size = partial.stat().st_size
            os.replace(partial, local)
            return size
        finally:
            partial.unlink(missing_ok=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()

    # --- connecting --------------------------------------------------------------------------

    def _connect(
        self, alias: str, depth: int, user: str | None = None, port: int | None = None
    ) -> _HostConn:
        if depth > MAX_JUMPS:
            raise SSHConfigError(f"{alias}: ProxyJump chain longer than {MAX_JUMPS} (a loop?)")
        s = self.settings(alias)
        if user:
            s.user = user
        if port:
            s.port = port
        sock: paramiko.Channel | paramiko.ProxyCommand | None = None
        jumps: list[paramiko.SSHClient] = []
        if s.proxy_jump:
            hops = [_parse_hop(h) for h in s.proxy_jump.split(",") if h.strip()]
            prev: _HostConn | None = None
            for hop_user, hop_host, hop_port in hops:
                if prev is None:
                    prev = self._connect(hop_host, depth + 1, hop_user, hop_port)
                    jumps.extend([*prev.jumps, prev.client])
                else:
                    hs = self.settings(hop_host)
                    hs.user, hs.port = hop_user or hs.user, hop_port or hs.port
                    chan = self._jump_channel(jumps[-1], hs.hostname, hs.port, alias)
                    jumps.append(self._open_client(hs, chan))
            sock = self._jump_channel(jumps[-1], s.hostname, s.port, alias)
        elif s.proxy_command:
            try:
                sock = paramiko.ProxyCommand(s.proxy_command)
            except Exception as e:
                raise SSHConfigError(f"{alias}: ProxyCommand failed: {e}") from None
        try:
            return _HostConn(self._open_client(s, sock), jumps)
        except BaseException:
            for j in reversed(jumps):
                j.close()
            raise

    def _jump_channel(
        self, via: paramiko.SSHClient, host: str, port: int, alias: str
    ) -> paramiko.Channel:
        transport = via.get_transport()
        assert transport is not None
        try:
            return transport.open_channel(
                "direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=self.options.connect_timeout
            )
        except (paramiko.SSHException, OSError) as e:
            raise HostUnreachable(f"{alias}: jump host cannot reach {host}:{port}: {e}") from None

    def _open_client(self, s: HostSettings, sock) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        sys_kh = self.options.system_known_hosts
        if sys_kh is not None and sys_kh.is_file():
            client.load_system_host_keys(str(sys_kh))
        if s.known_hosts.is_file():
            try:
                client.load_host_keys(str(s.known_hosts))
            except OSError as e:
                raise SSHConfigError(f"cannot read {s.known_hosts}: {e}") from None
        client.set_missing_host_key_policy(_KnownHostsPolicy(s))
        where = f"{s.alias} ({s.user}@{s.hostname}:{s.port})"
        t = self.options.connect_timeout
        try:
            client.connect(
                s.hostname,
                s.port,
                username=s.user,
                key_filename=s.identity_files or None,
                timeout=t,
                banner_timeout=t,
                auth_timeout=t,
                channel_timeout=t,
                allow_agent=self.options.allow_agent,
                look_for_keys=not s.identities_only,
                sock=sock,
            )
        except SSHError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            name = _hostkey_name(s.hostname, s.port)
            raise HostKeyChanged(
                f"{where}: HOST KEY CHANGED. It now presents {e.key.get_name()} "
                f"{fingerprint(e.key)}; {s.known_hosts} has {e.expected_key.get_name()} "
                f"{fingerprint(e.expected_key)}. This could be an attack; if the change is "
                f"expected, remove the old key with `ssh-keygen -R '{name}' -f {s.known_hosts}`"
            ) from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise AuthFailed(
                f"{where}: authentication failed ({e}); check User and IdentityFile in your "
                "ssh config, or load the key into ssh-agent"
            ) from None
        except (TimeoutError, paramiko.SSHException, OSError, EOFError) as e:
            client.close()
            raise HostUnreachable(f"{where}: {e or type(e).__name__}") from None
        transport = client.get_transport()
        if transport is not None and self.options.keepalive_s > 0:
            transport.set_keepalive(int(self.options.keepalive_s))
        return client
