"""Per-rank memory: MLX's cache, memory and wired limits, the rank's budget, the live set.

What keeps memory alive in MLX (0.32): `eval` walks the graph and hands each primitive to its
stream without waiting; the stream keeps every input of a kernel alive until the kernel has
run (CUDA: its command buffer; the CPU: its task, ten dispatches each). Up to ten tasks run
ahead, and `eval` waits for them only once active memory passes the memory limit (MLX's
default: 95% of a GPU, 80% of the CPU's machine). So without a limit, the peak holds buffers
that are dead but not yet released: 22.6 GiB for a live set of about 14 at issue 12's size on
an H200. A limit makes `eval` wait for the oldest task each time active memory passes it; it
never fails an allocation (the cache is trimmed first). Under a tight limit the peak is the
live set: what the graph needs at once.

`--memory-limit-gb auto` (`Limit`): a rank measures its live set at its first update (under a
tight limit: that one update runs with no run-ahead), then sets the limit 5% above it, so the
peak is the live set at the speed of the run-ahead that fits. After a rebalance no update runs
without run-ahead: that cost 1-2 updates' time after each autopilot move where ranks share cores
(this box's 4 ranks on 2 cores: 0.11-0.48 s against -0.05-0.14 s now) and a tenth to a fifth of
one on an H100 (RESULTS, session 23). At a batch below one measured, the first update runs under
a lower bound of its live set: the line from the base (what stays between updates: weights,
optimizer state) through the size measured nearest above, under the live set because the
gradients do not shrink with the samples. It waits only near its peak, and its peak, the live
set there, sets the limit: a rank that gives samples away (a swapping rank relieved) holds only
what it needs. Beyond the largest batch measured, that line extended stands for the live set and
sets the limit: for the same reason at or above it (1.10x at 24 samples from 16 on the H100,
1.00-1.50x at twice to four times the samples on three models here), so the rank waits on no
limit below its live set. A primitive's outputs are allocated before `eval` can wait, so a peak
passes the limit by up to the largest of them (the head's chunk of logits: 0.5 GiB at issue 12's
size on CUDA; on the CPU up to ten kernels' outputs): the update after a limit set from a peak
(and the first beyond the largest measured) lowers the limit by what its peak passed it by,
never below the live set (on the H200: 1.11x the live set without, 1.08x with, at the unlimited
speed). The limit never exceeds the rank's budget: what its machine gives without swapping (its
memory less a reserve for the OS, shared by the ranks on it; a GPU's own memory on CUDA). The
budget, not the limit, is the figure the memory guard, the rebalance caps and the console use:
it is what the rank could hold, where the limit is what it holds now.

On the CPU, auto measures the live set as above but leaves MLX's limit at the budget once it has
(`hold_peak` off): there a task is ten kernels of milliseconds, and waiting on the oldest each
time active memory passes a limit at the live set cost 17-30% of an update (two ranks at 8,8,
width 128, this box: 12.3-13.4 ms a sample against 10.4-10.7 without a limit, for a peak of 1.05x
the live set against 1.49x; RESULTS, session 41). On CUDA the same limit cost nothing measurable
(issue 20); Metal, whose tasks are command buffers as CUDA's are, keeps it (unmeasured).
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import psutil

from telemetry.balance import batch_cap
from telemetry.units import GiB, gib_text
from trainer.config import ConfigError

AUTO_HEADROOM = 0.05  # auto's limit over the measured live set
OS_RESERVE_FRACTION, OS_RESERVE_MIN = 0.15, 2 * GiB  # what auto leaves the OS on a machine
GPU_RESERVE_FRACTION = 0.05  # on CUDA, the GPU's memory less this (MLX's own default limit)
TIGHT = 1  # bytes: a limit every allocation passes, so eval waits after each task


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes, as MLX's allocator counts them on this rank."""

    active: int
    peak: int
    cache: int


def machine_budget(ranks_here: int = 1) -> int:
    """Bytes this rank may use without its machine swapping: a CUDA GPU's memory less 5%;
    elsewhere (unified memory, the CPU) the machine's memory less a reserve for the OS,
    shared by the `ranks_here` ranks on it. A ConfigError when the machine reports no size."""
    if mx.default_device() == mx.gpu and mx.cuda.is_available():
        total = int(mx.device_info().get("total_memory", 0) or 0)
        if total > 0:
            return int(total * (1 - GPU_RESERVE_FRACTION))
    try:
        total = int(psutil.virtual_memory().total)
    except (OSError, RuntimeError, AttributeError):
        total = 0
    if total <= 0:
        raise ConfigError(
            "--memory-limit-gb auto: this machine reports no memory size; give the limit in "
            "GiB (e.g. --memory-limit-gb 24), or 0 for none"
        )
    reserve = max(OS_RESERVE_MIN, int(OS_RESERVE_FRACTION * total))
    return max(GiB // 4, (total - reserve) // max(1, ranks_here))


class Limit:
    """This rank's --memory-limit-gb: auto (the measured live set + 5%, less what the next
    update's peak passed that by, within the machine's budget; with `hold_peak` off, the live set
    measured alike and the limit left at the budget), a fixed number of bytes, or none (MLX's
    default). `update()` wraps each update."""

    def __init__(
        self,
        mode: str,
        budget: int | None,
        headroom: float = AUTO_HEADROOM,
        hold_peak: bool = True,
    ) -> None:
        self.mode, self.budget, self.headroom = mode, budget, headroom
        self.hold_peak = hold_peak  # auto: MLX's limit at the live set, or at the budget
        self.live = 0  # bytes: the live set the limit is set from (auto): measured, or estimated
        self.limit = budget if mode == "fixed" else None  # MLX's limit now, bytes
        self._rows: int | None = None  # the microbatch size the limit is set for
        self._live_at: dict[int, int] = {}  # microbatch size -> the live set measured there
        self._base = 0  # active memory after the first update: weights, optimizer state
        self._trim = False  # the next update's peak lowers the limit by what passed it

    @classmethod
    def from_setting(cls, setting: float | str | None, ranks_here: int = 1) -> Limit:
        """From config.memory_limit(): "auto", GiB, or None."""
        if setting == "auto":  # the CPU runs at the budget (the module's docstring says why)
            return cls("auto", machine_budget(ranks_here), hold_peak=mx.default_device() != mx.cpu)
        if setting is None:
            return cls("none", None)
        return cls("fixed", int(float(setting) * GiB))

    def apply(self) -> str | None:
        """Set MLX's limit for the start of the run; the line for the run's log."""
        if self.mode == "none":
            return None
        if self.mode == "fixed":
            mx.set_memory_limit(self.limit)
            return f"memory limit {gib_text(self.limit)}"
        mx.set_memory_limit(self.budget)  # until the first update has measured the live set
        if not self.hold_peak:
            return (
                f"memory limit auto: {gib_text(self.budget)} (this rank's share of its "
                "machine); the live set measured, not held (on the CPU that costs speed)"
            )
        return (
            f"memory limit auto: the live set + {self.headroom:.0%}, within "
            f"{gib_text(self.budget)} (this rank's share of its machine)"
        )

    def estimate(self, rows: int) -> tuple[int, bool]:
        """The live set at `rows` samples a microbatch (bytes), and whether the next update
        there measures it. As measured there; else on the line from the base (what stays
        between updates: weights, optimizer state) at 0 samples through the size measured
        nearest above: a lower bound, as the gradients do not shrink with the samples (0.72-
        0.97x the live set at a quarter to half the samples, three models here), which the
        update measures. Beyond the largest size measured, its line extended: for the same
        reason at or above the live set, never measured (1.00-1.10x at twice to four times the
        samples on two models, 1.23-1.50x on one whose gradients are much of its live set)."""
        if rows in self._live_at:
            return self._live_at[rows], False
        above = min((b for b in self._live_at if b > rows), default=None)
        at = max(self._live_at) if above is None else above
        base = min(self._base, self._live_at[at])
        return base + (self._live_at[at] - base) * rows // at, above is not None

    @contextmanager
    def update(self, rows: int | None) -> Iterator[None]:
        """Around one update of microbatches of `rows` samples. Under auto, the first one
        runs under a tight limit, the first at a size below one measured under the lower bound
        `estimate` gives (waiting at most near its peak), and the peak of either, the live set
        there, sets the limit; the next update's peak trims it. Beyond the largest size
        measured, the line extended sets it."""
        auto = self.mode == "auto" and rows is not None
        first = auto and not self._live_at
        measuring = first
        if first:
            mx.set_memory_limit(TIGHT)
        elif auto and rows != self._rows:  # a rebalance: no update without run-ahead
            live, measuring = self.estimate(rows)
            # under a lower bound, no headroom: the peak above it is the live set
            self._set(live, rows, bound=measuring)
        trimming = self._trim and not measuring
        mx.reset_peak_memory()
        try:
            yield
        finally:
            peak = mx.get_peak_memory()
            if first:  # what stays between updates (weights, optimizer state): the base
                self._base = mx.get_active_memory()
            if measuring:
                self._live_at[rows] = peak
                self._set(peak, rows)
            elif trimming:
                self._trim = False
                if peak > self.limit:  # so the peak comes to the limit it was set to
                    self.limit = max(min(self.live, self.budget), 2 * self.limit - peak)
                    mx.set_memory_limit(self.limit)

    def _set(self, live: int, rows: int | None, bound: bool = False) -> None:
        """The limit over a live set at microbatches of `rows`, measured or estimated: none
        over it where it is a lower bound the update measures (`bound`); else the rank's
        headroom, which the next update not measuring trims, or without `hold_peak` the
        budget."""
        self.live, self._rows, self._trim = live, rows, self.hold_peak and not bound
        if bound:
            self.limit = min(self.budget, live)
        elif self.hold_peak:
            self.limit = min(self.budget, int(live * (1 + self.headroom)))
        else:
            self.limit = self.budget
        mx.set_memory_limit(self.limit)

    def figures(self) -> dict[str, int]:
        """The matching keyword arguments of `records.Update` (bytes, 0 = none)."""
        return {
            "mem_budget": self.budget or 0,
            "mem_limit": self.limit or 0,
            "live_mem": self.live,
        }


@contextmanager
def tight() -> Iterator[None]:
    """A tight limit for the block (its peak is its live set), then the limit before it."""
    before = mx.set_memory_limit(TIGHT)
    try:
        yield
    finally:
        mx.set_memory_limit(before)


def apply_limits(cache_gb: float | None, wired_gb: float | None) -> list[str]:
    """Set MLX's cache and wired limits; one line per limit set, for the run's log (the
    memory limit is `Limit`'s)."""
    applied = []
    if cache_gb is not None:
        # A capped cache returns freed buffers to the system instead of hoarding them: on a
        # 36 GiB Mac beside 96 GiB ones, the cache is what tips a rank into swap.
        mx.set_cache_limit(int(cache_gb * GiB))
        applied.append(f"cache limit {cache_gb:g} GiB")
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


def memory_caps(
    budgets: list[float | None], split: list[int], peaks: list[float]
) -> list[int | None]:
    """The largest local batch each rank's memory budget allows, from its measured peak.

    The whole peak counts as per-sample cost (weights included), which overstates it, so the
    caps err on the safe side. None where a rank has no budget or has not measured a peak yet.
    """
    caps = []
    for batch, peak, budget in zip(split, peaks, budgets, strict=True):
        if not budget or peak <= 0:
            caps.append(None)
        else:
            caps.append(max(1, batch_cap(budget, 0.0, peak / batch, headroom=0.0) or 0))
    return caps
