"""The autopilot and the alerts: converging on a fixed slowdown, still on noise, guarding
memory (fast: figures as ranks report them), and on real ranks."""

from __future__ import annotations

import json
import random
import statistics
import threading

import mlx.core as mx
import pytest

from telemetry.control import CommandQueue
from telemetry.units import GiB
from tests.support import pilot_sim
from trainer.alerts import Alerts
from trainer.autopilot import Autopilot, Decision, RankFigures, nearest, pooled
from trainer.config import ConfigError, TrainConfig
from trainer.controller import Controller
from trainer.costs import Costs
from trainer.distributed import Cluster


def simulate(costs, split, updates=200, noise=0.02, pilot=None, seed=0, change_at=None):
    """Feed the pilot what ranks of these per-sample costs would measure; apply its commands
    at the next boundary, as the controller does. Returns (splits it chose, pilot)."""
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


# --- against this machine's noise (tests/support/pilot_sim.py: shared load, own scatter,
# spikes, recompiles; a decision applies to the next update, as in a run)
C = 0.05


def moving(t: int) -> list[float]:
    """issue 14's scenario: rank 0 twice as slow, then rank 2 three times, from update 50"""
    return [2 * C, C, C, C] if t < 50 else [C, C, 3 * C, C]


def flown(schedule, seed: int, updates: int = 100, split=(4, 4, 4, 4), noise=None):
    pilot = Autopilot(4, enabled=True)
    return pilot_sim.fly(schedule, list(split), updates, pilot, noise=noise, seed=seed)


def test_equal_ranks_make_no_change_in_500_updates():
    for seed in range(12):
        assert flown(lambda t: [C] * 4, seed, updates=500).changes == []


def test_no_sample_ever_moves_between_ranks_whose_costs_agree():
    for seed in range(6):
        out = flown(moving, seed)
        assert out.changes and out.unjustified == [], out.changes


def test_a_sustained_change_is_followed_within_8_updates():
    reactions = [pilot_sim.reaction(flown(moving, seed), 50) for seed in range(8)]
    assert statistics.median(reactions) <= 8 and max(reactions) <= 10, reactions


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


def test_the_nearest_fast_split_moves_the_fewest_samples():
    # rank 0 is twice as slow: its samples go, the equal ranks keep what they have
    assert nearest([4, 4, 4, 4], [2.0, 1.0, 1.0, 1.0], 5.1, [None] * 4) == [2, 5, 5, 4]
    # equal ranks never trade: a split already as fast as the target stays as it is
    assert nearest([3, 5, 4, 4], [1.0, 1.0, 1.0, 1.0], 5.1, [None] * 4) == [3, 5, 4, 4]


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


def test_a_run_of_spikes_read_as_a_shift_is_refuted_by_the_figures_after_it():
    costs, rng = Costs(4), random.Random(3)
    acted_on = False
    for t in range(40):
        compute = [4 * rng.uniform(0.8, 1.2) for _ in range(4)]
        if 20 <= t < 24:
            compute[2] *= 3  # four spikes in a row: as a shift would begin
        costs.add([4] * 4, compute)
        # a slow reading's figures were picked for being far out: it waits for others
        acted_on |= costs.shifted[2] == "slow" and costs.confirmed(2)
    assert not acted_on
    assert costs.shifted[2] == "" and costs.estimate(2).cost == pytest.approx(1.0, rel=0.15)


def test_a_short_quiet_record_does_not_pass_for_a_quiet_machine():
    costs = Costs(4)
    for t in range(400):
        costs.add([4] * 4, [4.0 * (1 + 0.01 * ((t * 7 + r) % 5)) for r in range(4)])
        if t == 20:
            assert costs.fast() == 0  # no far-out figure yet, but too few figures to say
    assert costs.fast() in (2, 3)


# --- a rank a core (pilot_sim.QUIET): the record of far-out figures lets a shift be read fast
def transient(t: int) -> list[float]:
    """a slowdown that comes and goes: rank 1 three times slower from update 30 to 60"""
    return [C, 3 * C, C, C] if 30 <= t < 60 else [C] * 4


def test_on_a_quiet_machine_a_change_is_followed_within_5_updates():
    reactions = []
    for schedule, changes in ((moving, [50]), (transient, [30, 60])):
        for seed in range(4):
            out = flown(schedule, seed, noise=pilot_sim.QUIET)
            reactions += [pilot_sim.reaction(out, at) for at in changes]
            assert out.unjustified == [], out.changes
    # 50 updates of a quiet record are too short for the fast reading (Costs.fast takes the
    # rate of far-out figures at its upper bound): four figures in a row, one that confirms
    # them, and the split changes at that boundary
    assert statistics.median(reactions) <= 5 and max(reactions) <= 8, reactions


def test_on_a_quiet_machine_the_pilot_beats_the_best_fixed_split():
    noise, vs_best, vs_oracle = pilot_sim.QUIET, [], []
    for schedule, phases in ((moving, [0, 50]), (transient, [0, 30, 60])):
        for seed in range(3):
            total = flown(schedule, seed, noise=noise).total
            vs_best.append(pilot_sim.best_fixed(schedule, 4, 16, 100, noise, seed)[1] / total)
            vs_oracle.append(pilot_sim.oracle(schedule, 4, 16, 100, phases, noise, seed) / total)
    assert min(vs_best) >= 1.0 and statistics.median(vs_oracle) >= 0.88, (vs_best, vs_oracle)


def test_quiet_equal_ranks_make_no_change_in_500_updates():
    for seed in range(3):
        assert flown(lambda t: [C] * 4, seed, updates=500, noise=pilot_sim.QUIET).changes == []


def test_spikes_in_a_row_are_read_as_a_shift_only_where_spikes_are_rare():
    def fed(spikes_every: int) -> tuple[int, int]:
        """Equal ranks, a spike on rank 1 every `spikes_every` updates; then rank 2 doubles
        from update 100 (its figures far out, as a spike's). (The fast reading's figures
        at update 99, the update rank 2's shift is read from 100.)"""
        costs, rng, fast = Costs(4), random.Random(0), 0
        for t in range(110):
            compute = [4 * rng.uniform(0.97, 1.03) for _ in range(4)]
            if t % spikes_every == 0:
                compute[1] *= 4
            if t >= 100:
                compute[2] *= 2
            if t == 99:
                fast = costs.fast()
            if 2 in costs.add([4] * 4, compute) and t >= 100:
                return fast, t - 100
        raise AssertionError("never read")

    fast, at = fed(1000)
    assert fast in (2, 3) and at == fast - 1  # none before: two or three figures far out
    fast, at = fed(5)
    assert fast == 0 and at >= 2  # a spike in five updates: the slow reading


def test_one_ranks_spike_does_not_move_the_others():
    costs, rng = Costs(4), random.Random(2)
    for _ in range(20):  # rank 0 twice as slow per sample, the others alike
        costs.add([4] * 4, [c * 4 * rng.uniform(0.97, 1.03) for c in (2, 1, 1, 1)])
    before = [costs.estimate(r).cost for r in range(4)]
    costs.add([4] * 4, [8, 4, 40, 4])  # rank 2 spikes: the median of the four would jump
    after = [costs.estimate(r).cost for r in range(4)]
    assert after[1] == pytest.approx(before[1], rel=0.02)
    assert after[3] == pytest.approx(before[3], rel=0.02)


# --- the controller: the pilot's decision applies at the boundary it was made at, on every rank
class _Ring:
    """What MLX's all_sum does for ranks that are threads of this process."""

    def __init__(self, size: int) -> None:
        self.size, self.slots = size, [None] * size
        self.barrier = threading.Barrier(size, timeout=10)

    def sum(self, rank: int, vec: list[float]) -> list[float]:
        self.slots[rank] = vec
        self.barrier.wait()
        total = [sum(col) for col in zip(*self.slots, strict=True)]
        self.barrier.wait()  # every rank has read the slots before any writes again
        return total


class _ThreadRank(Cluster):
    def __init__(self, ring: _Ring, rank: int) -> None:
        self.backend, self.group, self.rank, self.size = "threads", None, rank, ring.size
        self.ring = ring

    def _sum(self, x):
        return mx.array(self.ring.sum(self.rank, x.tolist()))


class _Pilot:
    """Decides `decision` at boundary `at` (counted from 0), nothing otherwise."""

    def __init__(self, at: int, decision: list) -> None:
        self.enabled, self.at, self.decision, self.seen = True, at, decision, 0

    def observe(self, split, figures) -> Decision:
        self.seen += 1
        return Decision(commands=list(self.decision) if self.seen - 1 == self.at else [])


def _boundaries(pilot, n: int, before=None) -> list[list[tuple[str, list[int]]]]:
    """Every rank's (command, payload) at each of `n` boundaries of a 3-rank run; `before`
    (boundary, rank 0's queue) is called before that boundary's exchange."""
    ring, world = _Ring(3), 3
    seen: list[list] = [[] for _ in range(world)]
    queue = CommandQueue()

    def rank(r: int) -> None:
        ctl = Controller(
            _ThreadRank(ring, r), queue if r == 0 else None, pilot=pilot if r == 0 else None
        )
        split = [2, 2, 2]
        for b in range(n):
            if r == 0 and before:
                before(b, queue)
            ring.barrier.wait()  # rank 0's queue is filled before anyone exchanges
            a = ctl.exchange(split, compute_s=0.01 * (r + 1))
            if a.name == "rebalance":
                split = a.payload
            seen[r].append((a.name, a.payload))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert all(len(s) == n for s in seen), seen
    return seen


def test_the_pilots_decision_applies_on_every_rank_at_the_boundary_it_is_made_at():
    move = ("rebalance", {"split": [3, 2, 1], "reason": "autopilot: test"})
    seen = _boundaries(_Pilot(3, [move]), 6)
    assert seen[0] == seen[1] == seen[2]
    assert [name for name, _ in seen[0]] == ["none"] * 3 + ["rebalance"] + ["none"] * 2
    assert seen[0][3][1] == [3, 2, 1]


def test_an_operators_command_at_that_boundary_goes_first_and_the_pilots_waits_one():
    move = ("rebalance", {"split": [3, 2, 1], "reason": "autopilot: test"})

    def operator(b: int, queue: CommandQueue) -> None:
        if b == 3:
            queue.submit("checkpoint")

    seen = _boundaries(_Pilot(3, [move]), 6, operator)
    assert seen[0] == seen[1] == seen[2]
    assert [name for name, _ in seen[0]][3:5] == ["checkpoint", "rebalance"]
