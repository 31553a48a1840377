"""End to end over a real sshd: --once and the app's link layer reach fake ranks (real telemetry
hubs) through direct-tcpip channels, send signed pause and checkpoint commands, and refuse
unknown and changed host keys. Uses its own HOME, ssh config and known_hosts."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.records import run_id_of
from tests.support.console_fakes import log_text, until
from tests.support.fleet import ROOT
from tests.support.sshd import FakeRanks, fingerprint, free_port_base, keygen, sshd_missing

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(sshd_missing()) and not os.environ.get("CI"), reason=sshd_missing()),
]

HOSTS = ["rankhost", "jumped", "rankhost"]  # rank 1 comes through a ProxyJump


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    fake = FakeRanks(run, len(HOSTS), free_port_base(len(HOSTS)))
    yield fake
    fake.stop()


@pytest.fixture
def home(tmp_path):
    """A HOME with nothing in it, and no agent: only the test's own files count."""
    h = tmp_path / "home"
    h.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env["HOME"] = str(h)
    return env


def hostfile(tmp_path, hosts=HOSTS) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"ssh": h, "ips": ["127.0.0.1"]} for h in hosts]))
    return path


def once(env, hosts_json, sshd, ranks, known_hosts, *extra, timeout=10):
    cmd = [
        sys.executable,
        "-m",
        "fleet.cli",
        "console",
        "--hostfile",
        str(hosts_json),
        "--port-base",
        str(ranks.port_base),
        "--run-dir",
        str(ranks.run_dir),
        "--ssh-config",
        str(sshd.ssh_config),
        "--known-hosts",
        str(known_hosts),
        "--once",
        "--json",
        "--timeout",
        str(timeout),
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_once_reaches_every_rank_over_ssh(tmp_path, sshd, ranks, home):
    out = once(home, hostfile(tmp_path), sshd, ranks, sshd.known_hosts)
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert snap["run_id"] == run_id_of(ranks.run_dir) and snap["world"] == 3 and snap["live"] == 3
    for r, rank in enumerate(snap["ranks"]):
        assert rank["rank"] == r and rank["host"] == f"fake-{r}"
        assert rank["update"] is not None and rank["update"]["step"] >= 1
    assert snap["unreachable"] == []
    assert not (Path(home["HOME"]) / ".ssh").exists()  # nothing written to the (fake) home


def test_app_link_layer_pauses_and_checkpoints_over_ssh(tmp_path, sshd, ranks, monkeypatch):
    from console.app import FleetApp

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    feed = sshd.feed(hostfile(tmp_path), ranks.port_base, ranks.run_dir)

    async def scenario():
        app = FleetApp(feed)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.fleet.live_count() == 3 and app.fleet.step() > 0)
            # One SSH connection per host, shared by its ranks (rankhost carries ranks 0 and 2).
            assert feed.connector.pool.hosts() == ["jumped", "rankhost"]
            await pilot.press("p", "y")
            await until(
                pilot, lambda: "pause: applied at update" in log_text(app) and app.fleet.paused
            )
            await pilot.press("c", "y")
            await until(pilot, lambda: "checkpoint: applied at update" in log_text(app))
            await until(pilot, lambda: "checkpoint ckpt-" in log_text(app))
            await pilot.press("p", "y")
            await until(pilot, lambda: "resume: applied" in log_text(app) and not app.fleet.paused)
            step = app.fleet.step()
            await until(pilot, lambda: app.fleet.step() > step)  # training goes on
            await pilot.press("q")

    asyncio.run(scenario())


def test_unknown_host_key_is_refused_with_its_fingerprint(tmp_path, sshd, ranks, home):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    out = once(home, hostfile(tmp_path, ["rankhost"]), sshd, ranks, empty)
    assert out.returncode == 1
    assert "cannot reach rank 0 (rankhost)" in out.stderr
    assert "not in" in out.stderr and fingerprint(sshd.root / "host_key.pub") in out.stderr
    assert "--accept-new-host-keys" in out.stderr
    assert empty.read_text() == ""


def test_accept_new_adds_the_key_like_openssh(tmp_path, sshd, ranks, home):
    kh = tmp_path / "known_hosts"
    out = once(home, hostfile(tmp_path, ["rankhost"]), sshd, ranks, kh, "--accept-new-host-keys")
    assert out.returncode == 0, out.stderr
    line = kh.read_text().strip()
    assert line.startswith(sshd.host_entry) and sshd.host_pub.split()[1] in line
    # Next time the key is known: no flag needed.
    assert once(home, hostfile(tmp_path, ["rankhost"]), sshd, ranks, kh).returncode == 0


def test_changed_host_key_is_always_refused(tmp_path, sshd, ranks, home):
    other = keygen(tmp_path / "other_host_key")
    kh = tmp_path / "known_hosts"
    kh.write_text(f"{sshd.host_entry} {other.split()[0]} {other.split()[1]}\n")
    before = kh.read_text()
    out = once(home, hostfile(tmp_path, ["rankhost"]), sshd, ranks, kh, "--accept-new-host-keys")
    assert out.returncode == 1
    assert "HOST KEY CHANGED" in out.stderr
    assert fingerprint(sshd.root / "host_key.pub") in out.stderr
    assert fingerprint(tmp_path / "other_host_key.pub") in out.stderr
    assert "ssh-keygen -R" in out.stderr
    assert kh.read_text() == before


def test_auth_failure_is_refused(tmp_path, sshd, ranks, home):
    import shutil

    stranger = tmp_path / "stranger_key"
    keygen(stranger)
    config = tmp_path / "ssh_config"
    shutil.copy(sshd.ssh_config, config)
    config.write_text(config.read_text().replace(str(sshd.client_key), str(stranger)))
    cmd_sshd = argparse.Namespace(ssh_config=config)
    out = once(home, hostfile(tmp_path, ["rankhost"]), cmd_sshd, ranks, sshd.known_hosts)
    assert out.returncode == 1
    assert "authentication failed" in out.stderr


def test_nothing_listening_names_the_rank(tmp_path, sshd, ranks, home):
    # A fourth rank in the hostfile that no process serves.
    out = once(
        home, hostfile(tmp_path, [*HOSTS, "rankhost"]), sshd, ranks, sshd.known_hosts, timeout=3
    )
    assert out.returncode == 1
    assert "rank 3 (rankhost)" in out.stderr and "nothing listening" in out.stderr
    assert "rank 0" not in out.stderr
    snap = json.loads(out.stdout)
    assert [r["update"] is not None for r in snap["ranks"]] == [True, True, True, False]


def gather(env, hosts_json, sshd, run_dir, dest, *extra):
    cmd = [
        *(sys.executable, "-m", "fleet.cli", "console", "--hostfile", str(hosts_json)),
        *("--run-dir", str(run_dir), "--gather", str(dest), "--ssh-config", str(sshd.ssh_config)),
        *("--known-hosts", str(sshd.known_hosts), *extra),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def test_gather_brings_every_ranks_logs_home_for_report(tmp_path, sshd, home):
    from bench import synthetic
    from telemetry.arrowlog import ArrowLog
    from telemetry.report import summarize

    def log(rank: int, steps: range) -> None:
        writer = ArrowLog(run, rank)
        writer.directory.mkdir(parents=True, exist_ok=True)
        writer.write([synthetic.update(step, rank) for step in steps])
        writer.close()

    run, dest = tmp_path / "run", tmp_path / "gathered"
    for rank in range(3):
        log(rank, range(1, 6))
    (run / "config.json").write_text(json.dumps({"run_id": "far-run"}))
    (run / "control.key").write_bytes(b"k" * 32)
    out = gather(home, hostfile(tmp_path), sshd, run, dest)
    assert out.returncode == 0, out.stderr
    assert "gathered 3 log files" in out.stdout and "from 2 hosts" in out.stdout
    mine, theirs = summarize(run), summarize(dest)
    assert {**theirs, "run_dir": ""} == {**mine, "run_dir": ""}
    assert not (dest / "control.key").exists()  # the secret stays on its host

    # Again: nothing new is fetched. After a resume, rank 1's new segment is.
    again = gather(home, hostfile(tmp_path), sshd, run, dest)
    assert "gathered 0 log files" in again.stdout and "3 unchanged" in again.stdout
    log(1, range(6, 9))
    grown = gather(home, hostfile(tmp_path), sshd, run, dest)
    assert "gathered 1 log files" in grown.stdout and "rank-1.1.arrow" in grown.stderr
    assert summarize(dest)["ranks"][1]["updates"] == 8

    # A rank whose host has no logs is named; a folder that is not a gather's is refused.
    more = gather(home, hostfile(tmp_path, [*HOSTS, "rankhost"]), sshd, run, dest)
    assert more.returncode == 1 and "no logs of ranks 3" in more.stderr
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused = gather(home, hostfile(tmp_path), sshd, run, other)
    assert refused.returncode == 2 and "no gather put there" in refused.stderr
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]


def test_sftp_failures_name_host_and_path(tmp_path, sshd):
    from console.ssh import SSHOptions, SSHPool

    pool = SSHPool(
        SSHOptions(config_path=sshd.ssh_config, known_hosts=sshd.known_hosts, allow_agent=False)
    )
    try:
        key = tmp_path / "control.key"
        key.write_bytes(b"k" * 32)
        key.chmod(0o644)  # readable by others: a secret left open is not trusted
        with pytest.raises(PermissionError, match="too open.*chmod 600"):
            pool.read_file("rankhost", str(key), private=True)
        key.chmod(0o600)
        assert pool.read_file("rankhost", str(key), private=True) == b"k" * 32
        with pytest.raises(FileNotFoundError, match=f"rankhost:{tmp_path}/nope does not exist"):
            pool.read_file("rankhost", str(tmp_path / "nope"))
        with pytest.raises(FileNotFoundError, match="does not exist"):
            pool.list_dir("rankhost", str(tmp_path / "no-folder"))
        (tmp_path / "logs").mkdir()
        (tmp_path / "logs" / "a.arrow").write_bytes(b"x" * 10)
        (tmp_path / "logs" / "sub").mkdir()
        assert pool.list_dir("rankhost", str(tmp_path / "logs")) == {"a.arrow": 10}
        got = tmp_path / "copy.arrow"
        assert pool.download("rankhost", str(tmp_path / "logs" / "a.arrow"), got) == 10
        with pytest.raises(FileNotFoundError):
            pool.download("rankhost", str(tmp_path / "logs" / "gone.arrow"), tmp_path / "g")
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    finally:
        pool.close()


def test_once_over_ssh_finds_the_ports_the_run_recorded(tmp_path, sshd, ranks, home):
    """No --port-base: the base comes from RUN/telemetry/ports.json on rank 0's host."""
    from telemetry import ports

    where = ports.record(ranks.run_dir, ports.RecordedPorts(ranks.port_base, len(HOSTS)))
    try:
        out = once(home, hostfile(tmp_path), sshd, ranks, sshd.known_hosts)
        cmd = [a for a in out.args if a not in ("--port-base", str(ranks.port_base))]
        out = subprocess.run(cmd, capture_output=True, text=True, env=home, cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stderr
        snap = json.loads(out.stdout)
        assert [r["port"] for r in snap["ranks"]] == [ranks.port_base + r for r in range(3)]
    finally:
        where.unlink()
