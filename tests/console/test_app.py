"""The console app against a fake feed: panes update, keys send the right commands, only after
confirmation, outcomes and refusals reach the log, and read-only blocks every change."""

from __future__ import annotations

import asyncio
import functools

import pytest
from textual.widgets import Input

from console.app import FleetApp
from console.link_phase import LinkPhase
from console.screens import (
    ConfirmScreen,
    HelpScreen,
    QuitScreen,
    RankDetailScreen,
    RebalanceScreen,
)
from console.widgets import EventLog, RankTable, RunHeader
from telemetry.records import Event
from tests.support.console_fakes import T0, FakeFeed, log_text, straggler_fleet, until

SIZE = (100, 30)


def aio(fn):
    """Run an async test on a fresh event loop (no pytest plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def started(pilot, feed: FakeFeed, **kw) -> None:
    feed.live()
    feed.push(straggler_fleet(**kw))
    await until(pilot, lambda: pilot.app.fleet.step() == 20)
    await pilot.pause(0.2)


@pytest.fixture
def feed():
    return FakeFeed()


@aio
async def test_panes_show_the_fleet(feed):
    app = FleetApp(feed, clock=lambda: T0 + 100)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        header = app.query_one(RunHeader)
        assert header.info.step == 20 and header.info.live == 4
        assert header.info.straggler == 3
        table = app.query_one(RankTable)
        assert table.fleet is app.fleet and table.virtual_size.height == 5
        assert "rank 3" in header.render().plain
        assert app.query_one(EventLog).last_seq >= 1
        # More data moves the figures without any key press.
        feed.push([(r, m) for r, m in straggler_fleet(steps=25) if getattr(m, "step", 0) > 20])
        await until(pilot, lambda: app.query_one(RunHeader).info.step == 25)


@aio
async def test_a_frame_during_shutdown_does_not_raise(feed):
    # The redraw timer can tick once more while the app tears its widgets down (a CI run
    # failed so); a frame then must be harmless.
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("enter")
        assert isinstance(app.screen, RankDetailScreen)
    frames = app.frames
    app._frame(force=True)
    assert app.frames == frames + 1


@pytest.mark.parametrize(
    "key, cmd",
    [("c", "checkpoint"), ("p", "pause"), ("s", "stop")],
)
@aio
async def test_keys_confirm_then_send(feed, key, cmd):
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press(key)
        assert isinstance(app.screen, ConfirmScreen)
        assert feed.sent == []  # nothing leaves before the answer
        await pilot.press("y")
        await until(pilot, lambda: feed.sent == [(cmd, {})])
        await until(pilot, lambda: f"{cmd}: applied at update 21" in log_text(app))


@aio
async def test_no_and_escape_send_nothing(feed):
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("s")
        await pilot.press("enter")  # focus starts on No: Enter is the safe answer
        await pilot.press("c", "escape", "p", "n")
        await pilot.pause(0.2)
        assert feed.sent == []
        assert log_text(app).count("cancelled") == 3


@aio
async def test_pause_key_resumes_a_paused_run(feed):
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        feed.push([(0, Event("paused", 0, 20, time=T0 + 50))])
        await until(pilot, lambda: app.fleet.paused)
        await pilot.press("p", "y")
        await until(pilot, lambda: feed.sent == [("resume", {})])


@aio
async def test_refusal_reaches_the_log(feed):
    from telemetry.records import Reply

    feed.auto_reply = False
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("c", "y")
        await until(pilot, lambda: feed.sent)
        await until(pilot, lambda: "checkpoint: sent" in log_text(app))
        feed.push([(0, Reply(1, False, error="a checkpoint is already being written"))])
        await until(pilot, lambda: "checkpoint: refused: a checkpoint is already" in log_text(app))


@aio
async def test_send_failure_is_logged_not_raised(feed):
    def broken(cmd, args=None):
        raise ConnectionError("rank 0 link is lost")

    feed.send = broken
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("c", "y")
        await until(pilot, lambda: "checkpoint: not sent: rank 0 link is lost" in log_text(app))
        assert app.is_running


@pytest.mark.parametrize("how", ["read_only", "no_key"])
@aio
async def test_read_only_blocks_every_change(how):
    feed = FakeFeed(control_problem="no --run-dir given" if how == "no_key" else "")
    app = FleetApp(feed, read_only=how == "read_only")
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        assert "READ-ONLY" in app.query_one(RunHeader).badges
        for key in "cprs":
            await pilot.press(key)
            assert not isinstance(app.screen, ConfirmScreen | RebalanceScreen)
            await pilot.press("y")
        await pilot.pause(0.2)
        assert feed.sent == []
        assert log_text(app).count("not sent") == 4


@aio
async def test_rebalance_dialog_proposes_and_sends(feed):
    app = FleetApp(feed)
    async with app.run_test(size=(100, 40)) as pilot:
        await started(pilot, feed, split=(2, 2, 2, 2), slow=(1, 1, 1, 3))
        await pilot.press("r")
        assert isinstance(app.screen, RebalanceScreen)
        dialog = app.screen
        proposal = dialog.proposal
        assert proposal is not None and proposal.split[3] < 2
        field = dialog.query_one(Input)
        assert field.value == ",".join(map(str, proposal.split))
        await pilot.press("enter")
        await until(pilot, lambda: feed.sent == [("rebalance", {"split": proposal.split})])
        await until(pilot, lambda: "rebalance to" in log_text(app) and "applied" in log_text(app))


@aio
async def test_rebalance_refuses_an_impossible_split_before_sending(feed):
    app = FleetApp(feed)
    async with app.run_test(size=(100, 40)) as pilot:
        await started(pilot, feed, split=(2, 2, 2, 2), slow=(1, 1, 1, 3))
        await pilot.press("r")
        dialog = app.screen
        field = dialog.query_one(Input)
        for bad, why in [
            ("3,3,3,3", "sums to 12"),
            ("4,4,0", "3 entries"),
            ("2,2,2,2", "current split"),
            ("a,b", "whole numbers"),
            ("7,0,0,1", "at least 1"),
            ("2,2,3,1", ""),
        ]:
            field.value = bad
            await pilot.pause(0.05)
            problems = str(dialog.query_one("#problems").render())
            assert why in problems, (bad, problems)
            assert dialog.query_one("#apply").disabled is bool(why)
        field.value = "9,9,9,9"
        await pilot.pause(0.05)
        await pilot.press("enter")
        assert isinstance(app.screen, RebalanceScreen)  # still open: nothing sent
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert feed.sent == [] and "rebalance: cancelled" in log_text(app)


@aio
async def test_rebalance_memory_cap_is_enforced(feed):
    app = FleetApp(feed)
    async with app.run_test(size=(100, 40)) as pilot:
        await started(pilot, feed, split=(2, 2, 2, 2), slow=(1, 1, 1, 3))
        await pilot.press("r")
        dialog = app.screen
        caps = dialog.proposal.caps
        assert all(c is not None for c in caps)
        over = [caps[0] + 1, 1, 1, 8 - caps[0] - 3]
        if min(over) >= 1:
            dialog.query_one(Input).value = ",".join(map(str, over))
            await pilot.pause(0.05)
            assert "rank 0:" in str(dialog.query_one("#problems").render())


@aio
async def test_enter_opens_rank_detail_and_help(feed):
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("down", "down", "down", "enter")
        assert isinstance(app.screen, RankDetailScreen) and app.screen.rank == 3
        await pilot.pause(0.2)
        text = str(app.screen.query_one("#detail").render())
        assert "rank 3" in text and "compute" in text and "peak mem" in text
        await pilot.press("up")
        assert app.screen.rank == 2
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@aio
async def test_lost_and_refused_ranks_show_why(feed):
    app = FleetApp(feed, clock=lambda: T0 + 100)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        feed.link(2, LinkPhase.LOST, "connection reset by peer", "lost", retry_at=T0 + 103)
        feed.link(1, LinkPhase.REFUSED, "mini-1: HOST KEY CHANGED …", "host key changed")
        await until(pilot, lambda: app.fleet.live_count() == 2)
        await pilot.pause(0.2)
        assert app.query_one(RunHeader).info.live == 2
        text = log_text(app)
        assert "rank 2 link lost: connection reset by peer" in text
        assert "rank 1 refused: mini-1: HOST KEY CHANGED" in text


@aio
async def test_l_reconnects_the_links_that_are_down(feed):
    app = FleetApp(feed, read_only=True)  # reconnecting changes nothing in the run
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("l")
        assert feed.reconnects == 0 and "reconnect: every link is up" in log_text(app)
        feed.link(1, LinkPhase.REFUSED, "mini-1: HOST KEY CHANGED …", "host key changed")
        await until(pilot, lambda: app.fleet.live_count() == 3)
        await pilot.press("l")
        assert feed.reconnects == 1 and "reconnect: rank 1 trying again now" in log_text(app)


@aio
async def test_quit_leaves_the_run_alone(feed):
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("q")
        await pilot.pause(0.1)
    assert feed.sent == [] and feed.closed


@aio
async def test_demo_quit_asks_and_can_stop_the_run(feed):
    app = FleetApp(feed, demo=True)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("escape")
        assert app.is_running and feed.sent == []
        await pilot.press("q", "s")
        await until(pilot, lambda: feed.sent == [("stop", {})])
        await until(pilot, lambda: not app.is_running)
    assert app.quit_choice == "stop"


@aio
async def test_replay_app_steps_and_blocks_commands(tmp_path):
    from bench.synthetic import write_run
    from console.replay import ReplayFeed

    write_run(tmp_path, world_size=3, steps=20)
    feed = ReplayFeed(tmp_path, speed=1.0)
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("space")  # pause the playback
        step = None
        for _ in range(30):  # a record already in flight may still land: wait until still
            await pilot.pause(0.1)
            if app.fleet.step() == step:
                break
            step = app.fleet.step()
        await pilot.press("n")
        await until(pilot, lambda: app.fleet.step() == step + 1)
        await pilot.press("plus")
        assert feed.speed == 2.0
        await pilot.press("c", "p", "s")
        assert not isinstance(app.screen, ConfirmScreen)
        assert "REPLAY" in app.query_one(RunHeader).badges[0]


def test_feed_ready_coalesces():
    from console.messages import FeedReady

    assert FeedReady().can_replace(FeedReady())


# --- issue 14: the event log, the cursor and the straggler, a replay's end ---------------------


def log_rows(app) -> list[str]:
    """The event log's rows on screen, as text."""
    view = app.query_one(EventLog)
    return [view.render_line(y).text for y in range(view.scrollable_content_region.height)]


@aio
async def test_log_groups_what_every_rank_says_alike(feed):
    app = FleetApp(feed, clock=lambda: T0 + 100)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        move = {"from": [3, 2, 2, 1], "to": [1, 3, 2, 2]}
        feed.push(
            [
                (r, Event("rebalanced", r, 42, "split 3,2,2,1 -> 1,3,2,2", move, T0 + 60))
                for r in range(4)
            ]
        )
        await until(pilot, lambda: app.fleet.log_lines[-1].who == "all 4 ranks")
        app._frame(force=True)
        await pilot.pause(0.1)
        rows = [row for row in log_rows(app) if "split 3,2,2,1" in row]
        assert len(rows) == 1 and "all 4 ranks @42 split 3,2,2,1 -> 1,3,2,2" in rows[0]


@aio
async def test_log_stays_at_the_newest_line_through_a_resize_unless_scrolled_up(feed):
    app = FleetApp(feed, clock=lambda: T0 + 100)
    async with app.run_test(size=(130, 36)) as pilot:
        await started(pilot, feed)
        for i in range(60):
            app.fleet.log(f"line {i:02d}", "info")
        app._frame(force=True)
        await pilot.pause(0.2)
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.3)
        view = app.query_one(EventLog)
        assert view.follow and view.scroll_y == view.max_scroll_y
        assert any("line 59" in row for row in log_rows(app))
        view.scroll_to(y=0, animate=False)  # the operator reads back
        await pilot.pause(0.2)
        assert not view.follow
        app.fleet.log("line 60", "info")
        app._frame(force=True)
        await pilot.pause(0.2)
        assert view.scroll_y == 0 and not any("line 60" in row for row in log_rows(app))
        view.scroll_end(animate=False)  # back at the end: follows again
        await pilot.pause(0.2)
        app.fleet.log("line 61", "info")
        app._frame(force=True)
        await pilot.pause(0.3)
        assert view.follow and any("line 61" in row for row in log_rows(app))


def _backgrounds(strip) -> set:
    return {s.style.bgcolor for s in strip if s.style and s.style.bgcolor and s.text.strip()}


@aio
async def test_cursor_and_straggler_look_different(feed):
    app = FleetApp(feed, clock=lambda: T0 + 100)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)  # rank 3 is the straggler
        table = app.query_one(RankTable)
        table.focus()
        table.cursor = 1
        await pilot.pause(0.1)
        cursor_row, straggler_row = table.render_line(2), table.render_line(4)
        cursor_bg = _backgrounds(cursor_row)
        assert len(cursor_bg) == 1  # one band across the whole row
        badge = [seg for seg in straggler_row if seg.text.strip() == "3"][0]
        assert badge.style.bgcolor.name == "red" and badge.style.color.name == "white"
        assert badge.style.bgcolor not in cursor_bg  # not the cursor's colour
        plain = _backgrounds(table.render_line(1))  # rank 0: neither cursor nor straggler
        assert _backgrounds(straggler_row) - {badge.style.bgcolor} == plain  # no band off-cursor
        assert cursor_bg != plain
        (bg,) = cursor_bg
        r, g, b = bg.get_truecolor()
        assert b > r  # a blue band, not amber (which read as the straggler's warning)


@aio
async def test_replay_of_a_finished_run_shows_it_finished_with_its_end(tmp_path):
    from console.replay import ReplayFeed
    from tests.support.console_fakes import write_finished_run

    write_finished_run(tmp_path, world=2, steps=12)
    feed = ReplayFeed(tmp_path, speed=256.0)
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.fleet.ended())
        app._frame(force=True)
        await pilot.pause(0.1)
        text = app.query_one(RunHeader).render().plain
        assert "FINISHED" in text and "RUNNING" not in text and "live" not in text
        assert "finished at update 12/12" in text
        row = app.query_one(RankTable).render_line(1).text
        assert "■ ended" in row and "● live" not in row


@aio
async def test_nothing_listening_is_said_once_with_advice(feed):
    app = FleetApp(feed, clock=lambda: T0 + 100, advice=lambda: "replay it with: X")
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(3):  # the links retry: connecting, refused, ...
            for r in range(4):
                feed.link(r, LinkPhase.CONNECTING, f"127.0.0.1:{47800 + r}")
                feed.link(r, LinkPhase.REFUSED, "nothing listening", "nothing listening", T0 + 101)
            await pilot.pause(0.1)
        await until(pilot, lambda: "no run serves there" in log_text(app))
        app._frame(force=True)
        await pilot.pause(0.1)
        assert log_text(app).count("no run serves there") == 1
        assert log_text(app).count("refused") == 4  # once per rank, not once per retry
        header = app.query_one(RunHeader).render().plain
        assert "NO RUN" in header and "CONNECTING" not in header
        where = "ports 47800-47803 of studio, mini-1, mini-2, air"
        assert f"nothing listening on {where}: no run serves there" in log_text(app)
        assert "replay it with: X" in log_text(app)


@aio
async def test_the_header_shows_the_best_the_autopilot_and_alerts_and_a_toggles_it(feed):
    app = FleetApp(feed)
    async with app.run_test(size=(160, 40)) as pilot:
        await started(pilot, feed)
        feed.push(
            [
                (
                    0,
                    Event(
                        "eval",
                        0,
                        20,
                        data={"val_loss": 2.5, "best_val_loss": 2.4, "best_step": 10},
                        time=T0 + 50,
                    ),
                ),
                (0, Event("autopilot", 0, 20, "autopilot on", {"on": True}, time=T0 + 51)),
                (
                    0,
                    Event(
                        "alert", 0, 20, "memory: rank 2 swaps", {"alert": "memory"}, time=T0 + 52
                    ),
                ),
                (
                    0,
                    Event(
                        "restarted",
                        0,
                        20,
                        data={
                            "attempt": 1,
                            "reason": "rank 2 was killed",
                            "from": [2, 2, 2],
                            "to": [3, 3],
                        },
                        time=T0 + 53,
                    ),
                ),
            ]
        )
        await until(pilot, lambda: "swaps" in app.query_one(RunHeader).render().plain)
        header = app.query_one(RunHeader).render().plain
        assert "best 2.4000 @10" in header and "autopilot" in header
        assert "memory: rank 2 swaps" in header
        await until(
            pilot, lambda: "restart 1 after rank 2 was killed: 2,2,2 → 3,3" in log_text(app)
        )
        await pilot.press("a")
        assert isinstance(app.screen, ConfirmScreen) and feed.sent == []
        await pilot.press("y")
        await until(pilot, lambda: feed.sent == [("autopilot", {"on": False})])


@aio
async def test_a_paused_or_stopped_header_shows_no_rate_and_no_eta(feed):
    """Issue 18, defect 9: a paused or stopped run still showed tok/s and an ETA."""
    app = FleetApp(feed)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, feed)
        header = lambda: app.query_one(RunHeader).render().plain  # noqa: E731
        assert "tok/s" in header() and "ETA" in header()
        feed.push([(0, Event("paused", 0, 20, time=T0 + 50))])
        await until(pilot, lambda: "PAUSED" in header())
        assert "tok/s" not in header() and "ETA" not in header()
        assert "straggler » rank 3" in header() and "loss" in header()
        feed.push([(0, Event("stopped", 0, 20, "stopped by a stop command", time=T0 + 51))])
        await until(pilot, lambda: "STOPPED" in header())
        assert "tok/s" not in header() and "ETA" not in header()


def test_a_multi_line_message_is_one_log_line_and_the_autopilot_measures():
    from console.events import event_line

    sample = Event("sample", 0, 5, "def f():\n    return 1\n", {"text": "def f():\n..."})
    assert event_line(sample) == ("info", "sample: def f():⏎    return 1⏎")
    measured = Event(
        "autopilot",
        0,
        40,
        "split [3, 1] -> [2, 2]: slowest compute 300 -> 200 ms",
        {"from": [3, 1], "to": [2, 2], "after_s": 0.2, "before_s": 0.3},
    )
    assert event_line(measured)[1] == (
        "autopilot measured its rebalance to 2,2: the slowest rank's compute went "
        "300 → 200 ms (-33%)"
    )


def test_a_stop_reply_says_how_the_run_goes_on():
    """Issue 18, defect 11: every stop, `s` too, prints the command that continues the run."""
    from console.events import reply_line
    from telemetry.records import Reply

    cmd = "fleet launch -n 4 -- train --resume latest --run-dir runs/x"
    reply = Reply(id=3, ok=True, result={"step": 40, "path": "p", "resume": cmd})
    assert reply_line(reply, "stop") == ("good", f"✓ stop: applied at update 40; to go on: {cmd}")
