"""`fleet bench memory` and `throughput`: the trainer's update, each configuration measured in
a fresh process (the internal `fleet bench _worker`).

A fresh process per configuration keeps one variant's allocator cache and compiled graphs
from colouring another's figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.update import make_update

GiB = 1024**3

# The model flags every measured configuration passes to its worker (bench/cli.py's _model_args).
MODEL_FLAGS = (
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


def _model_argv(args: argparse.Namespace, **override) -> list[str]:
    values = {k: getattr(args, k) for k in MODEL_FLAGS}
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


def measure(args: argparse.Namespace) -> dict:
    """Build the model and optimizer, run warmup + measured updates, report the figures
    (in the worker process: `fleet bench _worker` prints them as JSON)."""
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
        figures = update(i)
        times.append(time.perf_counter() - t0)  # with the batches' making, as before
        micro.append(figures.compute_s)
        apply_.append(figures.optimizer_s)
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
    """The dense bf16 peak of a known device, in TFLOP/s (0 when unknown)."""
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device), 0.0)


def memory(args: argparse.Namespace) -> int:
    """Unrolled against sequential accumulation: peak active memory, the ratio, update times."""
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
        "config": {k: getattr(args, k) for k in MODEL_FLAGS if k != "accum_mode"},
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
    """Tokens/s, MFU, peak memory and update time of one configuration."""
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
