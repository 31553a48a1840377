"""The loss head: softcapped logits and the summed token cross-entropy, fused or plain.

Plain (`fused=False`), the head is softcap(h @ weight.T) under autodiff with the softmax in
FP32: the (tokens x vocab) logits exist at once in the compute dtype and again in FP32, with
the softcap's and the softmax's intermediates beside them, and autodiff keeps several of
them for the backward pass. At a 32k vocabulary that is the largest activation of a small
model (656 MiB of an 838 MiB bf16 peak on the CPU at 4 x 256 tokens; 4 GiB at 16 x 1024).

Fused (the default from FUSED_VOCAB on), a custom function computes the loss and its gradients
in the same pass, chunk by chunk of rows: the loss is the graph's end, so its cotangent is a
scalar that the backward pass only multiplies in, and what is kept for the backward pass is
the input gradient (tokens x width, compute dtype) and the weight gradient (vocab x width,
FP32), never the logits. The logits are written once, in the compute dtype (bf16 under
bf16/mixed); the log-sum-exp and the softmax are FP32 (on a GPU MLX's fused cross-entropy
kernel casts inside the kernel; on the CPU one chunk's logits are cast), so the math differs
from the plain head by the bf16 rounding of the logits alone. The same three matmuls as the
plain head, none recomputed. For evaluation, the chunks compute the loss alone.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import mlx.nn as nn

from trainer.model.config import LOGIT_SOFTCAP
from trainer.model.gpt import softcap

# From this vocabulary on, the fused head is the default (`fused=None`). Below it the logits
# are small beside the activations. On the CPU the fused head is faster at every size measured
# (0.68x the plain head's time at 512, 0.88x at 32k: benchmarks/RESULTS.md, issue 20); the
# threshold keeps tiny models on the path the GPU has run since issue 6 until the fused head
# is measured there (benchmarks/gpu_memory.sh).
FUSED_VOCAB = 4096
# One chunk's logits hold at most this many entries unless `chunk` says how many rows. On a GPU
# 2**28 (512 MiB in bf16: 8192 rows at a 32k vocabulary, 2 chunks at 16 x 1024 tokens): on an
# H200 the update ran 1.017x (0.993-1.031; an earlier call 1.003-1.037) the speed of 2**26's 8
# chunks, three interleaved rounds, for about 0.75 GiB more of live set (benchmarks/RESULTS.md,
# issue 23). On the CPU, whose kernels run one after another whatever their size, 2**22 (a
# chunk's FP32 cast is 16 MiB: 128 rows at 32k).
CHUNK_ENTRIES = {"gpu": 1 << 28, "cpu": 1 << 22}


def ce_sum(logits: mx.array, targets: mx.array, mask: mx.array) -> mx.array:
    """The summed cross-entropy of the masked tokens; the softmax in FP32 whatever the compute."""
    ce = nn.losses.cross_entropy(logits.astype(mx.float32), targets, reduction="none")
    return (ce * mask).sum()


def chunk_rows(vocab: int, chunk: int = 0) -> int:
    """Rows a chunk of the fused head: `chunk`, or (0) as many as CHUNK_ENTRIES allow here."""
    if chunk > 0:
        return chunk
    entries = CHUNK_ENTRIES["gpu" if mx.default_device() == mx.gpu else "cpu"]
    return max(64, entries // vocab)


def uses_fused(vocab: int, fused: bool | None = None, chunk: int = 0) -> bool:
    """Whether head_loss takes the fused head: as asked, or (None) when a chunk size is
    given or the vocabulary reaches FUSED_VOCAB."""
    return (chunk > 0 or vocab >= FUSED_VOCAB) if fused is None else fused


def head_loss(
    h: mx.array,
    weight: mx.array,
    targets: mx.array,
    mask: mx.array,
    chunk: int = 0,
    grad: bool = True,
    fused: bool | None = None,
) -> mx.array:
    """Summed cross-entropy of softcap(h @ weight.T) over the masked rows of h (rows, width).

    `fused`: the fused head (True), plain autodiff (False), or by vocabulary (None: fused
    from FUSED_VOCAB on). `chunk`: the fused head's rows per chunk (0: CHUNK_ENTRIES' worth);
    a positive `chunk` asks for the fused head when `fused` is None. Same value and
    gradients either way up to summation order and, in bf16, the logits' rounding. `grad`
    False (evaluation: never differentiated) lets the chunks skip their gradients.
    """
    if not uses_fused(weight.shape[0], fused, chunk):
        return ce_sum(softcap(h @ weight.T), targets, mask)
    rows = min(chunk_rows(weight.shape[0], chunk), h.shape[0])
    safe = mx.where(mask > 0, targets, 0)  # padding ids may be out of range (synthetic: -1)
    if not grad:
        return _chunk_pass(h, weight, safe, mask, rows, grads=False)[0]
    return _fused(rows)(h, weight, safe, mask)[0]


def _row_losses(logits: mx.array, targets: mx.array) -> tuple[mx.array, mx.array]:
    """(per-row cross-entropy, per-row log-sum-exp), both FP32, of one chunk's logits.

    On a GPU, MLX's fused kernel reads the logits in their dtype and accumulates in FP32
    (no FP32 copy); the CPU's fallback would reduce in the logits' dtype, so there the chunk
    is cast (one chunk's FP32 copy: what CHUNK_ENTRIES bounds)."""
    picked = mx.take_along_axis(logits, targets[:, None], axis=1)[:, 0].astype(mx.float32)
    if logits.dtype != mx.float32 and mx.default_device() == mx.gpu:
        ce = mx.fast.cross_entropy(logits, targets)
        return ce, ce + picked
    lse = mx.logsumexp(logits.astype(mx.float32), axis=1)
    return lse - picked, lse


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
        logits = softcap(hc @ weight.T)  # written once, in the compute dtype
        t, m = targets[i : i + rows], mask[i : i + rows]
        ce, lse = _row_losses(logits, t)
        total = total + (ce * m).sum()
        if grads:
            # d(lse - picked)/dlogits = softmax - onehot, per token weighted by the mask;
            # through the softcap, dlogits/dz = 1 - tanh² = 1 - (logits / cap)². One fused
            # elementwise pass in FP32 registers, written in the compute dtype.
            x = logits.astype(mx.float32)
            onehot = classes[None, :] == t[:, None]
            g = (mx.exp(x - lse[:, None]) - onehot) * m[:, None]
            gz = (g * (1.0 - mx.square(x / LOGIT_SOFTCAP))).astype(hc.dtype)
            dh.append(gz @ weight)
            dw = dw + (gz.T @ hc).astype(mx.float32)
    return total, (mx.concatenate(dh) if grads else None), dw


@cache
def _fused(rows: int):
    """The fused training head for `rows` rows a chunk (one custom function per size)."""

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
