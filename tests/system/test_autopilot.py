"""The autopilot and the memory guard on real ranks (slow: real processes)."""

from __future__ import annotations

import pytest

from telemetry.arrowlog import read_events
from tests.support.ranks import launch


@pytest.mark.slow
def test_the_autopilot_rebalances_real_ranks(tiny_data, tmp_path):
    run = tmp_path / "run"
    launch(
        3,
        tiny_data,
        run,
        "--local-batches",
        "2,2,2",
        "--updates",
        "40",
        "--simulate-slowdown",
        "1,1,4",
        "--autopilot",
        "--autopilot-window",
        "3",
        "--autopilot-cooldown",
        "4",
    )
    moves = [e for e in read_events(run, 0) if e.kind == "rebalanced"]
    assert moves and "autopilot" in moves[0].data["reason"]
    assert moves[-1].data["to"][2] < 2  # the slow rank was given less
    assert any(e.kind == "autopilot" for e in read_events(run, 0))


@pytest.mark.slow
def test_the_memory_guard_on_real_ranks(tiny_data, tmp_path):
    run = tmp_path / "run"
    launch(
        3,
        tiny_data,
        run,
        "--local-batches",
        "2,2,2",
        "--updates",
        "12",
        "--memory-limit-gb",
        "2",
        "--simulate-peak-gb",
        "0,0,1.9",
        "--autopilot",
    )
    moves = [e for e in read_events(run, 0) if e.kind == "rebalanced"]
    assert moves and "memory guard" in moves[0].data["reason"]
    assert moves[0].data["to"][2] == 1
