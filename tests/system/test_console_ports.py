"""A second real run on the default port base moves, and the console finds it (slow)."""

from __future__ import annotations

import json
import socket
import time

import pytest

from telemetry import ports
from telemetry.protocol import DEFAULT_PORT_BASE
from tests.support.fleet import run_fleet, spawn_launch

TINY = ["--depth", "2", "--width", "64", "--heads", "2", "--collective-timeout", "120"]


@pytest.mark.slow
def test_a_second_run_on_the_default_base_moves_and_is_found_without_a_port(tiny_data, tmp_path):
    held = []  # the first run on this machine, as far as the second can tell
    for port in range(DEFAULT_PORT_BASE, DEFAULT_PORT_BASE + 2):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
            held.append(s)
        except OSError:
            s.close()  # taken already: by another run, which is just as good
    run = tmp_path / "run"
    proc = spawn_launch(2, tiny_data, run, *TINY, "--local-batches", "2,2", "--updates", "100000")
    try:
        deadline = time.monotonic() + 240
        while (recorded := ports.read(run)) is None:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the run never recorded its ports"
            time.sleep(0.3)
        assert recorded.base != DEFAULT_PORT_BASE and recorded.world_size == 2
        assert recorded.base in list(ports.candidates(DEFAULT_PORT_BASE, 2))
        # No -n, no --port-base: the run folder says where its ranks are.
        once = ["console", "--local", "--run-dir", str(run), "--once", "--json"]
        deadline = time.monotonic() + 120
        while True:
            out = run_fleet(*once, check=False, timeout=60)
            snap = json.loads(out.stdout) if out.stdout.strip() else {}
            if out.returncode == 0 and all(r["update"] for r in snap["ranks"]):
                break
            assert time.monotonic() < deadline, out.stderr
            time.sleep(1)
        assert [r["port"] for r in snap["ranks"]] == [recorded.base, recorded.base + 1]
        sent = run_fleet("telemetry", "send", "--run-dir", str(run), "stop", timeout=120)
        assert sent.stdout.startswith("stopped at update ")
        assert (
            f"to go on: fleet launch -n 2 -- train --resume latest --run-dir {run}" in sent.stdout
        )
        proc.communicate(timeout=120)  # (read: a full pipe would hold its last lines)
    finally:
        for s in held:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
        if proc.stdout:
            proc.stdout.close()
