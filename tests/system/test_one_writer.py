"""Two `fleet train` processes on one run folder (issue 19's trial: the second 4 s after the
first, both resuming latest and checkpointing every update): the second refuses, naming the
first's pid and host, and the first finishes untouched."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.fleet import fleet_env, run_fleet
from tests.support.ranks import last_update, single
from trainer import lock
from trainer.checkpoint import catalog

pytestmark = pytest.mark.slow


def test_a_second_process_on_a_run_folder_refuses_and_the_first_is_untouched(tiny_data, tmp_path):
    run = tmp_path / "run"
    single(tiny_data, run, "--local-batch", "2", "--updates", "2", "--checkpoint-every", "1")
    again = ("train", "--resume", "latest", "--run-dir", str(run), "--updates", "100000")
    again += ("--checkpoint-every", "1", "--telemetry-port-base", "0")
    first = subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", *again],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=fleet_env(),
    )
    try:
        deadline = time.monotonic() + 60  # until the first holds the folder (or says nothing)
        while (o := lock.owner(run)) is None or o.pid != first.pid:
            if time.monotonic() > deadline or first.poll() is not None:
                break
            time.sleep(0.1)
        time.sleep(4)
        second = run_fleet(*again, check=False)
        first.send_signal(signal.SIGTERM)  # then the first stops, with a checkpoint
        out, err = first.communicate(timeout=300)
    finally:
        first.kill()
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"in use by pid {first.pid} on {socket.gethostname()}" in second.stderr
    assert "Traceback" not in second.stderr
    assert first.returncode == 0, err[-3000:]
    assert "Traceback" not in err
    path, _, _ = catalog.resolve(run, "latest")
    assert catalog.read_json(path, catalog.STATE)["step"] == last_update(run) > 2
