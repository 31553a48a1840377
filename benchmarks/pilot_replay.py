"""A real run's logged figures replayed through an autopilot: what it would have decided.

    python benchmarks/pilot_replay.py RUN_DIR                  # this checkout's pilot
    python benchmarks/pilot_replay.py RUN_DIR --tree /tmp/old  # another checkout's
    python benchmarks/pilot_replay.py RUN_DIR --show 44-49     # its reading, update by update
    python benchmarks/pilot_replay.py OUT.json --run equal/pilot/0  # kept by autopilot.py

Every rank's logged batch and compute time of each update are fed to a fresh `Autopilot` as
the controller feeds it (memory figures left out: the guard is not replayed). A decision after
update t that the pilot announced (`Autopilot.may_decide`) is applied, and logged as
`rebalanced`, at t (update t + 1 runs it); others, and every decision of a pilot from before
session 15, at t + 1, a boundary later, as the controller applies them. The replay holds
only until its first decision that differs from the run's: after that the run's splits are
not the ones the replayed pilot chose. Run with the tree's pilot that flew the run, it gives
the run's moves back, which tells a move the box's figures called for (a rank that measured
faster than the schedule made it) from one the pilot made up.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def span(text: str) -> range:
    """ "44-49" (or "44") as the updates it names."""
    lo, _, hi = text.partition("-")
    try:
        return range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not A-B (two update numbers)") from None


def from_run_dir(run_dir: Path) -> tuple[dict[int, list[tuple[int, float]]], list]:
    """Each update's (batch, compute_s) of every rank, and the logged moves, of a run folder."""
    from telemetry.arrowlog import log_ranks, read_events, read_updates

    ranks = log_ranks(run_dir)
    if not ranks:
        raise SystemExit(f"{run_dir}: no update log (is it a run folder?)")
    rows = {r: {x["step"]: x for x in read_updates(run_dir, r).to_pylist()} for r in ranks}
    steps = sorted(set.intersection(*(set(v) for v in rows.values())))
    figures = {
        t: [(rows[r][t]["local_batch"], rows[r][t]["compute_s"]) for r in ranks] for t in steps
    }
    logged = [
        (e.step, e.data.get("from"), e.data.get("to"))
        for e in read_events(run_dir, 0)
        if e.kind == "rebalanced"
    ]
    return figures, logged


def from_results(path: Path, run: str) -> tuple[dict[int, list[tuple[int, float]]], list]:
    """The same, of one run that benchmarks/autopilot.py kept in its results file."""
    name, _, rest = run.partition("/")
    arm, _, repeat = rest.partition("/")
    try:
        kept = json.loads(path.read_text())["runs"][name][arm][int(repeat)]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise SystemExit(f"{path}: no run {run!r} there (NAME/ARM/REPEAT: {e})") from None
    if not kept or "figures" not in kept:
        raise SystemExit(f"{path}: run {run!r} kept no figures (an older benchmark's file?)")
    figures = {int(t): [tuple(f) for f in row] for t, row in kept["figures"].items()}
    return dict(sorted(figures.items())), [tuple(c) for c in kept["changes"]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "source", type=Path, help="a run folder (its telemetry/ holds the log), or a results JSON"
    )
    p.add_argument("--run", default="", help="in a results JSON: the run, NAME/ARM/REPEAT")
    p.add_argument("--tree", type=Path, default=None, help="the checkout whose pilot replays")
    p.add_argument(
        "--show", type=span, default=range(0), help="updates A-B to print (default: none)"
    )
    a = p.parse_args(argv)
    if a.tree is not None:
        sys.path.insert(0, str(a.tree.resolve()))
    from telemetry.units import GiB
    from trainer.autopilot import Autopilot, RankFigures

    if a.source.is_dir():
        figures, logged = from_run_dir(a.source)
    elif not a.run:
        p.error(f"{a.source}: not a run folder; for a results JSON say which run (--run)")
    else:
        figures, logged = from_results(a.source, a.run)
    world = len(next(iter(figures.values()), ()))
    if not world:
        p.error(f"{a.source}: no updates that every rank logged")
    pilot = Autopilot(world, enabled=True)
    replayed = []
    for step, row in figures.items():
        split = [b for b, _ in row]
        compute = [c for _, c in row]
        rank_figures = [RankFigures(b, c, GiB, 0, 0, None) for b, c in row]
        announced = hasattr(pilot, "may_decide") and pilot.may_decide()
        decision = pilot.observe(split, rank_figures)
        moves = [args["split"] for cmd, args in decision.commands if cmd == "rebalance"]
        replayed += [(step if announced else step + 1, split, new) for new in moves]
        if step in a.show:
            est = [pilot.costs.estimate(r) for r in range(world)]
            read = [f"{e.cost:.2f}±{e.se:.2f} n{e.n}" if e else "-" for e in est]
            secs = " ".join(f"{c:.3f}" for c in compute)
            # the fixed part steered by, and the least and the most the figures allow
            fit = getattr(getattr(pilot, "fixed_part", None), "reading", lambda: None)()
            fixed = f"{fit.best:.2f} ({fit.least:.2f}-{fit.most:.2f})" if fit else "-"
            print(
                f"update {step}: split {split} compute_s {secs} cost {read} fixed {fixed}",
                moves or "",
            )
    print("logged:  ", logged)
    print("replayed:", replayed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
