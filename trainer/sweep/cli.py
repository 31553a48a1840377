"""`fleet sweep SPEC`, `fleet sweep status SWEEP`, `fleet sweep promote SWEEP`, and
`fleet report SWEEP` (fleet/cli.py hands a sweep folder over to this module).

    fleet sweep sweeps/lr-wd.toml                   # run it (sweeps/lr-wd/ by default)
    fleet sweep sweeps/lr-wd.toml --resume          # after a crash, a reboot or a SIGTERM
    fleet sweep status sweeps/lr-wd                 # done / pruned / running, champion, time
    fleet report sweeps/lr-wd --plot lr-wd.png      # every trial side by side
    fleet sweep promote sweeps/lr-wd --updates 5000 # the champion's fleet train command
"""

from __future__ import annotations

import argparse
import sys

from trainer.config import DefaultsHelp

ACTIONS = ("status", "promote")


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = DefaultsHelp
    if name == "report":
        parser.add_argument("sweep", metavar="SWEEP", help="a sweep folder")
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument(
            "--plot",
            metavar="FILE",
            default="",
            help="draw the metric against each searched flag, and every trial's curve, into "
            "FILE (.png or .svg; the `plot` extra)",
        )
        return
    parser.description = (
        "Search `fleet train` flags with Optuna (grid, random or TPE): each trial a real "
        "`fleet launch` run under the sweep's folder, pruned only at evaluations after a "
        "warm-up, the best re-run on new seeds before a champion is crowned. "
        "`fleet sweep status SWEEP` and `fleet sweep promote SWEEP` read a sweep folder."
    )
    parser.epilog = (
        "SPEC is TOML: name, sampler (grid, random, tpe), trials; [train] the fixed flags; "
        "[search] each searched flag as { low, high, log } or { values = [...] }; [baseline]; "
        "[budget] tokens and evals; [metric] name (val_bpb, val_loss) and direction; [prune] "
        "rule (median, halving, none), warmup, diverge; [champion] top_k and seeds; [fleet] "
        "ranks or hostfile, concurrent. An example with every key: the docstring of "
        "trainer/sweep/spec.py."
    )
    parser.add_argument(
        "target",
        metavar="SPEC|status|promote",
        help="the sweep's TOML spec (or, with --resume, its folder); or status / promote",
    )
    parser.add_argument(
        "sweep", nargs="?", metavar="SWEEP", help="with status or promote: the sweep folder"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="go on with the sweep in the spec's folder after a crash, a reboot or a stop: "
        "finished trials are kept, running ones restart from their newest checkpoint",
    )
    parser.add_argument(
        "--out", metavar="DIR", default=None, help="the sweep folder (default: the spec's)"
    )
    parser.add_argument(
        "--concurrent",
        type=int,
        default=0,
        metavar="K",
        help="trials side by side, each on its own part of the fleet (a hostfile is split in "
        "K parts) (default: the spec's, else 1)",
    )
    parser.add_argument(
        "--updates",
        type=int,
        default=0,
        metavar="N",
        help="promote: --updates of the full run (default: 0 = the trials' budget)",
    )
    parser.add_argument(
        "--run-dir",
        default="",
        metavar="RUN",
        help="promote: --run-dir of the full run (default: runs/NAME-champion)",
    )
    parser.add_argument("--json", action="store_true", help="status: print JSON")


def run(name: str, args: argparse.Namespace) -> int:
    from trainer.sweep.controller import SweepError
    from trainer.sweep.spec import SpecError

    who = f"fleet {name}"
    try:
        if name == "report":
            return report(args)
        if args.target in ACTIONS:
            if not args.sweep:
                raise SweepError(f"give the sweep folder: fleet sweep {args.target} SWEEP")
            return status(args) if args.target == "status" else promote(args)
        if args.sweep:
            raise SweepError(f"unexpected {args.sweep!r}: fleet sweep SPEC [--resume]")
        if args.concurrent < 0:
            raise SweepError("--concurrent must be at least 1")
        from trainer.sweep.controller import main

        return main(
            args.target, resume=args.resume, out=args.out, concurrent=args.concurrent or None
        )
    except (SweepError, SpecError) as e:
        print(f"{who}: error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
        return 2


def status(args: argparse.Namespace) -> int:
    from trainer.sweep.report import as_json, open_sweep
    from trainer.sweep.status import render, status

    st = status(open_sweep(args.sweep))
    print(as_json(st) if args.json else render(st))
    return 0


def promote(args: argparse.Namespace) -> int:
    from trainer.sweep.report import open_sweep, promote

    print(promote(open_sweep(args.sweep), args.updates, args.run_dir))
    return 0


def report(args: argparse.Namespace) -> int:
    from trainer.sweep.report import as_json, open_sweep, plot, render, summary

    s = open_sweep(args.sweep)
    data = summary(s)
    if args.plot:
        plot(data, s.spec, args.plot)
    print(as_json(data) if args.json else render(data))
    if args.plot:
        print(f"plots drawn in {args.plot}")
    return 0
