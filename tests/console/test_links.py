"""Links to ranks: the inbox, live/lost/reconnect, refusals, commands, gathering."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from console.connectors import LinkRefused
from console.feed import Inbox
from console.hostfile import (
    local_targets,
)
from console.link_phase import LinkPhase, LinkStatus
from console.links import RankLink
from telemetry.errors import ConnectionLost
from tests.support.console_fakes import hello, update

# --- inbox and links ---------------------------------------------------------------------------


def test_inbox_notifies_once_per_batch():
    calls = []
    inbox = Inbox(notify=lambda: calls.append(1))
    for i in range(100):
        inbox.link_message(0, update(0, i + 1))
    assert calls == [1]
    assert len(inbox.drain()) == 100
    inbox.link_status(LinkStatus(0, LinkPhase.LIVE))
    assert calls == [1, 1]


class Recorder:
    def __init__(self):
        self.statuses: list[LinkStatus] = []
        self.messages = []
        self.changed = threading.Event()

    def link_status(self, s):
        self.statuses.append(s)
        self.changed.set()

    def link_message(self, rank, m):
        self.messages.append((rank, m))
        self.changed.set()

    def wait_for(self, pred, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            self.changed.wait(0.05)
            self.changed.clear()
        return pred()


class ScriptedConnector:
    """Each open() takes the next outcome: an exception to raise, or a list of messages."""

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)
        self.opens = 0

    def open(self, target, timeout):
        self.opens += 1
        out = self.outcomes.pop(0) if self.outcomes else LinkRefused("gone", "nothing listening")
        if isinstance(out, BaseException):
            raise out
        return out

    def describe(self, target):
        return f"fake:{target.port}"

    def close(self):
        pass


class ScriptedClient:
    def __init__(self, messages, key, timeout, peer=""):
        self.hello = messages[0]
        self.rest = list(messages[1:])
        self.key = key
        self.sent = []

    def recv(self, timeout=None):
        if self.rest:
            m = self.rest.pop(0)
            if isinstance(m, BaseException):
                raise m
            return m
        time.sleep(timeout or 0)
        return None

    def send_command(self, cmd, args):
        self.sent.append((cmd, args))
        return 7

    def close(self):
        pass


def make_link(outcomes, sink, **kw):
    from telemetry.backoff import Backoff

    return RankLink(
        local_targets(1)[0],
        ScriptedConnector(outcomes),
        sink,
        backoff=Backoff(0.01, 1.0, 0.01, 0.0),
        client_factory=ScriptedClient,
        recv_timeout=0.01,
        **kw,
    )


def run_link(link):
    t = threading.Thread(target=link.run, daemon=True)
    t.start()
    return t


def test_link_goes_live_then_lost_then_reconnects():
    sink = Recorder()
    session = [hello(0, world=1), update(0, 1), ConnectionLost("eof")]
    link = make_link(
        [
            LinkRefused("nothing listening on 127.0.0.1:47800", "nothing listening"),
            session,
            [hello(0, world=1), update(0, 2)],
        ],
        sink,
    )
    t = run_link(link)
    assert sink.wait_for(
        lambda: sum(isinstance(m, type(update(0, 1))) for _, m in sink.messages) == 2
    )
    link.stop()
    t.join(2)
    phases = [s.phase for s in sink.statuses]
    assert phases[:2] == [LinkPhase.CONNECTING, LinkPhase.REFUSED]
    assert LinkPhase.LIVE in phases and LinkPhase.LOST in phases
    lost = next(s for s in sink.statuses if s.phase is LinkPhase.LOST)
    assert "eof" in lost.detail and lost.retry_at is not None
    assert phases.index(LinkPhase.LOST) < len(phases) - 1


def test_link_refused_for_good_waits_without_retrying():
    sink = Recorder()
    link = make_link([LinkRefused("key changed", "host key changed", retry=False)], sink)
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.phase is LinkPhase.REFUSED for s in sink.statuses))
    time.sleep(0.1)
    assert link.connector.opens == 1
    refused = next(s for s in sink.statuses if s.phase is LinkPhase.REFUSED)
    assert refused.retry_at is None and refused.kind == "host key changed"
    link.stop()
    t.join(2)
    assert not t.is_alive()


def test_link_refused_for_good_tries_again_when_asked():
    sink = Recorder()
    link = make_link(
        [LinkRefused("key changed", "host key changed", retry=False), [hello(0, world=1)]], sink
    )
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.phase is LinkPhase.REFUSED for s in sink.statuses))
    link.retry_now()  # the operator pressed l
    assert sink.wait_for(lambda: link.phase is LinkPhase.LIVE)
    assert link.connector.opens == 2
    link.stop()
    t.join(2)


def test_feed_reconnects_only_the_links_that_are_down():
    from console.live import LiveFeed

    feed = LiveFeed(local_targets(2), ScriptedConnector([]))
    asked = []
    for link in feed.links:
        link.retry_now = functools.partial(asked.append, link.rank)
    feed.links[0].phase = LinkPhase.LIVE
    feed.links[1].phase = LinkPhase.REFUSED
    feed.reconnect()
    assert asked == [1]


def test_link_marks_stale_and_back_live():
    sink = Recorder()
    session = [hello(0, world=1), update(0, 1)]
    link = make_link([session], sink, stale_after=0.05)
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.phase is LinkPhase.STALE for s in sink.statuses))
    link.stop()
    t.join(2)


def test_link_refuses_a_port_serving_another_rank():
    sink = Recorder()
    link = make_link([[hello(3, world=4)]], sink)
    t = run_link(link)
    assert sink.wait_for(lambda: any(s.kind == "wrong rank" for s in sink.statuses))
    link.stop()
    t.join(2)
    assert not any(isinstance(m, type(hello(0))) for _, m in sink.messages)


def test_link_send_command_needs_a_live_link():
    sink = Recorder()
    link = make_link([[hello(0, world=1)]], sink)
    with pytest.raises(ConnectionLost, match="connecting"):
        link.send_command("pause")
    link.key = b"k" * 32
    t = run_link(link)
    assert sink.wait_for(lambda: link.phase is LinkPhase.LIVE)
    assert link.send_command("pause") == 7
    link.stop()
    t.join(2)


def test_gather_knows_every_log_name_the_ranks_write():
    from console.gather import LOG_NAME
    from telemetry.arrowlog import event_stem, update_stem

    for rank in (0, 7, 12):
        for stem in (update_stem(rank), event_stem(rank)):
            for segment in ("", ".1", ".23"):
                m = LOG_NAME.match(f"{stem}{segment}.arrow")
                assert m is not None and int(m.group(1)) == rank
    for other in ("control.key", "config.json", "rank-1.arrow.part", ".rank-1.arrow.part"):
        assert LOG_NAME.match(other) is None


def test_feed_turns_commands_off_when_rank0_serves_another_run(tmp_path):
    from console.connectors import SSHConnector, TCPConnector
    from console.live import LiveFeed
    from telemetry.errors import AuthError
    from telemetry.records import run_id_of

    run = tmp_path / "runs" / "mine"
    local = LiveFeed(local_targets(1), TCPConnector(), run_dir=str(run))
    local.link_message(0, hello(0, world=1, run_id=run_id_of(run)))
    assert local.control_problem == ""
    # Same folder name, another folder (another run on this machine): the hash tells.
    local.link_message(0, hello(0, world=1, run_id=run_id_of(tmp_path / "mine")))
    assert "rank 0 serves run mine-" in local.control_problem
    with pytest.raises(AuthError, match="commands are off"):
        local.send("pause")
    assert local.links[0].key is None  # the key was never read for the wrong run

    # Over SSH only the folder's name can be checked (the hash is of the remote path).
    far = LiveFeed(local_targets(1), SSHConnector(None), run_dir="runs/mine/")
    far.link_message(0, hello(0, world=1, run_id="mine-0a1b2c"))
    assert far.control_problem == ""
    far.link_message(0, hello(0, world=1, run_id="other-0a1b2c"))
    assert "--run-dir runs/mine/ is run mine-" in far.control_problem
