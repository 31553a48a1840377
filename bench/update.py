"""The trainer's model, optimizer and update on synthetic tokens, as the benchmarks time them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mlx loads only when a benchmark builds a model
    from mlx.optimizers import Optimizer

    from trainer.model import GPT
    from trainer.step import Stepper


def synthetic_stepper(
    *,
    depth: int,
    width: int,
    heads: int,
    vocab: int,
    seq_len: int,
    precision: str,
    loss_chunk: int = 0,
) -> tuple[GPT, Optimizer, Stepper]:
    """A freshly initialized GPT, its AdamW and the trainer's Stepper, as `fleet train
    --synthetic` builds them (the benchmarks and profiles time these)."""
    import mlx.core as mx

    from trainer.config import TrainConfig
    from trainer.model import GPT, ModelConfig
    from trainer.optim import make_optimizer
    from trainer.step import Stepper

    cfg = ModelConfig.from_sizes(
        depth=depth, width=width, heads=heads, vocab=vocab, seq_len=seq_len
    )
    model = GPT(cfg)
    model.init_weights(0)
    if precision == "bf16":
        model.set_dtype(mx.bfloat16)
    optimizer = make_optimizer(TrainConfig(synthetic=True))
    optimizer.init(model.trainable_parameters())
    mx.eval(model.parameters(), optimizer.state)
    stepper = Stepper(
        model,
        optimizer,
        precision=precision,
        pad_id=-1,
        grad_clip=1.0,
        loss_chunk=loss_chunk,
    )
    return model, optimizer, stepper


def make_update(args: argparse.Namespace) -> tuple[Callable[[int], tuple[float, float]], GPT]:
    """The trainer's update on synthetic tokens: returns (update(i) -> (microsteps_s,
    optimizer_s), model). Model, precision, accumulation and optimizer as `fleet train`'s."""
    import time

    import mlx.core as mx

    from trainer.data import SyntheticStream
    from trainer.step import zeros_f32

    model, optimizer, stepper = synthetic_stepper(
        depth=args.depth,
        width=args.width,
        heads=args.heads,
        vocab=args.vocab,
        seq_len=args.seq_len,
        precision=args.precision,
        loss_chunk=args.loss_chunk,
    )
    stream = SyntheticStream(args.vocab, args.seq_len, 0)
    B, accum = args.local_batch, args.accum

    def update(i: int) -> tuple[float, float]:
        """One update; returns (seconds in microsteps, seconds in the optimizer step)."""
        t0 = time.perf_counter()
        batches = [mx.array(stream.batch((i * accum + m) * B, B, 0, B)) for m in range(accum)]
        if args.accum_mode == "sequential":
            acc = zeros_f32(model.trainable_parameters())
            loss, ntok = mx.array(0.0), mx.array(0.0)
            for b in batches:
                acc, loss, ntok = stepper.microstep(acc, loss, ntok, b)
                mx.eval(acc, loss, ntok)
        else:
            acc, loss, ntok = stepper.unrolled(batches)
            mx.eval(acc, loss, ntok)
        t1 = time.perf_counter()
        norm = stepper.apply(acc, ntok, 1e-4)
        mx.eval(model.parameters(), optimizer.state, norm)
        return t1 - t0, time.perf_counter() - t1

    return update, model
