"""MLX's CUDA graphs on or off for this process: the product's default and its override.

MLX reads `MLX_USE_CUDA_GRAPHS` once, when its CUDA backend launches its first kernel, so the
setting must be in the environment before that (before the model is built; importing mlx is
fine). Nothing here imports mlx. On Metal and the CPU the variable means nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping

VARIABLE = "MLX_USE_CUDA_GRAPHS"
SETTINGS = ("auto", "on", "off")

# What `auto` means where the environment does not say (None would keep MLX's own: graphs on).
# Off: three interleaved pairs on one H200 (issue 12's 135M model, mixed precision, 2026-12-01)
# ran 9.5%, 9.1% and 12.4% faster without graphs (benchmarks/RESULTS.md). It costs memory: the
# peak rose from 19.9 to 22.1-22.6 GiB. CUDA only; Metal and the CPU never read the variable.
DEFAULT: bool | None = False


def apply(setting: str, env: MutableMapping[str, str] | None = None) -> str:
    """Put `setting` (auto, on, off) into the environment; returns a line for the run's log.

    `auto` keeps a value the environment already has (the user's), else applies DEFAULT.
    """
    env = os.environ if env is None else env
    if setting not in SETTINGS:
        raise ValueError(f"cuda graphs: expected one of {', '.join(SETTINGS)}, got {setting!r}")
    if setting == "auto":
        if VARIABLE in env:
            return f"CUDA graphs {_word(env[VARIABLE])} ({VARIABLE}={env[VARIABLE]})"
        if DEFAULT is None:
            return "CUDA graphs: MLX's default"
        on = DEFAULT
    else:
        on = setting == "on"
    env[VARIABLE] = "1" if on else "0"
    return f"CUDA graphs {'on' if on else 'off'}"


def _word(value: str) -> str:
    # MLX reads the variable with atoi: "1" is on; "0", and anything not a number, off.
    number = re.match(r"\s*([+-]?\d+)", value)
    return "on" if number and int(number.group(1)) else "off"
