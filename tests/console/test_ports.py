"""What a new user hits first (issue 14): `--once` shows each rank's newest update, no run is
said at once (with a finished run offered for replay), and a second run on the default port
base moves to a free one that the console and `fleet telemetry send` find with no port flag."""

from __future__ import annotations

import json
import re
import time

from telemetry import ports
from telemetry.client import TelemetryClient
from telemetry.records import Update
from tests.support.fleet import free_port, run_fleet
from tests.support.sshd import FakeRanks, free_port_base


def newest_step(port: int) -> int:
    """The newest update a rank holds now: the last of the history its hello announces."""
    with TelemetryClient.connect("127.0.0.1", port, timeout=10) as client:
        left, step = client.hello.backlog, 0
        while left:
            msg = client.recv(5)
            if isinstance(msg, Update):
                step, left = msg.step, left - 1
        return step


def test_once_takes_each_ranks_newest_update_not_the_oldest_of_its_history(tmp_path):
    ranks = FakeRanks(tmp_path / "run", 3, free_port_base(3))
    try:
        deadline = time.monotonic() + 60
        while newest_step(ranks.port_base + 2) < 40:  # history now far older than the newest
            assert time.monotonic() < deadline, "fake ranks too slow"
            time.sleep(0.3)
        before = [newest_step(ranks.port_base + r) for r in range(3)]
        base = ["console", "--local", "-n", "3", "--port-base", str(ranks.port_base), "--once"]
        snap = json.loads(run_fleet(*base, "--json", timeout=60).stdout)
        steps = [r["update"]["step"] for r in snap["ranks"]]
        assert all(s >= b for s, b in zip(steps, before, strict=True)), (steps, before)
        assert snap["step"] == max(steps) and min(steps) >= max(before) - 5
        assert all(0 <= r["update_age_s"] < 10 for r in snap["ranks"])
        table = run_fleet(*base, timeout=60).stdout
        shown = int(re.search(r"step ([\d,]+)", table).group(1).replace(",", ""))
        assert shown >= max(before) and " age " in table
    finally:
        ranks.stop()


def test_no_run_is_said_at_once_and_a_finished_run_is_offered_for_replay(tmp_path):
    from bench.synthetic import write_run

    run = tmp_path / "run"
    write_run(run, world_size=3, steps=12, eval_every=0, rebalance_at=None)
    base = free_port(3)  # nothing listens there
    argv = ["console", "--local", "-n", "3", "--port-base", str(base), "--run-dir", str(run)]
    t0 = time.monotonic()
    out = run_fleet(*argv, "--once", check=False, timeout=60)
    assert time.monotonic() - t0 < 10  # not the 15 s timeout: nothing listens, nothing will
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # one line, not the same refusal once per rank
    assert f"nothing listening on 127.0.0.1:{base}-{base + 2}" in lines[0]
    assert f"console --replay {run}" in lines[0] and "at update 12" in lines[0]
    snap = json.loads(run_fleet(*argv, "--once", "--json", check=False, timeout=60).stdout)
    assert snap["status"] == "no run" and len(snap["unreachable"]) == 1


def test_console_port_flags_stay_as_given(tmp_path):
    """An explicit --port-base wins over the record, and -n over its world size."""
    ports.record(tmp_path, ports.RecordedPorts(free_port(4), 4))
    args = ["console", "--local", "-n", "2", "--run-dir", str(tmp_path), "--port-base", "1"]
    out = run_fleet(*args, "--once", "--json", check=False, timeout=60)
    snap = json.loads(out.stdout)
    assert [r["port"] for r in snap["ranks"]] == [1, 2]
    recorded = ports.read(tmp_path)
    out = run_fleet(
        "console", "--local", "--run-dir", str(tmp_path), "--once", "--json", check=False
    )
    assert [r["port"] for r in json.loads(out.stdout)["ranks"]] == [
        recorded.base + r for r in range(4)
    ]
