"""`fleet bench balance`: measure batch splits on real local ranks, and the balancer's pick."""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from telemetry import balance
from telemetry.arrowlog import read_updates
from telemetry.split import parse as parse_split
from trainer.blas import preload_env


def splits_of(total: int, parts: int) -> list[list[int]]:
    """Every split of `total` samples over `parts` ranks, each at least 1."""
    out = []
    for cuts in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *cuts, total)
        out.append([edges[i + 1] - edges[i] for i in range(parts)])
    return out


def run_variant(
    args: argparse.Namespace, split: list[int], run_dir: Path, cache_gb: str = ""
) -> dict:
    """One synthetic run on len(split) local ranks; its figures from the Arrow logs."""
    n = len(split)
    total = args.warmup + args.updates
    train = [
        "train",
        "--synthetic",
        "--depth",
        str(args.depth),
        "--width",
        str(args.width),
        "--heads",
        str(args.heads),
        "--vocab",
        str(args.vocab),
        "--seq-len",
        str(args.seq_len),
        "--precision",
        args.precision,
        "--local-batches",
        ",".join(map(str, split)),
        "--accum",
        str(args.accum),
        "--updates",
        str(total),
        "--run-dir",
        str(run_dir),
        "--telemetry-port-base",
        "0",
        "--checkpoint-every",
        "0",
        "--log-every",
        str(total),
        "--collective-timeout",
        "300",
        "--device",
        args.device,
    ]
    if args.simulate_slowdown and n == args.n:
        train += ["--simulate-slowdown", args.simulate_slowdown]
    if cache_gb:
        train += ["--cache-limit-gb", cache_gb]
    train += shlex.split(args.train_args)
    env = preload_env()
    if n == 1:  # the scaling baseline: the same loop, no launcher, no collectives
        env.update(e.split("=", 1) for e in args.env)
        cmd = [sys.executable, "-m", "fleet.cli", *train]
    else:
        backend = args.backend or ("ring" if args.device == "cpu" else "")
        cmd = [
            sys.executable,
            "-m",
            "fleet.cli",
            "launch",
            "-n",
            str(n),
            "--starting-port",
            str(args.starting_port),
            *(["--backend", backend] if backend else []),
            *[a for e in args.env for a in ("--env", e)],
            "--",
            *train,
        ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"variant {split} failed:\n{proc.stderr[-3000:]}")
    ranks = [read_updates(run_dir, r).to_pydict() for r in range(n)]
    counted = [i for i, step in enumerate(ranks[0]["step"]) if step > args.warmup]
    slowest = [max(ranks[r]["update_s"][i] for r in range(n)) for i in counted]
    median = statistics.median(slowest)
    global_tokens = ranks[0]["update_tokens"][counted[0]]

    def per_rank(column: str) -> list[float]:
        return [statistics.median(ranks[r][column][i] for i in counted) for r in range(n)]

    return {
        "split": split,
        "cache_limit_gb": cache_gb,
        "update_s": median,
        "tokens_per_s": global_tokens / median,
        "compute_s": per_rank("compute_s"),
        "wait_s": per_rank("wait_s"),
        "transfer_s": per_rank("transfer_s"),
        "optimizer_s": per_rank("optimizer_s"),
        "peak_mem": [max(ranks[r]["peak_mem"][i] for i in counted) for r in range(n)],
        "samples": [
            [
                balance.RankSample(split[r], ranks[r]["compute_s"][i], ranks[r]["peak_mem"][i])
                for i in counted
            ]
            for r in range(n)
        ],
    }


def gradient_bytes(args: argparse.Namespace) -> int:
    """Bytes one rank all-reduces per update: FP32 gradients of every weight (lazy arrays: the
    model is described, never materialized)."""
    from trainer.builder import SYNTHETIC_VOCAB
    from trainer.model.config import ModelConfig
    from trainer.model.gpt import GPT

    mcfg = ModelConfig.from_sizes(
        depth=args.depth,
        width=args.width,
        heads=args.heads,
        vocab=args.vocab or SYNTHETIC_VOCAB,
        seq_len=args.seq_len,
    )
    return 4 * GPT(mcfg).num_params()


def bandwidth(nbytes: int, seconds: float, ranks: int) -> dict:
    """All-reduce bandwidth as nccl-tests states it: algorithm bandwidth (bytes / time) and bus
    bandwidth (x 2(n-1)/n, comparable across rank counts and with the link's figure)."""
    alg = nbytes / seconds if seconds > 0 else 0.0
    return {
        "bytes": nbytes,
        "time_s": seconds,
        "algbw_GBps": alg / 1e9,
        "busbw_GBps": alg * 2 * (ranks - 1) / ranks / 1e9,
    }


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    err = Console(stderr=True, quiet=args.json)
    variants = [parse_split(v) for v in args.variant]
    gb = args.global_batch or (sum(variants[0]) if variants else 2 * args.n)
    even = [gb // args.n + (1 if r < gb % args.n else 0) for r in range(args.n)]
    variants = variants or [even]
    for v in variants:
        if len(v) != args.n or sum(v) != gb or min(v) < 1:
            print(
                f"fleet bench balance: error: variant {v} is not a split of {gb} over "
                f"{args.n} ranks",
                file=sys.stderr,
            )
            return 2
    root = Path(args.run_dir or f"runs/bench-balance-{time.strftime('%Y%m%d-%H%M%S')}")
    root.mkdir(parents=True, exist_ok=True)
    caches = list(args.variant_cache_gb) + [""] * len(variants)
    results: dict[tuple, dict] = {}

    def measure(split: list[int], label: str, cache: str = "") -> dict:
        key = (tuple(split), cache)
        if key not in results:
            err.print(f"measuring {label} split {split} on {args.n} ranks...")
            name = "-".join(map(str, split)) + (f"-cache{cache}" if cache else "")
            results[key] = run_variant(args, split, root / f"split-{name}", cache)
            results[key]["labels"] = []
        results[key]["labels"].append(label)
        return results[key]

    for v, cache in zip(variants, caches, strict=False):
        measure(v, "variant", cache)
    proposal = None
    if args.propose:
        samples = [
            [s for r in results.values() for s in r["samples"][rank]] for rank in range(args.n)
        ]
        proposal = balance.propose(balance.fit(samples), gb, current=even)
        measure(proposal.split, "proposed")
    if args.all:
        for split in splits_of(gb, args.n):
            measure(split, "exhaustive")
    scaling = None
    if args.scaling and args.n > 1:
        if gb % args.n:
            print(
                f"fleet bench balance: error: --scaling needs a global batch divisible by {args.n}",
                file=sys.stderr,
            )
            return 2
        per_rank = gb // args.n
        err.print(f"measuring the scaling baseline: one rank, local batch {per_rank}...")
        one = run_variant(args, [per_rank], root / f"one-rank-{per_rank}")
        many = measure(even, "even")
        scaling = {
            "one_rank_split": [per_rank],
            "one_rank_tokens_per_s": one["tokens_per_s"],
            "one_rank_update_s": one["update_s"],
            "one_rank_peak_mem": one["peak_mem"][0],
            "one_rank_compute_s": one["compute_s"][0],
            "one_rank_optimizer_s": one["optimizer_s"][0],
            "ranks": args.n,
            "ranks_tokens_per_s": many["tokens_per_s"],
            "speedup": many["tokens_per_s"] / one["tokens_per_s"],
            "efficiency": many["tokens_per_s"] / one["tokens_per_s"] / args.n,
        }

    rows = sorted(results.values(), key=lambda r: -r["tokens_per_s"])
    best = rows[0]
    if args.n > 1:
        nbytes = gradient_bytes(args)
        for r in rows:  # the slowest rank's all-reduce: the one every rank waited for
            r["allreduce"] = bandwidth(nbytes, max(r["transfer_s"]), args.n)
    even_row = results.get((tuple(even), ""))
    summary = {
        "ranks": args.n,
        "global_batch": gb,
        "simulated_slowdown": args.simulate_slowdown or None,
        "variants": [{k: v for k, v in r.items() if k != "samples"} for r in rows],
        "best": best["split"],
        "proposal": proposal.to_dict() if proposal else None,
        "scaling": scaling,
        "run_dir": str(root),
    }
    if proposal:
        measured = results[(tuple(proposal.split), "")]
        summary["proposed_vs_best"] = measured["tokens_per_s"] / best["tokens_per_s"]
        if even_row:
            summary["proposed_vs_even"] = measured["tokens_per_s"] / even_row["tokens_per_s"]
    _write_tables(root, summary["variants"])
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    table = Table(
        title=f"{args.n} ranks, global batch {gb}"
        + (f", simulated slowdown {args.simulate_slowdown}" if args.simulate_slowdown else "")
    )
    cols = ("split", "from", "update", "tokens/s", "compute ms", "wait ms", "transfer ms")
    for col in (*cols, "all-reduce busbw"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["split"]),
            ",".join(dict.fromkeys(r["labels"])),
            f"{r['update_s'] * 1000:.0f} ms",
            f"{r['tokens_per_s']:,.0f}",
            " ".join(f"{c * 1000:.0f}" for c in r["compute_s"]),
            " ".join(f"{w * 1000:.0f}" for w in r["wait_s"]),
            " ".join(f"{t * 1000:.1f}" for t in r["transfer_s"]),
            f"{r['allreduce']['busbw_GBps']:.1f} GB/s" if "allreduce" in r else "-",
        )
    Console().print(table)
    if scaling:
        print(
            f"scaling: 1 rank {scaling['one_rank_tokens_per_s']:,.0f} tokens/s -> {args.n} ranks "
            f"{scaling['ranks_tokens_per_s']:,.0f} tokens/s: {scaling['speedup']:.2f}x "
            f"({scaling['efficiency']:.0%} efficiency)"
        )
    if proposal:
        line = f"proposed {proposal.split}: {summary['proposed_vs_best']:.1%} of the best"
        if "proposed_vs_even" in summary:
            line += f", {summary['proposed_vs_even'] - 1:+.1%} tokens/s against the even split"
        print(line + ("" if proposal.confident else f" (not confident: {proposal.reason})"))
    print(f"tables: {root}/balance.parquet, {root}/balance.csv")
    return 0


def _write_tables(root: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    flat = [
        {
            "split": ",".join(map(str, r["split"])),
            "labels": ",".join(r["labels"]),
            "cache_limit_gb": r["cache_limit_gb"],
            "update_s": r["update_s"],
            "tokens_per_s": r["tokens_per_s"],
            **{f"compute_s_{i}": c for i, c in enumerate(r["compute_s"])},
            **{f"wait_s_{i}": w for i, w in enumerate(r["wait_s"])},
            **{f"transfer_s_{i}": t for i, t in enumerate(r["transfer_s"])},
            **{f"optimizer_s_{i}": t for i, t in enumerate(r["optimizer_s"])},
            **{f"peak_mem_{i}": p for i, p in enumerate(r["peak_mem"])},
        }
        for r in rows
    ]
    table = pa.Table.from_pylist(flat)
    pq.write_table(table, root / "balance.parquet")
    pacsv.write_csv(table, root / "balance.csv")
