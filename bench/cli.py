"""`fleet bench`: memory (accumulation modes), throughput, balance, telemetry and console.

The `configure(name, parser)` / `run(name, args)` pair `fleet/cli.py` dispatches to. Each
benchmark lives in its own module; nothing here imports mlx or textual at module level.
"""

from __future__ import annotations

import argparse
import json


def configure(name: str, parser: argparse.ArgumentParser) -> None:
    """`fleet bench`'s subcommands and their flags (nothing heavy is imported here); every
    flag's help shows its default."""
    from trainer.config import DefaultsHelp  # no mlx: the dataclass of train's flags

    parser.formatter_class = DefaultsHelp
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for add in (_memory, _throughput, _balance, _telemetry, _console, _worker):
        add(sub)
    for p in sub.choices.values():
        p.formatter_class = DefaultsHelp


def _memory(sub: argparse._SubParsersAction) -> None:
    """Unrolled against sequential accumulation, each mode in a fresh process."""
    mem = sub.add_parser(
        "memory",
        help="peak memory of unrolled vs sequential gradient accumulation",
        description="The same model and update under unrolled and sequential accumulation, "
        "each in a fresh process: peak active memory, the ratio, and update times.",
    )
    # Deep and narrow with long rows: activations (which grow with depth x batch x length)
    # dominate the weights and optimizer state, as in a long-context run on a small Mac.
    _model_args(mem, depth=8, width=128, heads=2, seq_len=256, local_batch=8, accum=4)
    _device_args(mem)
    mem.add_argument("--updates", type=int, default=2, help="measured updates (after 1 warmup)")
    mem.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _throughput(sub: argparse._SubParsersAction) -> None:
    """The trainer's update, one configuration."""
    thr = sub.add_parser(
        "throughput",
        help="tokens/s, MFU, peak memory and update time of the trainer's update",
        description="The trainer's own update path (model, precision, accumulation, "
        "optimizer, compiled step) on synthetic tokens.",
    )
    _model_args(thr, depth=4, width=256, heads=4, seq_len=256, local_batch=8, accum=1)
    _device_args(thr)
    thr.add_argument("--updates", type=int, default=10, help="measured updates")
    thr.add_argument("--warmup", type=int, default=2, help="updates before measuring")
    thr.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="the device's dense bf16 peak for MFU (0 = known devices only)",
    )
    thr.add_argument(
        "--breakdown",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure where the peak memory goes (a few probes before the timed updates)",
    )
    thr.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _balance(sub: argparse._SubParsersAction) -> None:
    """Batch splits on real local ranks."""
    bal = sub.add_parser(
        "balance",
        help="tokens/s of batch splits across real local ranks (and the balancer's proposal)",
        description="Synthetic updates on -n local ranks for each --variant split: the median "
        "over counted updates of the slowest rank's update time, tokens/s, per-rank compute "
        "and wait, and peak memory. Written as Parquet and CSV into the run folder.",
    )
    bal.add_argument("-n", type=int, default=3, help="local ranks")
    bal.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SPLIT",
        help="a split to measure, e.g. 2,2,2 (repeatable; default: the even split)",
    )
    bal.add_argument(
        "--variant-cache-gb",
        action="append",
        default=[],
        metavar="GB",
        help="per-variant --cache-limit-gb, in the order of --variant",
    )
    bal.add_argument(
        "--global-batch",
        type=int,
        default=0,
        help="global microbatch (default: the first variant's sum, else 2n)",
    )
    bal.add_argument("--simulate-slowdown", default="", help="per-rank factors, e.g. 1,1,2")
    bal.add_argument(
        "--propose",
        action="store_true",
        help="also measure the split the balancer proposes from the variants",
    )
    bal.add_argument(
        "--all",
        action="store_true",
        help="also measure every split of the global batch (small batches only)",
    )
    bal.add_argument(
        "--scaling",
        action="store_true",
        help="also run one rank on the even split's per-rank batch: tokens/s from 1 to n ranks",
    )
    bal.add_argument("--updates", type=int, default=8, help="counted updates per variant")
    bal.add_argument("--warmup", type=int, default=2, help="updates before counting")
    bal.add_argument("--depth", type=int, default=2, help="transformer blocks")
    bal.add_argument("--width", type=int, default=128, help="model width")
    bal.add_argument("--heads", type=int, default=0, help="attention heads (0 = width / 64)")
    bal.add_argument("--vocab", type=int, default=0, help="vocabulary (0 = the synthetic default)")
    bal.add_argument("--seq-len", type=int, default=256, help="tokens per sample")
    bal.add_argument("--accum", type=int, default=1, help="microsteps per update")
    bal.add_argument(
        "--precision", choices=("fp32", "bf16", "mixed"), default="fp32", help="as fleet train's"
    )
    bal.add_argument("--starting-port", type=int, default=30323, help="ring ports for the runs")
    bal.add_argument(
        "--device", choices=("auto", "gpu", "cpu"), default="auto", help="where the ranks compute"
    )
    bal.add_argument(
        "--backend",
        default="",
        help="fleet launch --backend (default: ring with --device cpu, else mlx.launch's pick: "
        "nccl on CUDA)",
    )
    bal.add_argument(
        "--train-args",
        default="",
        metavar="ARGS",
        help='more `fleet train` arguments for every run, e.g. "--allreduce-bucket-mb 32"',
    )
    bal.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment variable for every rank (repeatable)",
    )
    bal.add_argument("--run-dir", default="", help="where runs and tables go (default: runs/)")
    bal.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _telemetry(sub: argparse._SubParsersAction) -> None:
    """Telemetry's overhead, memory and fuzz; `--trainer` times the real update."""
    tel = sub.add_parser(
        "telemetry",
        help="telemetry overhead, memory with a stalled subscriber, and the 10k-input fuzz",
        description="Telemetry's own benchmarks (bench/telemetry.py).",
    )
    from bench.telemetry import add_arguments as telemetry_arguments

    telemetry_arguments(tel)
    tel.add_argument(
        "--trainer",
        action="store_true",
        help="overhead: time the trainer's real update (synthetic tokens, the model below) "
        "instead of the stand-in work",
    )
    _model_args(tel, depth=2, width=128, heads=2, seq_len=256, local_batch=8, accum=2)


def _console(sub: argparse._SubParsersAction) -> None:
    """The console under synthetic load."""
    con = sub.add_parser(
        "console",
        help="frame time, loop lag and CPU of the console fed 64 ranks x 10 updates/s",
        description="The console, headless, fed synthetic ranks: frame time p50/p95/max, "
        "loop lag and CPU, as JSON (bench/console.py). Targets: frame p95 <= 50 ms, "
        "CPU <= 30% of one core.",
    )
    from bench.console import add_arguments as console_arguments

    console_arguments(con)


def _worker(sub: argparse._SubParsersAction) -> None:
    """One configuration measured in its own process (internal)."""
    worker = sub.add_parser("_worker")  # no help=: not listed by --help
    _model_args(worker, depth=2, width=128, heads=2, seq_len=1024, local_batch=4, accum=4)
    worker.add_argument("--updates", type=int, default=2)
    worker.add_argument("--warmup", type=int, default=1)
    worker.add_argument("--breakdown", action=argparse.BooleanOptionalAction, default=False)
    _device_args(worker)


def _model_args(p: argparse.ArgumentParser, **d) -> None:
    """The model and batch measured: the flags of `fleet train` of the same names."""
    p.add_argument("--depth", type=int, default=d["depth"], help="transformer blocks")
    p.add_argument("--width", type=int, default=d["width"], help="model width")
    p.add_argument("--heads", type=int, default=d["heads"], help="attention heads")
    p.add_argument("--vocab", type=int, default=512, help="vocabulary of the synthetic tokens")
    p.add_argument("--seq-len", type=int, default=d["seq_len"], help="tokens per sample")
    p.add_argument(
        "--local-batch", type=int, default=d["local_batch"], help="samples per microstep"
    )
    p.add_argument("--accum", type=int, default=d["accum"], help="microsteps per update")
    p.add_argument(
        "--accum-mode",
        choices=("sequential", "unrolled"),
        default="sequential",
        help="gradient accumulation, as fleet train --accum-mode",
    )
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16", "mixed"),
        default="fp32",
        help="as fleet train --precision",
    )
    p.add_argument(
        "--loss-head",
        choices=("auto", "fused", "plain"),
        default="auto",
        help="the loss head (fleet train --loss-head): fused, plain, or auto (fused from a "
        "vocabulary of 4096 on)",
    )
    p.add_argument(
        "--loss-chunk",
        type=int,
        default=0,
        help="tokens per chunk of the fused head (0 = sized by the vocabulary)",
    )
    p.add_argument(
        "--grad-checkpoint",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="recompute each block in the backward pass (fleet train --grad-checkpoint)",
    )
    p.add_argument(
        "--overlap",
        choices=("auto", "on", "off"),
        default="auto",
        help="build the next update's first microstep while this one's step runs "
        "(fleet train --overlap; auto: on with a GPU)",
    )


def _device_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cuda-graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="MLX's CUDA graphs in the measuring process (fleet train --cuda-graphs)",
    )
    p.add_argument(
        "--memory-limit-gb",
        default="auto",
        help="MLX memory limit as fleet train's: auto (the live set measured at the first "
        "update + 5%%), GiB (also the bar `fits` is judged by), or 0 (none)",
    )


def run(name: str, args: argparse.Namespace) -> int:
    """Run the benchmark `args.bench`; its exit status."""
    if args.bench in ("memory", "throughput"):
        from bench import trainer

        return trainer.memory(args) if args.bench == "memory" else trainer.throughput(args)
    if args.bench == "telemetry":
        from bench.telemetry import run as telemetry_bench

        if not args.trainer:
            return telemetry_bench(args)
        from bench.update import make_update

        update, _ = make_update(args)
        steps = iter(range(1 << 62))
        return telemetry_bench(args, work=lambda: update(next(steps)))
    if args.bench == "balance":
        from bench import balance

        return balance.main(args)
    if args.bench == "console":
        from bench import console

        return console.run(args)
    if args.bench == "_worker":
        from bench.trainer import measure

        print(json.dumps(measure(args)), flush=True)
        return 0
    raise ValueError(args.bench)
