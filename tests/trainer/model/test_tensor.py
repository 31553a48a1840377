"""Tensor parallelism's pieces without processes: sizes, splits, and what is refused."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from trainer.config import ConfigError, TrainConfig
from trainer.model import tensor
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.parallel import LayoutError, make_layout


class One:
    """A group of one rank."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def test_the_config_counts_the_parameters_the_gpt_holds():
    for depth, width, vocab in ((1, 64, 256), (3, 128, 512), (2, 96, 320)):
        cfg = ModelConfig.from_sizes(depth=depth, width=width, vocab=vocab, seq_len=16)
        assert cfg.num_params() == GPT(cfg).num_params()


def test_a_model_that_does_not_split_equally_is_refused_naming_what():
    cfg = ModelConfig.from_sizes(depth=1, width=96, heads=3, vocab=320, seq_len=16)
    tensor.check_divisible(cfg, 1)
    with pytest.raises(ValueError, match="its 3 heads do not divide by 2"):
        tensor.check_divisible(cfg, 2)
    odd = ModelConfig.from_sizes(depth=1, width=96, heads=4, vocab=321, seq_len=8)
    with pytest.raises(ValueError, match="its padded vocabulary 321 do not divide by 2"):
        tensor.check_divisible(odd, 2)


def test_each_weight_knows_its_split_axis_and_each_moment_its_weight():
    assert tensor.shard_axis("blocks.0.attn.c_proj.weight") == 1
    assert tensor.shard_axis("blocks.3.mlp.c_proj.weight") == 1
    for path in ("wte.weight", "lm_head.weight", "blocks.0.attn.c_q.weight", "blocks.1.mlp.c_fc"):
        assert tensor.shard_axis(path) == 0
    assert tensor._owner("blocks.0.attn.c_proj.weight.v") == "blocks.0.attn.c_proj.weight"
    assert tensor._owner("step") is None


def test_a_group_of_one_leaves_the_model_whole():
    cfg = ModelConfig.from_sizes(depth=1, width=64, heads=2, vocab=128, seq_len=8)
    model = GPT(cfg)
    before = [p.shape for _, p in tree_flatten(model.parameters())]
    assert tensor.shard_gpt(model, One()) is model
    assert [p.shape for _, p in tree_flatten(model.parameters())] == before
    tree = {"w": {"weight": mx.ones((4, 2))}}
    assert tensor.gather_tree(tree, One()) is tree


@pytest.mark.parametrize("parallel", ["pipeline", "tensor:0", "tensor:x", "tensor:"])
def test_a_parallel_mode_that_does_not_exist_is_refused(parallel):
    with pytest.raises(ConfigError, match="give data, tensor, or tensor:K"):
        TrainConfig(synthetic=True, parallel=parallel).validate()


def test_muon_is_refused_under_tensor_parallelism_with_the_reason():
    with pytest.raises(ConfigError, match="orthogonalizes whole matrices"):
        TrainConfig(synthetic=True, parallel="tensor", optimizer="muon").validate()


def test_a_sharded_optimizer_is_refused_under_tensor_parallelism():
    # each rank of a tensor-parallel group already holds only its slice of the state
    with pytest.raises(ConfigError, match="leave --shard-optimizer out"):
        TrainConfig(synthetic=True, parallel="tensor:2", shard_optimizer=True).validate()


def test_the_split_has_one_local_batch_per_replica():
    assert TrainConfig(parallel="tensor", local_batch=4).split(4) == [4]
    assert TrainConfig(parallel="tensor:2", local_batches="3,1").split(4) == [3, 1]
    with pytest.raises(ConfigError, match=r"2 replica\(s\) \(--parallel\)"):
        TrainConfig(parallel="tensor:2", local_batches="3,1,1").split(4)
    with pytest.raises(ConfigError, match="do not make groups of 2"):
        TrainConfig(parallel="tensor:2").split(3)


def test_groups_split_out_of_the_world_need_mpi_or_nccl():
    cfg = TrainConfig(parallel="tensor:2")
    ring = SimpleNamespace(size=4, rank=1, backend="ring", group=None)
    with pytest.raises(LayoutError, match="the ring backend cannot do"):
        make_layout(cfg, ring)
    assert cfg.needs_split_groups(4, "mpi") is None
    assert cfg.needs_split_groups(2, "ring") is None  # one group of every rank: no split
    whole = make_layout(TrainConfig(parallel="tensor"), ring)
    assert (whole.tensor, whole.replicas, whole.tensor_rank, whole.mode) == (4, 1, 1, "tensor")
    assert whole.data.size == 1 and whole.samples
    data = make_layout(TrainConfig(), ring)
    assert (data.tensor, data.replicas, data.replica, data.mode) == (1, 4, 1, "data")
    assert not data.samples  # rank 1 of a data-parallel run leaves the sample to rank 0


def test_a_tensor_parallel_split_is_fixed_for_rebalance_and_autopilot():
    from telemetry.control import CommandQueue
    from telemetry.parallelism import FIXED_SPLIT
    from trainer.controller import Controller
    from trainer.distributed import Cluster

    queue = CommandQueue()
    ctl = Controller(Cluster.solo(), queue, fixed_split=FIXED_SPLIT)
    moved = queue.submit("rebalance", {"split": [4]})
    piloted = queue.submit("autopilot", {"on": True})
    off = queue.submit("autopilot", {"on": False})
    action = ctl.exchange([4])
    assert action.name == "autopilot" and action.pending is not None  # turning it off is fine
    assert moved.result().error == piloted.result().error == FIXED_SPLIT
    assert not off.done()


def test_tensor_groups_on_the_ring_backend_are_refused_before_any_rank_starts(tmp_path):
    from tests.support.fleet import run_fleet

    out = run_fleet(
        "launch", "-n", "4", "--backend", "ring", "--",
        "train", "--synthetic", "--parallel", "tensor:2", "--run-dir", str(tmp_path / "r"),
        check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert "the ring backend cannot do" in out.stderr and len(out.stderr.splitlines()) == 1
    assert not (tmp_path / "r").exists()
