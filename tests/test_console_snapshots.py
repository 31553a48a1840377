"""SVG snapshots of the console's main screens, from deterministic fake data and a frozen clock.

Update them after an intended change with: pytest tests/test_console_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest
from textual.widgets import Input

from console.app import FleetApp
from console.model import LinkPhase
from tests.console_fakes import T0, FakeFeed, straggler_fleet


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
