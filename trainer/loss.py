"""The loss head: softcapped logits and the summed token cross-entropy, whole or in chunks.

Whole, the (tokens x vocab) logits exist at once, in the compute dtype and again in FP32, with
the softcap's and the softmax's intermediates beside them, and autodiff keeps them for the
backward pass: at a 32k vocabulary that is the largest activation of a small model. In chunks,
a custom VJP keeps nothing but the inputs: the forward pass sums the loss chunk by chunk, and
the backward pass recomputes each chunk's logits, so one chunk's logits are alive at a time.
That costs one more head matmul (the forward one, again in the backward pass).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import mlx.nn as nn

from trainer.model import LOGIT_SOFTCAP, softcap


def ce_sum(logits: mx.array, targets: mx.array, mask: mx.array) -> mx.array:
    """The summed cross-entropy of the masked tokens; the softmax in FP32 whatever the compute."""
    ce = nn.losses.cross_entropy(logits.astype(mx.float32), targets, reduction="none")
    return (ce * mask).sum()


def head_loss(
    h: mx.array, weight: mx.array, targets: mx.array, mask: mx.array, chunk: int = 0
) -> mx.array:
    """Summed cross-entropy of softcap(h @ weight.T) over the masked rows of h (rows, width).

    `chunk`: rows per chunk, 0 for all at once (plain autodiff). Same value and gradients
    either way, up to summation order.
    """
    if chunk <= 0 or chunk >= h.shape[0]:
        return ce_sum(softcap(h @ weight.T), targets, mask)
    safe = mx.where(mask > 0, targets, 0)  # padding ids may be out of range (synthetic: -1)
    return _chunked(chunk)(h, weight, safe, mask)


@cache
def _chunked(rows: int):
    """The chunked head for `rows` rows a chunk (one custom function per size, cached)."""

    @mx.custom_function
    def loss(h, weight, targets, mask):
        total = mx.array(0.0, dtype=mx.float32)
        for i in range(0, h.shape[0], rows):
            # The dependency on the running total makes chunks run one after another, so the
            # scheduler never holds two chunks' logits at once.
            hc = mx.depends(h[i : i + rows], total)
            logits = softcap(hc @ weight.T).astype(mx.float32)
            picked = mx.take_along_axis(logits, targets[i : i + rows, None], axis=1)[:, 0]
            ce = mx.logsumexp(logits, axis=1) - picked
            total = total + (ce * mask[i : i + rows]).sum()
        return total

    @loss.vjp
    def loss_vjp(primals, cotangent, _output):
        h, weight, targets, mask = primals
        dh, dw = [], mx.zeros(weight.shape, dtype=mx.float32)
        classes = mx.arange(weight.shape[0])
        for i in range(0, h.shape[0], rows):
            hc = mx.depends(h[i : i + rows], dw)  # one chunk at a time, as in the forward pass
            s = mx.tanh((hc @ weight.T) / LOGIT_SOFTCAP)
            logits = (LOGIT_SOFTCAP * s).astype(mx.float32)
            onehot = classes[None, :] == targets[i : i + rows, None]
            # d(lse - picked)/dlogits = softmax - onehot, per token weighted by mask x cotangent;
            # through the softcap, dlogits/dz = 1 - tanh².
            g = (mx.softmax(logits, axis=1) - onehot) * (mask[i : i + rows] * cotangent)[:, None]
            gz = (g * (1.0 - mx.square(s.astype(mx.float32)))).astype(hc.dtype)
            dh.append(gz @ weight)
            dw = dw + (gz.T @ hc).astype(mx.float32)
        return (
            mx.concatenate(dh).astype(h.dtype),
            dw.astype(weight.dtype),
            mx.zeros_like(targets),
            mx.zeros_like(mask),
        )

    return loss
