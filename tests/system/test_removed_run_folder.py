"""A run folder removed under a running rank (issue 19 item 9): rank 0 writes back its control
key, its ports record and its lock, so `fleet telemetry send` steers the run again and a
second process is still refused; the next checkpoint makes its folder again."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

from tests.support.fleet import fleet_env, free_port, run_fleet
from tests.support.ranks import TINY, wait_until_gone
from trainer import lock
from trainer.checkpoint import catalog

pytestmark = pytest.mark.slow


def _remove(run) -> None:
    """`rm -rf RUN`, again where the rank wrote a file between the listing and the removal of a
    folder (rm -rf itself then says "Directory not empty")."""
    for _ in range(20):
        try:
            shutil.rmtree(run)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{run} could not be removed")


def test_a_removed_run_folder_is_written_back_and_steered_again(tiny_data, tmp_path):
    run = tmp_path / "run"
    train = ("train", "--data", str(tiny_data), "--run-dir", str(run), *TINY[:-2])
    train += ("--telemetry-port-base", str(free_port(1)), "--updates", "100000")
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", *train],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=fleet_env(),
    )
    try:
        key = run / "control.key"
        deadline = time.monotonic() + 120
        while not (run / "telemetry" / "ports.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        _remove(run)  # rm -rf RUN while it trains
        deadline = time.monotonic() + 30
        while not key.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "never written back"
            time.sleep(0.2)
        time.sleep(0.5)
        assert lock.owner(run) is not None and lock.owner(run).pid == proc.pid
        sent = run_fleet("telemetry", "send", "--run-dir", str(run), "checkpoint", check=False)
        assert sent.returncode == 0, sent.stdout + sent.stderr
        assert catalog.complete(run), "the checkpoint made its folder again"
        stop = run_fleet("telemetry", "send", "--run-dir", str(run), "stop", check=False)
        assert stop.returncode == 0
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        wait_until_gone(run, timeout=0)
    assert "went missing from" in err and "written again" in err
    assert "Traceback" not in err
