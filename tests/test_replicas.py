"""A fake group (no processes): replica disagreement and the controller's refusals."""

from __future__ import annotations

import mlx.core as mx
import pytest

from telemetry.control import CommandQueue
from telemetry.split import problems
from trainer import checkpoint
from trainer.config import TrainConfig
from trainer.controller import Controller
from trainer.distributed import Cluster
from trainer.train import memory_caps, train


class FakeGroup:
    """Rank 0 of a one-rank group: collectives are identities, as MLX's are for size 1."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1


class DisagreeingCluster(Cluster):
    """Pretends ranks 1 and 2 exist and that rank 2's replica differs."""

    def gather_bytes(self, blob: bytes) -> list[bytes]:
        return [blob, blob, bytes(len(blob))]


def test_replica_mismatch_names_the_rank_and_keeps_latest(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = TrainConfig(
        synthetic=True,
        run_dir=str(run),
        depth=1,
        width=32,
        heads=1,
        seq_len=16,
        vocab=64,
        local_batch=2,
        updates=4,
        checkpoint_every=2,
        telemetry_port_base=0,
    )
    honest = train(cfg, Cluster(FakeGroup()))
    assert honest == 0
    assert checkpoint.resolve(run, "latest")[0].name == "step-000004"

    cfg.updates = 6
    path, _, _ = checkpoint.resolve(run, "latest")
    rc = train(cfg, DisagreeingCluster(FakeGroup()), resume=path)
    err = capsys.readouterr().err
    assert rc == 4
    assert "rank(s) [2] differ" in err
    # the disagreeing checkpoint exists but is never `latest`, nor chosen by a resume
    assert checkpoint.step_dir(run, 6).exists()
    found, _, warnings = checkpoint.resolve(run, "latest")
    assert found.name == "step-000004"


def test_a_disagreeing_checkpoint_is_never_taken_even_without_latest(tmp_path):
    def save(step: int, agree: bool) -> None:
        checkpoint.save(
            tmp_path,
            step,
            params={"w": mx.full((2,), float(step))},
            optimizer_state={},
            state={"step": step},
            config={},
            identity={"replicas_agree": agree},
            make_latest=agree,
        )

    save(4, True)
    save(6, False)  # the newest save, by step and by serial
    link = checkpoint.root(tmp_path) / checkpoint.LATEST
    for damage in ("none", "dangling", "missing"):
        if damage == "dangling":
            link.unlink()
            link.symlink_to("step-000008")
        elif damage == "missing":
            link.unlink()
        path, manifest, warnings = checkpoint.resolve(tmp_path, "latest")
        assert path.name == "step-000004" and manifest["replicas_agree"] is True, damage
        assert any("step-000006" in w and "disagreed" in w for w in warnings), damage
        if damage != "none":
            assert any("resuming from step-000004" in w for w in warnings), damage
    assert checkpoint.clear_orphans(tmp_path) == []
    assert checkpoint.step_dir(tmp_path, 6).exists()  # kept for inspection, never latest


def test_controller_refuses_before_broadcasting():
    queue = CommandQueue()
    ctl = Controller(Cluster(FakeGroup()), queue)
    resume = queue.submit("resume")
    bad = queue.submit("rebalance", {"split": [4, 2]})
    good = queue.submit("rebalance", {"split": [3, 2]})
    action = ctl.exchange([2, 3])
    assert action.name == "rebalance" and action.payload == [3, 2]
    assert resume.result().error == "not paused"
    assert "sums to 6" in bad.result().error and not bad.result().ok
    assert not good.done()  # answered by the loop once applied
    Controller.answer(action, 7, split=[3, 2])
    assert good.result().ok and good.result().step == 7


@pytest.mark.parametrize(
    "split, caps, message",
    [
        ([3, 2, 2], None, "sums to 7"),
        ([2, 2, 0], None, "at least 1"),
        ([2, 2], None, "2 values for 3 ranks"),
        ([4, 1, 1], [3, None, None], "rank 0 can hold at most 3"),
        ("2,2,2", None, "list of integers"),
    ],
)
def test_validate_split(split, caps, message):
    assert message in "; ".join(problems(split, 6, 3, caps))


def test_memory_caps_follow_the_measured_peak():
    cfg = TrainConfig(synthetic=True, memory_limit_gb="8,0.5,4")
    caps = memory_caps(cfg, [4, 2, 2], [4 * 2**30, 2**30, 2 * 2**30])
    assert caps == [8, 1, 4]
    assert memory_caps(TrainConfig(synthetic=True), [2, 2], [1.0, 1.0]) == [None, None]
