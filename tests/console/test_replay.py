"""Replaying a finished run's logs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from console.feed import Inbox
from console.fleet import Fleet
from console.link_phase import LinkPhase, LinkStatus
from console.snapshot import header
from tests.support.fleet import ROOT

# --- replay ------------------------------------------------------------------------------------


def test_replay_plays_steps_and_finishes(tmp_path):
    from bench.synthetic import write_run
    from console.replay import ReplayError, ReplayFeed

    write_run(tmp_path, world_size=3, steps=30, rebalance_at=15, eval_every=10)
    feed = ReplayFeed(tmp_path)
    inbox = Inbox()
    feed.attach(inbox)
    fleet = Fleet(feed.targets)

    def pump():
        for rank, item in inbox.drain():
            fleet.set_link(item) if isinstance(item, LinkStatus) else fleet.apply(rank, item)

    feed.start()
    feed.step()
    pump()
    assert fleet.step() == 1 and not feed.playing
    feed.step()
    pump()
    assert fleet.step() == 2
    feed.finish()
    pump()
    assert fleet.step() == 30 and feed.done
    assert any("rebalanced" in ln.text for ln in fleet.log_lines)
    assert header(fleet).val_loss is not None
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReplayError, match="no telemetry logs"):
        ReplayFeed(empty)
    with pytest.raises(ReplayError, match="no such run folder"):
        ReplayFeed(tmp_path / "missing")


def test_replay_once_json_cli(tmp_path):
    from bench.synthetic import write_run

    write_run(tmp_path, world_size=2, steps=12, slow_rank=1, eval_every=0, rebalance_at=None)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleet.cli",
            "console",
            "--replay",
            str(tmp_path),
            "--once",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert snap["step"] == 12 and len(snap["ranks"]) == 2


# --- issue 14: a replay that is over shows how the run ended ------------------------------------


def test_replay_end_is_finished_stopped_failed_or_ended(tmp_path):
    from bench.synthetic import write_run
    from console.cli import nobody_advice, replayed, run_end
    from console.replay import ReplayFeed
    from console.snapshot import ending

    write_run(tmp_path, world_size=2, steps=12, slow_rank=1, eval_every=0, rebalance_at=None)
    fleet = replayed(ReplayFeed(tmp_path))
    assert fleet.ended() and all(v.phase is LinkPhase.ENDED for v in fleet.ranks)
    h = header(fleet)
    assert h.status == "ended" and h.ended.startswith("ended at update 12, ")
    fleet.total_updates = 12
    assert ending(fleet).how == "finished" and header(fleet).status == "finished"
    assert header(fleet).ended.startswith("finished at update 12/12, ")
    fleet.stopped = True
    assert ending(fleet).how == "stopped"
    fleet.failed = "loss is nan"
    assert ending(fleet).how == "failed"
    assert run_end(str(tmp_path)).step == 12
    advice = nobody_advice(str(tmp_path))
    assert f"console --replay {tmp_path}" in advice and "train --resume latest" in advice
    assert "no telemetry logs" in nobody_advice(str(tmp_path / "nope"))
