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


def block_probes() -> dict:
    """The attention module's pieces: what rotary, QK-norm and the layout cost, fwd + bwd."""
    from trainer.model.config import ModelConfig
    from trainer.model.gpt import Attention

    cfg = ModelConfig.from_sizes(depth=1, width=C, heads=H, vocab=V, seq_len=T)
    attn = Attention(cfg)
    attn.set_dtype(mx.bfloat16)
    x = (mx.random.normal((B, T, C), key=mx.random.key(2)) * 0.5).astype(mx.bfloat16)
    mx.eval(attn.parameters(), x)
    scale = 1 / math.sqrt(D)
    rope = dict(traditional=False, base=10000.0, scale=1.0, offset=0)

    def heads(t):
        return t.reshape(B, T, H, D).transpose(0, 2, 1, 3)

    def merge(y):
        return y.transpose(0, 2, 1, 3).reshape(B, T, C)

    def sdpa(q, k, v):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")

    def norm(t):
        return mx.fast.rms_norm(t, None, 1e-5)

    def norm_first(t):  # RMS norm commutes with rotary (a rotation keeps the RMS)
        return mx.fast.rope(norm(t.reshape(B, T, H, D)).transpose(0, 2, 1, 3), D, **rope)

    variants = {
        "module": lambda x: attn(x),
        "projections_sdpa_only": lambda x: attn.c_proj(
            merge(sdpa(heads(attn.c_q(x)), heads(attn.c_k(x)), heads(attn.c_v(x))))
        ),
        "rope_only": lambda x: attn.c_proj(
            merge(
                sdpa(
                    mx.fast.rope(heads(attn.c_q(x)), D, **rope),
                    mx.fast.rope(heads(attn.c_k(x)), D, **rope),
                    heads(attn.c_v(x)),
                )
            )
        ),
        "norm_only": lambda x: attn.c_proj(
            merge(sdpa(norm(heads(attn.c_q(x))), norm(heads(attn.c_k(x))), heads(attn.c_v(x))))
        ),
        "norm_fast_kernel": lambda x: attn.c_proj(
            merge(
                sdpa(
                    norm(mx.fast.rope(heads(attn.c_q(x)), D, **rope)),
                    norm(mx.fast.rope(heads(attn.c_k(x)), D, **rope)),
                    heads(attn.c_v(x)),
                )
            )
        ),
        "norm_first_contiguous": lambda x: attn.c_proj(
            merge(sdpa(norm_first(attn.c_q(x)), norm_first(attn.c_k(x)), heads(attn.c_v(x))))
        ),
    }
    out = {}
    params = attn.trainable_parameters()
    for name, f in variants.items():

        def loss(p, x, f=f):
            attn.update(p)
            return f(x).astype(mx.float32).sum()

        g = mx.compile(mx.value_and_grad(loss))

        def run(g=g):
            mx.eval(g(params, x))
            attn.update(params)

        out[name] = timed(run)
    return out


def optimizer_probes() -> dict:
    """AdamW alone over GPT-size weights, against the trainer's apply (norm, clip, AdamW)."""
    import mlx.optimizers as optim
    from mlx.utils import tree_flatten, tree_map

    from bench.update import synthetic_stepper

    model, opt, stepper = synthetic_stepper(
        depth=12, width=C, heads=H, vocab=V, seq_len=T, precision="mixed"
    )
    grads = tree_map(
        lambda p: mx.full(p.shape, 1e-3, dtype=mx.float32), model.trainable_parameters()
    )
    ntok = mx.array(16384.0)
    mx.eval(model.parameters(), opt.state, grads)

    def apply():
        mx.eval(stepper.apply(grads, ntok, 1e-4), model.parameters(), opt.state)

    out = {"apply": timed(apply)}
    plain = optim.AdamW(learning_rate=1e-4, bias_correction=True)
    plain.init(model.trainable_parameters())
    state = [model.state, plain.state]
    bare = mx.compile(lambda g: plain.update(model, g), inputs=state, outputs=state)

    def alone():
        bare(grads)
        mx.eval(model.parameters(), plain.state)

    out["adamw_compiled_alone"] = timed(alone)
    n = sum(p.size for _, p in tree_flatten(model.parameters()))
    out["min_gb_moved"] = round(n * 4 * 7 / 1e9, 2)  # read p, g, m, v; write p, m, v
    return out


def main() -> None:
    which = os.environ.get("PROBES", "attention,head,block,optimizer").split(",")
    probes = {
        "attention": attention_probes,
        "head": head_probes,
        "block": block_probes,
        "optimizer": optimizer_probes,
    }
    out = {"mlx": mx.__version__, "device": str(mx.default_device())}
    for name in which:
        out[name] = probes[name]()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
