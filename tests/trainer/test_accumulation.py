"""Numerical fixture: sequential and unrolled accumulation give the same loss and gradients."""

from __future__ import annotations

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from trainer.data.dataset import SyntheticStream
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.step import Stepper, zeros_f32

PAD = 7


def _setup(precision: str, **levers):
    cfg = ModelConfig.from_sizes(depth=2, width=64, heads=2, vocab=128, seq_len=24)
    model = GPT(cfg)
    model.init_weights(3)
    # Zero-initialized projections would zero most first-step gradients; perturb every weight
    # so that the comparison covers all of them.
    noise = mx.random.normal((1 << 16,), key=mx.random.key(5))
    model.update(
        tree_map(lambda p: p + 0.02 * noise[: p.size].reshape(p.shape), model.parameters())
    )
    if precision == "bf16":
        model.set_dtype(mx.bfloat16)
    opt = optim.AdamW(learning_rate=1e-3)
    opt.init(model.trainable_parameters())
    stepper = Stepper(model, opt, precision=precision, pad_id=PAD, grad_clip=1.0, **levers)
    stream = SyntheticStream(128, 24, seed=11)
    batches = []
    for m in range(4):  # unequal microbatches, with padding at the end of some rows
        b = stream.batch(m * 5, 5, 0, 2 + m % 3)
        b[0, -5:] = PAD
        batches.append(mx.array(b))
    return model, stepper, batches


def _sequential(model, stepper, batches):
    acc = zeros_f32(model.trainable_parameters())
    loss, ntok = mx.array(0.0), mx.array(0.0)
    for b in batches:
        acc, loss, ntok = stepper.microstep(acc, loss, ntok, b)
        mx.eval(acc, loss, ntok)
    return acc, loss, ntok


LEVERS = [
    {"relu2_recompute": False},
    {"relu2_recompute": True},
    {"grad_checkpoint": True},
    {"grad_checkpoint": True, "relu2_recompute": True},
]


@pytest.mark.parametrize("levers", LEVERS, ids=lambda d: ",".join(d))
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_sequential_matches_unrolled(precision, levers):
    model, stepper, batches = _setup(precision, **levers)
    acc, loss, ntok = _sequential(model, stepper, batches)
    grads, loss_u, ntok_u = stepper.unrolled(batches)
    mx.eval(grads, loss_u, ntok_u)

    expected_tokens = sum(int((np.array(b)[:, 1:] != PAD).sum()) for b in batches)
    assert int(ntok.item()) == int(ntok_u.item()) == expected_tokens
    assert loss.item() == pytest.approx(loss_u.item(), rel=1e-5)
    seq, unr = dict(tree_flatten(acc)), dict(tree_flatten(grads))
    assert seq.keys() == unr.keys()
    for name in seq:
        assert seq[name].dtype == mx.float32, name  # FP32 accumulators whatever the compute
        np.testing.assert_allclose(
            np.array(seq[name]), np.array(unr[name]), atol=1e-5, rtol=1e-4, err_msg=name
        )
    nonzero = [n for n in seq if float(mx.abs(seq[n]).max().item()) > 0]
    assert nonzero == list(seq)  # the comparison is not between zeros


def test_loss_is_summed_over_real_tokens_and_divided_per_update():
    """A microbatch split differently gives the same update: the loss is a token sum."""
    model, stepper, batches = _setup("fp32")
    whole = mx.concatenate([batches[0], batches[1]])
    a_acc, a_loss, a_n = _sequential(model, stepper, [whole])
    b_acc, b_loss, b_n = _sequential(model, stepper, batches[:2])
    assert a_n.item() == b_n.item()
    assert a_loss.item() == pytest.approx(b_loss.item(), rel=1e-5)
    for (name, x), (_, y) in zip(tree_flatten(a_acc), tree_flatten(b_acc), strict=True):
        np.testing.assert_allclose(np.array(x), np.array(y), atol=1e-5, rtol=1e-4, err_msg=name)


def test_bf16_keeps_bf16_weights_and_fp32_accumulators():
    model, stepper, batches = _setup("bf16")
    acc, loss, ntok = _sequential(model, stepper, batches)
    assert all(a.dtype == mx.float32 for _, a in tree_flatten(acc))
    norm = stepper.apply(acc, ntok, 1e-3)
    mx.eval(model.parameters(), norm)
    assert all(p.dtype == mx.bfloat16 for _, p in tree_flatten(model.parameters()))
    assert np.isfinite(norm.item()) and norm.item() > 0


def test_mixed_keeps_fp32_master_weights():
    model, stepper, batches = _setup("mixed")
    acc, loss, ntok = _sequential(model, stepper, batches)
    before = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    stepper.apply(acc, ntok, 1e-3)
    mx.eval(model.parameters())
    after = dict(tree_flatten(model.parameters()))
    assert all(p.dtype == mx.float32 for p in after.values())
    changed = [k for k in after if not np.array_equal(before[k], np.array(after[k]))]
    assert changed, "the optimizer step changed no weight"


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("mixed", 2e-2)])
@pytest.mark.parametrize("chunk", [7, 16])  # 7 does not divide a microbatch's rows
def test_chunked_loss_head_gives_the_same_loss_and_gradients(precision, tol, chunk):
    model, whole, batches = _setup(precision)
    chunked = Stepper(
        model, whole.optimizer, precision=precision, pad_id=PAD, grad_clip=1.0, loss_chunk=chunk
    )
    acc_w, loss_w, n_w = _sequential(model, whole, batches)
    acc_c, loss_c, n_c = _sequential(model, chunked, batches)
    assert n_c.item() == n_w.item()  # padding (PAD targets) masked the same way
    assert loss_c.item() == pytest.approx(loss_w.item(), rel=tol / 10)
    for (name, x), (_, y) in zip(tree_flatten(acc_w), tree_flatten(acc_c), strict=True):
        scale = float(mx.abs(x).max().item())
        assert scale > 0, name
        np.testing.assert_allclose(
            np.array(y), np.array(x), atol=tol * scale, rtol=tol, err_msg=name
        )


def _assert_same(acc_a, acc_b, atol=1e-5, rtol=1e-4):
    a, b = dict(tree_flatten(acc_a)), dict(tree_flatten(acc_b))
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype == mx.float32, name
        np.testing.assert_allclose(
            np.array(a[name]), np.array(b[name]), atol=atol, rtol=rtol, err_msg=name
        )


@pytest.mark.parametrize("levers", LEVERS[1:], ids=lambda d: ",".join(d))
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_memory_levers_give_the_same_loss_and_gradients(precision, levers):
    """Recomputing blocks or ReLU² in the backward pass changes memory, not the update."""
    model, plain, batches = _setup(precision, relu2_recompute=False)
    lean = Stepper(model, plain.optimizer, precision=precision, pad_id=PAD, grad_clip=1.0, **levers)
    acc_p, loss_p, n_p = _sequential(model, plain, batches)
    acc_c, loss_c, n_c = _sequential(model, lean, batches)
    assert n_c.item() == n_p.item()
    assert loss_c.item() == pytest.approx(loss_p.item(), rel=1e-5)
    _assert_same(acc_c, acc_p)
    # Only the lean Stepper's twin changed: the model and the other twin did not.
    parts = (lambda m: m.blocks[0], lambda m: m.blocks[0].mlp)
    assert all(type(p(model)) is type(p(plain.twin)) for p in parts)
    assert any(type(p(lean.twin)) is not type(p(model)) for p in parts)


@pytest.mark.parametrize("precision", ["fp32", "mixed", "bf16"])
def test_first_microstep_writes_the_accumulators(precision):
    """Starting from None gives what adding to FP32 zeros gives, bit for bit."""
    model, stepper, batches = _setup(precision)
    zeros = zeros_f32(model.trainable_parameters())
    zero = mx.array(0.0)
    acc_z, loss_z, n_z = stepper.microstep(zeros, zero, zero, batches[0])
    acc_n, loss_n, n_n = stepper.microstep(None, None, None, batches[0])
    mx.eval(acc_z, acc_n, loss_z, loss_n)
    assert loss_n.item() == loss_z.item() and n_n.item() == n_z.item()
    _assert_same(acc_n, acc_z, atol=0, rtol=0)


@pytest.mark.parametrize("chunk", [0, 7])
def test_evaluation_loss_matches_the_training_loss(chunk):
    """eval_sums (no gradients kept) gives the loss a microstep adds, chunked or whole."""
    model, whole, batches = _setup("fp32")
    stepper = Stepper(
        model, whole.optimizer, precision="fp32", pad_id=PAD, grad_clip=1.0, loss_chunk=chunk
    )
    for b in batches:
        loss_e, n_e = stepper.eval_sums(b)
        _, loss_t, n_t = stepper.microstep(None, None, None, b)
        assert n_e.item() == n_t.item()
        assert loss_e.item() == pytest.approx(loss_t.item(), rel=1e-6)


def test_checkpointed_relu2_projection_matches_plain_autodiff():
    """The MLP's ReLU² recomputed in the backward pass: the same value and gradients."""
    from trainer.step import relu2_proj

    z = mx.random.normal((16, 32), key=mx.random.key(1))
    w = mx.random.normal((8, 32), key=mx.random.key(2))
    c = mx.random.normal((16, 8), key=mx.random.key(3))

    def plain(z, w):
        return ((mx.square(mx.maximum(z, 0.0)) @ w.T) * c).sum()

    def checkpointed(z, w):
        return (relu2_proj(z, w) * c).sum()

    (vp, gp), (vc, gc) = (mx.value_and_grad(f, argnums=(0, 1))(z, w) for f in (plain, checkpointed))
    assert vc.item() == vp.item()
    for a, b in zip(gc, gp, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))
