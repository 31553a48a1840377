"""The balancer: linear fits, the greedy split (checked against brute force), validation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telemetry.balance import (
    BalanceError,
    RankModel,
    RankSample,
    fit,
    predict,
    propose,
    validate,
)
from telemetry.split import SplitError
from telemetry.split import parse as parse_split
from telemetry.units import GiB


def model(rank, fixed, per, base=0, per_mem=0, limit=None, confident=True):
    return RankModel(rank, fixed, per, base, per_mem, limit, n=10, confident=confident)


def samples(batches, fixed, per, base=1 * GiB, per_mem=GiB // 4, total=16 * GiB, jitter=()):
    out = []
    for i, b in enumerate(batches):
        j = jitter[i % len(jitter)] if jitter else 0.0
        out.append(RankSample(b, fixed + per * b + j, base + per_mem * b, total))
    return out


# --- fit ---------------------------------------------------------------------------------------


def test_fit_recovers_line_from_two_batch_sizes():
    (m,) = fit([samples([2, 4, 2, 4], fixed=0.1, per=0.05)])
    assert m.fixed_s == pytest.approx(0.1)
    assert m.per_sample_s == pytest.approx(0.05)
    assert m.base_mem == pytest.approx(1 * GiB, rel=1e-6)
    assert m.per_sample_mem == pytest.approx(GiB // 4, rel=1e-6)
    assert m.mem_limit == 16 * GiB
    assert m.n == 4
    assert m.confident, m.reason


def test_fit_with_one_batch_size_assumes_no_fixed_cost_and_says_so():
    (m,) = fit([samples([4, 4, 4, 4], fixed=0.2, per=0.05)])
    assert m.fixed_s == 0.0
    assert m.per_sample_s == pytest.approx((0.2 + 0.05 * 4) / 4)
    assert not m.confident
    assert "one batch size" in m.reason


def test_fit_with_too_few_updates_is_not_confident():
    (m,) = fit([samples([2, 4], fixed=0.1, per=0.05)])
    assert not m.confident
    assert "2 update" in m.reason


def test_fit_with_noisy_compute_is_not_confident():
    (m,) = fit([samples([2, 4] * 5, fixed=0.1, per=0.05, jitter=(0.0, 0.15, -0.1, 0.05))])
    assert not m.confident
    assert "varies" in m.reason
    assert m.noise > 0.15


def test_fit_mem_limits_override_reported_totals():
    models = fit([samples([2, 4, 6], 0, 0.1), samples([2, 4, 6], 0, 0.2)], [8 * GiB, None])
    assert models[0].mem_limit == 8 * GiB
    assert models[1].mem_limit == 16 * GiB  # from the samples


def test_fit_rejects_unusable_input():
    with pytest.raises(BalanceError, match="no usable updates"):
        fit([[RankSample(0, 1.0, 1)]])
    with pytest.raises(BalanceError, match="memory limits"):
        fit([samples([1, 2, 3], 0, 0.1)], [1, 2])
    with pytest.raises(BalanceError, match="no ranks"):
        fit([])


def test_fit_falls_back_to_proportional_when_noise_bends_the_line():
    # Batch 4 measured faster than batch 2: a negative slope is impossible, so fall back.
    data = [RankSample(2, 0.5, GiB), RankSample(4, 0.4, GiB), RankSample(2, 0.5, GiB)]
    (m,) = fit([data])
    assert m.fixed_s == 0.0
    assert m.per_sample_s > 0


# --- predict and propose: hand-computed cases ---------------------------------------------------


def test_predict_is_the_slowest_rank():
    models = [model(0, 0.1, 0.1), model(1, 0.0, 0.3)]
    # rank 0: 0.1 + 0.1*3 = 0.4; rank 1: 0.3*2 = 0.6
    assert predict(models, [3, 2]) == pytest.approx(0.6)
    with pytest.raises(BalanceError):
        predict(models, [1, 2, 3])


def test_propose_hand_computed_two_ranks():
    # Rank 1 is 3x slower per sample. Global 8: costs 0.1*b0 vs 0.3*b1.
    # (6,2): max(0.6, 0.6) = 0.6; any other split is worse, e.g. (5,3) -> 0.9, (7,1) -> 0.7.
    models = [model(0, 0.0, 0.1), model(1, 0.0, 0.3)]
    p = propose(models, 8, current=[4, 4])
    assert p.split == [6, 2]
    assert p.predicted_s == pytest.approx(0.6)
    assert p.current_s == pytest.approx(1.2)
    assert p.gain == pytest.approx(0.5)
    assert p.confident


def test_propose_hand_computed_demo_straggler():
    # The demo: four equal ranks, rank 3 slowed 2.5x, split 3,2,2,1 of 8.
    # Per-sample 0.1 s (rank 3: 0.25 s). Current: max(0.3, 0.2, 0.2, 0.25) = 0.3.
    # Best: (2,2,2,2) -> max(0.2, 0.2, 0.2, 0.5) = 0.5 is worse; (3,2,2,1) and (2,3,2,1)
    # tie at 0.3 but (2,2,3,1)... all 0.3: no split beats 0.3 (one rank must take 3 or rank 3
    # takes 2 -> 0.5), so the current split is kept.
    models = [model(r, 0.0, 0.1) for r in range(3)] + [model(3, 0.0, 0.25)]
    p = propose(models, 8, current=[3, 2, 2, 1])
    assert p.split == [3, 2, 2, 1]
    assert p.predicted_s == pytest.approx(0.3)
    assert p.gain == pytest.approx(0.0)
    assert any("already" in n for n in p.notes)


def test_propose_respects_memory_cap():
    # Rank 0 is fast but its memory allows only 3 samples: (1 GiB + b * 1 GiB) <= 0.85 * 5 GiB.
    models = [model(0, 0.0, 0.1, GiB, GiB, 5 * GiB), model(1, 0.0, 0.3)]
    assert models[0].cap(0.15) == 3
    p = propose(models, 8)
    assert p.split == [3, 5]
    assert p.caps == [3, None]
    assert p.predicted_s == pytest.approx(1.5)
    assert any("memory cap" in n for n in p.notes)
    assert p.rank_mem[0] == 4 * GiB


def test_propose_refuses_impossible_constraints():
    models = [model(0, 0, 0.1, GiB, GiB, 4 * GiB), model(1, 0, 0.1, GiB, GiB, 4 * GiB)]
    with pytest.raises(BalanceError, match="at most 4 samples"):
        propose(models, 10)  # caps are 2 + 2
    with pytest.raises(BalanceError, match="cannot give 2 ranks"):
        propose(models, 1)
    tiny = [model(0, 0, 0.1, 4 * GiB, GiB, 4 * GiB)]
    with pytest.raises(BalanceError, match="even 1 sample"):
        propose(tiny, 1)


def test_propose_is_unsure_when_any_rank_is():
    models = [model(0, 0, 0.1), model(1, 0, 0.2, confident=False)]
    models[1].reason = "only 1 update(s) measured"
    p = propose(models, 6)
    assert not p.confident
    assert "rank 1: only 1 update(s)" in p.reason


# --- optimality: greedy vs brute force ----------------------------------------------------------


def brute_force(models, global_batch, headroom, min_batch):
    best = None
    caps = [m.cap(headroom) for m in models]
    for split in itertools.product(range(min_batch, global_batch + 1), repeat=len(models)):
        if sum(split) != global_batch:
            continue
        if any(c is not None and b > c for c, b in zip(caps, split, strict=True)):
            continue
        t = predict(models, split)
        best = t if best is None else min(best, t)
    return best


rank_models = st.builds(
    lambda fixed, per, base, per_mem, limit: (fixed, per, base, per_mem, limit),
    st.floats(0.0, 0.5),
    st.floats(0.01, 1.0),
    st.integers(0, 4),
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(4, 40)),
)


@settings(max_examples=150, deadline=None)
@given(
    specs=st.lists(rank_models, min_size=1, max_size=4),
    global_batch=st.integers(1, 12),
    min_batch=st.integers(0, 2),
    headroom=st.sampled_from([0.0, 0.15, 0.3]),
)
def test_greedy_matches_brute_force(specs, global_batch, min_batch, headroom):
    models = [model(r, *spec) for r, spec in enumerate(specs)]
    best = brute_force(models, global_batch, headroom, min_batch)
    if best is None:
        with pytest.raises(BalanceError):
            propose(models, global_batch, headroom=headroom, min_batch=min_batch)
        return
    p = propose(models, global_batch, headroom=headroom, min_batch=min_batch)
    assert sum(p.split) == global_batch
    assert all(b >= min_batch for b in p.split)
    assert all(c is None or b <= c for c, b in zip(p.caps, p.split, strict=True))
    assert p.predicted_s == pytest.approx(best, abs=1e-12)


def test_greedy_matches_brute_force_exhaustive_small_grid():
    # A fixed grid too, so the cross-check does not depend on what hypothesis happens to draw.
    for fixed in (0.0, 0.2):
        for pers in itertools.product((0.1, 0.25, 0.4), repeat=3):
            models = [model(r, fixed * r, per) for r, per in enumerate(pers)]
            for g in range(3, 10):
                p = propose(models, g)
                assert p.predicted_s == pytest.approx(brute_force(models, g, 0.15, 1))


# --- validate ----------------------------------------------------------------------------------


def test_validate_lists_every_problem():
    models = [model(0, 0, 0.1, GiB, GiB, 5 * GiB), model(1, 0, 0.1), model(2, 0, 0.1)]
    assert validate([3, 3, 2], 8, 3, models) == []
    errs = validate([5, 0], 8, 3, models)
    assert any("2 entries" in e for e in errs)
    assert any("sums to 5" in e for e in errs)
    assert any("at least 1" in e for e in errs)
    errs = validate([6, 1, 1], 8, 3, models)
    assert len(errs) == 1 and "rank 0" in errs[0] and "cap 3" in errs[0]
    assert any("whole number" in e for e in validate([1.5, 2, 3], 8, 3))


def test_parse_split():
    assert parse_split("3,2, 2 1") == [3, 2, 2, 1]
    with pytest.raises(SplitError, match="whole numbers"):
        parse_split("3,x")
    with pytest.raises(SplitError, match="empty"):
        parse_split(" , ")
