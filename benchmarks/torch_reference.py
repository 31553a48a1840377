"""The trainer's GPT and update in PyTorch, for a throughput baseline beside `fleet bench`.

Standalone: torch is not a product dependency and only this script imports it.

    python benchmarks/torch_reference.py --json                # eager, CUDA if present
    python benchmarks/torch_reference.py --compile --json      # torch.compile of forward+loss
    python benchmarks/torch_reference.py --depth 2 --width 64 --heads 2 --vocab 256 \
        --seq-len 32 --local-batch 2 --updates 3 --warmup 1 --device cpu   # smoke test
    python benchmarks/torch_reference.py --compile --rounds 3 --sync   # driven by another
        # process: compiles and warms up once, prints {"ready": ...}, then times one round
        # of --updates per line read from stdin and prints each round's JSON on one line

It mirrors trainer/model/gpt.py (rotary, weightless RMSNorm, QK-norm, ReLU² MLP, untied head,
logit softcap) and trainer/step.py with --precision mixed: FP32 master weights, a bf16
autocast forward, FP32 cross-entropy summed over every token and divided by the update's
token count, FP32 gradients accumulated over --accum microsteps, global-norm clip 1.0,
AdamW (betas 0.9/0.95, eps 1e-8, weight decay 0.1 on every weight, bias correction).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LOGIT_SOFTCAP = 15.0
NORM_EPS = 1e-5
ROPE_BASE = 10000.0
LR = 1e-4  # what `fleet bench throughput` steps with; the value does not change the cost


def norm(x: torch.Tensor) -> torch.Tensor:
    # RMSNorm without a learnable gain, as trainer/model/gpt.py's _norm.
    return F.rms_norm(x, (x.size(-1),), eps=NORM_EPS)


def rotary_tables(seq_len: int, head_dim: int) -> torch.Tensor:
    """cos and sin of shape (2, 1, 1, T, head_dim/2): the rotation pairs dim i with i + d/2."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return torch.stack([angles.cos(), angles.sin()])[:, None, None]


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Non-interleaved (MLX's traditional=False) layout: halves, not even/odd pairs.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.c_q = nn.Linear(width, width, bias=False)
        self.c_k = nn.Linear(width, width, bias=False)
        self.c_v = nn.Linear(width, width, bias=False)
        self.c_proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (
            f(x).view(B, T, self.heads, self.head_dim).transpose(1, 2)
            for f in (self.c_q, self.c_k, self.c_v)
        )
        # Tables in the compute dtype so rotary does not promote bf16 activations to FP32.
        cos, sin = rot[0, ..., :T, :].to(q.dtype), rot[1, ..., :T, :].to(q.dtype)
        q, k = norm(rope(q, cos, sin)), norm(rope(k, cos, sin))  # QK-norm after rotary
        # Autocast may run rms_norm in FP32; SDPA needs one dtype for q, k and v.
        q, k = q.to(v.dtype), k.to(v.dtype)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.head_dim**-0.5)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 4 * width, bias=False)
        self.c_proj = nn.Linear(4 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())  # ReLU²


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.attn = Attention(width, heads)
        self.mlp = MLP(width)

    def forward(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(norm(x), rot)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    """Token ids (B, T) in, softcapped logits (B, T, vocab) out."""

    def __init__(self, depth: int, width: int, heads: int, vocab: int, seq_len: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.lm_head = nn.Linear(width, vocab, bias=False)
        # A buffer, not a parameter: the count stays equal to MLX's num_params().
        self.register_buffer("rot", rotary_tables(seq_len, width // heads), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = norm(self.wte(idx))
        for block in self.blocks:
            x = block(x, self.rot)
        logits = self.lm_head(norm(x))
        return LOGIT_SOFTCAP * torch.tanh(logits / LOGIT_SOFTCAP)

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """trainer/model/gpt.py's init: unit-variance embedding, zero output projections."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                p.zero_()
            elif name == "lm_head.weight":
                p.copy_(0.001 * torch.randn(p.shape, generator=gen))
            elif name == "wte.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:  # uniform with std 1/sqrt(fan_in)
                bound = math.sqrt(3.0 / p.shape[-1])
                p.copy_(torch.empty(p.shape).uniform_(-bound, bound, generator=gen))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--local-batch", type=int, default=16, help="rows per microstep")
    p.add_argument("--accum", type=int, default=1, help="microsteps per update")
    p.add_argument("--updates", type=int, default=20, help="measured updates")
    p.add_argument(
        "--warmup", type=int, default=5, help="updates before measuring (absorb compile)"
    )
    p.add_argument(
        "--precision",
        choices=("mixed", "fp32"),
        default="mixed",
        help="mixed = FP32 weights + bf16 autocast forward (fleet's --precision mixed)",
    )
    p.add_argument(
        "--compile", action="store_true", help="torch.compile the forward+loss (not the optimizer)"
    )
    p.add_argument(
        "--compile-mode",
        default="default",
        help="torch.compile mode, e.g. max-autotune-no-cudagraphs",
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda if any")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak, for MFU")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--rounds", type=int, default=1, help="timed rounds of --updates after one warmup"
    )
    p.add_argument(
        "--sync",
        action="store_true",
        help="wait for a line on stdin before each round; print each round's JSON on a line "
        "(for interleaving with another process's runs)",
    )
    args = p.parse_args(argv)
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.width % args.heads or (args.width // args.heads) % 2:
        p.error(f"width {args.width} must split into {args.heads} heads of even size")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(args.seed)

    model = GPT(args.depth, args.width, args.heads, args.vocab, args.seq_len)
    model.init_weights(args.seed)
    model.to(device)  # FP32 master weights in both precisions
    n_params = model.num_params()

    # fused=True: one multi-tensor kernel per step on CUDA; foreach is the fast CPU path.
    opt_kind = {"fused": True} if cuda else {"foreach": True}
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **opt_kind
    )

    B, T, accum = args.local_batch, args.seq_len, args.accum
    tokens_per_update = B * accum * T
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "mixed")

    def loss_sum(batch: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of one microbatch, softmax in FP32 whatever the compute."""
        with autocast:
            logits = model(batch[:, :-1])
        return F.cross_entropy(
            logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="sum"
        )

    # The forward and loss compile into one graph; AOTAutograd compiles their backward.
    # Clip and AdamW stay eager: fused AdamW is already one kernel launch per step.
    loss_fn = torch.compile(loss_sum, mode=args.compile_mode) if args.compile else loss_sum

    # Synthetic rows of seq_len + 1 ids (inputs [:, :-1], targets [:, 1:]), made up front on
    # the device so that the timed updates hold no host work or copies.
    n_updates = args.warmup + args.updates * args.rounds
    gen = torch.Generator(device=device).manual_seed(args.seed)
    data = torch.randint(0, args.vocab, (n_updates, accum, B, T + 1), device=device, generator=gen)

    def update(i: int) -> None:
        for m in range(accum):
            # The sum over all microsteps, divided by the update's token count, equals the
            # mean the MLX side takes after accumulating summed-loss gradients in FP32.
            (loss_fn(data[i, m]) / tokens_per_update).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    compile_s = time.perf_counter()
    for i in range(args.warmup):
        update(i)
    sync()
    compile_s = time.perf_counter() - compile_s
    if args.sync:
        print(json.dumps({"ready": True, "warmup_s": compile_s}), flush=True)
    i, times = args.warmup, []
    for _ in range(args.rounds):
        if args.sync and not sys.stdin.readline():
            return 0  # the driver went away
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.updates):
            sync()
            t0 = time.perf_counter()
            update(i)
            sync()
            times.append(time.perf_counter() - t0)
            i += 1
        if args.sync:
            print(json.dumps(figures(args, times, compile_s, n_params, device)), flush=True)
    if args.sync:
        return 0
    out = figures(args, times, compile_s, n_params, device)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    median, tokens_per_s, peak = out["update_s"], out["tokens_per_s"], out["peak_flops"]
    mem = f", peak {out['peak_bytes'] / 1024**3:.2f} GiB" if cuda else ""
    mfu = f", MFU {100 * out['mfu']:.1f}% of {args.peak_tflops:g} TFLOP/s" if peak else ""
    print(
        f"torch {out['mode']}: {tokens_per_s:,.0f} tokens/s, update {median * 1000:.1f} ms"
        f"{mem} ({n_params / 1e6:.1f}M params, {args.precision}, {out['device']}){mfu}"
    )
    return 0


def figures(
    args: argparse.Namespace, times: list[float], compile_s: float, n_params: int, device
) -> dict:
    """One run's (or round's) JSON: tokens/s from the median update, peak, MFU, config."""
    cuda = device.type == "cuda"
    tokens_per_update = args.local_batch * args.accum * args.seq_len
    flops_per_token = 6 * n_params + 12 * args.depth * args.width * args.seq_len
    median = statistics.median(times)
    tokens_per_s = tokens_per_update / median
    peak = args.peak_tflops * 1e12 if args.peak_tflops > 0 else None
    out = {
        "framework": "torch",
        "mode": "compile" if args.compile else "eager",
        "compiled": f"forward+loss ({args.compile_mode}); clip, AdamW eager"
        if args.compile
        else None,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "cpu",
        "precision": args.precision,
        "params": n_params,
        "tokens_per_update": tokens_per_update,
        "tokens_per_s": tokens_per_s,
        "update_s": median,
        "update_s_min": min(times),
        "warmup_s": compile_s,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "flops_per_token": flops_per_token,
        "peak_flops": peak,
        "mfu": tokens_per_s * flops_per_token / peak if peak else None,
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
                "updates",
                "warmup",
            )
        },
    }
    return out


if __name__ == "__main__":
    sys.exit(main())
