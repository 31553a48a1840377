"""Tensor parallelism for the GPT: every rank of a group holds 1/N of each block, of the
embedding and of the head, and the group computes what one rank would.

Megatron's layout, with MLX's own distributed layers where they serve:

- attention: q, k and v column-sharded by heads (QK-norm and rotary stay per head, so they
  need nothing; their shared input's gradient is summed once, as `nn.AllToShardedLinear` sums
  each layer's), the output projection row-sharded (`nn.ShardedToAllLinear`: one all_sum);
- MLP: `c_fc` column-sharded, `c_proj` row-sharded (one more all_sum);
- vocabulary: the embedding sharded by rows (each rank looks up the ids in its range, zeros
  elsewhere, then one all_sum), and the head column-sharded, read by a vocabulary-parallel
  cross-entropy (`tp_head_loss`): a rank computes the logits of its slice of the vocabulary
  only; the max and the sum of exponentials cross ranks as one value per token each, so no
  rank ever holds the full (tokens x vocab) logits. The softcap is elementwise: exact.

Backward passes are MLX's: an all_sum's gradient is the cotangent itself, and an
`AllToShardedLinear` sums its input's gradient over the group, so every replicated activation
(the residual stream) gets the same gradient on every rank. No parameter is replicated (the
norms have none), so a tensor-parallel group needs no gradient all-reduce of its own.

Splits are equal (MLX's layers require it): heads, the MLP width and the padded vocabulary
must divide by N; `check_divisible` names what does not.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import sum_gradients
from mlx.utils import tree_flatten, tree_unflatten

from trainer.model.config import LOGIT_SOFTCAP, ModelConfig
from trainer.model.gpt import GPT, Attention

Group = mx.distributed.Group

# Which axis of each weight is split: the column-sharded ("all-to-sharded") layers split their
# outputs (axis 0 of the weight), the row-sharded ones their inputs (axis 1); the embedding is
# split by rows (tokens), the head by its outputs (tokens of the vocabulary).
ROW_SHARDED = ("attn.c_proj.weight", "mlp.c_proj.weight")


def shard_axis(path: str) -> int:
    """The axis along which the parameter at `path` is split across a tensor-parallel group."""
    return 1 if path.endswith(ROW_SHARDED) else 0


def check_divisible(cfg: ModelConfig, n: int) -> None:
    """Refuse, naming the size, a model whose splits would not be equal over `n` ranks."""
    problems = []
    if cfg.heads % n:
        problems.append(f"its {cfg.heads} heads")
    if (4 * cfg.width) % n:
        problems.append(f"its MLP width {4 * cfg.width}")
    if cfg.vocab % n:
        problems.append(f"its padded vocabulary {cfg.vocab}")
    if problems:
        raise ValueError(
            f"tensor parallelism over {n} ranks splits every block, the embedding and the head "
            f"equally; {' and '.join(problems)} do not divide by {n} (choose --heads, --width, "
            f"--vocab or the number of ranks so that they do)"
        )


class VocabParallelEmbedding(nn.Module):
    """An embedding whose rows (token ids) are split over the group: each rank looks up the ids
    in its own range, contributes zeros for the others, and one all_sum gives every rank the
    full embedding of every token."""

    def __init__(self, vocab: int, width: int, group: Group) -> None:
        super().__init__()
        self.group = group
        n, r = group.size(), group.rank()
        self.rows = vocab // n
        self.offset = r * self.rows
        self.weight = mx.zeros((self.rows, width))

    def __call__(self, ids: mx.array) -> mx.array:
        local = ids - self.offset
        mine = (local >= 0) & (local < self.rows)
        x = self.weight[mx.where(mine, local, 0)] * mine[..., None].astype(self.weight.dtype)
        return mx.distributed.all_sum(x, group=self.group)


class TensorAttention(Attention):
    """Attention over this rank's heads. q, k and v read the same input: its gradient is
    summed over the group once, here, rather than once per projection (as three
    `AllToShardedLinear`s would): one all_sum of the backward pass instead of three."""

    def __call__(self, x: mx.array, cache=None) -> mx.array:
        return super().__call__(sum_gradients(self.group)(x), cache)


def _local(linear: nn.Linear, group: Group) -> nn.Linear:
    """A plain linear layer holding this rank's output rows of `linear` (no communication: its
    input's gradient is summed by the caller)."""
    out = nn.Linear(linear.weight.shape[1], linear.weight.shape[0] // group.size(), bias=False)
    out.weight = _slice(linear.weight, "weight", group)
    return out


def shard_gpt(model: GPT, group: Group) -> GPT:
    """Make `model` (full weights, on every rank alike) this rank's tensor-parallel shard of
    itself, in place: the same parameter tree, each array this rank's slice of it."""
    n = group.size()
    check_divisible(model.cfg, n)
    if n == 1:
        return model
    cfg = model.cfg
    embedding = VocabParallelEmbedding(cfg.vocab, cfg.width, group)
    embedding.weight = _slice(model.wte.weight, "wte.weight", group)
    model.wte = embedding
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        for name in ("c_q", "c_k", "c_v"):
            setattr(attn, name, _local(getattr(attn, name), group))
        attn.c_proj = nn.ShardedToAllLinear.from_linear(attn.c_proj, group=group)
        attn.heads = cfg.heads // n
        attn.__class__, attn.group = TensorAttention, group
        mlp.c_fc = nn.AllToShardedLinear.from_linear(mlp.c_fc, group=group)
        mlp.c_proj = nn.ShardedToAllLinear.from_linear(mlp.c_proj, group=group)
    model.lm_head = nn.AllToShardedLinear.from_linear(model.lm_head, group=group)
    model.tensor_group = group
    return model


def _slice(a: mx.array, path: str, group: Group) -> mx.array:
    n, r = group.size(), group.rank()
    axis = shard_axis(path)
    size = a.shape[axis] // n
    index = [slice(None)] * a.ndim
    index[axis] = slice(r * size, (r + 1) * size)
    return mx.contiguous(a[tuple(index)])


def slice_tree(tree: dict, group: Group) -> dict:
    """This rank's slices of a full parameter-shaped tree (weights, or AdamW's moments)."""
    out = []
    for path, a in tree_flatten(tree):
        leaf = path.rsplit(".", 1)[-1]
        sharded = isinstance(a, mx.array) and a.ndim >= 2 and leaf == "weight"
        out.append((path, _slice(a, path, group) if sharded else a))
    return tree_unflatten(out)


def slice_state(state: dict, group: Group) -> dict:
    """This rank's slices of an optimizer state whose leaves shadow the parameters
    (`{"blocks": [...{"attn": {"c_q": {"weight": {"m": .., "v": ..}}}}]}`): every moment of a
    sharded weight is sliced like the weight, scalars (step, learning rate) are kept."""
    out = []
    for path, a in tree_flatten(state):
        owner = _owner(path)
        sharded = owner is not None and isinstance(a, mx.array) and a.ndim >= 2
        out.append((path, _slice(a, owner, group) if sharded else a))
    return tree_unflatten(out)


def gather_tree(tree: dict, group: Group, keep: bool = True) -> dict:
    """The full tree from every rank's slices, for checkpoints: weights, or optimizer state
    shadowing them. A collective, tensor by tensor: every rank of the group calls it, in the
    same order; with `keep` False a rank takes part and drops each gathered tensor at once (only
    the rank that writes holds the whole model), and gets its own tree back."""
    if group.size() == 1:
        return tree
    out = []
    for path, a in tree_flatten(tree):
        owner = path if path.endswith("weight") else _owner(path)
        if owner is None or not isinstance(a, mx.array) or a.ndim < 2:
            out.append((path, a))
            continue
        if shard_axis(owner) == 0:
            full = mx.distributed.all_gather(a, group=group)
        else:  # all_gather concatenates along axis 0: gather the transpose
            full = mx.distributed.all_gather(mx.contiguous(a.T), group=group).T
        full = mx.contiguous(full)
        mx.eval(full)  # a sync point per tensor: bounded memory, and every rank in step
        out.append((path, full if keep else a))
    return tree_unflatten(out)


def _owner(path: str) -> str | None:
    """The parameter an optimizer-state leaf belongs to ("wte.weight.m" -> "wte.weight")."""
    head, sep, _ = path.partition(".weight.")
    return head + ".weight" if sep else None


def gather_logits(logits: mx.array, group: Group) -> mx.array:
    """The full vocabulary's logits of one position (vocab/N,) from every rank's slice."""
    return mx.distributed.all_gather(logits, group=group)


# --- the vocabulary-parallel loss head -----------------------------------------------------


def tp_head_loss(
    h: mx.array,
    weight: mx.array,
    targets: mx.array,
    mask: mx.array,
    group: Group,
    chunk: int = 0,
) -> mx.array:
    """Summed cross-entropy of softcap(h @ full_weight.T) over the masked rows of h, where
    `weight` is this rank's slice (vocab/N, width) of the head and the group holds the rest.

    The same value on every rank; its gradient for h is this rank's part, summed over the group
    by `sum_gradients` (MLX's, as AllToShardedLinear uses), and for `weight` this rank's slice.
    `chunk`: rows at a time (0: all at once): one chunk's logits slice exists at a time.
    """
    safe = mx.where(mask > 0, targets, 0)  # padding ids may be out of range (synthetic: -1)
    rows = chunk if 0 < chunk < h.shape[0] else h.shape[0]
    return _tp_fused(rows, group)(sum_gradients(group)(h), weight, safe, mask)[0]


def _tp_chunk_pass(h, weight, targets, mask, rows: int, group: Group):
    """(loss, dh part, dw) over chunks of `rows` rows: the loss of the full vocabulary, the
    gradients of this rank's slice for a cotangent of 1."""
    vocab_rows = weight.shape[0]
    offset = group.rank() * vocab_rows
    total = mx.array(0.0, dtype=mx.float32)
    dh, dw = [], mx.zeros(weight.shape, dtype=mx.float32)
    classes = mx.arange(vocab_rows) + offset
    for i in range(0, h.shape[0], rows):
        hc = mx.depends(h[i : i + rows], [total, dw, dh[-1]] if dh else [total])
        s = mx.tanh((hc @ weight.T) / LOGIT_SOFTCAP)
        logits = (LOGIT_SOFTCAP * s).astype(mx.float32)
        t, m = targets[i : i + rows], mask[i : i + rows]
        # Max and sum of exponentials over the whole vocabulary: one value per token each.
        peak = mx.distributed.all_max(mx.max(logits, axis=1, keepdims=True), group=group)
        peak = mx.stop_gradient(peak)
        sumexp = mx.distributed.all_sum(
            mx.sum(mx.exp(logits - peak), axis=1, keepdims=True), group=group
        )
        lse = peak + mx.log(sumexp)
        onehot = classes[None, :] == t[:, None]  # the target, where it is in this slice
        picked = mx.distributed.all_sum(mx.sum(mx.where(onehot, logits, 0.0), axis=1), group=group)
        total = total + ((lse[:, 0] - picked) * m).sum()
        g = (mx.exp(logits - lse) - onehot) * m[:, None]
        gz = (g * (1.0 - mx.square(s.astype(mx.float32)))).astype(hc.dtype)
        dh.append(gz @ weight)
        dw = dw + (gz.T @ hc).astype(mx.float32)
    return total, mx.concatenate(dh), dw


@cache
def _tp_fused(rows: int, group: Group):
    """The vocabulary-parallel head for `rows` rows a chunk (one custom function per size)."""

    @mx.custom_function
    def loss(h, weight, targets, mask):
        return _tp_chunk_pass(h, weight, targets, mask, rows, group)

    @loss.vjp
    def loss_vjp(primals, cotangents, outputs):
        h, weight, targets, mask = primals
        c = cotangents[0]
        _, dh, dw = outputs
        return (
            (dh * c.astype(dh.dtype)).astype(h.dtype),
            (dw * c).astype(weight.dtype),
            mx.zeros_like(targets),
            mx.zeros_like(mask),
        )

    return loss
