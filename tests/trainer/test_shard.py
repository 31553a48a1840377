"""The sharded optimizer's layout, shares and errors, and its step on one rank (no processes;
tests/system/test_shard.py runs real ranks)."""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from telemetry.units import GiB
from trainer import shard as sh
from trainer.config import ConfigError, TrainConfig
from trainer.model.config import ModelConfig
from trainer.optim import make_optimizer, muon_matrix
from trainer.shard import Shard, ShardError, parse_shares, plan

# a small model's shapes, in tree_flatten order: the embedding and the head dominate
SMALL = ModelConfig.from_sizes(depth=2, width=64, heads=2, vocab=4096, seq_len=32)


def _shapes(cfg: ModelConfig = SMALL) -> list[tuple[str, tuple[int, ...]]]:
    from trainer.model.gpt import GPT

    return [(n, p.shape) for n, p in tree_flatten(GPT(cfg).parameters())]


def _covered(layout) -> None:
    """Every row of every parameter is stepped by exactly one rank."""
    for name, shape in layout.shapes.items():
        rows = np.zeros(shape[0], dtype=int)
        for _, piece in layout.owners(name):
            rows[piece.start : piece.stop] += 1
        assert (rows == 1).all(), name


def test_unequal_shares_are_followed_to_within_a_row():
    params = _shapes()
    layout = plan(params, [4, 4, 1, 1, 1], lambda path, shape: False)
    _covered(layout)
    widest = max(math.prod(s[1:]) for _, s in params) / layout.total()
    for got, want in zip(layout.fractions(), [4 / 11, 4 / 11, 1 / 11, 1 / 11, 1 / 11], strict=True):
        assert abs(got - want) <= widest + 1e-9
    # the embedding and the head (2 x 4096 x 64 of 360k parameters) are shared by rows
    assert len(layout.owners("wte.weight")) >= 2 and len(layout.owners("lm_head.weight")) >= 2


def test_muon_matrices_stay_whole():
    params = _shapes()
    layout = plan(params, [4, 4, 1, 1, 1], muon_matrix)
    _covered(layout)
    for name, shape in params:
        owners = layout.owners(name)
        if muon_matrix(name, shape):
            assert len(owners) == 1 and owners[0][1].whole, name
    # the rows of the rest still bring every rank near its share
    for got, want in zip(layout.fractions(), [4 / 11, 4 / 11, 1 / 11, 1 / 11, 1 / 11], strict=True):
        assert abs(got - want) < 0.02


def test_every_rank_computes_the_same_layout():
    a = plan(_shapes(), [3, 1, 2], muon_matrix)
    b = plan(_shapes(), [3, 1, 2], muon_matrix)
    assert a.digest() == b.digest() and a.pieces == b.pieces
    assert plan(_shapes(), [1, 3, 2], muon_matrix).digest() != a.digest()


@pytest.mark.parametrize(
    "text, world, message",
    [
        ("4,1", 3, "has 2 values (4,1) but the run has 3 rank(s)"),
        ("4,0,1", 3, "rank 1's share is 0"),
        ("4,-1,1", 3, "rank 1's share is -1"),
        ("four,1", 2, "expected numbers like 4,4,1,1,1"),
    ],
)
def test_bad_shares_are_one_line_errors_that_say_what_to_give(text, world, message):
    with pytest.raises(ShardError) as e:
        parse_shares(text, world)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, ConfigError)  # printed as one line by `fleet train`


def test_auto_shares_follow_the_budgets_and_need_every_rank_s():
    assert parse_shares("auto", 3) is None and parse_shares("", 2) is None
    assert sh.shares_from_budgets([36 * GiB, 16 * GiB]) == [36 * GiB, 16 * GiB]
    with pytest.raises(ShardError, match=r"rank\(s\) \[1\] have none .*--optimizer-shares"):
        sh.shares_from_budgets([36 * GiB, 0])


def test_a_share_that_cannot_fit_its_rank_is_refused():
    cfg = TrainConfig(precision="mixed")
    params = _shapes()
    layout = plan(params, [1, 1], lambda p, s: False)
    fresh = make_optimizer(cfg)
    fresh.init(tree_unflatten([(n, mx.zeros(s)) for n, s in params]))
    total = layout.total()
    roomy = [GiB, GiB]
    sh.check_fit(layout, fresh.state, roomy, "mixed")
    # rank 1 has room for what every rank holds (weights + accumulators: 6 B a parameter)
    # but not for its half of the masters and AdamW's moments (12 B a parameter)
    tight = [GiB, 6 * total + 3 * total]
    with pytest.raises(ShardError, match="rank 1's share .* does not fit its memory budget"):
        sh.check_fit(layout, fresh.state, tight, "mixed")


def test_the_rows_a_rank_steps_get_the_update_the_whole_matrix_gets():
    """AdamW is elementwise: stepping rows [a, b) of a matrix with their rows of the state
    gives the rows of the whole step, bit for bit (what makes sharding exact)."""
    params = {"wte": {"weight": mx.random.normal((40, 8), key=mx.random.key(0))}}
    grads = tree_map(lambda p: 0.1 * mx.random.normal(p.shape, key=mx.random.key(1)), params)
    layout = plan([("wte.weight", (40, 8))], [2, 1, 1], lambda p, s: False)

    def adamw():
        return optim.AdamW(learning_rate=1e-2, betas=[0.9, 0.95], bias_correction=True)

    whole = adamw()
    full = params
    for _ in range(3):
        full = whole.apply_gradients(grads, full)
    mx.eval(full)
    for rank in range(3):
        shard = Shard(layout, rank, "fp32")
        mine = shard.params(params)
        opt = adamw()
        for _ in range(3):
            mine = opt.apply_gradients(shard.grads(grads), mine)
        piece = shard.mine["wte.weight"]
        got = np.array(mine["wte"]["weight"])
        want = np.array(full["wte"]["weight"][piece.start : piece.stop])
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_on_one_rank_the_sharded_step_is_the_unsharded_one():
    """A one-rank group: the layout is everything, the bits travel nowhere, and the update
    (mixed: bf16 compute weights cast from the FP32 masters) is the unsharded update."""
    from bench.update import synthetic_stepper
    from trainer.data.dataset import SyntheticStream
    from trainer.step import Stepper

    stream = SyntheticStream(512, 16, 0)
    batch = mx.array(stream.batch(0, 4, 0, 4))
    runs = []
    for sharded in (False, True):
        model, opt, stepper = synthetic_stepper(
            depth=1, width=32, heads=1, vocab=512, seq_len=16, precision="mixed"
        )
        if sharded:
            params = tree_flatten(model.trainable_parameters())
            layout = plan([(n, p.shape) for n, p in params], [1], lambda p, s: False)
            shard = Shard(layout, 0, "mixed")
            shard.take(model)
            opt.state = shard.local_state(opt.state)
            stepper = Stepper(model, opt, precision="mixed", pad_id=-1, grad_clip=1.0, shard=shard)
        for _ in range(2):
            stepper.update([batch], 1e-3)
        masters = shard.master if sharded else model.parameters()
        runs.append({k: np.array(v) for k, v in tree_flatten(masters)})
        assert stepper.memory_fields()["opt_share"] == 1.0
    assert runs[0].keys() == runs[1].keys()
    for k in runs[0]:
        assert np.array_equal(runs[0][k].view(np.uint32), runs[1][k].view(np.uint32)), k


def test_a_rank_whose_masters_left_its_weights_does_not_agree():
    """The replica check, sharded: every rank's digest covers the compute weights (which all
    ranks hold) and the layout; a rank whose FP32 masters no longer cast to its rows of those
    weights gets another digest, so the save is refused as a disagreement."""
    from bench.update import synthetic_stepper
    from trainer.step import Stepper

    model, opt, _ = synthetic_stepper(
        depth=1, width=32, heads=1, vocab=512, seq_len=16, precision="mixed"
    )
    params = tree_flatten(model.trainable_parameters())
    layout = plan([(n, p.shape) for n, p in params], [1], lambda p, s: False)
    shard = Shard(layout, 0, "mixed")
    shard.take(model)
    opt.state = shard.local_state(opt.state)
    stepper = Stepper(model, opt, precision="mixed", pad_id=-1, grad_clip=1.0, shard=shard)
    agreed = stepper.replica_digest()
    assert stepper.replica_digest() == agreed and shard.consistent(model.parameters())
    shard.master["wte"]["weight"] = shard.master["wte"]["weight"] + 1.0
    assert not shard.consistent(model.parameters())
    assert stepper.replica_digest() != agreed


class _OneRank:
    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


def _tiny(run, **kw) -> TrainConfig:
    return TrainConfig(
        synthetic=True, run_dir=str(run), depth=1, width=32, heads=1, seq_len=16, vocab=64,
        local_batch=2, updates=2, telemetry_port_base=0, **kw,
    )  # fmt: skip


def test_shares_without_a_sharded_optimizer_are_refused(tmp_path):
    from trainer.distributed import Cluster
    from trainer.train import train

    cfg = _tiny(tmp_path / "run", optimizer_shares="1")
    with pytest.raises(ConfigError, match="add --shard-optimizer, or leave the shares out"):
        train(cfg, Cluster(_OneRank()), explicit=frozenset({"optimizer_shares"}))


def test_a_one_rank_sharded_run_trains_and_saves_a_plain_checkpoint(tmp_path):
    from trainer.checkpoint import catalog
    from trainer.distributed import Cluster
    from trainer.train import train

    cfg = _tiny(tmp_path / "run", shard_optimizer=True, precision="mixed")
    assert train(cfg, Cluster(_OneRank())) == 0
    manifest = catalog.verify(catalog.step_dir(tmp_path / "run", 2))
    assert manifest["replicas_agree"] is True
    weights = mx.load(str(catalog.step_dir(tmp_path / "run", 2) / catalog.WEIGHTS))
    assert {str(w.dtype) for w in weights.values()} == {"mlx.core.float32"}  # the FP32 masters
