"""`fleet bench console` says whether it met its targets (issue 18, defect 14: it printed the
targets but no verdict)."""

from __future__ import annotations

from bench.console import verdict

RESULT = {
    "ranks": 64,
    "updates_per_s_per_rank": 10.0,
    "terminal": "160x50",
    "frame_ms_p95": 17.8,
    "cpu_percent_of_one_core": 13.4,
    "targets": {"frame_ms_p95": 50, "cpu_percent_of_one_core": 30},
}


def test_the_verdict_names_each_target_met():
    ok, line = verdict(RESULT)
    assert ok
    assert line == (
        "fleet bench console: 64 ranks x 10 updates/s at 160x50: frame p95 17.8 ms (target "
        "<= 50 ms: met), CPU 13.4% of one core (target <= 30%: met)"
    )


def test_the_verdict_names_a_missed_target():
    ok, line = verdict({**RESULT, "frame_ms_p95": 62.0})
    assert not ok and "frame p95 62.0 ms (target <= 50 ms: MISSED)" in line
    assert "CPU 13.4% of one core (target <= 30%: met)" in line
