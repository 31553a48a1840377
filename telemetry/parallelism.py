"""The run's parallel mode as its records name it (`Hello.parallel`, the `started` event).

    data        every rank a replica with its own local batch (the default, and older logs)
    tensor      one tensor-parallel group of every rank: each holds 1/N of every block
    tensor:K    groups of K consecutive ranks, each group one data-parallel replica

The console and `fleet report` read it from here, so both say a mode, and why a tensor-parallel
split cannot be rebalanced, in the same words.
"""

from __future__ import annotations

from dataclasses import dataclass

FIXED_SPLIT = (
    "a tensor-parallel split is fixed: every rank of a group reads the same rows, so no rank "
    "can take more of them than its peers; to change the batch, restart the run with another "
    "--local-batch (--local-batches: one per group)"
)


@dataclass(frozen=True, slots=True)
class Parallelism:
    """How the ranks of a run share the work."""

    mode: str  # as recorded: data, tensor, tensor:K
    tensor: int  # ranks a tensor-parallel group (1: data parallel)
    replicas: int  # data-parallel replicas (groups)

    @property
    def fixed_split(self) -> bool:
        """Whether the batch split can never change while the run lives (tensor parallelism)."""
        return self.tensor > 1

    def describe(self) -> str:
        """`data parallel`, `tensor parallel x2`, `2 replicas x tensor 2`."""
        if self.tensor <= 1:
            return "data parallel"
        if self.replicas <= 1:
            return f"tensor parallel x{self.tensor}"
        return f"{self.replicas} replicas x tensor {self.tensor}"

    def groups(self) -> str:
        """The mode with its groups, for the report: `tensor (2 ranks a group)`."""
        if self.tensor <= 1:
            return self.mode
        if self.replicas <= 1:
            return f"{self.mode} ({self.tensor} ranks a group)"
        return f"{self.mode} ({self.replicas} groups of {self.tensor} ranks)"

    def slice_of(self, rank: int) -> str:
        """Which slice of the model `rank` holds: `slice 2 of 2, group 1` (1-based slices)."""
        if self.tensor <= 1:
            return ""
        group = f", group {rank // self.tensor}" if self.replicas > 1 else ""
        return f"slice {rank % self.tensor + 1} of {self.tensor}{group}"


def parse(mode: str | None, world: int) -> Parallelism:
    """The mode a record names, over `world` ranks; anything unknown reads as data parallel,
    since a record from a newer or broken peer must not stop the console or the report."""
    mode = (mode or "data").strip()
    world = max(1, world)
    if mode == "tensor":
        return Parallelism(mode, world, 1)
    name, _, k = mode.partition(":")
    if name == "tensor" and k.isdigit() and int(k) > 0:
        tensor = int(k)
        return Parallelism(mode, tensor, max(1, world // tensor))
    return Parallelism("data", 1, world)
