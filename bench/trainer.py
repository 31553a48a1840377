"""`fleet bench memory` and `throughput`: the trainer's update, each configuration measured in
a fresh process (the internal `fleet bench _worker`).

A fresh process per configuration keeps one variant's allocator cache and compiled graphs
from colouring another's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench.breakdown import breakdown, table
from bench.update import make_update
from telemetry.units import GiB, size_text

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
    "loss_head",
    "loss_chunk",
    "grad_checkpoint",
    "overlap",
    "cuda_graphs",
    "memory_limit_gb",
)


def _model_argv(args: argparse.Namespace, **override) -> list[str]:
    values = {k: getattr(args, k) for k in MODEL_FLAGS}
    values.update(override)
    argv = []
    for k, v in values.items():
        flag = k.replace("_", "-")
        if isinstance(v, bool):
            argv.append(f"--{flag}" if v else f"--no-{flag}")
        else:
            argv += ["--" + flag, str(v)]
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
    from trainer import run_ahead
    from trainer.cuda_graphs import VARIABLE
    from trainer.cuda_graphs import apply as apply_cuda_graphs

    graphs = apply_cuda_graphs(args.cuda_graphs)  # before MLX launches its first kernel
    ahead = run_ahead.apply()  # likewise
    import mlx.core as mx
    import numpy as np

    from trainer.config import TrainConfig
    from trainer.memory import Limit, device_name, tight

    setting = TrainConfig(memory_limit_gb=str(args.memory_limit_gb)).memory_limit(1, 0)
    limit = Limit.from_setting(setting)
    limit.apply()
    update, model = make_update(args)
    memory = None
    if args.breakdown:  # probes, then one update that counts as a warmup
        with tight():  # each phase's live set: what it needs, not what runs ahead of it
            memory = breakdown(update, args.precision, args.seq_len, args.loss_chunk)
    # Auto measures the live set at the first whole update, as train's: not the breakdown's,
    # which resets the peak between its phases (its last phase alone would set the limit).
    update.stepper.limit = limit
    for i in range(int(args.breakdown), args.warmup):
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
    # The live set: one more update under a tight limit (no run-ahead), whatever the policy.
    with tight():
        mx.reset_peak_memory()
        update(args.warmup + args.updates)
        live = mx.get_peak_memory()
    tokens = args.local_batch * args.accum * args.seq_len
    median = float(np.median(times))
    peak = int(max(peaks))
    budget = limit.budget if limit.mode == "fixed" else None
    return {
        "framework": "mlx",
        "device_name": device_name(),
        "microsteps_s": float(np.median(micro)),
        "optimizer_s": float(np.median(apply_)),
        "accum_mode": args.accum_mode,
        "precision": args.precision,
        "loss_head": args.loss_head,
        "loss_chunk": args.loss_chunk,
        "grad_checkpoint": args.grad_checkpoint,
        "overlap": args.overlap,
        "local_batch": args.local_batch,
        "accum": args.accum,
        "cuda_graphs": {"setting": args.cuda_graphs, "note": graphs, VARIABLE: _env(VARIABLE)},
        "run_ahead": {"note": ahead, run_ahead.VARIABLE: _env(run_ahead.VARIABLE)},
        "params": model.num_params(),
        "tokens_per_update": tokens,
        "peak_bytes": peak,
        "live_set_bytes": int(live),
        "peak_over_live": peak / live if live else None,
        "memory_limit": str(args.memory_limit_gb),
        "memory_limit_bytes": limit.limit,  # auto: the live set + 5% (the CPU: the budget)
        "fits": peak <= budget if budget else None,
        "update_s_all": [float(t) for t in times],
        "memory": memory,
        "update_s": median,
        "tokens_per_s": tokens / median,
        "flops_per_token": model.flops_per_token(),
        "device": "gpu" if mx.default_device().type == mx.gpu else "cpu",  # not "Device(cpu, 0)"
        "mlx": mx.__version__,
    }


def _env(name: str) -> str | None:
    return os.environ.get(name)


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
    for col in ("mode", "peak active", "live set", "update time", "tokens/s"):
        table.add_column(col, justify="right")
    for mode in ("unrolled", "sequential"):
        r = results[mode]
        table.add_row(
            mode,
            f"{r['peak_bytes'] / GiB:.3f} GiB",
            f"{r['live_set_bytes'] / GiB:.3f} GiB",
            f"{r['update_s']:.2f} s",
            f"{r['tokens_per_s']:,.0f}",
        )
    Console().print(table)
    print(f"sequential / unrolled peak: {ratio:.2f}x (target <= 0.40x)")
    return 0


def throughput(args: argparse.Namespace) -> int:
    """Tokens/s, MFU, peak memory and update time of one configuration."""
    argv = _model_argv(args) + ["--updates", str(args.updates), "--warmup", str(args.warmup)]
    r = run_worker(argv + (["--breakdown"] if args.breakdown else []))
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
        f"peak {size_text(r['peak_bytes'])}, live set {size_text(r['live_set_bytes'])} "
        f"(memory limit {r['memory_limit']}; {r['params'] / 1e6:.1f}M params, "
        f"{r['precision']}, {r['device']}: {r['device_name']}){mfu}"
    )
    if r["memory"]:
        from rich.console import Console

        title = (
            f"where the peak goes: {r['precision']}, {args.local_batch}x{args.seq_len} tokens, "
            f"accum {args.accum}" + (", grad checkpoint" if args.grad_checkpoint else "")
        )
        Console().print(table(r["memory"], title))
    return 0
