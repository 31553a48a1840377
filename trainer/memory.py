"""Per-rank memory controls and figures: MLX's cache, memory and wired limits, peak tracking."""

from __future__ import annotations

import platform
from dataclasses import dataclass

import mlx.core as mx

from telemetry.balance import batch_cap
from telemetry.units import GiB


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes, as MLX's allocator counts them on this rank."""

    active: int
    peak: int
    cache: int


def apply_limits(
    cache_gb: float | None, memory_gb: float | None, wired_gb: float | None
) -> list[str]:
    """Set MLX's limits; returns one line per limit set, for the run's log."""
    applied = []
    if cache_gb is not None:
        # A capped cache returns freed buffers to the system instead of hoarding them: on a
        # 36 GiB Mac beside 96 GiB ones, the cache is what tips a rank into swap.
        mx.set_cache_limit(int(cache_gb * GiB))
        applied.append(f"cache limit {cache_gb:g} GiB")
    if memory_gb is not None:
        mx.set_memory_limit(int(memory_gb * GiB))
        applied.append(f"memory limit {memory_gb:g} GiB")
    if wired_gb is not None:
        if platform.system() == "Darwin" and mx.metal.is_available():
            mx.set_wired_limit(int(wired_gb * GiB))
            applied.append(f"wired limit {wired_gb:g} GiB")
        else:
            applied.append("wired limit ignored (Metal only)")
    return applied


def reset_peak() -> None:
    mx.reset_peak_memory()


def figures() -> MemoryFigures:
    return MemoryFigures(mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory())


def device_name() -> str:
    """A short name of what MLX computes on: the chip on a Mac, the GPU or CPU elsewhere."""
    dev = mx.default_device()
    if dev.type == mx.gpu:
        try:
            info = mx.device_info()
            return str(info.get("device_name") or info.get("architecture") or "gpu")
        except Exception:
            return "gpu"
    return platform.processor() or platform.machine() or "cpu"


def memory_caps(cfg, split: list[int], peaks: list[float]) -> list[int | None]:
    """The largest local batch each rank's --memory-limit-gb allows, from its measured peak.

    The whole peak counts as per-sample cost (weights included), which overstates it, so the
    caps err on the safe side. None where a rank has no limit or has not measured a peak yet.
    """
    world, caps = len(split), []
    for r, (batch, peak) in enumerate(zip(split, peaks, strict=True)):
        limit = cfg.per_rank("memory_limit_gb", world, r)
        if limit is None or peak <= 0:
            caps.append(None)
        else:
            caps.append(max(1, batch_cap(limit * GiB, 0.0, peak / batch, headroom=0.0) or 0))
    return caps
