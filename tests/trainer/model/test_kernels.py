"""QK-norm + rotary: every path (trainer/model/kernels.py) against the plain composition, the
kernels' backward formula against autodiff, and the model's paths against each other."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from trainer.data.dataset import SyntheticStream
from trainer.model import kernels
from trainer.model.cache import KVCache
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.step import Stepper

EPS, BASE = 1e-5, 10000.0
PATHS = list(kernels.PATHS)
TOL = {mx.float32: 2e-5, mx.bfloat16: 3e-2}


def _rows(B=2, T=12, H=3, D=16, dtype=mx.float32, seed=0):
    kq, kk = mx.random.split(mx.random.key(seed))
    q = mx.random.normal((B, T, H, D), key=kq)
    k = 3.0 * mx.random.normal((B, T, H, D), key=kk)  # unequal scales: the norm must matter
    return q.astype(dtype), k.astype(dtype)


def _close(a, b, dtype) -> None:
    a, b = np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32))
    np.testing.assert_allclose(a, b, atol=TOL[dtype], rtol=TOL[dtype])


def _loss(path, offset):
    # Unequal weights per position and head, so every output element's gradient differs.
    w = mx.random.normal((2, 3, 12, 16), key=mx.random.key(9))

    def loss(q, k):
        qn, kn = kernels.PATHS[path](q, k, eps=EPS, base=BASE, offset=offset)
        return (qn.astype(mx.float32) * w).sum() + (kn.astype(mx.float32) * w * w).sum()

    return loss


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("offset", [0, 37])
@pytest.mark.parametrize("path", PATHS)
def test_each_path_equals_plain_forward_and_backward(path, offset, dtype):
    q, k = _rows(dtype=dtype)
    want = kernels.plain(q, k, eps=EPS, base=BASE, offset=offset)
    got = kernels.PATHS[path](q, k, eps=EPS, base=BASE, offset=offset)
    assert [g.shape for g in got] == [(2, 3, 12, 16)] * 2
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype
        _close(g, w, dtype)
    grad_want = mx.grad(_loss("plain", offset), argnums=(0, 1))(q, k)
    grad_got = mx.grad(_loss(path, offset), argnums=(0, 1))(q, k)
    for g, w in zip(grad_got, grad_want, strict=True):
        _close(g, w, dtype)


def test_output_is_normalized_and_rotated():
    # Independent of MLX's own kernels: unit RMS per row, and position 0 is not rotated.
    q, k = _rows()
    qn, kn = kernels.ops(q, k, eps=0.0, base=BASE)
    rms = mx.sqrt(mx.mean(qn * qn, axis=-1))
    np.testing.assert_allclose(np.array(rms), 1.0, rtol=1e-5)
    first = q[:, 0] / mx.sqrt(mx.mean(q[:, 0] * q[:, 0], axis=-1, keepdims=True))
    np.testing.assert_allclose(np.array(qn[:, :, 0]), np.array(first), atol=1e-5)


def test_kernel_backward_formula_is_the_derivative_of_the_forward():
    # The CUDA and Metal kernels compute dx = r dn - x r³ mean(dn x) with dn = Rᵀ dy; its ops
    # mirror must equal autodiff of the ops forward (the same math as the forward kernel).
    q, _ = _rows(T=9, H=2, D=32)
    dy = mx.random.normal(q.shape, key=mx.random.key(4))
    offset = mx.array([5], dtype=mx.int32)
    _, (auto,) = mx.vjp(lambda x: kernels._ops_forward(x, EPS, BASE, offset), [q], [dy])
    mine = kernels._ops_backward(q, dy, EPS, BASE, offset)
    np.testing.assert_allclose(np.array(mine), np.array(auto), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_a_shard_of_the_heads_gives_those_heads(path):
    # Tensor parallelism hands a rank some of the heads: per-head norm and rotary must not
    # depend on the others.
    q, k = _rows(H=4)
    whole = kernels.PATHS[path](q, k, eps=EPS, base=BASE, offset=3)
    for lo, hi in ((0, 1), (1, 4)):
        part = kernels.PATHS[path](q[:, :, lo:hi], k[:, :, lo:hi], eps=EPS, base=BASE, offset=3)
        for p, w in zip(part, whole, strict=True):
            np.testing.assert_allclose(np.array(p), np.array(w[:, lo:hi]), atol=1e-6)


@pytest.mark.skipif(kernels.gpu_backend() is not None, reason="the CPU's dispatch")
def test_fused_without_a_gpu_kernel_is_the_ops_mirror():
    q, k = _rows()
    got = kernels.fused(q, k, eps=EPS, base=BASE, offset=2)
    want = kernels.ops(q, k, eps=EPS, base=BASE, offset=2)
    for g, w in zip(got, want, strict=True):
        assert mx.array_equal(g, w)


@pytest.mark.skipif(kernels.gpu_backend() is None, reason="needs a GPU with custom kernels")
@pytest.mark.parametrize("heads_first", [False, True])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["fp32", "bf16"])
def test_gpu_kernel_equals_its_ops_mirror(dtype, heads_first):
    q, k = _rows(T=130, H=5, D=64, dtype=dtype)
    want = kernels.ops(q, k, eps=EPS, base=BASE, offset=7)
    got = kernels.fused(q, k, eps=EPS, base=BASE, offset=7, heads_first=heads_first)
    for g, w in zip(got, want, strict=True):
        _close(g, w, dtype)


# --- the model with each path -----------------------------------------------------------------
def _model(path: str, packed: bool = False) -> GPT:
    cfg = ModelConfig.from_sizes(depth=2, width=64, heads=4, vocab=97, seq_len=20)
    model = GPT(cfg)
    model.init_weights(1)
    noise = mx.random.normal((1 << 14,), key=mx.random.key(2))  # non-zero c_proj weights
    model.update(
        tree_map(lambda p: p + 0.05 * noise[: p.size].reshape(p.shape), model.parameters())
    )
    model.set_attention(path, packed)
    return model


def test_attention_setting_names_a_path_and_auto_is_plain_without_the_cuda_kernel():
    from trainer.step import attention_path

    assert attention_path("fused-qkv") == ("fused", True)
    assert attention_path("strided") == ("strided", False)
    want = ("fused", True) if kernels.gpu_backend() == "cuda" else ("plain", False)
    assert attention_path("auto") == want


def test_set_attention_refuses_an_unknown_path():
    with pytest.raises(ValueError, match="unknown attention path 'fast'; one of plain"):
        _model("plain").set_attention("fast")


MODEL_PATHS = [(p, False) for p in PATHS[1:]] + [("plain", True), ("fused", True)]


@pytest.mark.parametrize(("path", "packed"), MODEL_PATHS)
def test_model_paths_give_the_plain_logits_and_cache(path, packed):
    idx = mx.array(SyntheticStream(97, 19, 0).batch(0, 2, 0, 2))[:, :-1]
    want = _model("plain")(idx)
    model = _model(path, packed)
    np.testing.assert_allclose(np.array(model(idx)), np.array(want), atol=2e-5)
    cache = [KVCache() for _ in model.blocks]  # a prompt, then one token at a time
    steps = [model.extend(idx[:, :11], cache)] + [
        model.extend(idx[:, t : t + 1], cache) for t in range(11, idx.shape[1])
    ]
    np.testing.assert_allclose(np.array(mx.concatenate(steps, axis=1)), np.array(want), atol=2e-5)


STEPPER_CASES = [(p, k, False) for p, k in MODEL_PATHS] + [("fused", True, True)]


@pytest.mark.parametrize(("path", "packed", "checkpointed"), STEPPER_CASES)
def test_stepper_gradients_equal_with_each_path(path, packed, checkpointed):
    # The compiled microstep (value_and_grad inside mx.compile), mixed precision, and with
    # --grad-checkpoint (the block's forward recomputed in the backward pass): the custom VJP
    # must trace and give the plain path's gradients.
    import mlx.optimizers as optim

    batch = mx.array(SyntheticStream(97, 20, 0).batch(0, 3, 0, 3))
    grads = {}
    for p, pack, ckpt in (("plain", False, False), (path, packed, checkpointed)):
        model = _model("plain")
        stepper = Stepper(
            model,
            optim.AdamW(1e-3),
            precision="mixed",
            pad_id=-1,
            grad_clip=1.0,
            grad_checkpoint=ckpt,
            attention="fused-qkv" if (p, pack) == ("fused", True) else p,
        )
        if pack and p != "fused":  # packed plain: no --attention names it
            for m in (stepper.twin, model):
                m.set_attention(p, pack)
        blocks = stepper.twin.blocks + model.blocks  # trained and evaluated alike
        assert {(b.attn.path, b.attn.packed) for b in blocks} == {(p, pack)}
        acc, loss, _ = stepper.microstep(None, None, None, batch)
        mx.eval(acc, loss)
        grads[p, pack, ckpt] = (loss.item(), dict(tree_flatten(acc)))
    want, got_all = grads["plain", False, False], grads[path, packed, checkpointed]
    assert got_all[0] == pytest.approx(want[0], rel=1e-3)
    assert set(got_all[1]) == set(want[1])  # the packed weights' gradients land per tensor
    for name, g in want[1].items():
        got = np.array(got_all[1][name])
        scale = np.abs(np.array(g)).max() + 1e-6
        assert np.abs(got - np.array(g)).max() <= 3e-2 * scale, name
