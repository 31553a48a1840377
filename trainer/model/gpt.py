"""A GPT of the nanochat family: rotary positions, RMSNorm, QK-norm, ReLU² MLP, untied head."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from trainer.model.cache import KVCache
from trainer.model.config import LOGIT_SOFTCAP, ModelConfig
from trainer.model.kernels import PATHS


def softcap(z: mx.array) -> mx.array:
    """nanochat's smooth cap on the logits, in the dtype they come in."""
    return LOGIT_SOFTCAP * mx.tanh(z / LOGIT_SOFTCAP)


def _norm(x: mx.array, eps: float) -> mx.array:
    # RMSNorm without a learnable gain, as in nanochat: one fused kernel, no parameters.
    return mx.fast.rms_norm(x, None, eps)


class Attention(nn.Module):
    """Causal self-attention with QK-norm and rotary; `path` picks how those two run
    (trainer/model/kernels.py: PATHS), all with the same math. A subclass may wrap the input
    and call this; the heads may be a shard (their count follows from the projections)."""

    path = "plain"  # today's composition until the GPU says otherwise (GPT.set_attention)
    # q, k and v from one matmul over their weights concatenated: x read once, and in the
    # backward pass one matmul for dx instead of three and two sums. Reads the projections'
    # `weight`s itself, so a subclass whose projections are not plain Linears keeps it off.
    packed = False

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim, self.eps = cfg.heads, cfg.width // cfg.heads, cfg.norm_eps
        self.rope_base = cfg.rope_base
        self.c_q = nn.Linear(cfg.width, cfg.width, bias=False)
        self.c_k = nn.Linear(cfg.width, cfg.width, bias=False)
        self.c_v = nn.Linear(cfg.width, cfg.width, bias=False)
        self.c_proj = nn.Linear(cfg.width, cfg.width, bias=False)

    def __call__(self, x: mx.array, cache: KVCache | None = None) -> mx.array:
        B, T, _ = x.shape
        if self.packed:  # views of one (B, T, 3C) product, read in place by SDPA and the kernel
            w = mx.concatenate([self.c_q.weight, self.c_k.weight, self.c_v.weight])
            qkv = mx.split(x @ w.T, 3, axis=-1)
        else:
            qkv = (f(x) for f in (self.c_q, self.c_k, self.c_v))
        # Token-major (B, T, H, D) rows, as the projections wrote them: no copy yet.
        q, k, v = (y.reshape(B, T, -1, self.head_dim) for y in qkv)
        offset = 0 if cache is None else cache.offset  # x's first position
        # (B, H, T, D): heads-first copies ("plain") or views of token-major memory, which
        # SDPA reads in place and whose output it then writes token-major too (cuDNN's output
        # takes q's layout), so that the reshape to (B, T, C) after it is free, not a copy.
        q, k = PATHS[self.path](q, k, eps=self.eps, base=self.rope_base, offset=offset)
        v = v.transpose(0, 2, 1, 3)
        if cache is not None:  # attend to every earlier position too
            k, v = cache.update(k, v)
        # "causal" aligns the queries with the last keys, so it also fits a cache's longer keys.
        y = mx.fast.scaled_dot_product_attention(
            q, k, v, scale=1.0 / math.sqrt(self.head_dim), mask="causal"
        )
        return self.c_proj(y.transpose(0, 2, 1, 3).reshape(B, T, -1))  # heads may be a shard


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.width, 4 * cfg.width, bias=False)
        self.c_proj = nn.Linear(4 * cfg.width, cfg.width, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.c_proj(mx.square(nn.relu(self.c_fc(x))))  # ReLU²


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.eps = cfg.norm_eps
        self.attn = Attention(cfg)
        self.mlp = MLP(cfg)

    def __call__(self, x: mx.array, cache: KVCache | None = None) -> mx.array:
        x = x + self.attn(_norm(x, self.eps), cache)
        return x + self.mlp(_norm(x, self.eps))


class GPT(nn.Module):
    """Token ids (B, T) in, logits (B, T, vocab) out."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.blocks = [Block(cfg) for _ in range(cfg.depth)]
        self.lm_head = nn.Linear(cfg.width, cfg.vocab, bias=False)

    def __call__(self, idx: mx.array) -> mx.array:
        return softcap(self.lm_head(self.features(idx)))

    def features(self, idx: mx.array) -> mx.array:
        """The final normalized hidden states (B, T, width): what the head reads."""
        x = _norm(self.wte(idx), self.cfg.norm_eps)
        for block in self.blocks:
            x = block(x)
        return _norm(x, self.cfg.norm_eps)

    def extend(self, idx: mx.array, cache: list[KVCache]) -> mx.array:
        """Logits of `idx`, the tokens after those whose keys and values `cache` (one per
        block) holds; the cache grows by them. The same math as __call__, one token at a time
        instead of the whole prefix again (trainer/model/generate.py)."""
        x = _norm(self.wte(idx), self.cfg.norm_eps)
        for block, layer_cache in zip(self.blocks, cache, strict=True):
            x = block(x, layer_cache)
        logits = softcap(self.lm_head(_norm(x, self.cfg.norm_eps)))
        group = getattr(self, "tensor_group", None)
        if group is not None:  # tensor parallel: each rank holds a slice of the vocabulary
            logits = mx.distributed.all_gather(logits.transpose(2, 0, 1), group=group)
            logits = logits.transpose(1, 2, 0)
        return logits

    def set_attention(self, path: str, packed: bool = False) -> None:
        """How every block runs QK-norm and rotary (a name in kernels.PATHS) and whether its
        q, k, v come from one matmul (Attention.packed). Set it before the first compiled
        call: a compiled graph keeps what it was traced with."""
        if path not in PATHS:
            raise ValueError(f"unknown attention path {path!r}; one of {', '.join(PATHS)}")
        for block in self.blocks:
            block.attn.path, block.attn.packed = path, packed

    def init_weights(self, seed: int) -> None:
        """nanochat's init: unit-variance embedding, zeroed output projections, small head."""
        flat = tree_flatten(self.parameters())
        keys = mx.random.split(mx.random.key(seed), len(flat))
        params = {}
        for k, (name, p) in zip(keys, flat, strict=True):
            if name.endswith("c_proj.weight"):
                params[name] = mx.zeros_like(p)
            elif name == "lm_head.weight":
                params[name] = 0.001 * mx.random.normal(p.shape, key=k)
            elif name == "wte.weight":
                params[name] = mx.random.normal(p.shape, key=k)
            else:  # uniform with std 1/sqrt(fan_in), as nanochat's linear init
                bound = math.sqrt(3.0 / p.shape[-1])
                params[name] = mx.random.uniform(-bound, bound, p.shape, key=k)
        self.load_weights(list(params.items()))

    def num_params(self) -> int:
        return sum(p.size for _, p in tree_flatten(self.parameters()))

    def flops_per_token(self) -> int:
        """nanoGPT's count: 6N for the matmuls plus the attention scores and values."""
        c = self.cfg
        return 6 * self.num_params() + 12 * c.depth * c.width * c.seq_len
