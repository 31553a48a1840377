"""The autopilot and the alerts: converging on a fixed slowdown, still on noise, guarding
memory (fast: figures as ranks report them), and on real ranks."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest

from telemetry.units import GiB
from tests.support import pilot_sim
from tests.support.fleet import ROOT
from trainer import autopilot
from trainer.alerts import Alerts
from trainer.autopilot import Autopilot, Decision, RankFigures, nearest, pooled, unjustified
from trainer.config import ConfigError, TrainConfig
from trainer.costs import SPELL, Costs, Estimate


def simulate(costs, split, updates=200, noise=0.02, pilot=None, seed=0, change_at=None):
    """Feed the pilot what ranks of these per-sample costs would measure; apply its commands
    to the next update, as the controller does with a decision the pilot announced (here
    every decision: tests/support/pilot_sim.py tells the two apart). Returns (splits it
    chose, pilot)."""
    rng = random.Random(seed)
    pilot = pilot or Autopilot(len(split), enabled=True)
    chosen, queued = [], []
    for step in range(updates):
        for cmd, args in queued:
            if cmd == "rebalance":
                split = args["split"]
                chosen.append(split)
        if change_at and step == change_at[0]:
            costs = change_at[1]
        figures = [
            RankFigures(b, 0.002 + c * b * rng.uniform(1 - noise, 1 + noise), GiB, 0, 0, None)
            for c, b in zip(costs, split, strict=True)
        ]
        queued = pilot.observe(split, figures).commands
    return chosen, pilot


def slowest(costs, split):
    return max(0.002 + c * b for c, b in zip(costs, split, strict=True))


def test_a_fixed_slowdown_converges_within_two_changes():
    costs = [0.02, 0.01, 0.01, 0.01]  # rank 0 takes twice as long per sample
    chosen, _ = simulate(costs, [2, 2, 2, 2])
    assert 1 <= len(chosen) <= 2
    best = min(
        slowest(costs, [a, b, c, 8 - a - b - c])
        for a in range(1, 6)
        for b in range(1, 6)
        for c in range(1, 6)
        if 8 - a - b - c >= 1
    )
    assert best / slowest(costs, chosen[-1]) >= 0.95


def test_noise_alone_changes_nothing():
    for seed in range(5):
        chosen, _ = simulate([0.01] * 4, [2, 2, 2, 2], noise=0.10, seed=seed)
        assert chosen == []


def test_a_slowdown_that_moves_is_followed():
    before, after = [0.02, 0.01, 0.01, 0.01], [0.01, 0.01, 0.03, 0.01]
    chosen, _ = simulate(before, [2, 2, 2, 2], updates=300, change_at=(100, after))
    assert chosen and chosen[-1][2] < chosen[-1][0]  # rank 2 is now the one given less


def test_the_pilot_announces_the_boundary_of_a_move_for_a_slowdown():
    """The controller applies a decision at its own boundary only where the pilot said it
    may decide there (a second exchange, trainer/controller.py): a slowdown's move must be
    announced; steady equal ranks announce none (no second exchange to pay for)."""
    rng = random.Random(0)
    pilot, split = Autopilot(4, enabled=True), [4, 4, 4, 4]
    announced, moves = [], []
    for step in range(80):
        costs = [0.01, 0.01, 0.03 if step >= 40 else 0.01, 0.01]
        figures = [
            RankFigures(b, 0.002 + c * b * rng.uniform(0.98, 1.02), GiB, 0, 0, None)
            for c, b in zip(costs, split, strict=True)
        ]
        announced.append(pilot.may_decide())
        for cmd, args in pilot.observe(split, figures).commands:
            if cmd == "rebalance":
                moves.append(step)
                split = args["split"]
    assert moves and moves[0] >= 40 and announced[moves[0]]
    assert not any(announced[:40])


def test_a_young_new_speed_is_announced_only_one_agreeing_figure_from_confirmation():
    """Each announced boundary costs a second exchange, tens of ms where ranks outnumber
    cores. On spiky ranks (1.6x in one figure of 8) a 1.5x slowdown is read from the median
    of 2-4 figures and waits for 3 more to confirm it: the pilot announces where the next
    figure may bring the move, not at every figure of a young shift (or of a spike's, which
    two figures back at the old level undo). Over 8 seeds every slowdown is answered, 7 of
    the 8 moves at an announced boundary (the eighth waited for a settled regime, as before),
    and 7 of 17 announced boundaries bring a move (before: 7 of 56)."""
    announced_in_all, moves, announced_moves = 0, [], 0
    for seed in range(8):
        rng = random.Random(seed)
        pilot, split = Autopilot(4, enabled=True), [4, 4, 4, 4]
        for step in range(90):
            costs = [0.01, 0.01, 0.015 if step >= 60 else 0.01, 0.01]
            figures = [
                RankFigures(b, 0.002 + c * b * rng.uniform(0.95, 1.05) * spike, GiB, 0, 0, None)
                for c, b in zip(costs, split, strict=True)
                for spike in [1.6 if rng.random() < 0.12 else 1.0]
            ]
            announced = pilot.may_decide()
            announced_in_all += announced
            for cmd, args in pilot.observe(split, figures).commands:
                if cmd == "rebalance":
                    moves.append((seed, step))
                    announced_moves += announced
                    split = args["split"]
    assert sorted({seed for seed, _ in moves}) == list(range(8))
    assert all(step >= 60 for _, step in moves), moves
    assert announced_moves >= 3 * len(moves) / 4, (announced_moves, moves)
    assert announced_moves / announced_in_all >= 1 / 3, (announced_moves, announced_in_all)


def test_the_memory_guard_moves_samples_off_a_pressed_rank():
    pilot = Autopilot(3, enabled=True)
    split, decided = [3, 3, 3], []
    for _ in range(5):
        figures = [
            RankFigures(3, 0.03, 2 * GiB, 0, 0, 8 * GiB),
            RankFigures(3, 0.03, 2 * GiB, 0, 0, 8 * GiB),
            RankFigures(3, 0.03, 7.5 * GiB, 0, 0, 8 * GiB),  # over 85% of its limit
        ]
        decided += pilot.observe(split, figures).commands
    ((cmd, args),) = decided  # once: then it waits for figures at the new split
    assert cmd == "rebalance" and args["split"][2] < 3 and sum(args["split"]) == 9
    assert "memory guard" in args["reason"] and "rank 2: peak 7.50 GiB" in args["reason"]


def test_when_no_split_fits_the_guard_warns_and_pauses():
    pilot = Autopilot(2, enabled=True, pause_on_pressure=True)
    d = None
    for _ in range(5):
        d = pilot.observe([1, 1], [RankFigures(1, 0.01, 7.9 * GiB, 0, 0, 8 * GiB)] * 2)
        if d.commands:
            break
    assert d.commands == [("checkpoint", {}), ("pause", {})]
    assert d.events[0][0] == "alert" and "no split fits" in d.events[0][1]


def test_a_pilot_that_is_off_only_tells():
    pilot = Autopilot(2, enabled=False)
    for _ in range(5):
        d = pilot.observe([2, 2], [RankFigures(2, 0.01, GiB, 0, 0.9, None)] * 2)
        assert d.commands == []
    assert any(kind == "alert" for kind, _, _ in simulate_notes(pilot))


def simulate_notes(pilot):
    pilot.pressed_before = set()
    return pilot.observe([2, 2], [RankFigures(2, 0.01, GiB, 0, 0.9, None)] * 2).events


def test_alerts_reach_a_command_once_per_kind(tmp_path):
    now = [0.0]
    seen = []
    out = tmp_path / "alerts.jsonl"
    alerts = Alerts(f"cat >> {out}", 300, lambda *a: seen.append(a), clock=lambda: now[0])
    assert alerts.raise_("disk", "no space", free=1)
    assert not alerts.raise_("disk", "no space again")  # within 300 s: once
    now[0] = 301
    assert alerts.raise_("disk", "still no space")
    alerts.close()
    # each alert runs its own command, without waiting for the last: any order may land
    lines = sorted((json.loads(x) for x in out.read_text().splitlines()), key=lambda x: x["time"])
    assert [x["message"] for x in lines] == ["no space", "still no space"]
    assert lines[0]["kind"] == "disk" and lines[0]["free"] == 1
    assert [s[0] for s in seen] == ["alert", "alert"]


def test_alerts_watch_the_loss_and_the_throughput():
    seen = []
    alerts = Alerts("", 0, lambda kind, msg, data: seen.append(data["alert"]))
    for step in range(40):
        alerts.watch(step, 2.0, 1000.0)
    assert seen == []
    alerts.watch(41, 9.0, 1000.0)  # a spike
    for step in range(42, 80):
        alerts.watch(step, 2.0, 300.0)  # throughput falls to 30%
    alerts.watch(81, float("nan"), 1000.0)
    assert seen[0] == "loss" and "throughput" in seen and seen[-1] == "loss"


def test_a_slowdown_schedule_is_read_per_rank():
    cfg = TrainConfig(synthetic=True, simulate_slowdown="2,1,1,1@0;1,1,3,1@50")
    assert cfg.slowdown(4, 0) == [(0, 2.0), (50, 1.0)]
    assert cfg.slowdown(4, 2) == [(0, 1.0), (50, 3.0)]
    with pytest.raises(ConfigError, match="later than the last"):
        TrainConfig(simulate_slowdown="2@5;1@5").slowdown(1, 0)


def test_a_slowdown_from_update_n_slows_the_update_the_log_numbers_n():
    """The log numbers updates from 1 (the update in progress is the loop's step + 1); `@50`
    was applied from update 51, one later than the operator and the benchmark's judge read it."""
    schedule = TrainConfig(synthetic=True, simulate_slowdown="2@0;1,1,3,1@50").slowdown(4, 2)
    assert [TrainConfig.slowdown_at(schedule, u) for u in (1, 49, 50, 51)] == [2, 2, 3, 3]


# --- against this machine's noise (tests/support/pilot_sim.py: shared load, own scatter,
# spikes, recompiles; an announced decision runs from the next update, others a boundary
# later, as in a run)
C = 0.05


def moving(t: int) -> list[float]:
    """issue 14's scenario: rank 0 twice as slow, then rank 2 three times, from update 50"""
    return [2 * C, C, C, C] if t < 50 else [C, C, 3 * C, C]


def flown(schedule, seed: int, updates: int = 100, split=(4, 4, 4, 4)):
    return pilot_sim.fly(schedule, list(split), updates, Autopilot(4, enabled=True), seed=seed)


def test_equal_ranks_make_no_change_in_500_updates():
    for seed in range(4):
        assert flown(lambda t: [C] * 4, seed, updates=500).changes == []


def test_equal_ranks_make_no_change_on_this_boxs_fast_spells():
    """pilot_sim.SPELLS: this box with its fast spells (a rank about twice as fast for 4-10
    updates, runs of fast figures rather than independent spikes). Main's pilot moved
    samples to such a rank in 2 of these 24 runs (seeds 3 and 13), as it did in 9 of 33
    real runs of equal ranks."""
    for seed in range(24):
        out = pilot_sim.fly(
            lambda t: [C] * 4, [4] * 4, 500, Autopilot(4, enabled=True), pilot_sim.SPELLS, seed
        )
        assert out.changes == [], (seed, out.changes)


def test_no_sample_ever_moves_between_ranks_whose_costs_agree():
    # seed 16: a young regime judged by the scatter of a regime of 5 figures (a MAD that
    # short was half the true one) read a spike as a recovery and moved samples at 66
    for seed in (*range(6), 16):
        out = flown(moving, seed)
        assert out.changes and out.unjustified == [], out.changes


def test_a_sustained_change_is_followed_within_8_updates():
    reactions = [pilot_sim.reaction(flown(moving, seed), 50) for seed in range(8)]
    assert statistics.median(reactions) <= 8 and max(reactions) <= 10, reactions


def gradual(t: int) -> list[float]:
    """benchmarks/autopilot.py's gradual16: rank 3 1.5x as slow from 25, 2x from 45, 3x from 65"""
    return [C, C, C, C * (1 if t < 25 else 1.5 if t < 45 else 2 if t < 65 else 3)]


def test_a_split_taken_for_a_small_slowdown_still_holds_when_it_grows():
    """On this box's noise (pilot_sim.BOX), the split the pilot takes when rank 3 turns 1.5x
    as slow is already as fast as any (within 2%) when it turns 2x as slow, in most runs: it
    left rank 3 what fits at the high end of its new cost, read from few figures (5,5,4,2).
    Main's pilot left it what fits at the midpoint (5,4,4,3), which had to be answered again
    4-10 updates later: it kept 2 of these 24 runs, this one 17."""
    phase = [
        pilot_sim.reaction(
            pilot_sim.fly(gradual, [4] * 4, 100, Autopilot(4, enabled=True), pilot_sim.BOX, seed),
            45,
            gradual,
            65,
            pilot_sim.BOX,
        )
        for seed in range(24)
    ]
    assert phase.count("kept") >= 12, phase


def test_the_pilot_keeps_up_with_the_best_fixed_split_and_the_oracle():
    noise = pilot_sim.Noise()
    vs_best, vs_oracle = [], []
    for seed in range(6):
        total = flown(moving, seed).total
        vs_best.append(pilot_sim.best_fixed(moving, 4, 16, 100, noise, seed)[1] / total)
        vs_oracle.append(pilot_sim.oracle(moving, 4, 16, 100, [0, 50], noise, seed) / total)
    # the ideal pilot, moving straight to each phase's best split 8 and 7 updates late, makes
    # 1.03 and 0.905 here: this noise costs any reader of it a few updates per change
    assert statistics.median(vs_best) >= 0.95 and statistics.median(vs_oracle) >= 0.83


def transient(t: int) -> list[float]:
    """rank 1 three times as slow from update 30 to 60, then itself again"""
    return [C, 3 * C if 30 <= t < 60 else C, C, C]


def test_the_pilot_reads_the_fixed_part_and_sees_a_rank_recover():
    """Ranks whose compute has a fixed part of 6 samples' worth (as session 7 read this
    project's box). The slow rank is left 1 sample; when it recovers, its compute (6 + 1) is
    still dear per sample read as cost x batch, and a pilot that assumes no fixed part never
    gives it its samples back. Reading the fixed part from its own move, the pilot does
    where that reading requires a fixed part of a sample or more (session 20 read the rank
    at most at the least the figures allowed, and gave 12 of these 24 seeds their samples
    back; session 19, the fit at any batch, 23; session 21, 19; session 22, slowdowns
    confirmed a figure sooner, 17). The move back gains 9% of the compute here (11 -> 10
    samples' worth), and was read under the pilot's least gain of 5% while the fit was young
    or the ranks' parts differed: 17 of 24 until session 27, whose least gain of 3% gives
    all 24 their samples back. A fit misread from a move made with 3 updates before it (19
    samples: a rank given 5 samples to its peers' 3, a move the true costs do not justify)
    may still happen once."""
    back, readings, unjustified_runs = {}, [], []
    for fixed, seeds in ((0.0, 6), (None, 24)):
        back[fixed] = []
        for seed in range(seeds):
            pilot = Autopilot(4, enabled=True, fixed_samples=fixed)
            out = pilot_sim.fly(transient, [4] * 4, 100, pilot, pilot_sim.SIX, seed)
            if out.unjustified:
                unjustified_runs.append(out.changes)
            back[fixed].append(out.splits[-1][1])
            if fixed is None:
                readings.append(pilot.fixed_part.reading())
    assert len(unjustified_runs) <= 1, unjustified_runs
    assert sum(b >= 3 for b in back[None]) >= 22 and max(back[0.0]) == 1, back
    assert sum(r is not None and r.least <= 6.0 <= r.most for r in readings) >= 16, readings


def kept(name: str) -> dict:
    """A real run's figures as tests/support/traces/NAME.json keeps them (its "what" says
    which run)."""
    return json.loads((ROOT / f"tests/support/traces/{name}.json").read_text())


def replayed(
    trace: dict,
    pilot: Autopilot,
    moves_at_most: int = 1 << 30,
    reasons: list | None = None,
    late: list | None = None,
) -> list[list]:
    """The moves `pilot` makes on a kept trace's figures, [update, from, to] as the run logs
    them (at the boundary it said it may decide on, else the next); their reasons are added
    to `reasons`, and the indices of those applied a boundary late (not announced) to `late`."""
    moves: list[list] = []
    for step, row in enumerate(trace["figures"], trace["first_update"]):
        split, figures = traced(row)
        announced = pilot.may_decide()
        decision = pilot.observe(split, figures)
        at = step if announced else step + 1
        moved = [a for cmd, a in decision.commands if cmd == "rebalance"]
        if late is not None and not announced:
            late += range(len(moves), len(moves) + len(moved))
        moves += [[at, split, a["split"]] for a in moved]
        if reasons is not None:
            reasons += [a["reason"] for a in moved]
        if len(moves) >= moves_at_most:
            break
    return moves


def as_run(moves: list[list], logged: list[list], late: list[int]) -> bool:
    """Whether a replay's moves are the run's: the same splits, each applied at the update
    the run logged, or the one after where this pilot decided it at a boundary it had not
    announced (since session 32 it announces only where a move is likely: may_decide)."""
    return len(moves) == len(logged) and all(
        m[1:] == g[1:] and m[0] == g[0] + (i in late)
        for i, (m, g) in enumerate(zip(moves, logged, strict=True))
    )


def traced(row: list) -> tuple[list[int], list[RankFigures]]:
    """One update of a kept trace, [[batch, compute_s], ...]: its split, and its figures as
    the controller hands them to the pilot (memory left out)."""
    return [b for b, _ in row], [RankFigures(b, c, GiB, 0, 0, None) for b, c in row]


def test_on_real_figures_a_rank_left_one_sample_gets_its_share_back_in_one_move(monkeypatch):
    """Session 17's moving16 repeat 1 (tests/support/traces/moving16_s17.json: each update's
    batch and compute time of 4 real ranks on the 2-core box, where a rank at batch 1 costs
    a little more per sample than at 5-7). Rank 0, twice as slow and left 1 sample, is itself
    again from update 50, when rank 2 turns three times as slow; the pilot moved to 1,7,2,6
    at 53. Steering by the least fixed part the figures allowed (0), it read rank 0 a third
    dearer per sample than its peers and gave it its samples back two at a time, 3,6,1,6
    at 63 and 5,5,1,5 at 73. Steered by the fit (0.3-0.5 samples) it moves to 5,5,1,5 by
    60, and decides the run's first three moves as the run did. (Rank 0 held at 1 at 53, as
    that run's pilot held it: not taken at its new speed, see the next test.)"""
    monkeypatch.setattr(autopilot, "BET_ALPHA", 0.0)
    trace = kept("moving16_s17")
    pilot = Autopilot(4, enabled=True)
    late: list[int] = []
    moves = replayed(trace, pilot, moves_at_most=4, late=late)
    assert as_run(moves[:3], trace["changes"][:3], late), moves
    assert moves[3][2] == [5, 5, 1, 5] and moves[3][0] <= 60, moves
    assert 0.1 <= pilot.fixed()[0] <= 1.0


def test_a_rank_that_recovers_as_another_slows_is_taken_at_its_new_speed():
    """The same run: at 53 rank 2's slowdown is confirmed while rank 0's recovery (a rank
    held at batch 1 while twice as slow) awaits one more figure. Its figures since update 50
    are, by its record, spikes with a chance of about 1e-4, and the move for rank 2 is paid
    anyway: it is made straight to 5,5,1,5 with rank 0 taken at its new speed (the run's
    pilot held rank 0 at 1: 1,7,2,6, and 5,5,1,5 seven updates later)."""
    trace = kept("moving16_s17")
    reasons: list[str] = []
    late: list[int] = []
    moves = replayed(trace, Autopilot(4, enabled=True), 3, reasons, late)
    assert as_run(moves[:2], trace["changes"][:2], late), moves
    assert moves[2] == [53, [1, 5, 5, 5], [5, 5, 1, 5]], moves
    assert "rank(s) 0 taken at a new speed not yet confirmed" in reasons[2]


def test_a_rank_taken_at_a_new_speed_is_taken_at_no_faster_than_the_fastest_confirmed():
    """Session 33's run G, moving16 repeat 0 (tests/support/traces/moving16_s33.json): at 53
    rank 2's slowdown is confirmed while rank 0, back from 2x at 1 sample, awaits one more
    figure. On this box a rank at 1 sample is not a fifth of one at 5: rank 0 read 0.47x its
    peers, and the run's pilot took it at that speed, 1,5,5,5 -> 9,3,1,3 (and 5,5,1,5 six
    updates later). Taken at no faster than the fastest confirmed rank, it goes to 5,5,1,5
    at once."""
    trace = kept("moving16_s33")  # logged by a pilot that announced as this one does
    moves = replayed(trace, Autopilot(4, enabled=True), 3)
    assert moves[:2] == trace["changes"][:2], moves
    assert moves[2] == [53, [1, 5, 5, 5], [5, 5, 1, 5]], moves


def test_on_real_figures_of_two_ranks_a_slowdown_by_half_again_is_answered_within_6_updates():
    """Session 35's pair-gradual16 repeat 1 (tests/support/traces/pair_gradual16_s35.json):
    two real ranks, a core each, rank 1 half again as slow from 25. The run's pilot read it
    at the size one rank of four shows, never as a shift, and moved at 38 as the regime's
    median crept up; read at the size two ranks show, the move comes at 30."""
    trace = kept("pair_gradual16_s35")
    moves = replayed(trace, Autopilot(2, enabled=True), 1)
    assert trace["changes"] == [[38, [8, 8], [10, 6]]]
    assert moves and moves[0][1:] == [[8, 8], [10, 6]] and moves[0][0] <= 30, moves


def test_on_real_figures_a_shift_undone_is_no_news_and_the_calm_after_a_move_holds():
    """Session 39's pair-gradual16 on the GPU host's CPUs, repeat 0 (tests/support/traces/
    pair_gradual16_undone_s39.json): nine updates after the pilot's move to 10,6, both ranks'
    figures shifted for three updates and came back. The run's pilot still took both ranks
    for news, so the calm after its move (a move then must gain 10%) did not hold, and it
    moved 10,6 -> 9,7 at 41 for a predicted 3% (and back at 49). The shift undone is no
    news: the pilot stays at 10,6."""
    trace = kept("pair_gradual16_undone_s39")
    assert trace["changes"][-1] == [41, [10, 6], [9, 7]]
    pilot = Autopilot(2, enabled=True)
    assert replayed(trace, pilot) == trace["changes"][:1]
    assert pilot.costs.confirmed(0) and pilot.costs.confirmed(1) and pilot._news() == []


def watched(cost, updates: int = 45) -> Autopilot:
    """A watching pilot (it moves nothing) after `updates` of four simulated ranks at 4
    samples each, rank r costing `cost(update, r)` times its peers a sample (3% noise)."""
    pilot, noise = Autopilot(4, enabled=False), pilot_sim.Noise(shared=0, own=0.03, spikes=0)
    pilot_sim.fly(lambda t: [C * cost(t, r) for r in range(4)], [4] * 4, updates, pilot, noise)
    return pilot


def test_a_spike_undone_leaves_a_rank_as_it_found_it():
    """Two updates 3x slow and two back are spikes (trainer/costs.py undoes the shift): no
    news where there was none, and a slowdown confirmed before them is news still."""
    spike = watched(lambda t, r: 3.0 if r == 2 and t in (30, 31) else 1.0)
    assert spike.costs.confirmed(2) and spike.fresh == set() and spike._news() == []
    slowed = watched(
        lambda t, r: (2.0 if r == 2 and t >= 15 else 1.0) * (3.0 if r == 2 and t in (35, 36) else 1)
    )
    assert slowed._news() == [2]
    assert slowed.costs.estimate(2).cost / slowed.costs.estimate(0).cost == pytest.approx(
        2, rel=0.1
    )


def pair_changes(cost, split: list[int], updates: int, seed: int = 0) -> list:
    """The changes a pilot makes on two ranks of cost a sample `cost(update, rank, batch)`
    (times 10 ms, 2% noise): [(update, split), ...]."""
    rng, pilot, changes, queued = random.Random(seed), Autopilot(2, enabled=True), [], []
    for t in range(updates):
        for cmd, args in queued:
            if cmd == "rebalance":
                split = args["split"]
                changes.append((t, split))
        figures = [
            RankFigures(b, 0.01 * b * cost(t, r, b) * rng.uniform(0.98, 1.02), GiB, 0, 0, None)
            for r, b in enumerate(split)
        ]
        queued = pilot.observe(split, figures).commands
    return changes


def test_a_move_that_would_undo_the_last_one_goes_halfway():
    """Two equal ranks where a batch of 9 costs 12% more a sample than one of 8 and a batch of
    7 10% less (this box's pairs: 11.7, 10.9 and 9.0-10.7 ms). At 7,9 the rank at 9 reads
    dearer, and the pilot moves to 9,7; there the other does. Main's pilot went back and
    forth every 7 updates (21 changes in 150); the costs read at the two splits disagree, so
    the fastest lies between: the pilot goes halfway, to 8,8, and stays."""
    by_batch = {7: 0.90, 9: 1.12}
    for seed in range(4):
        changes = pair_changes(lambda t, r, b: by_batch.get(b, 1.0), [7, 9], 150, seed)
        assert [s for _, s in changes] == [[9, 7], [8, 8]], (seed, changes)


def test_a_move_undone_after_a_rank_s_cost_moved_is_undone_whole():
    """Rank 1 three times as slow from 10 to 40: the pilot's move for it (12,4) is undone
    whole when it recovers (news: the two splits were read in different worlds)."""
    changes = pair_changes(lambda t, r, b: 3.0 if r == 1 and 10 <= t < 40 else 1.0, [8, 8], 70)
    assert [s for _, s in changes] == [[12, 4], [8, 8]], changes
    assert changes[1][0] <= 48, changes


def test_halfway_keeps_the_global_batch_and_the_giving_ranks_keep_the_odd_sample():
    assert autopilot.halfway([9, 7], [7, 9]) == [8, 8]
    assert autopilot.halfway([12, 4], [7, 9]) == [10, 6]
    assert autopilot.halfway([4, 4, 4, 4], [1, 5, 5, 5]) == [3, 5, 4, 4]
    assert autopilot.halfway([2, 5, 5, 4], [1, 5, 5, 5]) == [2, 5, 5, 4]


def test_on_real_figures_a_move_that_made_the_update_slower_is_undone_whole():
    """Session 25's gradual16 repeat 1 of run C (tests/support/traces/gradual16_undo_s25.json):
    the pilot moved to 5,5,4,2 for rank 3's 1.5x slowdown, and back to 4,4,4,4 at 45 as rank 3
    turned 2x (the move's restart hid the shift: no news). 4,4,4,4 then measured slower than
    5,5,4,2 by 2.8 standard errors (the slowest compute's median): a mistake, undone whole at
    52 as the run did, not halfway (5,4,4,3 at 51)."""
    trace = kept("gradual16_undo_s25")
    moves = replayed(trace, Autopilot(4, enabled=True))
    assert moves == trace["changes"], moves
    assert moves[2] == [52, [4, 4, 4, 4], [5, 5, 4, 2]], moves


def test_on_real_figures_two_ranks_back_from_a_slowdown_do_not_ping_pong():
    """Session 35's pair-transient16 repeat 2 of run K (tests/support/traces/
    pair_transient16_s35.json): back from 13,3 the run's pilot went to 7,9 at 64, 9,7 at 71
    and 7,9 again at 80 (then on to the end, 4 moves between ranks equal by the schedule):
    the rank at 9 read 15-30% dearer a sample at either split (7,9 measured 105 ms, the
    slowest rank's compute; 9,7 100). This pilot goes halfway, to 8,8, at 80."""
    trace = kept("pair_transient16_s35")
    moves = replayed(trace, Autopilot(2, enabled=True))
    assert moves[:4] == trace["changes"][:4], moves
    assert moves[4] == [80, [9, 7], [8, 8]], moves


def test_on_real_figures_a_mistake_is_never_undone_past_the_split_it_left():
    """Session 41's pair-equal repeat 2 at width 384 (tests/support/traces/
    pair_equal_w384_s41.json: two real ranks, neither slowed). The pilot moved 8,8 -> 6,10 at
    485 on a three-update spell of rank 0; at 6,10 the update measured slower, and the fixed
    part read from earlier moves (4.8 samples) read rank 1 dearer where the raw figures read
    the ranks alike: main's pilot went on to 10,6 at 492, past the even split. The costs read
    at 8,8 called for nothing beyond it, and no rank's cost moved since: back to 8,8."""
    trace = kept("pair_equal_w384_s41")
    moves = replayed(trace, Autopilot(2, enabled=True))
    assert moves[:3] == trace["changes"][:3], moves
    assert moves[3] == [492, [6, 10], [8, 8]], moves


def test_on_real_figures_a_new_speed_a_restart_hid_is_answered_whole():
    """Session 42's pair-transient16 repeat 1 (tests/support/traces/
    pair_transient16_hidden_s42.json): 9,7 -> 8,8 at 28, and rank 1 three times as slow from
    30, inside the restart's regime (no shift read), so 8,8 measured slower than 9,7. The move
    due, 8,8 -> 13,3, goes back past 9,7 four times as far as the change came: a new speed,
    not the mirror of a mistake (854a888's pilot cut it to 9,7 and answered at 41)."""
    trace = kept("pair_transient16_hidden_s42")
    moves = replayed(trace, Autopilot(2, enabled=True))
    assert moves[:2] == trace["changes"][:2], moves
    assert moves[2] == [34, [8, 8], [13, 3]], moves


def test_on_real_figures_of_two_ranks_one_change_is_one_piece_of_evidence_of_the_fixed_part():
    """Session 43's pair-gradual16 repeat 1 (tests/support/traces/
    pair_gradual16_hidden_s43.json): 8,8 -> 9,7 at 43, and rank 1 twice as slow (from 1.5x)
    from 45, inside the change, so its time rose as its batch fell. Of two ranks each one's
    relative change is the other's negated; counted as two pieces of evidence, that one
    change outweighed the prior toward a small fixed part, and the pilot steered by 32
    samples (0 to 64) until its next move, at 64. It reads no fixed part now, the range
    still open (one change cannot rule a large one out)."""
    trace = kept("pair_gradual16_hidden_s43")
    pilot = Autopilot(2, enabled=True)
    steered = []
    for step, row in enumerate(trace["figures"], trace["first_update"]):
        pilot.observe(*traced(row))
        if 49 <= step <= 62:  # the change read (3 updates after its recompile), no move since
            steered.append(pilot.fixed())
    assert trace["changes"][0] == [43, [8, 8], [9, 7]]
    assert max(best for best, _ in steered) <= 2.0, steered
    assert min(most for _, most in steered) >= 8.0, steered


def test_a_move_back_past_the_split_the_last_change_left_is_told_apart():
    assert autopilot.mirrors([6, 10], [10, 6], [8, 8])
    assert autopilot.mirrors([2, 5, 5], [5, 5, 2], [4, 4, 4])
    assert autopilot.mirrors([5, 11], [12, 4], [9, 7])  # 3 beyond, where it came 4
    assert autopilot.mirrors([10, 6], [4, 12], [8, 8])  # 4 beyond, where it came 2
    assert not autopilot.mirrors([6, 10], [8, 8], [8, 8])  # back to it: the halfway rule's
    assert not autopilot.mirrors([6, 10], [7, 9], [8, 8])  # short of it
    assert not autopilot.mirrors([6, 10], [4, 12], [8, 8])  # further on
    # beyond by more than twice what it came: a new speed the change's restart may have hidden
    assert not autopilot.mirrors([8, 8], [13, 3], [9, 7])
    assert not autopilot.mirrors([12, 4], [7, 9], [11, 5])
    # a rank the last change left alone moves: not a way back
    assert not autopilot.mirrors([2, 6, 4], [5, 2, 5], [4, 4, 4])


def test_a_rank_is_taken_at_a_new_speed_only_for_a_move_due_anyway():
    """Session 15's equal ranks, repeat 2 (tests/support/traces/equal_s15.json: 110 updates
    of 4 real ranks, none slowed, no move made). At 101 rank 1 had shown four fast figures
    in a row (spikes with a chance of 2e-4 by its record) and ranks 0, 2 and 3 read as moved
    since the run began. Taken at that speed whenever another rank's cost had moved, rank
    1 was given 7 samples (4,4,4,4 -> 3,7,3,3, tried). No move was due for the others, so
    none is made."""
    trace = kept("equal_s15")
    assert replayed(trace, Autopilot(4, enabled=True)) == trace["changes"] == []


def test_on_real_figures_a_rank_twice_as_fast_for_a_spell_is_given_nothing():
    """Four runs on equal ranks (tests/support/traces/equal_spells.json, sessions 16-24): in
    each, one rank ran about twice as fast as its peers for 4-10 updates (it had a core of
    the two to itself), its fast figures in a row were confirmed as a new speed, and it was
    given 3 samples, taken back 7-13 updates later. Faster than it had ever been and alone
    in moving, it waits for a spell's worth of figures (trainer/costs.py, SPELL), and the
    spell is over first."""
    for run in kept("equal_spells")["runs"]:
        assert run["changes"], run["run"]  # what that run's pilot did on these figures
        assert replayed(run, Autopilot(4, enabled=True)) == [], run["run"]


def test_on_real_figures_a_slow_rank_left_one_sample_is_not_given_more_on_a_fit_from_elsewhere():
    """Session 19's gradual16 repeat 0 (tests/support/traces/gradual16_s19.json: rank 3
    slower and slower, 4 real ranks on the 2-core box, whose compute per sample falls with
    the batch). By 72 rank 3, three times as slow, had been left 1 sample (0.07-0.12 s where
    its peers took 0.04-0.16 s at 4-7), and the fixed part read from the moves between 4
    and 7 was 2.8 samples (0 to 4.8). Read at it, rank 3 cost a third more a sample than
    its peers, and the pilot moved 4,4,7,1 -> 4,4,4,4 at 72: rank 3 then took 0.2-0.35 s. Read at
    most at its batch, it costs more than twice as much and is given one sample more. The
    run's first move is decided as the run did (9 updates sooner: rank 3's slowdown read
    against all ranks' records), but for its split, and so is its answer to the 3x step; its
    moves at 48 and 64 are not (both came on news that was spikes undone, see
    test_on_real_figures_a_shift_undone_is_no_news_and_the_calm_after_a_move_holds)."""
    trace = kept("gradual16_s19")
    late: list[int] = []
    moves = replayed(trace, Autopilot(4, enabled=True), moves_at_most=9, late=late)
    # the first leaves rank 3, 1.5x as slow and read from few figures, 2 samples where the
    # run's pilot left it 3: what fits at the high end of its cost (see
    # test_a_rank_that_gives_is_left_what_fits_at_the_high_end_of_its_cost)
    assert moves[0] == [29, [4, 4, 4, 4], [5, 5, 4, 2]], moves
    i, first = next((i, m) for i, m in enumerate(moves) if m[1] == [5, 5, 4, 2])
    assert trace["changes"][2] == [55, [5, 5, 4, 2], [5, 5, 5, 1]]
    assert first[2] == [5, 5, 5, 1] and first[0] <= 55 + (i in late), moves
    # 5,4,4,3 -> 5,5,4,2 at 48, predicted 9% faster within the calm after a move, and
    # 5,5,5,1 -> 4,4,7,1 at 64, on rank 2 read fast for three updates
    assert not any(m[1] == [5, 4, 4, 3] or m[2] == [4, 4, 7, 1] for m in moves), moves
    # at the run's 4,4,7,1 (65-72), what this pilot proposes leaves rank 3 its 1 sample
    pilot = Autopilot(4, enabled=True)
    replayed(dict(trace, figures=trace["figures"][:72]), pilot)
    assert pilot._proposal([4, 4, 7, 1])[0] == [5, 5, 5, 1]


def test_on_real_figures_a_rank_read_from_a_scatter_that_agrees_with_anything_is_given_nothing():
    """gradual16 on the 2-core box (tests/support/traces/gradual16_backmoves.json, sessions 24
    and 25): rank 3, 1.5x as slow, was left 3 (or 2) samples, and at that batch read 0.5x to
    1.6x its peers a figure (it sleeps for half its compute, and then has a core to itself):
    1.05 +- 0.28 after 8 figures. Pooled with its peers, whose cost it agreed with within
    that noise, it was given its sample back, and at 4 read 1.5x again. The gain must clear
    the noise of every rank that may end slowest, its own too: the move back is not made."""
    for run in kept("gradual16_backmoves")["runs"]:
        assert len(run["changes"]) == 2, run["run"]  # the move, and the move back
        assert replayed(run, Autopilot(4, enabled=True)) == run["changes"][:1], run["run"]


def test_on_real_figures_a_move_no_new_cost_calls_for_waits_out_the_cooldown():
    """tests/support/traces/calm_moves_s27.json: a pilot whose least gain was 3%, and twice
    that within the cooldown, moved samples between ranks equal by the schedule (moving16,
    twice) and gave a 3x rank read cheap at 1 sample a sample back (gradual16), each within
    20 updates of its last change, at a predicted 6-10%, with no rank's cost moved since.
    Such a move needs CALM_GAIN (10%): none of the three is made, the moves before them are."""
    for run in kept("calm_moves_s27")["runs"]:
        calm = run["calm"]
        assert not run["changes"] or calm[0] - run["changes"][-1][0] < 20, run["run"]
        # the least gain named, so that the calm bar is what holds them whatever the default
        pilot = Autopilot(4, enabled=True, min_gain=0.03)
        assert replayed(run, pilot) == run["changes"], run["run"]


def test_on_real_figures_a_recovery_is_answered_though_its_first_figures_overshot():
    """Session 25's transient16 repeat 2 (tests/support/traces/transient16_s25.json): rank 1,
    three times as slow from 30 and left 1 sample, is itself again from 60. Its first two
    figures read 0.54x and 0.45x its peers, the next ones about 1x. Once confirmed, those
    two were the level its next figures were judged by: they read as a slowdown (shown at
    64, undone at 66), and the samples went back at 72. The figures that show a shift are
    picked for being far out and judge no later one: back by 65."""
    trace = kept("transient16_s25")
    moves = replayed(trace, Autopilot(4, enabled=True))
    assert moves[0] == trace["changes"][0] == [33, [4, 4, 4, 4], [5, 1, 5, 5]]
    assert trace["changes"][1][0] == 72
    assert moves[1][1:] == [[5, 1, 5, 5], [4, 4, 4, 4]] and moves[1][0] <= 65, moves


def test_on_real_figures_a_3x_slowdown_and_its_end_are_answered_sooner():
    """tests/support/traces/far_slowdowns_s28.json: four real runs whose pilot answered a
    rank turning three times as slow (transient16 at 30, moving16 at 50) 4-6 updates later,
    and one answering the end of it (transient16 at 60) at 66. On this box one figure of a
    rank in a thousand reads 1.5x its peers', none 2.5x (benchmarks/results/2026-12-06-s28/
    slow-tail.txt): a 3x slowdown's figures are further out than its spikes, and read by
    how far out they are, they are confirmed a figure sooner (the end of it, further out
    than most of its own fast spikes, two sooner). The same moves, each sooner; those before
    them unchanged."""
    for run in kept("far_slowdowns_s28")["runs"]:
        moves = replayed(run, Autopilot(4, enabled=True), moves_at_most=len(run["changes"]))
        *before, last = run["changes"]
        assert moves[:-1] == before, run["run"]
        assert moves[-1][1:] == last[1:] and moves[-1][0] < last[0], (run["run"], moves)


def test_on_real_figures_a_fast_spell_is_not_taken_for_news_by_a_rank_settling_after_a_move():
    """tests/support/traces/spell_after_restart_s28.json (moving8): the pilot moved 2,2,2,2 ->
    1,3,2,2 at 10, before any rank had held a level for 10 figures. Rank 0, left 1 sample,
    read 1.1x its peers for three figures after its recompile and 1.7x from then on: a shift
    to slower, confirmed at 21. Rank 3 ran 0.6x from 17 (a core to itself): a new best,
    which waits for a spell's worth of figures unless another rank turned slower than it
    has been, and rank 0's settling counted as that: 1,3,2,2 -> 1,2,2,3 at 23, between ranks
    equal by the schedule. A rank that held no level long is settling, as a new best is
    read: no move to 40."""
    trace = kept("spell_after_restart_s28")
    assert trace["changes"][1] == [23, [1, 3, 2, 2], [1, 2, 2, 3]]
    assert replayed(trace, Autopilot(4, enabled=True)) == trace["changes"][:1]


def test_the_boundary_before_the_first_update_changes_nothing_the_pilot_reads():
    """Every run's first boundary (and a resumed run's) comes before any update: its figures
    are zeros. The fixed-part reader took it for the update that recompiles at the first
    split, and read the real first update, a compile, into its first window. Session 18's
    moving16 repeat 1 then moved to 4,4,4,4 at 49 where its figures, replayed, say 2,5,5,4."""
    trace = kept("moving16_s17")
    pilots = [Autopilot(4, enabled=True), Autopilot(4, enabled=True)]
    first, _ = traced(trace["figures"][0])
    pilots[1].observe(first, [RankFigures(b, 0.0, 0, 0, 0, None) for b in first])
    for row in trace["figures"]:
        split, figures = traced(row)
        seen = [(p.observe(split, figures).commands, p.fixed_part.reading()) for p in pilots]
        assert seen[0] == seen[1]
        assert pilots[0].since_change == pilots[1].since_change


def test_where_ranks_have_no_fixed_part_reading_it_changes_nothing():
    for seed in range(4):
        told = Autopilot(4, enabled=True, fixed_samples=0.0)
        pilot = Autopilot(4, enabled=True)
        noise = pilot_sim.QUIET
        assert (
            pilot_sim.fly(moving, [4] * 4, 100, pilot, noise, seed).changes
            == pilot_sim.fly(moving, [4] * 4, 100, told, noise, seed).changes
        )
        assert pilot.fixed_part.reading().least == 0.0


def test_the_operator_hears_what_the_fixed_part_reads():
    pilot = Autopilot(4, enabled=True)
    heard = []
    split = [4, 4, 4, 4]
    for t in range(40):
        if t == 15:
            split = [5, 2, 5, 4]
        figures = [
            RankFigures(b, 0.01 * c * (6 + b), GiB, 0, 0, None)
            for c, b in zip([1.0, 3.0, 1.0, 1.0], split, strict=True)
        ]
        heard += [e for e in pilot.observe(split, figures).events if "fixed compute" in e[1]]
    assert len(heard) == 1, heard
    assert heard[0][2]["least"] <= 6.0 <= heard[0][2]["most"]


class OneMove:
    """A pilot that asks for `split` once, at its `at`-th boundary, announced (`may_decide`):
    update `at` (counted from 0) runs it."""

    def __init__(self, at: int, split: list[int]) -> None:
        self.at, self.split, self.seen = at, split, 0

    def may_decide(self) -> bool:
        return self.seen + 1 == self.at

    def observe(self, split, figures) -> Decision:
        self.seen += 1
        return Decision([("rebalance", {"split": self.split})] if self.seen == self.at else [])


def test_the_simulator_judges_a_move_by_the_true_fixed_part():
    """A move off a rank twice as slow at 2 samples onto one at 5: at 6 samples of fixed
    compute the giver took 2 x 8, the taker will take 1 x 12: justified; without a fixed
    part, 2 x 2 against 1 x 6: not."""
    for fixed, judged in ((6.0, []), (0.0, [(10, 0, 1)])):
        noise = pilot_sim.Noise(shared=0, own=0, spikes=0, fixed_samples=fixed)
        out = pilot_sim.fly(lambda t: [2 * C, C], [2, 5], 20, OneMove(10, [1, 6]), noise)
        assert out.changes == [(10, [2, 5], [1, 6])] and out.unjustified == judged


def test_the_nearest_fast_split_moves_the_fewest_samples():
    # rank 0 is twice as slow: its samples go, the equal ranks keep what they have
    assert nearest([4, 4, 4, 4], [2.0, 1.0, 1.0, 1.0], 5.1, [None] * 4) == [2, 5, 5, 4]
    # equal ranks never trade: a split already as fast as the target stays as it is
    assert nearest([3, 5, 4, 4], [1.0, 1.0, 1.0, 1.0], 5.1, [None] * 4) == [3, 5, 4, 4]


def test_a_rank_that_gives_is_left_what_fits_at_the_high_end_of_its_cost():
    """Rank 3 turned 1.5x as slow (a fixed part of 1.1 samples, this box's): 3 samples fit
    the target at that cost, 2 at 10% more. The update waits for its slowest rank, so a rank
    that gives keeps what fits at its `upper` cost, where the others can take the rest."""
    costs, fixed, target = [1.0, 1.0, 1.0, 1.5], [1.1] * 4, 6.1 * 1.02
    upper = [1.05, 1.05, 1.05, 1.65]
    assert nearest([4, 4, 4, 4], costs, target, [None] * 4, fixed) == [5, 4, 4, 3]
    assert nearest([4, 4, 4, 4], costs, target, [None] * 4, fixed, upper) == [5, 5, 4, 2]
    # where the others cannot take the rest within the target, the midpoint's room stands
    assert nearest([4, 4, 4, 4], costs, target, [None, 4, 4, None], fixed, upper) == [5, 4, 4, 3]
    # and caution never takes a rank to 1 sample, where its fixed part is most of its cost
    # and its cost is read worst; only the midpoint's room does
    assert nearest(
        [4, 4, 4, 4], [1.0, 1.0, 1.0, 2.0], 6.1 * 1.02, [None] * 4, fixed, [1.05, 1.05, 1.05, 2.4]
    ) == [5, 5, 4, 2]


def test_costs_that_agree_within_the_noise_are_pooled():
    assert pooled([1.0, 1.05, 2.0], [0.05, 0.05, 0.05]) == pytest.approx(
        [1.0247, 1.0247, 2.0], 1e-3
    )
    assert pooled([1.0, 1.5], [0.5, 0.5]) == [1.0, 1.5]  # never more than 30% apart


def test_a_rank_that_slows_down_starts_a_new_regime_within_four_updates():
    costs = Costs(3)
    rng = random.Random(1)
    moved_at = None
    for t in range(40):
        slow = 2.0 if t >= 25 else 1.0
        compute = [c * 4 * rng.uniform(0.9, 1.1) for c in (1.0, 1.0, slow)]
        if costs.add([4, 4, 4], compute) and moved_at is None:
            moved_at = t
    assert moved_at is not None and 25 <= moved_at <= 28
    assert costs.estimate(2).cost == pytest.approx(2 / 1.0, rel=0.15)
    assert costs.estimate(0).cost == pytest.approx(1.0, rel=0.15)


def test_of_two_ranks_a_slowdown_by_half_again_starts_a_new_regime_within_three_updates():
    """Of two ranks the median is their mean: rank 1 half again as slow shows 0.2 in log
    units in each rank's relative figures, under the 0.22 a shift of one rank of four must
    reach. Judged at full size, 4 of these 5 runs read no shift at all (the 1.5x crept into
    the regime's median, 12-15 updates late on the real box); judged at the size two ranks
    show, each reads it by the second figure."""
    for seed in range(5):
        costs, rng, moved = Costs(2), random.Random(seed), []
        for t in range(40):
            slow = 1.5 if t >= 25 else 1.0
            if costs.add([8, 8], [c * 8 * rng.uniform(0.95, 1.05) for c in (1, slow)]):
                moved.append(t)
        assert moved and 25 <= moved[0] <= 27, (seed, moved)
        assert costs.estimate(1).cost / costs.estimate(0).cost == pytest.approx(1.5, rel=0.05)


def test_two_ranks_are_compared_by_the_noise_of_their_ratio():
    """Each of two ranks' relative figures mirrors the other's, so their levels' errors are
    one: the noise a comparison takes (the hypot of the two standard errors) is that of the
    median of their log ratio, not 1/sqrt(2) of it (equal pairs in the simulator's noisy
    machine changed split 173 times in 24 runs of 500 updates; 60 with this)."""
    costs, rng = Costs(2), random.Random(3)
    for _ in range(20):
        costs.add([8, 8], [8 * math.exp(rng.gauss(0, 0.1)) for _ in range(2)])
    ratios = [costs.values[u][1] - costs.values[u][0] for u in costs.regimes[1]]
    middle = statistics.median(ratios)
    sigma = 1.4826 * statistics.median(abs(x - middle) for x in ratios)
    e0, e1 = costs.estimate(0), costs.estimate(1)
    assert math.hypot(e0.se, e1.se) == pytest.approx(1.2533 * sigma / math.sqrt(20))
    assert math.log(e1.cost / e0.cost) == pytest.approx(middle)


def steady_then(costs: Costs, rank_cost, updates: int, seed: int = 1) -> list[int]:
    """Feed three ranks at batch 4, rank 2 at rank_cost(t); the updates at which it moved."""
    rng = random.Random(seed)
    moved = []
    for t in range(updates):
        compute = [c * 4 * rng.uniform(0.9, 1.1) for c in (1.0, 1.0, rank_cost(t))]
        if 2 in costs.add([4, 4, 4], compute):
            moved.append(t)
    return moved


def test_a_change_far_beyond_the_noise_is_read_from_two_figures_and_confirmed():
    costs = Costs(3)
    moved = steady_then(costs, lambda t: 3.0 if t >= 30 else 1.0, 32)
    assert moved == [31] and not costs.confirmed(2)  # the second figure at 3x shows it
    steady_then(costs, lambda t: 3.0, 3, seed=2)  # the figures after it agree
    assert costs.confirmed(2) and costs.estimate(2).cost == pytest.approx(3.0, rel=0.15)


def slows_after_its_own_spikes(
    costs: Costs, peers_spike: float | None, updates: int = 70, spike: float = 3.0
) -> list:
    """Four ranks at batch 4; rank 2 spikes `spike` times slow at 8, 18 and 28 and is 3x slow
    from 45; with `peers_spike`, one of the others spikes that many times slow every 5
    updates. (update, whether rank 2's regime is confirmed, whether it is one agreeing
    figure from it, its spike chance) from 44."""
    rng, seen = random.Random(1), []
    for t in range(updates):
        cost = [1.0] * 4
        if peers_spike and t % 5 == 3:
            cost[(t // 5) % 4 if (t // 5) % 4 != 2 else 0] = peers_spike
        if t in (8, 18, 28):
            cost[2] = spike
        if t >= 45:
            cost[2] = 3.0
        costs.add([4] * 4, [c * 4 * rng.uniform(0.9, 1.1) for c in cost])
        if t >= 44:
            seen.append((t, costs.confirmed(2), costs.nearly(2, 0.0), costs.spike_chance(2)))
    return seen


def shown_and_confirmed(seen: list) -> tuple[int, int]:
    pending = [t for t, ok, _, _ in seen if not ok]
    return pending[0], pending[-1] + 1


def test_a_slowdown_is_read_against_every_ranks_record_of_slow_spikes():
    """Rank 2's own record (3 slow spikes in 45 figures, as far out as its slowdown) alone
    says a 3x slowdown needs 4 figures after those that showed it; against all four ranks'
    records (the others never spiked) it needs 3, and is confirmed at 49. Where its peers
    spike as often, and further (5x), it is shown a figure later, and waits as before."""
    for peers_spike, shown, confirmed in ((None, 46, 49), (5.0, 47, 50)):
        seen = slows_after_its_own_spikes(Costs(4), peers_spike)
        assert shown_and_confirmed(seen) == (shown, confirmed), seen


def test_a_slowdown_further_out_than_every_ranks_spikes_is_confirmed_a_figure_sooner():
    """Rank 2's spikes at 8, 18 and 28 are 1.5x (its peers never spike), its slowdown from 45
    3x: further out than any figure of any rank. Read as any outlier (3 of its 45 figures
    out), two figures show it at 46 and three after them confirm it at 49; read by how far
    out they are, two confirm it at 48. Where its spikes were 3x, as far out as the
    slowdown, it waits for three."""
    small = slows_after_its_own_spikes(Costs(4), None, spike=1.5)
    assert shown_and_confirmed(small) == (46, 48), small
    assert shown_and_confirmed(slows_after_its_own_spikes(Costs(4), None, spike=3.0)) == (46, 49)


def test_a_rank_one_agreeing_figure_from_confirmation_is_nearly_confirmed():
    seen = {t: rest for t, *rest in slows_after_its_own_spikes(Costs(4), None, 51)}
    assert seen[48] == [False, True, pytest.approx(4e-6, rel=0.1)]  # one figure more: 49
    assert seen[47][:2] == [False, False] and seen[49][:2] == [True, False]
    assert not Costs(4).nearly(0, 1.0)  # no shift
    # or one figure from the bet: its spike chance, one agreeing figure on, under alpha
    costs = Costs(4)
    slows_after_its_own_spikes(costs, None, 47)  # at 46: 2e-3, and 9e-5 at 47
    assert costs.spike_chance(2) > 1e-3 and costs.nearly(2, 1e-4) and not costs.nearly(2, 5e-5)


def test_two_spikes_in_a_row_start_a_shift_that_the_figures_after_them_undo():
    costs = Costs(3)
    moved = steady_then(costs, lambda t: 3.0 if t in (30, 31) else 1.0, 32)
    assert moved == [31] and not costs.confirmed(2) and costs.n(2) == 2
    steady_then(costs, lambda t: 1.0, 2, seed=2)  # two back at the old level: spikes
    assert costs.confirmed(2) and costs.n(2) == 20  # the old regime goes on, with them
    assert costs.estimate(2).cost == pytest.approx(1.0, rel=0.1)


def confirmed_at(cost_of, updates: int, since: int) -> tuple[int | None, int | None]:
    """Three ranks at batch 4 at the costs cost_of(t): the update at which rank 2's first
    shift from `since` on was shown, and the one at which it was confirmed."""
    rng, costs, shown, confirmed = random.Random(1), Costs(3), None, None
    for t in range(updates):
        moved = costs.add([4, 4, 4], [c * 4 * rng.uniform(0.9, 1.1) for c in cost_of(t)])
        if 2 in moved and t >= since and shown is None:
            shown = t
        if shown is not None and confirmed is None and costs.confirmed(2):
            confirmed = t
    return shown, confirmed


def test_a_rank_faster_than_it_has_been_is_confirmed_by_a_spell_s_worth_of_figures():
    """Twice as fast from update 30, faster than any level it held: its two figures show
    it at 31, and where the figures after them confirmed it at 34, the regime must hold
    SPELL figures (this box's fast spells are shorter). Back at its level after a slowdown,
    or faster as another rank turns slower than it has been (a load that moved between
    machines), it is confirmed as any shift is."""
    assert confirmed_at(lambda t: (1, 1, 0.5 if t >= 30 else 1), 60, 30) == (31, 30 + SPELL - 1)
    recovered = confirmed_at(lambda t: (1, 1, 3 if 30 <= t < 60 else 1), 80, 60)
    assert recovered == (61, 63)
    moving = confirmed_at(lambda t: (1, 3, 0.5) if t >= 30 else (1, 1, 1), 60, 30)
    assert moving == (31, 34)


def test_the_figures_that_showed_a_shift_judge_no_later_one():
    """Rank 2 three times as slow from 20 to 49, then itself again, its first two figures
    back 2.5 times faster still (0.4x). Confirmed, its regime begins with those two: judged
    against them, its next figures at 1x read as a slowdown (shown at 54, main's reading).
    They were picked for being far out, so they are no level for the next shift."""
    costs = Costs(3)
    moved = steady_then(costs, lambda t: 3.0 if 20 <= t < 50 else (0.4 if t < 52 else 1.0), 70)
    assert moved == [21, 51] and costs.confirmed(2), moved
    assert costs.estimate(2).cost == pytest.approx(1.0, rel=0.15)


def test_while_a_shift_awaits_confirmation_a_decision_takes_the_cost_before_it():
    costs = Costs(3)
    steady_then(costs, lambda t: 3.0 if t in (30, 31) else 1.0, 32)  # two spikes: a shift
    assert not costs.confirmed(2) and costs.estimate(2).cost > 2.0
    assert costs.standing(2).cost == pytest.approx(1.0, rel=0.1)
    assert costs.standing(2).n == 18  # the regime before it
    assert costs.standing(0) == costs.estimate(0)


def fly_with_spikes(fast: bool) -> list[tuple[int, list[int]]]:
    """Four ranks at 4 (a rank's compute is 0.1 s x (6 + batch), this box's fixed part);
    rank 2 three times slower from update 40; rank 1 twice as fast at 41 and 42 only (two
    spikes: a young shift that its next figures undo), or twice as slow (`fast` False).
    The pilot's moves: (the update whose figures decided it, the split)."""
    rng = random.Random(3)
    pilot, split, moves = Autopilot(4, enabled=True, fixed_samples=6.0), [4, 4, 4, 4], []
    for t in range(60):
        cost = [1.0, 1.0, 3.0 if t >= 40 else 1.0, 1.0]
        if t in (41, 42):
            cost[1] = 0.5 if fast else 2.0
        figures = [
            RankFigures(b, 0.1 * c * (6 + b) * rng.uniform(0.95, 1.05), GiB, 0, 0, None)
            for c, b in zip(cost, split, strict=True)
        ]
        for cmd, args in pilot.observe(split, figures).commands:
            if cmd == "rebalance":
                moves.append((t, list(args["split"])))
                split = list(args["split"])
    return moves


def test_a_rank_that_may_be_faster_keeps_its_batch_and_no_one_waits_for_it():
    """moving16 on the 2-core box (session 15, repeat 2): rank 2's slowdown was confirmed at
    55, and its move waited to 58 because two fast spikes of rank 1 had started a shift that
    two more figures had to undo. A rank that may have got faster cannot make the move moot:
    it keeps its batch, the move goes as soon as rank 2's slowdown is confirmed."""
    moves = fly_with_spikes(fast=True)
    first = moves[0]
    assert first[0] <= 43, moves  # read at 41, confirmed at 43; not after rank 1's undo at 44
    assert first[1][1] == 4 and first[1][2] < 4  # rank 1 held, rank 2 gives


def test_a_rank_that_may_be_slower_is_waited_for():
    """Two slow figures of rank 1 may be a second slowdown, which would make any move for
    rank 2 alone moot (rank 1 would be the slowest): the pilot waits until they are undone."""
    moves = fly_with_spikes(fast=False)
    assert moves and moves[0][0] >= 44, moves


def test_a_shift_soon_after_a_restart_is_read_though_its_figures_are_half_the_regime():
    """moving16 on the 2-core box (session 12, repeat 1): a rank moved to batch 1 recovers
    from 2x four figures later. Its young regime's own scatter, taken over the figures being
    judged too, grew with them (0.08 -> 0.77) and hid the recovery for as long as the split
    stood; judged by the scatter its last regime showed, the third figure reads it."""
    costs = Costs(3)
    rng = random.Random(0)

    def feed(v: float) -> bool:  # rank 2's log cost per sample relative to its peers: v
        return 2 in costs.add([4, 4, 1], [0.4, 0.4, 0.1 * math.exp(v)])

    for t in range(40):  # its own scatter 0.1, and one figure in nine fast (as this box's)
        feed(0.8 + rng.gauss(0, 0.1) - (0.6 if t % 9 == 4 else 0))
    costs.restart([2])  # its batch changed; its first figure there recompiles
    feed(2.0)
    young = [0.70, 0.58, 0.92, 1.10]  # the real figures, as that run's pilot read them
    recovered = [-0.24, -0.22, -0.40, 0.13, -0.30]
    moved = [i for i, v in enumerate(young + recovered) if feed(v)]
    assert moved == [len(young) + 2]
    assert costs.estimate(2).cost < 0.9  # before: 1.14, the two levels' mix


def test_costs_are_read_again_at_a_new_fixed_part():
    costs = Costs(2)
    for _ in range(10):  # equal ranks whose compute has 2 samples' worth of fixed part
        costs.add([2, 8], [0.1 * (2 + 2), 0.1 * (2 + 8)])
    assert costs.estimate(0).cost > 1.5 * costs.estimate(1).cost  # the small batch looks dear
    costs.fixed = 2.0
    assert costs.estimate(0).cost == pytest.approx(costs.estimate(1).cost)


def test_a_read_fixed_part_is_taken_at_most_at_a_ranks_batch_unless_the_figures_require_more():
    """Rank 0 at 1 sample took as long as rank 1 at 4. Read at a fit of 8 samples, rank 0
    would cost a third more than rank 1 a sample (0.1 s over 9 samples' worth against 12),
    and a sample moved to it would seem to cost little. Where the figures allow a fixed part
    of 0, the ranks are read at most at their batches (2 samples' worth against 8): rank 0
    costs 4 times as much. Where they require 6, more than either batch, both are read at
    the fit (session 20 read them at 6, 7 against 10: with a true fixed part of 6, a rank
    left 1 sample then looked dear per sample after it recovered). Told, as told."""
    costs = Costs(2)
    for _ in range(10):
        costs.add([1, 4], [0.1, 0.1])
    costs.fixed, costs.floor = 8.0, 0.0
    assert costs.estimate(0).cost / costs.estimate(1).cost == pytest.approx(8 / 2)
    costs.floor = 6.0  # a new reading re-reads
    assert costs.estimate(0).cost / costs.estimate(1).cost == pytest.approx(12 / 9)
    costs.floor = 2.0  # required for rank 0 at 1, not for rank 1 at 4
    assert costs.estimate(0).cost / costs.estimate(1).cost == pytest.approx(8 / 9)
    costs.floor = math.inf
    assert costs.estimate(0).cost / costs.estimate(1).cost == pytest.approx(12 / 9)


def test_a_move_must_hold_at_every_fixed_part_the_figures_allow():
    """Rank 0 at 2 samples took 8, rank 1 at 6 took 12. With no fixed part rank 0 costs
    twice as much a sample, and a sample moved to it would make it as slow as rank 1 was;
    with 6 samples of fixed part they cost the same and the move pays."""
    est = [Estimate(4.0, 0.02, 10, 0.05), Estimate(2.0, 0.02, 10, 0.05)]  # read at 0
    assert "slower" in unjustified([2, 6], [3, 5], est, [0.0] * 2, [0.0] * 2)
    assert unjustified([2, 6], [3, 5], est, [0.0] * 2, [6.0] * 2) == ""


def test_equal_ranks_read_at_fixed_parts_capped_at_their_batches_never_swap():
    """Session 29's run C, gradual16 r0 at update 36: a fixed part read as 4.76 samples is
    capped at 4 for the ranks at batch 4, so rank 0 at 5 and rank 1 at 4, pooled as one cost,
    were predicted 9.76 and 9 of it at 5 samples: rank 0 gave rank 1 a sample on those parts
    alone. Pooled ranks are equals: the giver must have had more than the taker will."""
    est = [
        Estimate(0.925, 0.029, 7, 0.08),  # young, read at 4.76
        Estimate(0.997, 0.018, 20, 0.08),  # read at 4, its batch
        Estimate(0.981, 0.017, 20, 0.08),
        Estimate(1.698, 0.057, 7, 0.08),  # the slowed rank, read at 3
    ]
    read = [4.76, 4.0, 4.0, 3.0]
    why = unjustified([5, 4, 4, 3], [4, 5, 5, 2], est, read, read)
    assert why == "ranks 0 and 1 cost the same within the noise"
    # between those equals a move toward even batches still goes (rank 0 at 6 gives one)
    at_six = [4.76, 4.0, 4.0, 2.0]
    assert unjustified([6, 4, 4, 2], [5, 5, 4, 2], est, at_six, at_six) == ""
    # and the slowed rank, pooled with nobody, gives to them as before
    assert unjustified([5, 4, 4, 3], [5, 5, 4, 2], est, read, read) == ""


def fly_recovery_as_another_slows() -> list[tuple[int, list[int], bool]]:
    """Rank 0, held at batch 1 while 2.4x slower, recovers at update 40 as rank 2 turns 3x
    slower (this box's fast spikes, one figure in nine, in rank 0's record). The pilot's moves:
    (the update whose figures decided it, the split, whether rank 0's recovery was
    confirmed)."""
    rng = random.Random(5)
    pilot, split, moves = Autopilot(4, enabled=True, fixed_samples=0.0), [1, 5, 5, 5], []
    for t in range(50):
        cost = [2.4 if t < 40 else 1.0, 1.0, 3.0 if t >= 40 else 1.0, 1.0]
        if t < 40 and t % 9 == 4:
            cost[0] *= 0.6  # this box's fast spikes, one figure in nine
        figures = [
            RankFigures(b, 0.02 * c * b * rng.uniform(0.95, 1.05), GiB, 0, 0, None)
            for c, b in zip(cost, split, strict=True)
        ]
        for cmd, args in pilot.observe(split, figures).commands:
            if cmd == "rebalance":
                moves.append((t, list(args["split"]), pilot.costs.confirmed(0)))
                split = list(args["split"])
    return moves


def test_a_rank_that_may_be_faster_keeps_its_batch_though_the_best_split_would_give_it_more(
    monkeypatch,
):
    """moving16 on the 2-core box (session 16, repeat 2): rank 2's slowdown was confirmed at
    55 while rank 0's recovery, read against its record of fast spikes, awaited one more
    figure; the best split gave rank 0 samples, which it may not take yet, the split nearest
    to that best found no room, and the move waited to 56. Where rank 0 is not taken at its
    new speed (its figures likelier spikes), the move goes as soon as rank 2's slowdown is
    confirmed, rank 0 held at 1."""
    monkeypatch.setattr(autopilot, "BET_ALPHA", 0.0)
    moves = fly_recovery_as_another_slows()
    t, first, rank0_confirmed = moves[0]
    # rank 2 shown at 41, confirmed at 42 (read against all four ranks' records)
    assert t == 42 and not rank0_confirmed, moves
    assert first[0] == 1 and first[2] < 5, moves  # rank 0 held, rank 2 gives
    assert moves[-1][1] == [5, 5, 1, 5], moves  # and rank 0 takes once it is confirmed


def test_a_recovery_nearly_confirmed_is_answered_in_the_same_move():
    """The same figures: rank 0's four fast figures from update 40 are spikes with a chance
    of about 1e-4 by its record, so the move for rank 2 takes it at its new speed and goes
    to 5,5,1,5 at once (it beats staying even if rank 0 were still 2.4x slower)."""
    moves = fly_recovery_as_another_slows()
    assert moves == [(43, [5, 5, 1, 5], False)], moves


def test_a_recovery_is_read_though_its_figures_would_widen_the_scatter_that_judges_them():
    """transient16 on the 2-core box (session 16): a slowed rank held at one sample scatters
    0.4-0.6 in log units, and its 3x recovery is 2-3 scatters deep. Its regime's scatter,
    taken over the figures being judged too, grew with each figure at the new level (0.51
    -> 0.78 in four) and the recovery went unread for 16 updates. Judged by the scatter of
    the figures before them, it is read within a few figures in nearly every run."""
    read = []
    for seed in range(20):
        rng, costs = random.Random(seed), Costs(3)
        for t in range(60):
            level = 1.1 if t < 40 else 0.0  # rank 2's log cost, relative
            compute = [0.4 * math.exp(rng.gauss(0, 0.05)) for _ in range(2)]
            compute.append(0.1 * math.exp(level + rng.gauss(0, 0.4)))
            if 2 in costs.add([4, 4, 1], compute) and t >= 40:
                read.append(t - 39)  # the figures at the new level it took
                break
    assert sum(n <= 6 for n in read) >= 17, read  # before: 14 of 20, 6 not within 20


def read_after(before: float, spread: float, after: float, seed: int) -> int | None:
    """Rank 2 of three at the relative log cost `before` for 40 updates, each figure uniform
    within `spread` of it (a heavy scatter), then at `after` with its peers' small scatter:
    how many figures at the new level its shift took to be read (None: not in 12)."""
    rng, costs = random.Random(seed), Costs(3)
    for t in range(52):
        compute = [0.4 * math.exp(rng.gauss(0, 0.05)) for _ in range(2)]
        level = before + rng.uniform(-spread, spread) if t < 40 else after + rng.gauss(0, 0.05)
        compute.append(0.1 * math.exp(level))
        if 2 in costs.add([4, 4, 1], compute) and t >= 40:
            return t - 39
    return None


def test_a_slow_rank_s_recovery_is_read_by_rank_where_its_scatter_hides_it():
    """Session 32's run F, transient16 repeat 1: rank 1, 3x at 1 sample, took 0.040-0.118 s
    (a log scatter of 0.45, as uniform as not); back at 0.021-0.035 s from update 60, below
    every figure of its regime but inside the bar its scatter set, it was read only as the
    regime's median crossed, and its samples went back at 70. That the newest three of twenty
    figures are its three lowest is 1 in 1,140 by chance: read by the third (main: 9 of 20
    not within 12)."""
    read = [read_after(0.9, 0.6, 0.0, seed) for seed in range(20)]
    assert all(n is not None and n <= 3 for n in read), read


def test_on_real_figures_a_recovery_hidden_by_its_rank_s_scatter_is_answered_sooner():
    """tests/support/traces/transient16_s32.json (the run above): the same two moves, the
    first as the run made it, the second at 65 instead of 70."""
    trace, late = kept("transient16_s32"), []
    moves = replayed(trace, Autopilot(4, enabled=True), late=late)
    assert as_run(moves[:1], trace["changes"][:1], late), moves
    assert moves[1][1:] == trace["changes"][1][1:] and moves[1][0] <= 66, moves
