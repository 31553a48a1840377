"""Probes behind the GPU notes: attention under grad, the loss head's formulations, AdamW.

    python benchmarks/mlx_probe.py            # issue 6's shapes: B 16, T 1024, C 768, H 12

Each probe is compiled, timed as the median of synchronized runs, and reports its peak memory
(reset before it), so a fused kernel and a fallback can be told apart by both.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time

import mlx.core as mx
import mlx.nn as nn

B, T, C, H, V = (int(x) for x in os.environ.get("PROBE_SHAPE", "16,1024,768,12,32768").split(","))
D = C // H


def timed(fn, reps: int = 10) -> dict:
    fn()
    fn()
    mx.synchronize()
    mx.reset_peak_memory()
    base = mx.get_active_memory()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {
        "ms": round(statistics.median(times) * 1e3, 3),
        "peak_mib": round((mx.get_peak_memory() - base) / 2**20, 1),
    }


def attention_probes() -> dict:
    key = mx.random.key(0)
    q, k, v = (
        mx.random.normal((B, H, T, D), key=kk).astype(mx.bfloat16) for kk in mx.random.split(key, 3)
    )
    scale = 1 / math.sqrt(D)
    mx.eval(q, k, v)

    def fused(q, k, v):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")

    def manual(q, k, v):
        s = (q * scale) @ k.transpose(0, 1, 3, 2)
        mask = mx.triu(mx.full((T, T), -mx.inf, dtype=mx.float32), k=1)
        p = mx.softmax(s.astype(mx.float32) + mask, axis=-1).astype(q.dtype)
        return p @ v

    out = {}
    for name, f in (("sdpa", fused), ("manual", manual)):
        fwd = mx.compile(f)
        out[f"{name}_forward"] = timed(lambda f=fwd: mx.eval(f(q, k, v)))
        g = mx.compile(
            mx.grad(lambda q, k, v, f=f: f(q, k, v).astype(mx.float32).sum(), argnums=(0, 1, 2))
        )
        out[f"{name}_forward_backward"] = timed(lambda g=g: mx.eval(g(q, k, v)))
    flops = 4 * B * H * T * T * D / 2  # causal forward
    out["flash_ideal_ms_at_400TF"] = round(3.5 * flops / 400e12 * 1e3, 3)
    return out


def head_probes() -> dict:
    key = mx.random.key(1)
    x = (mx.random.normal((B, T, C), key=key) * 0.5).astype(mx.bfloat16)
    w = (mx.random.normal((V, C), key=key) * 0.02).astype(mx.bfloat16)
    y = mx.random.randint(0, V, (B, T), key=key)
    mx.eval(x, w, y)

    def current(w, x):  # the trainer's: bf16 logits, softcap, FP32 cross-entropy
        logits = 15.0 * mx.tanh((x @ w.T) / 15.0)
        return nn.losses.cross_entropy(logits.astype(mx.float32), y, reduction="sum")

    def lse_bf16(w, x):  # logsumexp straight from bf16 logits (accumulates in FP32 inside)
        logits = 15.0 * mx.tanh((x @ w.T) / 15.0)
        lse = mx.logsumexp(logits, axis=-1).astype(mx.float32)
        pick = mx.take_along_axis(logits, y[..., None], axis=-1)[..., 0].astype(mx.float32)
        return (lse - pick).sum()

    def lse_fp32(w, x):  # softcap and logsumexp in FP32, no separate CE op
        logits = (x @ w.T).astype(mx.float32)
        logits = 15.0 * mx.tanh(logits / 15.0)
        lse = mx.logsumexp(logits, axis=-1)
        pick = mx.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
        return (lse - pick).sum()

    out = {}
    for name, f in (("current", current), ("lse_bf16", lse_bf16), ("lse_fp32", lse_fp32)):
        g = mx.compile(mx.value_and_grad(f, argnums=(0, 1)))
        out[name] = timed(lambda g=g: mx.eval(g(w, x)))
        out[name]["loss"] = float(g(w, x)[0].item())
    return out


def main() -> None:
    print(
        json.dumps(
            {
                "mlx": mx.__version__,
                "device": str(mx.default_device()),
                "attention": attention_probes(),
                "head": head_probes(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
