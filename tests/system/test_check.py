"""`fleet check` forms a real local group and times its links (slow: real ranks)."""

from __future__ import annotations

import pytest

from tests.support.fleet import free_port, run_fleet


@pytest.mark.slow
def test_a_local_group_forms_and_is_timed(tmp_path):
    out = run_fleet(
        *("check", "-n", "2", "--starting-port", str(free_port(3)), "--bytes", "65536", "--"),
        *("train", "--synthetic", "--depth", "1", "--width", "64", "--heads", "1"),
        *("--local-batches", "2,2", "--run-dir", str(tmp_path / "run")),
    )
    assert "no problems found" in out.stdout
    assert out.stdout.count(" ring ") == 2  # both ranks reported from one group of 2
