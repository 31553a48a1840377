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


def test_the_restart_blames_the_rank_the_verdict_names():
    """fleet launch --restarts dated and named its restart by mlx.launch's first exit, a peer
    that lost the killed rank ("rank 0 exited with code 1 ...; restart 1 of 1" right under
    "rank 1 failed first (exited with code -9)", seen in the suite)."""
    sup = Supervisor([], {})
    sup.proc = SimpleNamespace(
        stderr=io.StringIO(
            lost(0)
            + WARN.format("Node with rank 0 exited with code 1")
            + WARN.format("Node with rank 1 exited with code -9")
        )
    )
    sup._relay()
    assert sup.first_failure() == (1, "exited with code -9", -9)
    assert sup._failure_line("", ended=False).startswith("fleet launch: rank 1 failed first")


def test_the_first_to_end_is_named_when_no_rank_said_it_lost_a_peer():
    line = verdict(
        WARN.format("Node with rank 2 exited with code 1"),
        WARN.format("Node with rank 0 was killed"),
        WARN.format("Node with rank 1 was killed"),
    )
    assert line.startswith("fleet launch: rank 2 failed first (exited with code 1); then")


def test_the_ring_backends_words_cut_and_jumbled_are_left_out_and_the_cause_kept(capsys):
    """The ring backend writes its messages a word at a time from several threads, and
    mlx.launch passes on whatever chunks it reads: lines arrive jumbled, or glued in front of
    a rank's own line (seen in CI: a second "[ring]" shown)."""
    cause = "fleet train: rank 1: error: rank 1: telemetry port 5001 on 127.0.0.1 is taken\n"
    sup = Supervisor([], {})
    sup.proc = SimpleNamespace(
        stderr=io.StringIO(
            "".join(
                (
                    "[ring] Socket 3 was closed by the peer\n",  # whole: the first is shown
                    "[ring] [ring] Receiving from socket Socket 5 failed with errno 3 104\n",
                    "[ring] Sending to socket " + cause,  # a cut message before the cause
                    "7 was closed by the peer\n",
                    "5\n",
                    "[ring] Socket " + WARN.format("Node with rank 1 exited with code 2"),
                    "[ring] Socket 3 was closed by the peer\n",  # whole, but said already
                    lost(0),
                    WARN.format("Node with rank 0 exited with code 1"),
                )
            )
        )
    )
    sup._relay()
    shown = capsys.readouterr().err
    assert shown.count("[ring]") == 1 and shown.startswith("[ring] Socket 3 was closed")
    assert cause in shown.splitlines(keepends=True)  # the rank's own line, whole
    assert "Node with rank 1 exited with code 2" in shown and "lost contact" not in shown
    assert "was closed by the peer\n" not in shown.split("\n", 1)[1] and "\n5\n" not in shown
    assert sup.cause == (1, "rank 1: telemetry port 5001 on 127.0.0.1 is taken")
    assert sup._failure_line("", ended=False).startswith("fleet launch: rank 1 failed first")
    assert sup.hidden == 6  # 5 pieces of the ring's (the lone digit ends one) and 1 peer's


def test_a_ring_message_glued_after_mlx_launchs_warning_marker_is_left_out(capsys):
    """Seen in CI (session 17): mlx.launch's "[WARN]" marker, cut from its own message, with a
    ring message glued after it; shown as a line of its own, a second "[ring]"."""
    sup = Supervisor([], {})
    sup.proc = SimpleNamespace(
        stderr=io.StringIO(
            WARN.format("Node with rank 1 exited with code 2")
            + "\x1b[33m[WARN][ring] Socket 3 was closed by the peer\n"
            + "[ring] Socket 5 was closed by the peer\n"
        )
    )
    sup._relay()
    shown = capsys.readouterr().err
    assert shown.count("[ring]") == 1 and "[ring] Socket 5 was closed" in shown
    assert "Node with rank 1 exited with code 2" in shown and sup.hidden == 1


def test_a_line_of_digits_before_any_ring_words_is_a_rank_s_own():
    sup = Supervisor([], {})
    sup.proc = SimpleNamespace(stderr=io.StringIO("42\n[ring] Socket 3 was closed by the peer\n"))
    sup._relay()
    assert sup.hidden == 0
