"""Where an update's peak memory goes: weights, their bf16 copies, optimizer state, gradients,
FP32 accumulators, activations kept for the backward pass, the loss head, the allocator cache.

What the shapes determine is computed ("shapes"); the rest is read from MLX's counters
(active, peak and cache memory) around probes run in the measuring process before its timed
updates ("measured"): a forward pass alone, the loss head's forward and backward alone, one
microbatch's value_and_grad (before anything is accumulated), and one whole update with the
peak read at each of its phases. Activations are what a microbatch's peak holds beyond the
resident weights and state, the loss head and the weights' bf16 copies ("derived").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from telemetry.units import GiB, MiB

if TYPE_CHECKING:
    from bench.update import SyntheticUpdate


def shapes(upd: SyntheticUpdate, precision: str, seq_len: int, loss_chunk: int) -> dict:
    """The parts of the peak that the model's and the batch's shapes fix, in bytes."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    model, optimizer = upd.model, upd.optimizer
    by_dtype: dict[str, int] = {}
    n = 0
    for _, p in tree_flatten(model.parameters()):
        key = str(p.dtype).removeprefix("mlx.core.")
        by_dtype[key] = by_dtype.get(key, 0) + p.nbytes
        n += p.size
    state = sum(v.nbytes for _, v in tree_flatten(optimizer.state) if isinstance(v, mx.array))
    from trainer.model.loss import chunk_rows, uses_fused

    compute = 4 if precision == "fp32" else 2
    rows = upd.local_batch * seq_len
    vocab, width = model.cfg.vocab, model.cfg.width
    if uses_fused(vocab, upd.stepper.fused_head, loss_chunk):
        # One chunk's logits and their gradient in the compute dtype (and, on the CPU under
        # bf16, the chunk's FP32 cast), plus the input and weight gradients kept.
        head_rows = min(rows, chunk_rows(vocab, loss_chunk))
        cast = 4 if compute == 2 and mx.default_device() != mx.gpu else 0
        head = head_rows * vocab * (2 * compute + cast) + rows * width * compute
        head += vocab * width * 4
    else:  # plain: FP32 logits and their softmax gradient, the largest pair alive at once
        head = 2 * rows * vocab * 4
    return {
        "params": n,
        "weights_bytes": sum(by_dtype.values()),
        "weights_by_dtype": by_dtype,
        # mixed: the forward pass runs on bf16 casts of the FP32 master weights
        "twin_copies_bytes": 2 * n if precision == "mixed" else 0,
        "optimizer_state_bytes": state,
        "accumulator_bytes": 4 * n,
        # one microbatch's gradients of the master weights: FP32 under mixed (through the cast)
        "gradient_bytes": n * (2 if precision == "bf16" else 4),
        "loss_head_bytes": head,
    }


def _probe(fn) -> tuple[int, int, int]:
    """(active before, peak during, active after) around fn(), whose results are evaluated
    and kept until `after` is read."""
    import mlx.core as mx

    before = mx.get_active_memory()
    mx.reset_peak_memory()
    out = fn()
    mx.eval(out)
    peak, after = max(mx.get_peak_memory(), before), mx.get_active_memory()
    del out
    mx.clear_cache()
    return before, peak, after


def _head_peak(upd: SyntheticUpdate, batch, loss_chunk: int) -> int:
    """What the loss head's forward and backward add, alone, on inputs of the real shapes in
    the compute dtype (its input and weight gradients included)."""
    import mlx.core as mx

    from trainer.model.loss import head_loss

    rows, dtype = batch.shape[0] * (batch.shape[1] - 1), upd.stepper.compute_dtype
    h = (0.1 * mx.random.normal((rows, upd.model.cfg.width), key=mx.random.key(1))).astype(dtype)
    w = upd.model.lm_head.weight.astype(dtype)
    targets = batch[:, 1:].reshape(-1)
    mask = mx.ones(targets.shape, dtype=mx.float32)
    mx.eval(h, w, mask)

    def loss(h, w):
        return head_loss(h, w, targets, mask, loss_chunk, fused=upd.stepper.fused_head)

    grad = mx.compile(mx.value_and_grad(loss, argnums=(0, 1)))
    before, peak, _ = _probe(lambda: grad(h, w))
    return peak - before


def measured(upd: SyntheticUpdate, loss_chunk: int, index: int = 0) -> dict:
    """The probes, in bytes; runs update `index` as the last one (it counts as a warmup)."""
    import mlx.core as mx

    stepper, model = upd.stepper, upd.model
    mx.clear_cache()
    resident = mx.get_active_memory()
    batch = upd.batches(index)[0]
    mx.eval(batch)

    head = _head_peak(upd, batch, loss_chunk)
    _, forward_peak, _ = _probe(lambda: stepper.eval_sums(batch))
    value_and_grad = mx.compile(stepper._value_and_grad)
    before, micro_peak, after = _probe(lambda: value_and_grad(model.trainable_parameters(), batch))
    grads_held = after - before

    phases: dict[str, int] = {}

    def stage(name: str) -> None:
        if name == "optimizer":
            phases["compute"] = mx.get_peak_memory()
            mx.reset_peak_memory()

    upd(index, stage=stage)
    optimizer_peak, after_update = mx.get_peak_memory(), mx.get_active_memory()
    cache = mx.get_cache_memory()
    mx.clear_cache()
    return {
        "resident_bytes": resident,
        "loss_head_peak_bytes": head,
        "forward_peak_bytes": forward_peak,
        "microbatch_peak_bytes": micro_peak,
        "gradients_held_bytes": grads_held,
        "compute_peak_bytes": phases.get("compute", 0),
        "optimizer_peak_bytes": optimizer_peak,
        "after_update_bytes": after_update,
        "kept_across_updates_bytes": after_update - resident,
        "cache_bytes": cache,
    }


def breakdown(upd: SyntheticUpdate, precision: str, seq_len: int, loss_chunk: int) -> dict:
    """Every part, in bytes: the shapes' figures, the probes', and the activations derived."""
    out = shapes(upd, precision, seq_len, loss_chunk)
    out.update(measured(upd, loss_chunk))
    out["activations_bytes"] = max(
        0,
        out["microbatch_peak_bytes"]
        - out["resident_bytes"]
        - out["loss_head_peak_bytes"]
        - out["twin_copies_bytes"],
    )
    return out


# (label, key, how it is known) in the order the table prints them.
ROWS = (
    ("weights", "weights_bytes", "shapes"),
    ("bf16 copies of the weights (mixed)", "twin_copies_bytes", "shapes"),
    ("optimizer state (AdamW)", "optimizer_state_bytes", "shapes"),
    ("FP32 accumulators", "accumulator_bytes", "shapes"),
    ("gradients of one microbatch", "gradient_bytes", "shapes"),
    ("  the same, held after value_and_grad", "gradients_held_bytes", "measured"),
    ("loss head: logits + their gradient (one chunk)", "loss_head_bytes", "shapes"),
    ("  the head's forward + backward alone", "loss_head_peak_bytes", "measured"),
    ("activations kept for the backward pass", "activations_bytes", "derived"),
    ("resident after init (weights + state)", "resident_bytes", "measured"),
    ("peak: forward pass alone", "forward_peak_bytes", "measured"),
    ("peak: one microbatch's value_and_grad", "microbatch_peak_bytes", "measured"),
    ("peak: an update's microsteps", "compute_peak_bytes", "measured"),
    ("peak: an update's optimizer step", "optimizer_peak_bytes", "measured"),
    ("kept alive across updates", "kept_across_updates_bytes", "measured"),
    ("allocator cache after an update", "cache_bytes", "measured"),
)


def table(memory: dict, title: str):
    """The breakdown as a rich Table."""
    from rich.table import Table

    unit, size = ("GiB", GiB) if memory["compute_peak_bytes"] >= 4 * GiB else ("MiB", MiB)
    t = Table(title=title)
    for col, justify in (("part", "left"), (unit, "right"), ("how", "left")):
        t.add_column(col, justify=justify)
    dtypes = ", ".join(f"{k} {v / size:.2f}" for k, v in memory["weights_by_dtype"].items())
    for label, key, how in ROWS:
        extra = f" ({dtypes})" if key == "weights_bytes" else ""
        t.add_row(label + extra, f"{memory[key] / size:.2f}", how)
    return t
