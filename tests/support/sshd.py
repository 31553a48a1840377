"""A throwaway OpenSSH server on a loopback address, and fake ranks behind it, for e2e tests.

Everything lives in a temporary folder: host and user keys made with ssh-keygen, its own
sshd_config (HostKey, AuthorizedKeysFile, PidFile, UsePAM no, StrictModes no), its own ssh
config and known_hosts for the client. The user's ~/.ssh is never read or written.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

SSHD_BIN = Path("/usr/sbin/sshd")
HERE = Path(__file__).resolve().parent  # tests/support


def sshd_missing() -> str:
    """Why sshd tests cannot run here, or ""."""
    if not SSHD_BIN.exists():
        return f"{SSHD_BIN} not found (apt-get install openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not found"
    if os.geteuid() != 0 and not Path("/run/sshd").is_dir():
        return "sshd needs /run/sshd (create it as root)"
    return ""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    """Make an ed25519 key pair; return the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip()


def fingerprint(pub: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(pub)], check=True, capture_output=True, text=True
    )
    return out.stdout.split()[1]


class SSHD:
    """sshd -D on 127.0.0.2:<free port>, accepting one generated user key."""

    def __init__(self, root: Path, address: str = "127.0.0.2") -> None:
        self.root = root
        self.address = address
        self.port = free_port(address)
        self.user = getpass.getuser()
        root.mkdir(parents=True, exist_ok=True)
        self.host_pub = keygen(root / "host_key")
        self.client_key = root / "client_key"
        (root / "authorized_keys").write_text(keygen(self.client_key) + "\n")
        self.config = root / "sshd_config"
        self.config.write_text(
            f"ListenAddress {address}:{self.port}\n"
            f"HostKey {root / 'host_key'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
            f"PidFile {root / 'sshd.pid'}\n"
            "UsePAM no\nStrictModes no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
            "PermitRootLogin prohibit-password\nAllowTcpForwarding yes\n"
            "Subsystem sftp internal-sftp\nLogLevel ERROR\n"
        )
        # The client side: a config naming the host alias, and known_hosts holding its key.
        self.ssh_config = root / "ssh_config"
        self.known_hosts = root / "known_hosts"
        self.write_ssh_config()
        self.trust()
        self.proc: subprocess.Popen | None = None

    def write_ssh_config(self, identity: Path | None = None) -> None:
        ident = identity or self.client_key
        self.ssh_config.write_text(
            f"Host rankhost\n  HostName {self.address}\n  Port {self.port}\n  User {self.user}\n"
            f"  IdentityFile {ident}\n  IdentitiesOnly yes\n"
            # The same server reached through itself as a jump host: exercises ProxyJump.
            f"Host jumped\n  HostName {self.address}\n  Port {self.port}\n  User {self.user}\n"
            f"  IdentityFile {ident}\n  IdentitiesOnly yes\n  ProxyJump rankhost\n"
        )

    def feed(self, hostfile: Path, port_base: int, run_dir: Path):
        """The console's live feed over this server, as `fleet console --hostfile` builds it."""
        import argparse

        from console.cli import build_feed

        args = argparse.Namespace(
            local=False,
            hostfile=str(hostfile),
            port_base=port_base,
            run_dir=str(run_dir),
            read_only=False,
            accept_new_host_keys=False,
            ssh_config=str(self.ssh_config),
            known_hosts=str(self.known_hosts),
            ssh_user=None,
        )
        return build_feed(args)

    @property
    def host_entry(self) -> str:
        return f"[{self.address}]:{self.port}"

    def trust(self, pub_line: str | None = None) -> None:
        """known_hosts with this server's key (or another key, to fake a changed one)."""
        key = (pub_line or self.host_pub).split()
        self.known_hosts.write_text(f"{self.host_entry} {key[0]} {key[1]}\n")

    def start(self) -> SSHD:
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(SSHD_BIN), "-D", "-e", "-f", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sshd.log", "wb"),  # noqa: SIM115 - lives as long as sshd
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()}")
            try:
                socket.create_connection((self.address, self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class FakeRanks:
    """`world` fake rank processes (support/fake_rank.py) serving on this machine's loopback."""

    def __init__(
        self,
        run_dir: Path,
        world: int,
        port_base: int,
        split: str = "",
        slow: str = "",
        news: bool = False,
    ):
        self.run_dir = run_dir
        self.world = world
        self.port_base = port_base
        self.procs: list[subprocess.Popen] = []
        extra = (["--split", split] if split else []) + (["--slow", slow] if slow else [])
        extra += ["--news"] if news else []
        for r in range(world):
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(HERE / "fake_rank.py"),
                        "--rank",
                        str(r),
                        "--world",
                        str(world),
                        "--port-base",
                        str(port_base),
                        "--run-dir",
                        str(run_dir),
                        *extra,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        for p in self.procs:
            line = p.stdout.readline()
            if not line.startswith("ready"):
                self.stop()
                raise RuntimeError(f"fake rank did not start: {line}{p.stdout.read()}")

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()


def free_port_base(n: int) -> int:
    """A base with n free consecutive loopback ports (best effort)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        ok = True
        for i in range(n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + i))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port range")
