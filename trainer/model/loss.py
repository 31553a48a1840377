"""The loss head: softcapped logits and the summed token cross-entropy, whole or in chunks.

Whole, the (tokens x vocab) logits exist at once, in the compute dtype and again in FP32, with
the softcap's and the softmax's intermediates beside them, and autodiff keeps them for the
backward pass: at a 32k vocabulary that is the largest activation of a small model. In chunks,
only one chunk's logits are alive at a time. For training, a custom function computes each
chunk's loss and its gradients in the same pass (the softmax is at hand there: the loss is the
graph's end, so its cotangent is a scalar that the backward pass only has to multiply in) and
keeps the gradients for the backward pass: the input gradient (tokens x width, compute dtype)
and the weight gradient (vocab x width, FP32), not the logits. The same three matmuls as the
whole head, none recomputed. For evaluation, the chunks compute the loss alone.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import mlx.nn as nn

from trainer.model.config import LOGIT_SOFTCAP
from trainer.model.gpt import softcap


def ce_sum(logits: mx.array, targets: mx.array, mask: mx.array) -> mx.array:
    """The summed cross-entropy of the masked tokens; the softmax in FP32 whatever the compute."""
    ce = nn.losses.cross_entropy(logits.astype(mx.float32), targets, reduction="none")
    return (ce * mask).sum()


def head_loss(
    h: mx.array,
    weight: mx.array,
    targets: mx.array,
    mask: mx.array,
    chunk: int = 0,
    grad: bool = True,
) -> mx.array:
    """Summed cross-entropy of softcap(h @ weight.T) over the masked rows of h (rows, width).

    `chunk`: rows per chunk, 0 for all at once (plain autodiff). Same value and gradients
    either way, up to summation order. `grad` False (evaluation: never differentiated) lets
    the chunks skip their gradients.
    """
    if chunk <= 0 or chunk >= h.shape[0]:
        return ce_sum(softcap(h @ weight.T), targets, mask)
    safe = mx.where(mask > 0, targets, 0)  # padding ids may be out of range (synthetic: -1)
    if not grad:
        return _chunk_pass(h, weight, safe, mask, chunk, grads=False)[0]
    return _fused(chunk)(h, weight, safe, mask)[0]


def _chunk_pass(h, weight, targets, mask, rows: int, grads: bool):
    """The summed loss chunk by chunk and, with `grads`, its gradients for h and weight (for
    a cotangent of 1): (loss, dh or None, dw or None)."""
    total = mx.array(0.0, dtype=mx.float32)
    dh, dw = [], mx.zeros(weight.shape, dtype=mx.float32) if grads else None
    classes = mx.arange(weight.shape[0])
    for i in range(0, h.shape[0], rows):
        # Depending on everything the previous chunk produced makes chunks run one after
        # another, so the scheduler never holds two chunks' logits (or their gradient) at once.
        hc = mx.depends(h[i : i + rows], [total, dw, dh[-1]] if dh else [total])
        s = mx.tanh((hc @ weight.T) / LOGIT_SOFTCAP)
        logits = (LOGIT_SOFTCAP * s).astype(mx.float32)
        t, m = targets[i : i + rows], mask[i : i + rows]
        lse = mx.logsumexp(logits, axis=1, keepdims=True)
        picked = mx.take_along_axis(logits, t[:, None], axis=1)
        total = total + ((lse - picked)[:, 0] * m).sum()
        if grads:
            # d(lse - picked)/dlogits = softmax - onehot, per token weighted by the mask;
            # through the softcap, dlogits/dz = 1 - tanh².
            onehot = classes[None, :] == t[:, None]
            g = (mx.exp(logits - lse) - onehot) * m[:, None]
            gz = (g * (1.0 - mx.square(s.astype(mx.float32)))).astype(hc.dtype)
            dh.append(gz @ weight)
            dw = dw + (gz.T @ hc).astype(mx.float32)
    return total, (mx.concatenate(dh) if grads else None), dw


@cache
def _fused(rows: int):
    """The chunked training head for `rows` rows a chunk (one custom function per size)."""

    @mx.custom_function
    def loss(h, weight, targets, mask):
        return _chunk_pass(h, weight, targets, mask, rows, grads=True)

    @loss.vjp
    def loss_vjp(primals, cotangents, outputs):
        h, weight, targets, mask = primals
        c = cotangents[0]  # the loss's; the kept gradients' own cotangents are unused
        _, dh, dw = outputs
        return (
            (dh * c.astype(dh.dtype)).astype(h.dtype),  # c is 1.0 here: exact
            (dw * c).astype(weight.dtype),
            mx.zeros_like(targets),
            mx.zeros_like(mask),
        )

    return loss
