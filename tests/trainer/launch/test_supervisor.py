"""Which rank `fleet launch` names as the one that failed first, from mlx.launch's stderr."""

from __future__ import annotations

import io
from types import SimpleNamespace

from trainer.launch.supervisor import Supervisor

WARN = "\x1b[33m[WARN] {} \x1b[0m\n"


def verdict(*lines: str) -> str:
    sup = Supervisor([], {})
    sup.proc = SimpleNamespace(stderr=io.StringIO("".join(lines)))
    sup._relay()
    return sup._failure_line("", ended=False)


def lost(rank: int) -> str:
    return f"fleet train: rank {rank}: lost contact with a peer rank during 'all-reduce'\n"


def test_a_killed_rank_is_named_though_its_peers_exits_came_first():
    """On a busy machine the peers of a SIGKILLed rank can exit (having lost it) before
    mlx.launch sees the killed one go (seen in the suite: "rank 1 ... first")."""
    line = verdict(
        "[ring] Socket 3 was closed by the peer\n",
        lost(1),
        WARN.format("Node with rank 1 exited with code 1"),
        lost(0),
        WARN.format("Node with rank 0 exited with code 1"),
        WARN.format("Node with rank 2 was killed"),
    )
    assert line.startswith("fleet launch: rank 2 failed first (was killed); then rank(s) [0, 1]")


def test_the_first_to_end_is_named_when_no_rank_said_it_lost_a_peer():
    line = verdict(
        WARN.format("Node with rank 2 exited with code 1"),
        WARN.format("Node with rank 0 was killed"),
        WARN.format("Node with rank 1 was killed"),
    )
    assert line.startswith("fleet launch: rank 2 failed first (exited with code 1); then")
