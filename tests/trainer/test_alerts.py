"""Alerts carry the run's identity (issue 18, defect 13): one notifier serves several runs."""

from __future__ import annotations

import json
import socket

from telemetry.records import run_id_of
from tests.support.tiny_run import OneRank, smallest
from trainer.alerts import Alerts
from trainer.builder import open_run
from trainer.distributed import Cluster


def test_every_alert_says_which_run_host_and_rank(tmp_path):
    out = tmp_path / "alerts.jsonl"
    who = {"run_id": "abc", "run_dir": "/runs/a", "host": "mac-a", "rank": 2}
    alerts = Alerts(f"cat >> {out}", 0, lambda *a: None, identity=who)
    alerts.raise_("loss", "loss is nan at update 7", step=7)
    alerts.close()
    (alert,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert alert == {
        **who,
        "kind": "loss",
        "message": "loss is nan at update 7",
        "step": 7,
        "time": alert["time"],
    }


def test_a_run_gives_its_alerts_its_identity(tmp_path):
    run_dir = tmp_path / "run"
    cfg = smallest(run_dir, telemetry_port_base=0)
    run = open_run(cfg, Cluster(OneRank()), None, lambda msg: None)
    try:
        assert run.alerts.identity == {
            "run_id": run_id_of(run_dir),
            "run_dir": str(run_dir.resolve()),
            "host": socket.gethostname(),
            "rank": 0,
        }
    finally:
        run.reporter.close()
