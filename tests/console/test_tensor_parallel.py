"""Issue 21: the console sees tensor parallelism. The header says the mode, the rank panes and
the detail show each rank's compute and its per-block collectives, and the rebalance key and
the autopilot say plainly that a tensor-parallel split is fixed, opening no dialog."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io

from rich.console import Console

from console import render
from console.app import FleetApp
from console.fleet import Fleet
from console.hostfile import local_targets
from console.once import table
from console.screens import ConfirmScreen, RankDetailScreen, RebalanceScreen
from console.screens.rank_detail import detail_text
from console.snapshot import header, proposal, snapshot
from console.widgets import RankTable, RunHeader
from console.widgets.rank_table import header_text, layout, row_text
from telemetry.parallelism import FIXED_SPLIT
from tests.support.console_fakes import (
    T0,
    FakeFeed,
    log_text,
    straggler_fleet,
    tensor_fleet,
    until,
    update,
)


def aio(fn):
    """Run an async test on a fresh event loop (no pytest plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


def fleet_of(records, world: int) -> Fleet:
    fleet = Fleet(local_targets(world), clock=lambda: T0 + 100)
    for rank, msg in records:
        fleet.apply(rank, msg)
    return fleet


# --- unit: figures and formatting --------------------------------------------------------------


def test_the_header_says_the_mode_only_when_not_data_parallel():
    tensor = fleet_of(tensor_fleet(world=2), 2)
    assert header(tensor).parallel == "tensor parallel x2"
    groups = fleet_of(tensor_fleet(world=4, parallel="tensor:2"), 4)
    assert header(groups).parallel == "2 replicas x tensor 2"
    assert header(fleet_of(straggler_fleet(), 4)).parallel == ""


def test_a_group_s_batch_counts_once_in_the_global_batch():
    # Every rank of a group reads the same 4 rows: 2 groups of 2 ranks make a batch of 8.
    assert header(fleet_of(tensor_fleet(world=4, parallel="tensor:2"), 4)).global_batch == 8
    assert header(fleet_of(tensor_fleet(world=2), 2)).global_batch == 4


def test_a_replay_learns_the_mode_from_the_started_event():
    # A replay's hellos are made up from the log and say "data": the started event knows better.
    records = [(r, m) for r, m in tensor_fleet(world=2) if m.type != "hello"]
    fleet = fleet_of(records, 2)
    assert fleet.parallel == "tensor" and fleet.parallelism().fixed_split
    assert snapshot(fleet)["parallel"] == "tensor"


def test_the_balancer_proposes_nothing_for_a_fixed_split():
    prop, models, why = proposal(fleet_of(tensor_fleet(world=2), 2))
    assert prop is None and models == [] and why == FIXED_SPLIT
    assert "--local-batch" in why and "same rows" in why
    prop, _, why = proposal(fleet_of(straggler_fleet(), 4))
    assert prop is not None and why == ""  # data parallelism: offered as before


def test_the_time_bar_splits_the_collectives_out_of_compute():
    u = update(0, 1, batch=4, per_sample=0.05, slowest=0.2, collective=0.05)  # 25% of compute
    bar = render.time_bar(u, 22).plain
    assert len(bar) == 22 and bar.count(render.COLLECTIVE) == 5
    assert bar.index(render.COLLECTIVE) > bar.rindex(render.COMPUTE)  # inside compute: after it
    # Without collectives the bar is what it always was.
    plain = dataclasses.replace(u, collective_s=0.0)
    assert render.COLLECTIVE not in render.time_bar(plain, 22).plain
    assert render.time_bar(plain, 22).plain.count(render.COMPUTE) == 20
    assert render.collective_share(u) == (0.25, 0.05 / u.update_s)


def test_at_80_columns_a_tensor_row_keeps_its_link_and_shows_its_collectives():
    fleet = fleet_of(tensor_fleet(world=2, collective=0.012), 2)
    cols = layout(78, coll=True)  # 80 columns less the header's padding and the scrollbar
    head = header_text(cols)
    row = row_text(
        fleet.ranks[1], cols, straggler=False, scale_s=None, wait_hi=0.3, now=T0, paused=False
    )
    assert head.cell_len <= 78 and row.cell_len <= 78  # nothing cut: the link column shows
    assert "coll" in head.plain and "12ms" in row.plain and row.plain.endswith("connecting")
    data = layout(78)  # data parallelism: no column, its cells back in the bars
    assert data.coll == 0 and data.bar + data.mem == cols.bar + cols.mem + cols.coll


def test_the_detail_shows_compute_the_collectives_and_their_share():
    fleet = fleet_of(tensor_fleet(world=2, collective=0.05), 2)
    text = detail_text(fleet.ranks[1], fleet, 120, T0).plain
    assert "tensor parallel x2: slice 2 of 2; split fixed" in text
    u = fleet.ranks[1].last
    share = f"{0.05 / u.compute_s:.1%} of compute, {0.05 / u.update_s:.1%} of the update"
    assert f"compute {round(u.compute_s * 1000)}ms" in text and "collective 50ms" in text
    assert share in text
    assert any(line.startswith("collective    ") for line in text.splitlines())  # its history
    data = fleet_of(straggler_fleet(), 4)
    assert "collective" not in detail_text(data.ranks[0], data, 120, T0).plain


def once_text(fleet: Fleet) -> str:
    out = io.StringIO()
    Console(file=out, width=160).print(table(fleet, now=T0 + 100))
    return out.getvalue()


def test_once_prints_the_mode_and_a_coll_column():
    text = once_text(fleet_of(tensor_fleet(world=2, collective=0.012), 2))
    assert "tensor parallel x2" in text and " coll " in text and "12ms" in text
    assert " coll " not in once_text(fleet_of(straggler_fleet(), 4))


# --- the app against a fake feed ---------------------------------------------------------------


async def tensor_started(pilot, feed: FakeFeed) -> None:
    feed.live()
    feed.push(tensor_fleet(world=2, collective=0.012))
    await until(pilot, lambda: pilot.app.fleet.step() == 20)
    await pilot.pause(0.2)


def table_lines(app) -> list[str]:
    table = app.query_one(RankTable)
    return ["".join(s.text for s in table.render_line(y)) for y in range(3)]


@aio
async def test_tensor_parallel_panes_show_the_mode_and_the_collectives():
    feed = FakeFeed(n=2)
    app = FleetApp(feed, clock=lambda: T0 + 100)
    async with app.run_test(size=(80, 24)) as pilot:
        await tensor_started(pilot, feed)
        top = app.query_one(RunHeader).render().plain.splitlines()[0]
        assert "2/2 live  tensor parallel x2" in top
        head, *rows = table_lines(app)
        assert "coll" in head
        assert all("12ms" in row and "live" in row for row in rows)  # 80 columns: link shown
        await pilot.press("enter")
        assert isinstance(app.screen, RankDetailScreen)
        detail = str(app.screen.query_one("#detail").render())
        assert "collective 12ms" in detail and "of the update" in detail


@aio
async def test_the_rebalance_key_says_the_split_is_fixed_and_opens_no_dialog():
    feed = FakeFeed(n=2)
    app = FleetApp(feed, clock=lambda: T0 + 100)
    async with app.run_test(size=(80, 24)) as pilot:
        await tensor_started(pilot, feed)
        await pilot.press("r")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, RebalanceScreen | ConfirmScreen)
        log = log_text(app)
        assert "rebalance: not sent: a tensor-parallel split is fixed" in log
        assert "every rank of a group reads the same rows" in log and "--local-batch" in log
        # The autopilot would rebalance by itself: turning it on says the same, and sends nothing.
        await pilot.press("a")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, ConfirmScreen)
        assert "autopilot: not sent: a tensor-parallel split is fixed" in log_text(app)
        await pilot.press("y")
        await pilot.pause(0.2)
        assert feed.sent == []
