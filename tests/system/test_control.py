"""Control at update boundaries, with real ranks: every command is applied by all or refused."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from telemetry.arrowlog import read_events, read_updates
from telemetry.auth import read_key
from telemetry.client import TelemetryClient
from telemetry.errors import TelemetryError
from tests.support.fleet import spawn_launch
from trainer.checkpoint import catalog

pytestmark = pytest.mark.slow


def _connect(port: int, key: bytes | None = None, timeout: float = 60) -> TelemetryClient:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return TelemetryClient.connect("127.0.0.1", port, key=key, timeout=30)
        except (OSError, TelemetryError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_pause_checkpoint_rebalance_stop(tiny_data, tmp_path, port_base):
    run = tmp_path / "run"
    proc = spawn_launch(
        3,
        tiny_data,
        run,
        "--depth",
        "2",
        "--width",
        "64",
        "--heads",
        "2",
        "--local-batches",
        "3,2,1",
        "--updates",
        "100000",
        "--telemetry-port-base",
        str(port_base),
        "--collective-timeout",
        "60",
    )
    try:
        ctl = _connect(port_base)
        key = read_key(run)
        ctl.close()
        ctl = _connect(port_base, key)

        paused = ctl.command("pause", timeout=60)
        assert paused.ok, paused.error
        at = paused.result["step"]
        time.sleep(1.5)  # paused ranks only exchange heartbeats: no update may happen now
        assert max(read_updates(run, 0).to_pydict()["step"] or [0]) <= at
        assert not ctl.command("pause").ok  # already paused: refused, nothing changes

        saved = ctl.command("checkpoint", timeout=60)  # works while paused
        assert saved.ok and saved.result["step"] == at
        assert Path(saved.result["path"]) == catalog.step_dir(run, at)
        catalog.verify(saved.result["path"])

        bad = ctl.command("rebalance", {"split": [2, 2, 3]})
        assert not bad.ok and "global batch" in bad.error
        moved = ctl.command("rebalance", {"split": [2, 2, 2]})
        assert moved.ok and moved.result["split"] == [2, 2, 2]
        assert ctl.command("resume").ok
        assert not ctl.command("autopilot", {"on": "yes"}).ok  # refused before the trainer
        piloted = ctl.command("autopilot", {"on": True}, timeout=60)
        assert piloted.ok and piloted.result["on"] is True
        assert ctl.command("autopilot", {"on": False}, timeout=60).ok

        other = _connect(port_base + 1, key)  # control goes to rank 0 only
        refused = other.command("checkpoint")
        assert not refused.ok and "rank 0" in refused.error
        other.close()

        time.sleep(1.0)
        stopped = ctl.command("stop", timeout=60)
        assert stopped.ok
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    final = catalog.resolve(run, "latest")[0]
    assert final.name == f"step-{stopped.result['step']:06d}"
    state = json.loads((final / "state.json").read_text())
    assert state["split"] == [2, 2, 2]  # the rebalance is part of the saved state
    for rank in range(3):  # every rank applied the rebalance at the same update
        kinds = {e.kind: e for e in read_events(run, rank)}
        assert kinds["rebalanced"].step == moved.result["step"]
        assert kinds["rebalanced"].data == {"from": [3, 2, 1], "to": [2, 2, 2]}
        assert {"paused", "resumed", "stopped", "autopilot"} <= kinds.keys()
        table = read_updates(run, rank).to_pydict()
        after = [
            b
            for s, b in zip(table["step"], table["local_batch"], strict=True)
            if s > moved.result["step"]
        ]
        assert after and set(after) == {2}
