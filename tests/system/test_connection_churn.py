"""Strangers' connections cost a rank bounded memory: thousands of unauthenticated
connections to a live hub (a separate process serving a run's records) leave its RSS where
it was (issue 19 item 5: 164 -> 579 MB after 35k connections; msgpack's Unpacker allocated a
1 MiB buffer for every connection, which the allocator kept)."""

from __future__ import annotations

import psutil
import pytest

from tests.support.churn import churn
from tests.support.fleet import free_port
from tests.support.sshd import FakeRanks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kinds", [("read",), ("close", "read", "garbage", "partial")])
def test_thousands_of_strangers_leave_a_ranks_memory_flat(tmp_path, kinds):
    port = free_port(1)
    ranks = FakeRanks(tmp_path / "run", 1, port)
    try:
        rank = psutil.Process(ranks.procs[0].pid)
        churn(port, 400, kinds=kinds)  # the allocator's first growth is not the figure
        before = rank.memory_info().rss
        churn(port, 2000, start=400, kinds=kinds)
        grown = (rank.memory_info().rss - before) / 2**20
    finally:
        ranks.stop()
    assert grown < 8, f"{grown:.1f} MiB more after 2000 connections"
