"""The loss head: fused (gradients with the loss, logits in the compute dtype) against plain
autodiff and a float64 reference, and what the fused head keeps alive."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from trainer import memory
from trainer.model import loss as head
from trainer.model.loss import head_loss


def _inputs(rows=48, width=16, vocab=300, dtype=mx.float32, scale=0.5):
    h = (scale * mx.random.normal((rows, width), key=mx.random.key(1))).astype(dtype)
    w = (scale * mx.random.normal((vocab, width), key=mx.random.key(2))).astype(dtype)
    t = mx.random.randint(0, vocab, (rows,), key=mx.random.key(3))
    m = (mx.random.uniform(shape=(rows,), key=mx.random.key(4)) > 0.25).astype(mx.float32)
    t = mx.where(m > 0, t, -1)  # padding may carry an out-of-range id (synthetic data: -1)
    return h, w, t, m


def _reference(h, w, t, m):
    """Loss, dh and dw in float64 (numpy): softcap, log-sum-exp, softmax - onehot."""
    H, W, M = (np.array(x.astype(mx.float32), dtype=np.float64) for x in (h, w, m))
    T = np.maximum(np.array(t), 0)
    s = np.tanh(H @ W.T / 15.0)
    logits = 15.0 * s
    top = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    rows = np.arange(len(T))
    loss = ((lse - logits[rows, T]) * M).sum()
    g = np.exp(logits - lse[:, None])
    g[rows, T] -= 1
    gz = g * M[:, None] * (1 - s**2)
    return loss, gz @ W, gz.T @ H


def _grads(fused, chunk, h, w, t, m):
    f = mx.value_and_grad(lambda h, w: head_loss(h, w, t, m, chunk, fused=fused), argnums=(0, 1))
    loss, (dh, dw) = f(h, w)
    mx.eval(loss, dh, dw)
    return loss.item(), np.array(dh.astype(mx.float32)), np.array(dw.astype(mx.float32))


@pytest.mark.parametrize("fused, chunk", [(False, 0), (True, 0), (True, 7), (True, 48)])
def test_every_head_matches_a_float64_reference_in_fp32(fused, chunk):
    h, w, t, m = _inputs()
    loss, dh, dw = _grads(fused, chunk, h, w, t, m)
    ref_loss, ref_dh, ref_dw = _reference(h, w, t, m)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    np.testing.assert_allclose(dh, ref_dh, atol=1e-6 * np.abs(ref_dh).max(), rtol=1e-4)
    np.testing.assert_allclose(dw, ref_dw, atol=1e-6 * np.abs(ref_dw).max(), rtol=1e-4)


@pytest.mark.parametrize("chunk", [0, 16])
def test_the_bf16_fused_head_differs_from_the_plain_one_by_bf16_rounding(chunk):
    """Both read bf16 logits; the fused head's log-sum-exp and softmax are FP32 like the
    plain head's, so the two agree to bf16's precision (the gradients' own rounding)."""
    h, w, t, m = _inputs(dtype=mx.bfloat16)
    plain, fused = _grads(False, 0, h, w, t, m), _grads(True, chunk, h, w, t, m)
    ref_loss, ref_dh, ref_dw = _reference(h, w, t, m)
    assert fused[0] == pytest.approx(plain[0], rel=2e-3)
    assert fused[0] == pytest.approx(ref_loss, rel=2e-3)
    for got, want, ref in zip(fused[1:], plain[1:], (ref_dh, ref_dw), strict=True):
        scale = np.abs(ref).max()
        np.testing.assert_allclose(got, want, atol=2e-2 * scale)
        np.testing.assert_allclose(got, ref, atol=2e-2 * scale)


def test_evaluation_chunks_give_the_training_loss():
    h, w, t, m = _inputs()
    trained = head_loss(h, w, t, m, 7, fused=True)
    evaluated = head_loss(h, w, t, m, 7, grad=False, fused=True)
    assert evaluated.item() == pytest.approx(trained.item(), rel=1e-6)


def test_the_fused_head_is_the_default_from_a_measured_vocabulary():
    assert not head.uses_fused(head.FUSED_VOCAB - 1)
    assert head.uses_fused(head.FUSED_VOCAB)
    assert head.uses_fused(512, chunk=64)  # a chunk size asks for it
    assert not head.uses_fused(1 << 16, fused=False)
    assert head.chunk_rows(32768) >= 64 and head.chunk_rows(32768, 100) == 100


def _live_head_bytes(fused, rows, vocab, width=8, dtype=mx.bfloat16, chunk=0):
    """The head's live set (its forward and backward under a tight limit), inputs excluded:
    the least of three runs, since a buffer the CPU stream's thread frees a moment late can
    lift one run's peak by a chunk (seen: 1.5x and 2.0x FP32 logits for the same head)."""
    h, w, t, m = _inputs(rows, width, vocab, dtype, scale=0.1)
    grad = mx.compile(
        mx.value_and_grad(lambda h, w: head_loss(h, w, t, m, chunk, fused=fused), argnums=(0, 1))
    )
    mx.eval(grad(h, w))  # compiled once, outside the measurement
    seen = []
    for _ in range(3):
        mx.clear_cache()
        with memory.tight():
            mx.reset_peak_memory()
            before = mx.get_active_memory()
            out = grad(h, w)
            mx.eval(out)
            seen.append(mx.get_peak_memory() - before)
        del out
    return min(seen)


def test_the_default_bf16_head_never_holds_fp32_logits(monkeypatch):
    """At 512 rows of a 4k vocabulary one FP32 copy of the logits is 8 MiB: the plain head
    holds several; the fused default holds one chunk's logits and the gradients (chunks of
    2**18 entries here, to keep the test small: 64 rows)."""
    monkeypatch.setitem(head.CHUNK_ENTRIES, "cpu", 1 << 18)
    monkeypatch.setitem(head.CHUNK_ENTRIES, "gpu", 1 << 18)
    rows, vocab = 512, head.FUSED_VOCAB
    fp32_logits = rows * vocab * 4
    plain = _live_head_bytes(False, rows, vocab)
    default = _live_head_bytes(None, rows, vocab)
    assert plain > 2 * fp32_logits
    assert default < fp32_logits / 2
    # one chunk of every row: its logits in bf16 and their gradient (on the CPU, where MLX's
    # fused cross-entropy falls back to reducing in bf16, also the chunk's FP32 cast)
    assert _live_head_bytes(True, rows, vocab, chunk=rows) < 1.6 * fp32_logits
