"""How far MLX's CUDA stream runs ahead: the kernels it commits as one batch.

MLX (0.32, mlx/backend/cuda/device.cpp) keeps every input of a committed batch of kernels
alive until the whole batch has run, and lets up to ten batches run ahead of the GPU. At its
default of 100 kernels a batch on an H100/H200, issue 12's update peaks at 2.0x its live set
with no memory limit, and even under a tight limit holds one batch's dead inputs (9.8 GiB
against 6.6 at 10 kernels a batch). At 10 a batch the auto limit holds the peak to 1.08x the
live set, at the speed of MLX's default (benchmarks/RESULTS.md, issue 20; measured with
benchmarks/run_ahead.py). MLX reads `MLX_MAX_OPS_PER_BUFFER` once, when its backend starts,
so it must be in the environment before the model is built; a value already there (the
user's) is kept. Not set on a Mac: Metal's own defaults (20-50 a batch by chip) have not been
measured against ours; the CPU backend never reads it. Nothing here imports mlx.
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping

VARIABLE = "MLX_MAX_OPS_PER_BUFFER"
CUDA_OPS = 10  # kernels a committed batch, on CUDA


def apply(env: MutableMapping[str, str] | None = None, system: str | None = None) -> str:
    """Put the run-ahead into the environment (unless it is there); a line for the run's log."""
    env = os.environ if env is None else env
    if VARIABLE in env:
        return f"CUDA run-ahead: {VARIABLE}={env[VARIABLE]} (from the environment)"
    if (system or platform.system()) == "Darwin":
        return "run-ahead: MLX's own (Metal)"
    env[VARIABLE] = str(CUDA_OPS)
    return f"CUDA run-ahead: {CUDA_OPS} kernels a batch"
