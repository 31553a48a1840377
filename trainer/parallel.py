"""How the ranks of a run share the work: data-parallel replicas of tensor-parallel groups.

    --parallel data        every rank a replica (the default): each takes its own local batch
    --parallel tensor      every rank one slice of the model; all read the same rows
    --parallel tensor:K    groups of K consecutive ranks, each group one replica (MPI, NCCL)

Rank r is tensor rank r % K of replica r // K: consecutive ranks (one host's, as a hostfile
lists them) form a group, so the per-block collectives stay on the fastest links. The batch
split has one local batch per replica, and the gradient all-reduce runs among the replicas.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx

from trainer.config import TrainConfig
from trainer.distributed import Cluster


class LayoutError(ValueError):
    """A --parallel that this world or backend cannot give."""


@dataclass(frozen=True)
class Layout:
    """This rank's place in the run: its replica, its slice, and the groups it talks in."""

    tensor: int  # ranks per tensor-parallel group (1: data parallel)
    replicas: int  # data-parallel replicas
    replica: int  # this rank's replica: which local batch of the split it reads
    tensor_rank: int  # this rank's slice of the model
    tensor_group: mx.distributed.Group | None  # None: data parallel
    data: Cluster  # the replicas (this rank and its peers of the same slice): gradients, sums

    @property
    def mode(self) -> str:
        if self.tensor == 1:
            return "data"
        return "tensor" if self.replicas == 1 else f"tensor:{self.tensor}"

    @property
    def samples(self) -> bool:
        """Whether this rank takes part in generating the test sentence: rank 0 alone in data
        parallelism; every rank of replica 0's group in tensor parallelism (its forward pass
        is a collective)."""
        return self.replica == 0 and (self.tensor > 1 or self.tensor_rank == 0)


def make_layout(cfg: TrainConfig, cluster: Cluster) -> Layout:
    """The layout `--parallel` asks for over `cluster`; LayoutError says why it cannot be."""
    k = cluster.size // cfg.replicas(cluster.size)
    rank = cluster.rank
    if k == 1:
        return Layout(1, cluster.size, rank, 0, None, cluster)
    replicas = cluster.size // k
    if replicas == 1:
        return Layout(k, 1, 0, rank, cluster.group, Cluster.solo())
    if (why := cfg.needs_split_groups(cluster.size, cluster.backend)) is not None:
        raise LayoutError(why)
    replica, tensor_rank = divmod(rank, k)
    tensor_group = cluster.group.split(replica, tensor_rank)
    data_group = cluster.group.split(tensor_rank, replica)
    return Layout(k, replicas, replica, tensor_rank, tensor_group, Cluster(data_group))


def probe_collectives(layout: Layout, rows: int, width: int, depth: int, dtype) -> float:
    """Seconds one microstep spends in the per-block all-reduces of tensor parallelism: two in
    each block's forward pass (attention's and the MLP's output projections), two in its
    backward pass (the gradients of their inputs), one each for the embedding and the head,
    each of (rows x width) values. Inside the compiled step they cannot be told apart from
    compute, so the same chain of transfers is timed once on the real group, as one graph
    (each all-reduce waiting for the last, as in the step): the median of five. 0 without a
    group."""
    group = layout.tensor_group
    if group is None:
        return 0.0
    count = 4 * depth + 2
    x = mx.zeros((rows, width), dtype=dtype)
    mx.eval(x, mx.distributed.all_sum(x, group=group))  # connect and warm up
    times = []
    for _ in range(5):
        y = x
        t0 = time.perf_counter()
        for _ in range(count):
            y = mx.distributed.all_sum(y, group=group)
        mx.eval(y)
        times.append(time.perf_counter() - t0)
    return sorted(times)[2]
