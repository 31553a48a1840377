"""The autopilot and the memory guard on real ranks (slow: real processes)."""

from __future__ import annotations

import pytest

from telemetry.arrowlog import read_events, read_updates
from tests.support.ranks import launch
from trainer.autopilot import Autopilot, RankFigures


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
    # The same pilot fed the figures the ranks logged decides the first move on the figures
    # of the update the move is logged at (the next one, where it had not announced it):
    # it was applied at that boundary, on every rank.
    pilot = Autopilot(3, enabled=True, window=3, cooldown=4)
    logs = [{x["step"]: x for x in read_updates(run, r).to_pylist()} for r in range(3)]
    for step in sorted(logs[0]):
        row = [(log[step]["local_batch"], log[step]["compute_s"]) for log in logs]
        announced = pilot.may_decide()
        decision = pilot.observe(
            [b for b, _ in row], [RankFigures(b, c, 0, 0, 0, None) for b, c in row]
        )
        decided = [args["split"] for cmd, args in decision.commands if cmd == "rebalance"]
        if decided:
            break
    assert decided == [moves[0].data["to"]]
    for rank in range(3):
        first = next(e for e in read_events(run, rank) if e.kind == "rebalanced")
        assert (first.step, first.data["to"]) == (step + (not announced), decided[0]), rank


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
