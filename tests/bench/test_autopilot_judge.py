"""The autopilot benchmark's judge of a move by what the ranks measured (`unmeasured`): a move
the figures call for is not counted, one between ranks that measured alike is."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "autopilot.py"
_SPEC = importlib.util.spec_from_file_location("autopilot_benchmark", _PATH)
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)

EVEN, MOVED = [4, 4, 4, 4], [3, 5, 4, 4]  # one sample from rank 0 to rank 1
NOISE = (1.00, 1.08, 0.95, 1.03, 0.97, 1.05, 0.92, 1.02, 0.99)  # ~5% per update
NOW = {"memory_limit_gb": "0"}  # how a kept run says it ran, where it differs from before


def figures(rank0: list[float], split=EVEN) -> dict:
    """Updates 1.. with rank 0 taking `rank0[i]` s and the others 1 s (times a wobble)."""
    return {
        str(t + 1): [[b, (c if r == 0 else 1.0) * NOISE[(t + r) % 9]] for r, b in enumerate(split)]
        for t, c in enumerate(rank0)
    }


def test_a_move_between_ranks_that_measured_alike_is_counted():
    assert bench.unmeasured([(11, EVEN, MOVED)], figures([1.0] * 9), (0.0, 6.0)) == 1


def test_a_rank_twice_as_slow_for_three_updates_calls_for_the_move():
    """The pilot may act on three figures far beyond the noise; the judge sees them too (the
    H200 host's equal ranks: rank 1 took 0.92 s for three updates against 0.48)."""
    slowed = [1.0] * 6 + [2.0] * 3
    assert bench.unmeasured([(11, EVEN, MOVED)], figures(slowed), (0.0, 6.0)) == 0


def test_a_move_is_judged_by_the_figures_up_to_the_update_it_is_logged_at():
    """The pilot decides on the figures of the update that ends at the boundary where the
    move is logged (and applied): a slowdown in updates 7-9 calls for a move logged at 9."""
    slowed = [1.0] * 6 + [2.0] * 3
    assert bench.unmeasured([(9, EVEN, MOVED)], figures(slowed), (0.0, 6.0)) == 0


def test_figures_under_another_split_or_too_few_are_not_judged():
    assert bench.unmeasured([(4, EVEN, MOVED)], figures([1.0] * 2), (0.0, 6.0)) == 0
    elsewhere = figures([1.0] * 9, split=[2, 6, 4, 4])
    assert bench.unmeasured([(11, EVEN, MOVED)], elsewhere, (0.0, 6.0)) == 0


def test_a_results_file_is_judged_again_and_one_without_figures_is_not_judged(tmp_path):
    judged = {"changes": [[11, EVEN, MOVED]], "figures": figures([1.0] * 9)}
    older = {"changes": [[11, EVEN, MOVED]]}  # a file from before the figures were kept
    record = {"runs": {"equal": {"pilot": [judged, older]}}, "summary": {"equal": {"updates": 9}}}
    path = tmp_path / "autopilot.json"
    path.write_text(json.dumps(record))
    equal = bench.resummarized(path, (0.0, 6.0))["equal"]
    assert equal["changes"] == [1, 1]
    assert equal["moves_the_figures_did_not_call_for"] == [1, None]


def calls_for(factor: float, trials: int = 300) -> int:
    """Of `trials` moves from rank 0 after 9 updates with 20% noise each, rank 0 `factor`
    times as costly as the others: how many the judge finds called for."""
    rng = random.Random(0)
    called = 0
    for _ in range(trials):
        figs = {
            t: [[4, (factor if r == 0 else 1.0) * math.exp(rng.gauss(0, 0.2))] for r in range(4)]
            for t in range(1, 10)
        }
        called += bench.unmeasured([(11, EVEN, MOVED)], figs, (0.0, 6.0)) == 0
    return called


def test_the_judge_seldom_calls_for_a_move_between_equal_ranks_and_always_for_a_slow_one():
    """Its error rates, which the closing notes quote (12, 174, 280 and 300 of 300)."""
    assert calls_for(1.0) <= 15  # 5%: several windows and fixed parts are tried, each at 1%
    assert calls_for(1.5) >= 240 and calls_for(2.0) == 300


def fake_runs(move_at: int, name: str = "moving8", changes: list | None = None) -> dict:
    """benchmarks/autopilot.py's results for one scenario, one repeat: every arm at 1 s an
    update, the pilot's `changes` (moving8's: one move logged at `move_at`)."""
    plans = bench.plan({name}, (0.0, 6.0))
    arms = plans[name][5]
    run = {
        "tokens": dict.fromkeys(range(1, 101), 1024),
        "update_s": dict.fromkeys(range(1, 101), 1.0),
    }
    results = {name: {arm: [dict(run, changes=[])] for arm in arms}, "equal": {"pilot": []}}
    moves = changes if changes is not None else [(move_at, [1, 3, 2, 2], [2, 3, 1, 2])]
    results[name]["pilot"][0]["changes"] = moves
    return results


def test_the_summary_says_how_much_any_pilot_could_gain_over_the_best_fixed_split():
    """The oracle over the best fixed split: moving8 with 1,3,1,3 twice as fast before update
    50 and 1,2,1,4 twice as fast from 50 (every other arm at 1 s an update). The best fixed
    split runs 45 + 25 s over updates 5-99; the oracle switches at 50: 22.5 + 25 s."""
    plans = bench.plan({"moving8"}, (0.0, 6.0))
    runs = fake_runs(54)
    for arm, fast in (("1,3,1,3", range(5, 50)), ("1,2,1,4", range(50, 101))):
        run = runs["moving8"][arm][0]  # its clock is shared with the other arms': replace it
        run["update_s"] = {t: 0.5 if t in fast else s for t, s in run["update_s"].items()}
    summary = bench.summarize(plans, runs, 0, (0.0, 6.0))["moving8"]
    assert summary["best_fixed"] == ["1,2,1,4"]
    assert summary["oracle_over_best_fixed"]["each"] == [pytest.approx(70 / 47.5)]
    # one arm fastest in every phase: nothing to gain by switching
    summary = bench.summarize(plans, fake_runs(54), 0, (0.0, 6.0))["moving8"]
    assert summary["oracle_over_best_fixed"]["each"] == [pytest.approx(1.0)]


def test_a_reaction_counts_the_updates_run_on_the_old_split_after_the_change():
    """`@50` slows the update the log numbers 50 (since session 16): a move logged at 54 (its
    last update on the old split) leaves 50-54 on it. Files from before, whose trainer slowed
    update 51 on, are judged with their lag: the same move counts 4."""
    for lag, counted in ((0, 5), (1, 4)):
        plans = bench.plan({"moving8"}, (0.0, 6.0), lag)
        summary = bench.summarize(plans, fake_runs(54), 0, (0.0, 6.0), lag)
        assert summary["moving8"]["reactions"] == [[counted]]
    # a move logged before the first slowed update answers the phase before: no reaction
    # (None: none came), unless its split is already as fast as any in the new phase
    plans = bench.plan({"moving8"}, (0.0, 6.0), 1)
    early = fake_runs(0, changes=[(50, [2, 2, 2, 2], [1, 3, 2, 2])])
    assert bench.summarize(plans, early, 0, (0.0, 6.0), 1)["moving8"]["reactions"] == [[None]]
    assert bench.summarize(plans, fake_runs(50), 0, (0.0, 6.0), 1)["moving8"]["reactions"] == [
        ["kept"]
    ]


def test_a_phase_whose_split_in_place_is_already_as_fast_as_any_is_kept():
    """gradual16: rank 3 1.5x as slow from 25, 2x from 45, 3x from 65. 5,5,4,2, taken in the
    1.5x phase, is within 2% of the best at 2x on this box's model (its fixed part of 1.1
    samples): nothing to answer there, "kept" (the simulator's verdict), where the judge said
    "never" before. 5,4,4,3 is 34% slower at 2x: its answer, logged at 54, counts 10."""
    _, factors_at = bench.schedule(bench.SCENARIOS["gradual16"][0])
    taken = [(30, [4, 4, 4, 4], [5, 5, 4, 2])]
    assert bench.kept(taken, [4] * 4, factors_at, range(45, 65))
    assert not bench.kept([(30, [4] * 4, [5, 4, 4, 3])], [4] * 4, factors_at, range(45, 65))
    # a move logged at the phase's first update ran that update on the old split
    assert not bench.kept([(45, [4] * 4, [5, 5, 4, 2])], [4] * 4, factors_at, range(45, 65))
    plans = bench.plan({"gradual16"}, (0.0, 6.0))
    late = [(30, [4] * 4, [5, 4, 4, 3]), (54, [5, 4, 4, 3], [5, 5, 4, 2])]
    for changes, reactions in (
        (taken + [(70, [5, 5, 4, 2], [5, 5, 5, 1])], [6, "kept", 6]),
        (late + [(70, [5, 5, 4, 2], [5, 5, 5, 1])], [6, 10, 6]),
    ):
        runs = fake_runs(0, "gradual16", changes)
        summary = bench.summarize(plans, runs, 0, (0.0, 6.0))
        assert summary["gradual16"]["reactions"] == [reactions]


def test_the_summary_says_how_fast_the_machine_ran_each_arm_before_any_slowdown_or_move():
    """A noisy spell in one arm moves its ratio to the others: each repeat carries the least
    and the most ms a sample of its arms before the first slowed update (moving8: 50) and
    before the pilot's first move; equal ranks, how far apart they drifted."""
    plans = bench.plan({"moving8"}, (0.0, 6.0))
    runs = fake_runs(20)
    for arm, reps in runs["moving8"].items():
        ms = 20.0 if arm == "even" else 10.0  # a noisy spell in the even arm's first phase
        reps[0] = dict(reps[0], figures={
            str(t): [[b, (ms if t < 50 else 99.0) * b / 1e3] for b in plans["moving8"][5][arm]]
            for t in range(1, 101)
        })  # fmt: skip
    # the pilot's ranks ran slower from its move at 20 on: not read
    pilot = runs["moving8"]["pilot"][0]
    pilot["figures"] = {t: [[b, c * (3 if int(t) > 20 else 1)] for b, c in row]
                        for t, row in pilot["figures"].items()}  # fmt: skip
    summary = bench.summarize(plans, runs, 0, (0.0, 6.0))["moving8"]
    assert summary["ms_a_sample_before"] == [[pytest.approx(10.0), pytest.approx(20.0)]]
    assert bench.pace({"changes": []}, 50) is None  # a file from before the figures were kept

    equal = {"changes": [], "figures": {
        str(t): [[4, 0.1], [4, 0.1 * (1.2 if t % 10 == 0 else 1.0)], [3, 0.5]][: 2 + (t > 80)]
        for t in range(1, 101)
    }}  # fmt: skip
    # updates 81-100 are under unequal batches: not read; 8 of 80 read 1.2
    assert bench.rank_band(equal) == [pytest.approx(1.0), pytest.approx(1.2)]
    assert bench.rank_band({"changes": [], "figures": {}}) is None


def test_a_resume_keeps_whole_repeats_and_runs_a_repeat_cut_short_again():
    """Each repeat's arms must have run on one machine at one time: a repeat a call ran out
    of time in is dropped whole, the whole ones close up (repeats 0 and 2 become 0 and 1)."""
    plans = bench.plan({"moving8"}, (0.0, 6.0))
    arms = plans["moving8"][5]
    earlier = {
        "moving8": {
            a: [{"n": (a, 0), **NOW}, None if a == "even" else {}, {"n": (a, 2), **NOW}]
            for a in arms
        }
    }
    results = {"moving8": {a: [None] * 3 for a in arms}, "equal": {"pilot": []}}
    assert bench.resumed(results, earlier) == 2 * len(arms)
    for a in arms:
        assert [r and r["n"] for r in results["moving8"][a]] == [(a, 0), (a, 2), None]
    # as many as --repeats asks for, first repeats first
    fewer = {"moving8": {a: [None] for a in arms}, "equal": {"pilot": []}}
    assert bench.resumed(fewer, earlier) == len(arms)
    assert fewer["moving8"]["pilot"] == [{"n": ("pilot", 0), **NOW}]
    other = {"moving8": {"pilot": [{}], "even": [{}]}}  # another --plan-fixed's arms
    with pytest.raises(ValueError, match="moving8: the earlier file ran arms"):
        bench.resumed(results, other)


def test_a_resumed_benchmark_with_every_repeat_kept_runs_nothing_and_keeps_them(
    tmp_path, monkeypatch, capsys
):
    """No rank starts (no data is even prepared): the file written holds the kept run, and
    no folder is left behind."""
    kept = {"changes": [[11, [8, 8], [9, 7]]], "figures": figures([1.0] * 9, [8, 8]), **NOW}
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": {"pair-equal": {"pilot": [kept, None]}}}))
    out = tmp_path / "out.json"
    argv = ["autopilot.py", "--only", "pair-equal", "--repeats", "1", "--out", str(out)]
    monkeypatch.setattr(bench, "run_fleet", lambda *a: pytest.fail(f"ran fleet {a}"))
    made = tmp_path / "runs"
    monkeypatch.setattr(bench.tempfile, "mkdtemp", lambda prefix: made.mkdir() or str(made))
    monkeypatch.setattr("sys.argv", [*argv, "--resume", str(earlier)])
    assert bench.main() == 0
    assert "--resume: 1 runs kept" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["runs"]["pair-equal"]["pilot"][0]["changes"] == kept["changes"]
    assert record["summary"]["pair-equal"]["changes"] == [1]
    assert not made.exists()
    monkeypatch.setattr("sys.argv", [*argv, "--resume", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--resume" in capsys.readouterr().err


def test_the_width_asked_for_reaches_every_run_and_its_record(tmp_path, monkeypatch, capsys):
    """--width changes the model of every run (each record says which); a width the model
    cannot take, or a resume of another width's runs, is refused."""
    asked = []

    def run(
        data, out, split, updates, slow, *extra, cores=None, busy=False, model=bench.MODEL, **_
    ):
        asked.append(model)
        return {
            "split": split,
            "changes": [],
            "figures": figures([1.0] * 9, split=split),
            "wall_s": 1,
        }

    monkeypatch.setattr(bench, "run", run)
    monkeypatch.setattr(bench, "run_fleet", lambda *a: None)  # no data to prepare
    out = tmp_path / "out.json"
    argv = ["autopilot.py", "--only", "pair-equal", "--repeats", "2", "--out", str(out)]
    monkeypatch.setattr("sys.argv", [*argv, "--width", "384"])
    assert bench.main() == 0
    wide = ["--depth", "2", "--width", "384", "--heads", "2"]
    assert asked == [wide, wide] and wide != bench.MODEL
    assert [r["model"] for r in json.loads(out.read_text())["runs"]["pair-equal"]["pilot"]] == [
        wide,
        wide,
    ]
    asked.clear()
    monkeypatch.setattr("sys.argv", argv)
    assert bench.main() == 0
    assert asked == [bench.MODEL, bench.MODEL]
    # a width the model's heads do not divide, and a resume of runs of another width: refused
    # before anything runs
    asked.clear()
    capsys.readouterr()
    for bad, why in (
        (["--width", "3"], "--width 3: a positive multiple of the model's 2 heads"),
        (["--width", "0"], "--width 0: a positive multiple"),
        (["--resume", str(out), "--width", "384"], "ran --depth 2 --width 128 --heads 2 (another"),
    ):
        monkeypatch.setattr("sys.argv", [*argv, *bad])
        with pytest.raises(SystemExit):
            bench.main()
        assert why in capsys.readouterr().err
    assert asked == []


def test_every_run_goes_without_a_memory_limit_unless_one_is_asked_for(
    tmp_path, monkeypatch, capsys
):
    """The trainer's auto limit makes MLX's eval wait near it, and a rank's cost then depends
    on how it reached its batch: the benchmark's runs go without one (each record says so),
    --memory-limit-gb sets another, and a value the trainer would refuse is refused first."""
    asked = []

    def run(data, out, split, updates, slow, *extra, memory_limit=bench.MEMORY_LIMIT, **_):
        asked.append(memory_limit)
        return {"split": split, "changes": [], "figures": figures([1.0] * 9, split), "wall_s": 1}

    monkeypatch.setattr(bench, "run", run)
    monkeypatch.setattr(bench, "run_fleet", lambda *a: None)  # no data to prepare
    out = tmp_path / "out.json"
    argv = ["autopilot.py", "--only", "pair-equal", "--repeats", "2", "--out", str(out)]
    for extra, limit in (([], "0"), (["--memory-limit-gb", "auto"], "auto")):
        asked.clear()
        monkeypatch.setattr("sys.argv", [*argv, *extra])
        assert bench.main() == 0
        runs = json.loads(out.read_text())["runs"]["pair-equal"]["pilot"]
        assert asked == [limit, limit] and [r["memory_limit_gb"] for r in runs] == asked
    asked.clear()
    capsys.readouterr()
    monkeypatch.setattr("sys.argv", [*argv, "--memory-limit-gb", "-4"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--memory-limit-gb must be auto, 0 (none) or a positive" in capsys.readouterr().err
    # a resume keeps no run of another limit: one that names none ran the trainer's auto
    before = json.loads(out.read_text())
    for run in before["runs"]["pair-equal"]["pilot"]:
        del run["memory_limit_gb"]
    out.write_text(json.dumps(before))
    monkeypatch.setattr("sys.argv", [*argv, "--resume", str(out)])
    with pytest.raises(SystemExit):
        bench.main()
    assert "ran --memory-limit-gb auto (another limit?)" in capsys.readouterr().err
    assert asked == []


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="2 cores"
)
def test_each_rank_of_a_pair_runs_on_a_core_of_its_own_and_four_on_two_cores_are_left_alone():
    """A fleet's ranks each have a Mac: the benchmark pins each local rank to a core of its own
    where there is one for each, as its interpreter starts (real processes, as mlx.launch
    starts them: MLX_RANK set); where there is not, and for processes without a rank (the
    launchers), nothing."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    probe = ["-c", "import os; print(sorted(os.sched_getaffinity(0)))"]

    def affinity(env: dict, rank: str | None) -> list[int]:
        env = {**env, **({"MLX_RANK": rank} if rank is not None else {})}
        out = subprocess.run([sys.executable, *probe], env=env, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    base = {k: v for k, v in os.environ.items() if k != "MLX_RANK"}
    pair = bench.rank_env(2, cores, env=base, pinned=bench.rank_cores(2, cores))
    assert [affinity(pair, r) for r in ("0", "1")] == [[cores[0]], [cores[1]]]
    assert affinity(pair, None) == sorted(os.sched_getaffinity(0))  # a launcher: as it was
    assert bench.rank_cores(4, cores) is None  # four ranks, two cores: no core each
    assert "FLEET_BENCH_RANK_CORES" not in bench.rank_env(4, cores, env=base, pinned=None)
    free = bench.rank_env(2, cores, env=base)  # --no-pin: none
    assert affinity(free, "1") == sorted(os.sched_getaffinity(0))
    # a resume keeps no pair whose ranks ran otherwise (runs before session 41: unpinned)
    old = {"split": [8, 8], "memory_limit_gb": "0"}
    assert bench.unlike(old, bench.MODEL, "0", True) == "ran its ranks unpinned (--no-pin?)"
    assert bench.unlike(old, bench.MODEL, "0", False) == ""
