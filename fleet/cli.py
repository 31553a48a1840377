"""The `fleet` entry point: finds the package that owns a subcommand and imports only that one.

It lives in its own small package because it must reach all three parts (and `bench`, the
benchmarks beside them), and each of `trainer`, `telemetry` and `console` is forbidden to
import at least one of the others. At module level it imports only its table: the owner of a
subcommand is imported when that subcommand runs, which keeps `fleet console` free of mlx and
`fleet train` free of textual.
"""

from __future__ import annotations

import os
import sys
from importlib import import_module

# subcommand -> (module that owns it, one-line help). Each module has
# `configure(name, parser)` and `run(name, args) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "prepare": ("trainer.cli", "turn text into Parquet token shards"),
    "train": ("trainer.cli", "train a model (one rank, or one of many under mlx.launch)"),
    "launch": ("trainer.cli", "start a data-parallel run with mlx.launch"),
    "check": ("trainer.cli", "check a fleet before a run: hosts, versions, data, group, links"),
    "export": ("trainer.cli", "write a checkpoint as an mlx-lm model folder (mlx_lm.load)"),
    "sample": ("trainer.cli", "generate text from a checkpoint, printed as it comes"),
    "sweep": ("trainer.sweep.cli", "search train flags with Optuna; crown a champion over seeds"),
    "bench": ("bench.cli", "benchmarks: memory, balance, throughput, telemetry, console"),
    "telemetry": ("telemetry.cli", "tail a rank's telemetry or send it a signed command"),
    "report": ("telemetry.cli", "summarize a run from its telemetry logs"),
    "console": ("console.cli", "the live operator console (Textual, over SSH)"),
    "demo": ("console.cli", "the product in one command: a local run and its console"),
}

# Subcommands that run MLX on this machine: they get OpenBLAS on Linux CPU (trainer/blas.py).
COMPUTE = frozenset({"train", "launch", "bench", "demo", "sample"})


def _overview() -> str:
    width = max(map(len, SUBCOMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in SUBCOMMANDS.items())
    return (
        "usage: fleet <command> [options]\n\n"
        "Train one model data-parallel across unequal machines, and watch and steer it live.\n\n"
        f"commands:\n{rows}\n\n"
        "Run 'fleet <command> --help' for a command's options.\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; `argv=None` means the real command line (and may re-exec)."""
    as_command = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_overview())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        from telemetry.typos import did_you_mean

        print(
            f"usage: fleet <command> [options]\nfleet: error: unknown command {name!r}"
            f"{did_you_mean(name, SUBCOMMANDS, quote=True)}\n('fleet --help' lists them)",
            file=sys.stderr,
        )
        return 2
    if as_command and name in COMPUTE:
        # Imported here: `fleet` itself imports only its table, and the console never needs it.
        from trainer.blas import reexec_with_openblas

        reexec_with_openblas(argv)
    from telemetry.typos import Parser  # a typo: one usage line and the nearest valid name

    owner = SUBCOMMANDS[name][0]
    if name == "report" and rest and not rest[0].startswith("-"):
        from trainer.sweep.layout import is_sweep  # a sweep folder has its own report

        owner = "trainer.sweep.cli" if is_sweep(rest[0]) else owner
    module = import_module(owner)
    parser = Parser(prog=f"fleet {name}", description=SUBCOMMANDS[name][1])
    module.configure(name, parser)
    args = parser.parse_args(rest)
    try:
        return int(module.run(name, args) or 0)
    except KeyboardInterrupt:
        print("fleet: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`fleet report --json | head`): stop quietly, as Unix tools do.
        # Point stdout at /dev/null so the interpreter's final flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
