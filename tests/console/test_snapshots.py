"""SVG snapshots of the console's main screens, from deterministic fake data and a frozen clock.

Update them after an intended change with: pytest tests/test_console_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest
from textual.widgets import Input

from console.app import FleetApp
from console.link_phase import LinkPhase
from tests.support.console_fakes import T0, FakeFeed, straggler_fleet


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """Clock times in the event log are local time: pin the zone."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def fleet_app(**kw):
    feed = FakeFeed()
    app = FleetApp(feed, clock=lambda: T0 + 100)

    async def fill(pilot):
        feed.live()
        feed.push(straggler_fleet(split=(2, 2, 2, 2), slow=(1, 1, 1, 3), **kw))
        while app.fleet.step() < 20:
            await pilot.pause(0.02)
        await pilot.pause(0.1)

    return app, feed, fill


def settle(app):
    async def _settle(pilot):
        app._frame(force=True)
        await pilot.pause(0.2)

    return _settle


def test_main_screen_80x24(snap_compare):
    app, _, fill = fleet_app()

    async def run_before(pilot):
        await fill(pilot)
        await settle(app)(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_main_screen_wide_shows_history(snap_compare):
    app, _, fill = fleet_app(steps=60)

    async def run_before(pilot):
        await fill(pilot)
        await settle(app)(pilot)

    assert snap_compare(app, terminal_size=(130, 36), run_before=run_before)


def test_rebalance_dialog(snap_compare):
    app, _, fill = fleet_app()

    async def run_before(pilot):
        await fill(pilot)
        await pilot.press("r")
        await pilot.pause(0.1)
        app.screen.query_one(Input).cursor_blink = False
        await settle(app)(pilot)

    assert snap_compare(app, terminal_size=(100, 32), run_before=run_before)


def test_lost_and_refused_ranks(snap_compare):
    app, feed, fill = fleet_app()

    async def run_before(pilot):
        await fill(pilot)
        feed.link(2, LinkPhase.LOST, "connection reset by peer", "lost", retry_at=T0 + 103)
        feed.link(
            1, LinkPhase.REFUSED, "mini-1: HOST KEY CHANGED; see known_hosts", "host key changed"
        )
        while app.fleet.live_count() != 2:
            await pilot.pause(0.02)
        await settle(app)(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_grouped_log_after_a_command(snap_compare):
    """Issue 14: one line for what every rank said alike, the cursor a blue band apart from the
    straggler's red badge."""
    from telemetry.records import Event

    app, feed, fill = fleet_app()

    async def run_before(pilot):
        await fill(pilot)
        feed.push(
            [
                (r, Event("paused", r, 21, "paused at update 21", time=T0 + 30 + r * 0.01))
                for r in range(4)
            ]
        )
        while app.fleet.log_lines[-1].who != "all 4 ranks":
            await pilot.pause(0.02)
        await pilot.press("down")  # the cursor on rank 1, the straggler is rank 3
        await settle(app)(pilot)

    assert snap_compare(app, terminal_size=(100, 28), run_before=run_before)


def test_replay_of_a_finished_run(snap_compare, tmp_path):
    """Issue 14: a replay that is over says FINISHED and when, not RUNNING and live."""
    from console.replay import ReplayFeed
    from tests.support.console_fakes import write_finished_run

    write_finished_run(tmp_path, world=4, steps=20)
    app = FleetApp(ReplayFeed(tmp_path, speed=256.0), clock=lambda: T0 + 100)

    async def run_before(pilot):
        while not app.fleet.ended():
            await pilot.pause(0.02)
        await settle(app)(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_tensor_parallel_main_screen_80x24(snap_compare):
    """Issue 21: the header says the mode; each rank's line its per-block collectives (coll)."""
    from tests.support.console_fakes import tensor_fleet

    feed = FakeFeed(n=2)
    app = FleetApp(feed, clock=lambda: T0 + 100)

    async def run_before(pilot):
        feed.live()
        feed.push(tensor_fleet(world=2, collective=0.012))
        while app.fleet.step() < 20:
            await pilot.pause(0.02)
        await settle(app)(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
