"""`fleet launch --hostfile` as on a fleet of Macs: mlx.launch starts each rank over the system's
ssh (a real sshd on a loopback address, two host aliases for it), the ranks meet over the ring
backend, and the split still never changes the math. A host that ssh refuses is named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import fleet_env, free_port
from tests.console_sshd import sshd_missing
from tests.test_distributed import TINY, assert_same_weights, single, weights

ROOT = Path(__file__).resolve().parent.parent

MISSING = sshd_missing() or ("" if shutil.which("ssh") else "no ssh client (openssh-client)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING) and not os.environ.get("CI"), reason=MISSING),
]


@pytest.fixture
def ssh_path(tmp_path, sshd) -> str:
    """A PATH whose `ssh` reads this test's config (OpenSSH takes ~ from the password
    database, not $HOME, so the user's own ~/.ssh is neither read nor written). The config
    reaches the test sshd as `mac-a` and `mac-b` (known host key; BatchMode: never a prompt)
    and as `stranger`, whose key is not known."""
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    common = (
        f"  HostName {sshd.address}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  IdentitiesOnly yes\n  BatchMode yes\n"
        "  StrictHostKeyChecking yes\n"
    )
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host mac-a mac-b\n{common}  UserKnownHostsFile {sshd.known_hosts}\n"
        f"Host stranger\n{common}  UserKnownHostsFile {empty}\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {config} "$@"\n')
    wrapper.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def launch(ssh_path: str, hosts: list[str], data: Path, run: Path, split: str):
    hostfile = run.parent / f"{run.name}-hosts.json"
    hostfile.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in hosts]))
    cmd = [
        *(sys.executable, "-m", "fleet.cli", "launch", "--hostfile", str(hostfile)),
        *("--backend", "ring", "--starting-port", str(free_port(len(hosts) + 1))),
        *("--stop-grace", "5", "--"),
        *("train", "--data", str(data), "--run-dir", str(run), "--local-batches", split),
        *(*TINY, "--updates", "2", "--checkpoint-every", "1"),
    ]
    env = {**fleet_env(), "PATH": ssh_path}
    env.pop("SSH_AUTH_SOCK", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_ranks_started_over_ssh_train_the_same_model(tmp_path, ssh_path, tiny_data):
    single(
        tiny_data,
        tmp_path / "whole",
        "--local-batch",
        "3",
        "--updates",
        "2",
        "--checkpoint-every",
        "1",
    )
    run = tmp_path / "two-hosts"
    out = launch(ssh_path, ["mac-a", "mac-b"], tiny_data, run, "2,1")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    for step in (1, 2):
        assert_same_weights(weights(tmp_path / "whole", step), weights(run, step))


def test_a_host_ssh_refuses_is_named(tmp_path, ssh_path, tiny_data):
    out = launch(ssh_path, ["mac-a", "stranger"], tiny_data, tmp_path / "refused", "2,1")
    assert out.returncode == 1
    assert "rank 1 failed first (exited with code 255: ssh could not start it on stranger" in (
        out.stderr
    )
    assert "try `ssh stranger true`" in out.stderr
    assert "Traceback" not in out.stderr  # mlx.launch's own clean-up trace is left out
