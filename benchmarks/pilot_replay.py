"""A real run's logged figures replayed through an autopilot: what it would have decided.

    python benchmarks/pilot_replay.py RUN_DIR                  # this checkout's pilot
    python benchmarks/pilot_replay.py RUN_DIR --tree /tmp/old  # another checkout's
    python benchmarks/pilot_replay.py RUN_DIR --show 44-49     # its reading, update by update

Every rank's logged batch and compute time of each update are fed to a fresh `Autopilot` as
the controller feeds it (memory figures left out: the guard is not replayed). A decision after
update t is applied, and logged as `rebalanced`, at t + 1. The replay holds only until its
first decision that differs from the run's: after that the run's splits are not the ones the
replayed pilot chose. Run with the tree's pilot that flew the run, it gives the run's moves
back, which tells a move the box's figures called for (a rank that measured faster than the
schedule made it) from one the pilot made up.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def span(text: str) -> range:
    """ "44-49" (or "44") as the updates it names."""
    lo, _, hi = text.partition("-")
    try:
        return range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not A-B (two update numbers)") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="a run folder (its telemetry/ holds the log)")
    p.add_argument("--tree", type=Path, default=None, help="the checkout whose pilot replays")
    p.add_argument(
        "--show", type=span, default=range(0), help="updates A-B to print (default: none)"
    )
    a = p.parse_args(argv)
    if a.tree is not None:
        sys.path.insert(0, str(a.tree.resolve()))
    from telemetry.arrowlog import log_ranks, read_events, read_updates
    from telemetry.units import GiB
    from trainer.autopilot import Autopilot, RankFigures

    ranks = log_ranks(a.run_dir)
    if not ranks:
        p.error(f"{a.run_dir}: no update log (is it a run folder?)")
    rows = {r: {x["step"]: x for x in read_updates(a.run_dir, r).to_pylist()} for r in ranks}
    steps = sorted(set.intersection(*(set(v) for v in rows.values())))
    pilot = Autopilot(len(ranks), enabled=True)
    replayed = []
    for step in steps:
        split = [rows[r][step]["local_batch"] for r in ranks]
        compute = [rows[r][step]["compute_s"] for r in ranks]
        figures = [RankFigures(b, c, GiB, 0, 0, None) for b, c in zip(split, compute, strict=True)]
        decision = pilot.observe(split, figures)
        moves = [args["split"] for cmd, args in decision.commands if cmd == "rebalance"]
        replayed += [(step + 1, split, new) for new in moves]
        if step in a.show:
            est = [pilot.costs.estimate(r) for r in range(len(ranks))]
            read = [f"{e.cost:.2f}±{e.se:.2f} n{e.n}" if e else "-" for e in est]
            secs = " ".join(f"{c:.3f}" for c in compute)
            print(f"update {step}: split {split} compute_s {secs} cost {read}", moves or "")
    logged = [
        (e.step, e.data.get("from"), e.data.get("to"))
        for e in read_events(a.run_dir, 0)
        if e.kind == "rebalanced"
    ]
    print("logged:  ", logged)
    print("replayed:", replayed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
