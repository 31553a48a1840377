"""The console's model of the fleet: header figures, the straggler, events, the log."""

from __future__ import annotations

import json

import pytest

from console.fleet import Fleet
from console.hostfile import (
    local_targets,
)
from console.link_phase import LinkPhase, LinkStatus
from console.series import Series
from console.snapshot import header, proposal, snapshot, straggler
from telemetry.records import Dropped, Event, Reply
from tests.support.console_fakes import T0, hello, straggler_fleet, update

# --- fleet -------------------------------------------------------------------------------------


def fed_fleet(**kw) -> Fleet:
    fleet = Fleet(local_targets(4), clock=lambda: T0)
    for r in range(4):
        fleet.set_link(LinkStatus(r, LinkPhase.LIVE))
    for rank, msg in straggler_fleet(**kw):
        fleet.apply(rank, msg)
    return fleet


def test_state_header_figures_and_straggler():
    fleet = fed_fleet()
    h = header(fleet)
    assert h.step == 20 and h.live == 4 and h.world == 4
    assert h.straggler == 3
    assert h.global_batch == 8
    assert h.total_updates == 1000
    assert h.status == "running"
    u = fleet.ranks[0].last
    assert h.tokens_per_s == pytest.approx(u.update_tokens / u.update_s)
    assert h.eta_s == pytest.approx((1000 - 20) * u.update_s)


def test_state_no_straggler_when_balanced():
    fleet = fed_fleet(split=(2, 2, 2, 2), slow=(1, 1, 1, 1))
    assert straggler(fleet) is None


def test_state_skips_history_resent_after_reconnect():
    fleet = fed_fleet()
    n = len(fleet.ranks[0].updates)
    loss_n = len(fleet.loss)
    fleet.apply(0, hello(0))
    for step in range(15, 21):  # the hub's backlog again
        fleet.apply(0, update(0, step))
    assert len(fleet.ranks[0].updates) == n
    assert len(fleet.loss) == loss_n
    ev = Event("checkpoint", 0, 10, data={"path": "p", "verified": True}, time=T0 + 5)
    fleet.apply(0, ev)
    fleet.apply(0, ev)
    assert sum("checkpoint p" in ln.text for ln in fleet.log_lines) == 1


def test_state_new_run_on_rank0_resets():
    fleet = fed_fleet()
    fleet.apply(0, hello(0, run_id="other"))
    assert fleet.run_id == "other"
    assert len(fleet.ranks[0].updates) == 0
    assert any("now serves run other" in ln.text for ln in fleet.log_lines)


def test_state_events_drive_pause_and_log():
    fleet = fed_fleet()
    fleet.apply(0, Event("paused", 0, 21, time=T0 + 1))
    assert header(fleet).status == "paused"
    fleet.apply(0, Event("resumed", 0, 21, time=T0 + 2))
    assert header(fleet).status == "running"
    fleet.apply(0, Event("eval", 0, 20, data={"val_loss": 3.5}, time=T0 + 3))
    assert header(fleet).val_loss == 3.5
    fleet.apply(0, Event("stopped", 0, 22, data={"checkpoint": "ck"}, time=T0 + 4))
    assert header(fleet).status == "stopped"
    fleet.apply(2, Dropped(5, 7))
    assert fleet.ranks[2].dropped == 7


def test_state_replies_name_the_command_and_outcome():
    fleet = fed_fleet()
    fleet.command_sent(3, "rebalance", {"split": [3, 2, 2, 1]})
    fleet.apply(0, Reply(3, True, result={"step": 42}))
    assert "rebalance to 3,2,2,1: applied at update 42" in fleet.log_lines[-1].text
    fleet.command_sent(4, "pause", {})
    fleet.apply(0, Reply(4, False, error="bad mac"))
    assert fleet.log_lines[-1].text.endswith("pause: refused: bad mac")
    assert fleet.log_lines[-1].level == "error"
    assert not fleet.pending


def test_state_link_changes_are_logged_once():
    fleet = fed_fleet()
    lost = LinkStatus(1, LinkPhase.LOST, "connection reset", retry_at=T0 + 1)
    fleet.set_link(lost)
    fleet.set_link(lost)
    assert sum("link lost" in ln.text for ln in fleet.log_lines) == 1
    fleet.set_link(LinkStatus(1, LinkPhase.LIVE))
    assert "rank 1 link back" in fleet.log_lines[-1].text
    assert fleet.live_count() == 4


def test_state_proposal_moves_work_off_the_straggler():
    fleet = fed_fleet(split=(2, 2, 2, 2), slow=(1, 1, 1, 3))
    prop, models, why = proposal(fleet)
    assert why == "" and prop is not None and len(models) == 4
    assert sum(prop.split) == 8
    assert prop.split[3] < 2
    assert prop.gain is not None and prop.gain > 0.3


def test_state_proposal_says_why_not():
    fleet = Fleet(local_targets(2))
    prop, _, why = proposal(fleet)
    assert prop is None and "not every rank" in why


def test_series_keeps_whole_run_at_bounded_size():
    s = Series(8)
    for i in range(100):
        s.add(i, float(i))
    assert len(s) <= 9
    pts = s.all()
    assert pts[0][0] < 10 and pts[-1][0] >= 96  # the start and the newest are both there
    assert s.last_y == 99.0


def test_snapshot_is_json_ready():
    snap = snapshot(fed_fleet())
    text = json.dumps(snap)
    assert json.loads(text)["ranks"][3]["straggler"] is True


# --- issue 14: the event log groups what every rank says alike -----------------------------------


def test_log_groups_what_every_rank_says_alike_and_keeps_what_differs():
    fleet = fed_fleet()
    before, version = len(fleet.log_lines), fleet.log_version
    for r in range(4):
        move = {"from": [3, 2, 2, 1], "to": [1, 3, 2, 2]}
        text = "split [3, 2, 2, 1] -> [1, 3, 2, 2]"
        fleet.apply(r, Event("rebalanced", r, 42, text, move, time=T0 + 50 + r * 0.01))
    assert len(fleet.log_lines) == before + 1
    line = fleet.log_lines[-1]
    assert line.ranks == (0, 1, 2, 3) and line.who == "all 4 ranks" and line.step == 42
    assert line.rev == 3 and fleet.log_version == version + 4
    from console.widgets.event_log import format_line

    assert format_line(line).plain.endswith("all 4 ranks @42 split [3, 2, 2, 1] -> [1, 3, 2, 2]")
    # Three ranks agree, one differs: one line for the three, one of its own.
    for r in range(4):
        val = 3.5 if r < 3 else 3.7
        fleet.apply(r, Event("eval", r, 50, f"val loss {val}", {"val_loss": val}, T0 + 60))
    assert [ln.who for ln in list(fleet.log_lines)[-2:]] == ["r0,1,2", "r3"]
    # The same event again (a reconnect's history) joins nothing and adds nothing.
    fleet.apply(1, Event("eval", 1, 50, "val loss 3.5", {"val_loss": 3.5}, T0 + 60))
    assert list(fleet.log_lines)[-2].ranks == (0, 1, 2)
    snap = snapshot(fleet)
    assert snap["events"][-2]["ranks"] == [0, 1, 2]


def test_log_says_a_retrying_links_refusal_once():
    fleet = Fleet(local_targets(3))
    for _ in range(5):  # connecting, refused, connecting, refused, ...
        for r in range(3):
            fleet.set_link(LinkStatus(r, LinkPhase.CONNECTING, f"127.0.0.1:{47800 + r}"))
            fleet.set_link(
                LinkStatus(
                    r,
                    LinkPhase.REFUSED,
                    f"nothing listening on 127.0.0.1:{47800 + r}",
                    "nothing listening",
                    retry_at=T0 + 1,
                )
            )
    assert len(fleet.log_lines) == 3
    assert fleet.nobody() and header(fleet).status == "no run"
    fleet.set_link(LinkStatus(0, LinkPhase.CONNECTING, "127.0.0.1:47800"))
    assert fleet.nobody()  # retrying is not an answer
    fleet.set_link(LinkStatus(0, LinkPhase.LIVE, "127.0.0.1:47800"))
    assert not fleet.nobody()
