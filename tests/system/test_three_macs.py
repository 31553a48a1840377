"""README's "Three Macs", command by command, with a test sshd standing in for the three Macs.

The commands are read from the README itself, so the section and this test cannot drift. What
differs from three real Macs, and why:
- the three host names reach one sshd on a loopback address (OpenSSH through `ssh -F`, the
  console through ~/.ssh/config of a HOME of the test's own); the hostfile's `ips` become
  127.0.0.1;
- `ssh-keygen` runs with its two prompts answered; `ssh-copy-id` is not run: it would write
  the real ~/.ssh/authorized_keys of this machine's user (the test sshd trusts its own key);
- `scp` copies into a folder of the test's, not the other Macs' homes (here, this user's);
- commands start with `python -m fleet.cli` of this checkout instead of `.venv/bin/fleet`,
  `--starting-port` is a free one, the interactive console is run with `--once` while the
  run goes on, and the run has no end of its own (the console must find it running on a
  loaded box): once watched, it is stopped as the section says, with the stop the console's
  `s` sends.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests.support.fleet import ROOT, free_port
from tests.support.sshd import sshd_missing

MISSING = sshd_missing() or ("" if shutil.which("ssh") else "no ssh client (openssh-client)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(MISSING) and not os.environ.get("CI"), reason=MISSING),
]

MACS = ("mac-studio", "mac-mini-1", "mac-mini-2")


def section() -> list[tuple[str, str]]:
    """The Three Macs section's code blocks, as (language, text), in order."""
    text = (ROOT / "README.md").read_text()
    body = text.split("\n## Three Macs\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", body, re.S)


def commands(block: str) -> list[str]:
    """The command lines of a shell block (continuations joined, comments dropped)."""
    joined = block.replace("\\\n", " ")
    lines = [line.split("   #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.fixture
def macs(tmp_path, sshd):
    """A HOME whose ~/.ssh names the three Macs (all the test sshd), and a PATH whose ssh and
    scp read that config (OpenSSH takes ~ from the password database, not $HOME)."""
    home = tmp_path / "home"
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True)
    known = ssh_dir / "known_hosts"  # what `ssh mac-x true` leaves after accepting the key
    key = sshd.host_pub.split()
    known.write_text(f"{sshd.host_entry} {key[0]} {key[1]}\n")
    (ssh_dir / "config").write_text(
        f"Host {' '.join(MACS)}\n  HostName {sshd.address}\n  Port {sshd.port}\n"
        f"  User {sshd.user}\n  IdentityFile {sshd.client_key}\n  IdentitiesOnly yes\n"
        f"  BatchMode yes\n  StrictHostKeyChecking yes\n  UserKnownHostsFile {known}\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("ssh", "scp"):
        (bin_dir / tool).write_text(
            f'#!/bin/sh\nexec {shutil.which(tool)} -F {ssh_dir / "config"} "$@"\n'
        )
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    env["PYTHONPATH"] = str(ROOT)
    return home, env


def test_the_three_macs_section_runs(tmp_path, macs):
    home, env = macs
    blocks = section()
    assert [lang for lang, _ in blocks] == ["", "sh", "sh", "json", "sh"]
    fleet = f"{shlex.quote(sys.executable)} -m fleet.cli"
    hostfile = tmp_path / "hosts.json"

    def run(line: str, **kw) -> subprocess.CompletedProcess:
        line = line.replace(".venv/bin/fleet", fleet).replace("hosts.json", str(hostfile))
        out = subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, env=env, cwd=ROOT, **kw
        )
        assert out.returncode == 0, f"{line}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out

    # --- 1. ~/.ssh/config names the three Macs (the test's own config stands in for it)
    config = blocks[0][1]
    assert [h for h in re.findall(r"^Host (\S+)", config, re.M)] == list(MACS)

    # --- 1. a key, and each Mac logged into once
    keygen, copy_id, login = commands(blocks[1][1])
    assert keygen == "ssh-keygen -t ed25519" and copy_id.startswith("ssh-copy-id")
    run(f"{keygen} -q -N '' -f ~/.ssh/id_ed25519")  # its prompts, answered
    assert (home / ".ssh" / "id_ed25519.pub").is_file()
    run(login)

    # --- 2. the data, prepared once and copied to the same path on the other Macs
    prepare, copy = commands(blocks[2][1])
    run(prepare.replace("--stdlib", "--stdlib --max-files 40 --quiet"))
    data = home / "fleet-data"
    assert (data / "dataset.json").is_file()
    for mac in MACS[1:]:  # their homes would be this machine's real one: a folder of ours
        (tmp_path / mac).mkdir()
        copy = copy.replace(f"{mac}:", f"{mac}:{tmp_path / mac}/")
    run(copy)
    for mac in MACS[1:]:
        assert (tmp_path / mac / "fleet-data" / "dataset.json").read_bytes() == (
            (data / "dataset.json").read_bytes()
        )

    # --- 3. the hostfile
    hosts = json.loads(blocks[3][1])
    assert [h["ssh"] for h in hosts] == list(MACS)
    hostfile.write_text(json.dumps([{**h, "ips": ["127.0.0.1"]} for h in hosts]))

    # --- 4. check, launch, watch, gather, report
    check, launch, console, gather, report = commands(blocks[4][1])
    port = lambda: f"--hostfile hosts.json --starting-port {free_port(len(MACS) + 1)}"  # noqa: E731
    checked = run(check.replace("--hostfile hosts.json", port()), timeout=300)
    assert "no problems found" in checked.stdout, checked.stdout

    run_dir = home / "fleet-runs" / "three"
    launch = launch.replace("--hostfile hosts.json", port())
    for flag, value in (
        ("--updates", "100000"),
        ("--eval-every", "6"),
        ("--checkpoint-every", "6"),
    ):
        launch = re.sub(rf"{flag} \d+", f"{flag} {value}", launch)
    line = launch.replace(".venv/bin/fleet", fleet).replace("hosts.json", str(hostfile))
    proc = subprocess.Popen(
        ["bash", "-c", line], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not list((run_dir / "telemetry").glob("rank-2*.arrow")):
            assert proc.poll() is None, "\n".join(proc.communicate())[-4000:]
            assert time.monotonic() < deadline, "the run never started updating"
            time.sleep(0.5)
        watched = run(f"{console} --once --json --timeout 60", timeout=180)
        snap = json.loads(watched.stdout)
        assert snap["world"] == 3 and snap["live"] == 3, snap
        sent = run(f"{fleet} telemetry send --run-dir ~/fleet-runs/three stop", timeout=120)
        assert sent.stdout.startswith("stopped at update "), sent.stdout
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-3000:]
    stopped = re.search(r"stopped at update (\d+) of 100000 \(.*\); checkpoint (\S+);", out)
    assert stopped, out[-3000:]
    updates = int(stopped.group(1))
    assert stopped.group(2).endswith(f"step-{updates:06d}")
    assert "--resume latest --run-dir" in out

    gathered = run(gather, timeout=180)
    assert "gathered" in gathered.stdout and "from 3 hosts" in gathered.stdout
    reported = run(report, timeout=120)
    assert f"{home / 'fleet-logs' / 'three'}: 3 rank(s), {updates} updates" in reported.stdout
