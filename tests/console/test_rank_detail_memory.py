"""The rank detail's memory lines (issue 20): the live set, limit and budget a rank uses, and
its optimizer share with the master weights and state it holds."""

from __future__ import annotations

import dataclasses

from console.fleet import Fleet
from console.hostfile import local_targets
from console.screens.rank_detail import detail_text
from telemetry.units import GiB, MiB
from tests.support.console_fakes import T0, hello, update


def _detail(**fields) -> str:
    fleet = Fleet(local_targets(2), clock=lambda: T0)
    fleet.apply(1, hello(1, world=2))
    fleet.apply(1, dataclasses.replace(update(1, 1, world=2), **fields))
    return detail_text(fleet.ranks[1], fleet, 120, T0).plain


def test_the_detail_shows_the_limit_and_the_optimizer_share():
    text = _detail(
        mem_budget=30 * GiB,
        mem_limit=9 * GiB,
        live_mem=8 * GiB,
        opt_share=0.25,
        resident_mem=384 * MiB,
    )
    assert "live set 8.0G" in text and "limit 9.0G" in text and "budget 30G" in text
    assert "optimizer share 25.0%" in text and "master weights + state 384M" in text


def test_an_old_peer_s_update_shows_no_memory_policy_lines():
    text = _detail()  # an Update without the new fields: their defaults
    assert "live set" not in text and "optimizer share" not in text


def test_the_console_s_balancer_caps_a_rank_by_its_budget():
    """The console's proposal uses the figure the trainer's caps use: the rank's budget (here
    3 GiB on a 16 GiB Mac), not its machine's memory."""
    from console.snapshot import balance_samples

    fleet = Fleet(local_targets(2), clock=lambda: T0)
    for r in range(2):
        fleet.apply(r, hello(r, world=2))
    fleet.apply(0, dataclasses.replace(update(0, 1, world=2), mem_budget=3 * GiB))
    fleet.apply(1, update(1, 1, world=2))  # an older rank: no budget reported
    samples = balance_samples(fleet)
    assert samples[0][-1].mem_total == 3 * GiB
    assert samples[1][-1].mem_total == fleet.ranks[1].memory_total
