"""The console over a real sshd with real MLX ranks behind it: it sees both ranks, and the
operator's pause and checkpoint are applied by the run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from telemetry.auth import read_key
from telemetry.client import TelemetryClient
from tests.support.console_fakes import log_text, until
from tests.support.fleet import ROOT, free_port, spawn_launch
from tests.support.sshd import sshd_missing
from trainer.checkpoint import catalog

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(sshd_missing()) and not os.environ.get("CI"), reason=sshd_missing()),
]


@pytest.fixture(scope="module")
def run(tiny_data, tmp_path_factory):
    """Two real ranks training until stopped; yields (run folder, telemetry port base)."""
    run_dir = tmp_path_factory.mktemp("real") / "run"
    base = free_port(4)
    # fmt: off
    proc = spawn_launch(
        2, tiny_data, run_dir, "--depth", "2", "--width", "64", "--heads", "2",
        "--local-batches", "3,1", "--updates", "100000", "--simulate-slowdown", "1,3",
        "--telemetry-port-base", str(base), "--collective-timeout", "120",
        stdout=subprocess.DEVNULL,
    )
    # fmt: on
    deadline = time.monotonic() + 120
    while not (run_dir / "control.key").exists() or not list(
        (run_dir / "telemetry").glob("rank-1*.arrow")
    ):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.3)
    yield run_dir, base
    try:
        with TelemetryClient.connect("127.0.0.1", base, key=read_key(run_dir)) as ctl:
            ctl.command("stop", timeout=60)
        proc.wait(60)
    finally:
        proc.kill()


def hostfile(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"ssh": "rankhost", "ips": ["127.0.0.1"]}] * 2))
    return path


def test_once_over_ssh_shows_both_real_ranks(tmp_path, sshd, run):
    run_dir, base = run
    env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
    env["HOME"] = str(tmp_path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "console",
            "--hostfile",
            str(hostfile(tmp_path)),
            "--port-base",
            str(base),
            "--run-dir",
            str(run_dir),
            "--ssh-config",
            str(sshd.ssh_config),
            "--known-hosts",
            str(sshd.known_hosts),
            "--once",
            "--json",
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert snap["world"] == 2 and snap["live"] == 2 and snap["unreachable"] == []
    for r, rank in enumerate(snap["ranks"]):
        update = rank["update"]
        assert rank["rank"] == r and update["step"] >= 1
        assert update["compute_s"] > 0 and update["wait_s"] >= 0 and update["transfer_s"] >= 0
    # the simulated slow rank computes longer; the fast one waits for it
    slow, fast = snap["ranks"][1]["update"], snap["ranks"][0]["update"]
    assert slow["simulated"] and not fast["simulated"]


def test_console_pauses_and_checkpoints_a_real_run_over_ssh(tmp_path, sshd, run, monkeypatch):
    from console.app import FleetApp

    run_dir, base = run
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    feed = sshd.feed(hostfile(tmp_path), base, run_dir)

    async def scenario():
        app = FleetApp(feed)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.fleet.live_count() == 2 and app.fleet.step() > 0)
            await pilot.press("p", "y")
            await until(
                pilot, lambda: "pause: applied at update" in log_text(app) and app.fleet.paused
            )
            await pilot.press("c", "y")
            await until(pilot, lambda: "checkpoint: applied at update" in log_text(app))
            await pilot.press("p", "y")
            await until(pilot, lambda: "resume: applied" in log_text(app) and not app.fleet.paused)
            step = app.fleet.step()
            await until(pilot, lambda: app.fleet.step() > step)  # training goes on
            await pilot.press("q")

    asyncio.run(scenario())
    path, manifest, _ = catalog.resolve(run_dir, "latest")
    assert manifest["replicas_agree"] is True and manifest["world_size"] == 2
