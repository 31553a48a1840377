"""`fleet bench`: memory (accumulation modes), throughput, balance and telemetry benchmarks.

Each measured configuration runs in a fresh process, so one variant's allocator cache and
compiled graphs never colour another's figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

GiB = 1024**3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True, metavar="BENCH")
    mem = sub.add_parser(
        "memory",
        help="peak memory of unrolled vs sequential gradient accumulation",
        description="The same model and update under unrolled and sequential accumulation, "
        "each in a fresh process: peak active memory, the ratio, and update times.",
    )
    # Deep and narrow with long rows: activations (which grow with depth x batch x length)
    # dominate the weights and optimizer state, as in a long-context run on a small Mac.
    _model_args(mem, depth=8, width=128, heads=2, seq_len=256, local_batch=8, accum=4)
    mem.add_argument("--updates", type=int, default=2, help="measured updates (after 1 warmup)")
    mem.add_argument("--json", action="store_true", help="print JSON instead of a table")

    thr = sub.add_parser(
        "throughput",
        help="tokens/s, MFU, peak memory and update time of the trainer's update",
        description="The trainer's own update path (model, precision, accumulation, "
        "optimizer, compiled step) on synthetic tokens.",
    )
    _model_args(thr, depth=4, width=256, heads=4, seq_len=256, local_batch=8, accum=1)
    thr.add_argument("--updates", type=int, default=10, help="measured updates")
    thr.add_argument("--warmup", type=int, default=2, help="updates before measuring")
    thr.add_argument(
        "--peak-tflops",
        type=float,
        default=0.0,
        help="the device's dense bf16 peak for MFU (0 = known devices only)",
    )
    thr.add_argument("--json", action="store_true", help="print JSON instead of a table")

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
    bal.add_argument("--depth", type=int, default=2)
    bal.add_argument("--width", type=int, default=128)
    bal.add_argument("--heads", type=int, default=0, help="attention heads (0 = width / 64)")
    bal.add_argument("--vocab", type=int, default=0, help="vocabulary (0 = the synthetic default)")
    bal.add_argument("--seq-len", type=int, default=256)
    bal.add_argument("--accum", type=int, default=1, help="microsteps per update")
    bal.add_argument("--precision", choices=("fp32", "bf16", "mixed"), default="fp32")
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

    tel = sub.add_parser(
        "telemetry",
        help="telemetry overhead, memory with a stalled subscriber, and the 10k-input fuzz",
        description="Telemetry's own benchmarks (telemetry/bench.py).",
    )
    from telemetry.bench import add_arguments as telemetry_arguments

    telemetry_arguments(tel)
    tel.add_argument(
        "--trainer",
        action="store_true",
        help="overhead: time the trainer's real update (synthetic tokens, the model below) "
        "instead of the stand-in work",
    )
    _model_args(tel, depth=2, width=128, heads=2, seq_len=256, local_batch=8, accum=2)

    # The worker that measures one configuration in its own process (internal).
    worker = sub.add_parser("_worker")
    _model_args(worker, depth=2, width=128, heads=2, seq_len=1024, local_batch=4, accum=4)
    worker.add_argument("--updates", type=int, default=2)
    worker.add_argument("--warmup", type=int, default=1)


def _model_args(p: argparse.ArgumentParser, **d) -> None:
    p.add_argument("--depth", type=int, default=d["depth"])
    p.add_argument("--width", type=int, default=d["width"])
    p.add_argument("--heads", type=int, default=d["heads"])
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=d["seq_len"])
    p.add_argument("--local-batch", type=int, default=d["local_batch"])
    p.add_argument("--accum", type=int, default=d["accum"])
    p.add_argument("--accum-mode", choices=("sequential", "unrolled"), default="sequential")
    p.add_argument("--precision", choices=("fp32", "bf16", "mixed"), default="fp32")
    p.add_argument(
        "--loss-chunk", type=int, default=0, help="tokens per chunk of the loss head (0 = all)"
    )


def main(args: argparse.Namespace) -> int:
    if args.bench == "memory":
        return memory(args)
    if args.bench == "throughput":
        return throughput(args)
    if args.bench == "telemetry":
        from telemetry.bench import run as telemetry_bench

        if not args.trainer:
            return telemetry_bench(args)
        update, _ = make_update(args)
        steps = iter(range(1 << 62))
        return telemetry_bench(args, work=lambda: update(next(steps)))
    if args.bench == "balance":
        from trainer import balance_bench

        return balance_bench.main(args)
    if args.bench == "_worker":
        print(json.dumps(measure(args)), flush=True)
        return 0
    raise ValueError(args.bench)


def _model_argv(args: argparse.Namespace, **override) -> list[str]:
    values = {
        k: getattr(args, k)
        for k in (
            "depth",
            "width",
            "heads",
            "vocab",
            "seq_len",
            "local_batch",
            "accum",
            "accum_mode",
            "precision",
            "loss_chunk",
        )
    }
    values.update(override)
    argv = []
    for k, v in values.items():
        argv += ["--" + k.replace("_", "-"), str(v)]
    return argv


def run_worker(argv: list[str]) -> dict:
    """Measure one configuration in a fresh interpreter; returns its JSON figures."""
    cmd = [sys.executable, "-m", "fleet.cli", "bench", "_worker", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark worker failed ({' '.join(argv)}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def synthetic_stepper(
    *,
    depth: int,
    width: int,
    heads: int,
    vocab: int,
    seq_len: int,
    precision: str,
    loss_chunk: int = 0,
):
    """A freshly initialized GPT, its AdamW and the trainer's Stepper, as `fleet train
    --synthetic` builds them (the benchmarks and profiles time these)."""
    import mlx.core as mx

    from trainer.config import TrainConfig
    from trainer.model import GPT, ModelConfig
    from trainer.optim import make_optimizer
    from trainer.step import Stepper

    cfg = ModelConfig.from_sizes(
        depth=depth, width=width, heads=heads, vocab=vocab, seq_len=seq_len
    )
    model = GPT(cfg)
    model.init_weights(0)
    if precision == "bf16":
        model.set_dtype(mx.bfloat16)
    optimizer = make_optimizer(TrainConfig(synthetic=True))
    optimizer.init(model.trainable_parameters())
    mx.eval(model.parameters(), optimizer.state)
    stepper = Stepper(
        model,
        optimizer,
        precision=precision,
        pad_id=-1,
        grad_clip=1.0,
        loss_chunk=loss_chunk,
    )
    return model, optimizer, stepper


def make_update(args: argparse.Namespace):
    """The trainer's update on synthetic tokens: returns (update(i) -> (microsteps_s,
    optimizer_s), model). Model, precision, accumulation and optimizer as `fleet train`'s."""
    import mlx.core as mx

    from trainer.data import SyntheticStream
    from trainer.step import zeros_f32

    model, optimizer, stepper = synthetic_stepper(
        depth=args.depth,
        width=args.width,
        heads=args.heads,
        vocab=args.vocab,
        seq_len=args.seq_len,
        precision=args.precision,
        loss_chunk=args.loss_chunk,
    )
    stream = SyntheticStream(args.vocab, args.seq_len, 0)
    B, accum = args.local_batch, args.accum

    def update(i: int) -> tuple[float, float]:
        """One update; returns (seconds in microsteps, seconds in the optimizer step)."""
        t0 = time.perf_counter()
        batches = [mx.array(stream.batch((i * accum + m) * B, B, 0, B)) for m in range(accum)]
        if args.accum_mode == "sequential":
            acc = zeros_f32(model.trainable_parameters())
            loss, ntok = mx.array(0.0), mx.array(0.0)
            for b in batches:
                acc, loss, ntok = stepper.microstep(acc, loss, ntok, b)
                mx.eval(acc, loss, ntok)
        else:
            acc, loss, ntok = stepper.unrolled(batches)
            mx.eval(acc, loss, ntok)
        t1 = time.perf_counter()
        norm = stepper.apply(acc, ntok, 1e-4)
        mx.eval(model.parameters(), optimizer.state, norm)
        return t1 - t0, time.perf_counter() - t1

    return update, model


def measure(args: argparse.Namespace) -> dict:
    """Build the model and optimizer, run warmup + measured updates, report the figures."""
    import mlx.core as mx
    import numpy as np

    from trainer.memory import device_name

    update, model = make_update(args)
    for i in range(args.warmup):
        update(i)
    times, micro, apply_, peaks = [], [], [], []
    for i in range(args.warmup, args.warmup + args.updates):
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        m, a = update(i)
        times.append(time.perf_counter() - t0)
        micro.append(m)
        apply_.append(a)
        peaks.append(mx.get_peak_memory())
    tokens = args.local_batch * args.accum * args.seq_len
    median = float(np.median(times))
    return {
        "framework": "mlx",
        "device_name": device_name(),
        "microsteps_s": float(np.median(micro)),
        "optimizer_s": float(np.median(apply_)),
        "accum_mode": args.accum_mode,
        "precision": args.precision,
        "loss_chunk": args.loss_chunk,
        "params": model.num_params(),
        "tokens_per_update": tokens,
        "peak_bytes": int(max(peaks)),
        "update_s": median,
        "tokens_per_s": tokens / median,
        "flops_per_token": model.flops_per_token(),
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
    }


# Dense bf16 peaks (datasheets) for MFU when --peak-tflops is not given.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def known_peak(device: str) -> float:
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device), 0.0)


def memory(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    err = Console(stderr=True)
    results = {}
    for mode in ("unrolled", "sequential"):
        if not args.json:
            err.print(f"measuring {mode} accumulation in a fresh process...")
        argv = _model_argv(args, accum_mode=mode) + ["--updates", str(args.updates)]
        results[mode] = run_worker(argv)
    ratio = results["sequential"]["peak_bytes"] / results["unrolled"]["peak_bytes"]
    out = {
        "config": {
            k: getattr(args, k)
            for k in (
                "depth",
                "width",
                "heads",
                "vocab",
                "seq_len",
                "local_batch",
                "accum",
                "precision",
                "loss_chunk",
            )
        },
        "unrolled": results["unrolled"],
        "sequential": results["sequential"],
        "peak_ratio": ratio,
        "target_ratio": 0.4,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    table = Table(
        title=f"gradient accumulation, {args.accum} microsteps of "
        f"{args.local_batch}x{args.seq_len} tokens"
    )
    for col in ("mode", "peak active", "update time", "tokens/s"):
        table.add_column(col, justify="right")
    for mode in ("unrolled", "sequential"):
        r = results[mode]
        table.add_row(
            mode,
            f"{r['peak_bytes'] / GiB:.3f} GiB",
            f"{r['update_s']:.2f} s",
            f"{r['tokens_per_s']:,.0f}",
        )
    Console().print(table)
    print(f"sequential / unrolled peak: {ratio:.2f}x (target <= 0.40x)")
    return 0


def throughput(args: argparse.Namespace) -> int:
    argv = _model_argv(args) + ["--updates", str(args.updates), "--warmup", str(args.warmup)]
    r = run_worker(argv)
    tflops = args.peak_tflops or known_peak(r["device_name"])
    peak = tflops * 1e12 if tflops else None
    r["peak_flops"] = peak
    r["mfu"] = (r["tokens_per_s"] * r["flops_per_token"] / peak) if peak else None
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    mfu = f", MFU {100 * r['mfu']:.1f}% of {tflops:g} TFLOP/s bf16 dense" if peak else ""
    print(
        f"{r['tokens_per_s']:,.0f} tokens/s, update {r['update_s'] * 1000:.0f} ms, "
        f"peak {r['peak_bytes'] / GiB:.2f} GiB ({r['params'] / 1e6:.1f}M params, "
        f"{r['precision']}, {r['device']}){mfu}"
    )
    return 0
