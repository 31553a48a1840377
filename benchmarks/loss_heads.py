"""The loss head alone, plain against fused (and fused at other chunk sizes), interleaved in one
process: its forward and backward's time, peak and live set (peak under a tight limit).

    python benchmarks/loss_heads.py --rows 16384 --width 768 --vocab 32768 --dtype bf16 --json
    python benchmarks/loss_heads.py --rows 1024 --width 256 --vocab 512,4096,32768 --dtype fp32

Each variant is `mx.compile(mx.value_and_grad(head_loss))` on the same inputs (h, the head's
weight, targets, an all-ones mask); --reps rounds after one that compiles, the order of the
variants the same each round. Time: the median of a variant's rounds; peak: MLX's peak active
memory less what was active before (the inputs); live: the same under a tight limit. Variants:
plain (autodiff), fused (the default chunk size), fused-N (N rows a chunk).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import mlx.core as mx

from trainer import memory
from trainer.model.loss import chunk_rows, head_loss


def measure(rows: int, width: int, vocab: int, dtype, chunks: list[int], reps: int) -> dict:
    h = (0.1 * mx.random.normal((rows, width), key=mx.random.key(1))).astype(dtype)
    w = (0.05 * mx.random.normal((vocab, width), key=mx.random.key(2))).astype(dtype)
    t = mx.random.randint(0, vocab, (rows,), key=mx.random.key(3))
    m = mx.ones((rows,), dtype=mx.float32)
    mx.eval(h, w, t, m)
    variants = {"plain": (False, 0), "fused": (True, 0)}
    variants |= {f"fused-{c}": (True, c) for c in chunks if c != chunk_rows(vocab)}
    fns = {
        name: mx.compile(
            mx.value_and_grad(
                lambda h, w, f=fused, c=chunk: head_loss(h, w, t, m, c, fused=f), argnums=(0, 1)
            )
        )
        for name, (fused, chunk) in variants.items()
    }

    def run(fn, tight: bool) -> tuple[float, int]:
        mx.synchronize()
        mx.clear_cache()
        before = mx.get_active_memory()
        with memory.tight() if tight else contextlib.nullcontext():
            mx.reset_peak_memory()
            t0 = time.perf_counter()
            out = fn(h, w)
            mx.eval(out)
            seconds = time.perf_counter() - t0
            peak = mx.get_peak_memory() - before
        del out
        return seconds, peak

    figures = {name: {"ms": [], "peak": 0, "live": 0, "loss": 0.0} for name in fns}
    for rep in range(reps + 1):
        for name, fn in fns.items():
            seconds, peak = run(fn, tight=False)
            if rep:
                figures[name]["ms"].append(1000 * seconds)
                figures[name]["peak"] = max(figures[name]["peak"], peak)
    for name, fn in fns.items():
        figures[name]["live"] = run(fn, tight=True)[1]
        figures[name]["loss"] = fn(h, w)[0].item()
    base = statistics.median(figures["plain"]["ms"])
    for f in figures.values():
        f["ms_median"] = statistics.median(f["ms"])
        f["time_over_plain"] = f["ms_median"] / base
    return {
        "rows": rows,
        "width": width,
        "vocab": vocab,
        "default_chunk_rows": min(rows, chunk_rows(vocab)),
        "fp32_logits_bytes": rows * vocab * 4,
        "variants": figures,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024, help="tokens (batch x sequence)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--vocab", default="32768", help="one or more, e.g. 512,4096,32768")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--chunks", default="", help="more chunk sizes (rows) of the fused head")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.device != "auto":
        mx.set_default_device(mx.cpu if a.device == "cpu" else mx.gpu)
    dtype = mx.bfloat16 if a.dtype == "bf16" else mx.float32
    chunks = [int(c) for c in a.chunks.split(",") if c.strip()]
    results = [measure(a.rows, a.width, int(v), dtype, chunks, a.reps) for v in a.vocab.split(",")]
    out = {"device": str(mx.default_device()), "mlx": mx.__version__, "dtype": a.dtype}
    out["results"] = results
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for r in results:
        print(f"rows {r['rows']}, width {r['width']}, vocab {r['vocab']}, {a.dtype}:")
        for name, f in r["variants"].items():
            print(
                f"  {name:<12} {f['ms_median']:9.1f} ms ({f['time_over_plain']:.2f}x)  "
                f"peak {f['peak'] / 2**20:8.1f} MiB  live {f['live'] / 2**20:8.1f} MiB  "
                f"loss {f['loss']:.4f}"
            )


if __name__ == "__main__":
    main()
