"""The trainer's model, optimizer and update on synthetic tokens, as the benchmarks time them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mlx loads only when a benchmark builds a model
    import mlx.core as mx
    from mlx.optimizers import Optimizer

    from trainer.model.gpt import GPT
    from trainer.step import Stepper, UpdateFigures


def synthetic_stepper(
    *,
    depth: int,
    width: int,
    heads: int,
    vocab: int,
    seq_len: int,
    precision: str,
    loss_chunk: int = 0,
    loss_head: str = "auto",
    grad_checkpoint: bool = False,
    optimizer_step: str = "auto",  # as fleet train's default
    overlap: str = "auto",  # likewise
) -> tuple[GPT, Optimizer, Stepper]:
    """A freshly initialized GPT, its AdamW and the trainer's Stepper, as `fleet train
    --synthetic` builds them (the benchmarks and profiles time these)."""
    import mlx.core as mx

    from trainer.config import TrainConfig
    from trainer.model.config import ModelConfig
    from trainer.model.gpt import GPT
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
        loss_head=loss_head,
        grad_checkpoint=grad_checkpoint,
        optimizer_step=optimizer_step,
        overlap=overlap,
    )
    return model, optimizer, stepper


class SyntheticUpdate:
    """The trainer's update on synthetic tokens: `update(i)` runs update `i` and returns its
    figures. Model, precision, accumulation and optimizer as `fleet train`'s; the update itself
    is `Stepper.update`, the one `train()` runs."""

    def __init__(self, args: argparse.Namespace) -> None:
        from trainer.data.dataset import SyntheticStream

        self.model, self.optimizer, self.stepper = synthetic_stepper(
            depth=args.depth,
            width=args.width,
            heads=args.heads,
            vocab=args.vocab,
            seq_len=args.seq_len,
            precision=args.precision,
            loss_chunk=args.loss_chunk,
            loss_head=getattr(args, "loss_head", "auto"),
            grad_checkpoint=getattr(args, "grad_checkpoint", False),
            overlap=getattr(args, "overlap", "auto"),
        )
        self.stream = SyntheticStream(args.vocab, args.seq_len, 0)
        self.local_batch, self.accum = args.local_batch, args.accum
        self.sequential = args.accum_mode == "sequential"

    def batches(self, i: int) -> list[mx.array]:
        """Update `i`'s microbatches, built on the host (about 10 us a row)."""
        return [self._batch(i, m) for m in range(self.accum)]

    def _batch(self, i: int, m: int) -> mx.array:
        import mlx.core as mx

        B = self.local_batch
        return mx.array(self.stream.batch((i * self.accum + m) * B, B, 0, B))

    def __call__(self, i: int, stage: Callable[[str], None] | None = None) -> UpdateFigures:
        """Update `i`: its batches made, then the trainer's update on one rank, which builds
        update i + 1's first microstep during its step (--overlap) as `train()`'s does."""
        extra = {} if stage is None else {"stage": stage}
        return self.stepper.update(
            self.batches(i),
            1e-4,
            sequential=self.sequential,
            key=i,
            ahead=lambda: (i + 1, self._batch(i + 1, 0)),
            **extra,
        )


def make_update(args: argparse.Namespace) -> tuple[SyntheticUpdate, GPT]:
    """The trainer's update on synthetic tokens: returns (update(i) -> its figures, model)."""
    update = SyntheticUpdate(args)
    return update, update.model
