"""Helpers for tests of in-process runs: the smallest config, a tiny trained run, a
checkpoint's arrays, and a one-line CLI failure."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np

from fleet.cli import main as fleet
from trainer.checkpoint import catalog
from trainer.config import TrainConfig
from trainer.distributed import Cluster
from trainer.train import train


class OneRank:
    """A one-rank group without processes: collectives are identities, as MLX's are."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


def smallest(run: Path, **over) -> TrainConfig:
    """The smallest synthetic run a test builds in-process (`open_run`), in folder `run`."""
    fields = dict(synthetic=True, depth=1, width=32, heads=1, seq_len=16, vocab=64)
    return TrainConfig(**(fields | dict(run_dir=str(run), **over)))


def train_tiny(data: Path | None, run: Path, **over) -> Path:
    """A depth-2 model trained hard enough for its attention to matter (about a second at
    60 updates); returns the run folder."""
    fields = dict(depth=2, width=64, heads=2, local_batch=8, updates=60, lr=1e-2)
    fields |= dict(run_dir=str(run), telemetry_port_base=0, **over)
    cfg = TrainConfig(data=str(data), **fields) if data else TrainConfig(**fields)
    assert train(cfg, Cluster(OneRank())) == 0
    return run


def saved(run: Path, step: int) -> dict[str, dict[str, np.ndarray]]:
    """The weights and optimizer state of a run's checkpoint of `step`, as FP32 arrays."""
    folder = catalog.step_dir(run, step)
    return {
        name: {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(folder / name)).items()}
        for name in (catalog.WEIGHTS, catalog.OPTIMIZER)
    }


def fails(capsys, *argv: str) -> str:
    """Run `fleet ARGV` in this process; it must fail with one line on stderr, returned."""
    assert fleet(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err
