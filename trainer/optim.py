"""AdamW and a learning-rate schedule driven by tokens seen, not by steps."""

from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.optimizers as optim

from trainer.config import TrainConfig


@dataclass(frozen=True)
class Schedule:
    """Linear warmup to `peak`, then cosine or linear decay to `peak * min_ratio` at `total`.

    Driven by tokens so that changing the batch split, or the global batch between runs,
    keeps the learning rate where the data says the run is.
    """

    peak: float
    total_tokens: int
    warmup_tokens: int
    min_ratio: float = 0.1
    decay: str = "cosine"

    @classmethod
    def from_config(cls, cfg: TrainConfig, tokens_per_update: int) -> Schedule:
        total = cfg.updates * tokens_per_update
        return cls(
            peak=cfg.lr,
            total_tokens=total,
            warmup_tokens=int(cfg.warmup * total),
            min_ratio=cfg.min_lr_ratio,
            decay=cfg.decay,
        )

    def __call__(self, tokens: int) -> float:
        if self.warmup_tokens and tokens < self.warmup_tokens:
            return self.peak * (tokens + 1) / self.warmup_tokens
        if self.decay == "constant":
            return self.peak
        span = max(1, self.total_tokens - self.warmup_tokens)
        t = min(1.0, max(0.0, (tokens - self.warmup_tokens) / span))
        floor = self.peak * self.min_ratio
        if self.decay == "linear":
            return floor + (self.peak - floor) * (1.0 - t)
        return floor + (self.peak - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def make_optimizer(cfg: TrainConfig) -> optim.Optimizer:
    """The optimizer of `--optimizer`: AdamW on every weight, or Muon and AdamW."""
    return MuonAdamW(cfg) if cfg.optimizer == "muon" else adamw(cfg)


class MuonAdamW(optim.MultiOptimizer):
    """Muon (Newton-Schulz orthogonalized momentum) for the blocks' 2-D matrices and AdamW
    for the embedding and the head, as nanochat trains. The schedule's rate drives both: at
    its peak AdamW runs at --lr and Muon at --muon-lr."""

    def __init__(self, cfg: TrainConfig) -> None:
        muon = optim.Muon(learning_rate=cfg.muon_lr, momentum=0.95, weight_decay=0.0)
        super().__init__([muon, adamw(cfg)], [lambda path, p: muon_matrix(path, p.shape)])
        self.muon_ratio = cfg.muon_lr / cfg.lr

    @property
    def learning_rate(self):
        return self.optimizers[1].learning_rate

    @learning_rate.setter
    def learning_rate(self, lr) -> None:
        self.optimizers[0].learning_rate = lr * self.muon_ratio
        self.optimizers[1].learning_rate = lr


def muon_matrix(path: str, shape: tuple[int, ...]) -> bool:
    """The matrices Muon steps: the blocks' 2-D weights (orthogonalized whole, so a sharded
    optimizer keeps them whole)."""
    return path.startswith("blocks.") and len(shape) == 2


def whole_matrices(cfg: TrainConfig):
    """(path, shape) -> must the matrix stay whole when the optimizer is sharded."""
    return muon_matrix if cfg.optimizer == "muon" else (lambda path, shape: False)


def adamw(cfg: TrainConfig) -> optim.AdamW:
    """AdamW on every weight it is given: the model has only matrices (no biases, no gains).

    Bias correction on, as in PyTorch's AdamW and the papers (MLX defaults to off).
    """
    return optim.AdamW(
        learning_rate=cfg.lr,
        betas=[cfg.beta1, cfg.beta2],
        eps=1e-8,
        weight_decay=cfg.weight_decay,
        bias_correction=True,
    )
