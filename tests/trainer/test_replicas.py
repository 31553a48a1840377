"""A fake group (no processes): replica disagreement, the controller's refusals and when it
applies what the autopilot decides."""

from __future__ import annotations

import mlx.core as mx
import pytest

from telemetry.control import CommandQueue
from telemetry.split import problems
from trainer.autopilot import Autopilot, Decision
from trainer.checkpoint import catalog, store
from trainer.config import TrainConfig
from trainer.controller import Controller
from trainer.distributed import Cluster
from trainer.memory import memory_caps
from trainer.train import train


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
    cfg = _tiny(run, updates=4, checkpoint_every=2)
    honest = train(cfg, Cluster(FakeGroup()))
    assert honest == 0
    assert catalog.resolve(run, "latest")[0].name == "step-000004"

    cfg.updates = 6
    path, _, _ = catalog.resolve(run, "latest")
    rc = train(cfg, DisagreeingCluster(FakeGroup()), resume=path)
    err = capsys.readouterr().err
    assert rc == 4
    assert "rank(s) [2] differ" in err
    # the disagreeing checkpoint exists but is never `latest`, nor chosen by a resume
    assert catalog.step_dir(run, 6).exists()
    found, _, warnings = catalog.resolve(run, "latest")
    assert found.name == "step-000004"


def test_a_disagreeing_checkpoint_is_never_taken_even_without_latest(tmp_path):
    def save(step: int, agree: bool) -> None:
        store.save(
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
    link = catalog.root(tmp_path) / catalog.LATEST
    for damage in ("none", "dangling", "missing"):
        if damage == "dangling":
            link.unlink()
            link.symlink_to("step-000008")
        elif damage == "missing":
            link.unlink()
        path, manifest, warnings = catalog.resolve(tmp_path, "latest")
        assert path.name == "step-000004" and manifest["replicas_agree"] is True, damage
        assert any("step-000006" in w and "disagreed" in w for w in warnings), damage
        if damage != "none":
            assert any("resuming from step-000004" in w for w in warnings), damage
    assert catalog.clear_orphans(tmp_path) == []
    assert catalog.step_dir(tmp_path, 6).exists()  # kept for inspection, never latest


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


class CountingCluster(Cluster):
    """Counts the boundary's all-reduces (every rank must make as many)."""

    exchanges = 0

    def broadcast_command(self, cmd, payload, figures=()):
        self.exchanges += 1
        return super().broadcast_command(cmd, payload, figures)


class DecidingPilot(Autopilot):
    """An autopilot that decides a move to `split` at every boundary, having said before
    that it may (`announces`) or not."""

    def __init__(self, split: list[int], announces: bool = True) -> None:
        super().__init__(len(split), enabled=True)
        self.split, self.announces = split, announces

    def may_decide(self) -> bool:
        return self.announces

    def observe(self, split, figures) -> Decision:
        return Decision(commands=[("rebalance", {"split": self.split, "reason": "autopilot"})])


def test_the_autopilots_move_is_applied_at_the_boundary_it_was_decided():
    """Every update on the old split costs the slowed rank's excess: a decision the pilot
    said it may make waits for no second boundary."""
    cluster = CountingCluster(FakeGroup())
    ctl = Controller(cluster, CommandQueue(), pilot=DecidingPilot([3]))
    action = ctl.exchange([3], compute_s=0.1)
    assert action.name == "rebalance" and action.reason == "autopilot"
    assert cluster.exchanges == 2


def test_an_operators_command_goes_first_and_the_pilots_waits():
    queue = CommandQueue()
    cluster = CountingCluster(FakeGroup())
    ctl = Controller(cluster, queue, pilot=DecidingPilot([3]))
    done = queue.submit("checkpoint")
    assert ctl.exchange([3]).name == "checkpoint" and not done.done()
    assert cluster.exchanges == 1  # one command a boundary
    assert ctl.exchange([3]).name == "rebalance"  # decided at the last boundary


def test_an_unannounced_decision_costs_no_second_exchange_and_waits_a_boundary():
    cluster = CountingCluster(FakeGroup())
    ctl = Controller(cluster, CommandQueue(), pilot=DecidingPilot([3], announces=False))
    assert ctl.exchange([3]).name == "none" and cluster.exchanges == 1
    assert ctl.exchange([3]).name == "rebalance" and cluster.exchanges == 2


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
    caps = memory_caps([8 * 2**30, 2**29, 4 * 2**30], [4, 2, 2], [4 * 2**30, 2**30, 2 * 2**30])
    assert caps == [8, 1, 4]
    assert memory_caps([None, None], [2, 2], [1.0, 1.0]) == [None, None]


def test_rebalance_caps_come_from_the_last_boundary_not_the_log_line():
    """The peaks (and each rank's memory budget) ride the control all-reduce, so a rebalance
    is checked against the memory measured in the last update even when no progress line
    was printed."""
    queue = CommandQueue()
    ctl = Controller(Cluster(FakeGroup()), queue, caps_model=memory_caps)
    ctl.exchange([4], peak=2 * 2**30)  # no budget reported: no cap
    assert ctl.caps([4]) == [None]
    ctl.exchange([4], peak=2 * 2**30, budget=2**30)  # 0.5 GiB a sample: 2 fit in 1 GiB
    assert ctl.caps([4]) == [2]
    refused = queue.submit("rebalance", {"split": [4]})
    assert ctl.exchange([4], peak=2 * 2**30, budget=2**30).name == "none"
    assert "rank 0 can hold at most 2" in refused.result().error
    ctl.exchange([4], peak=2**30, budget=2**30)  # a smaller peak lifts the cap
    assert ctl.caps([4]) == [4]


def _tiny(run, **kw) -> TrainConfig:
    return TrainConfig(
        synthetic=True,
        run_dir=str(run),
        depth=1,
        width=32,
        heads=1,
        seq_len=16,
        vocab=64,
        local_batch=2,
        telemetry_port_base=0,
        **kw,
    )


def test_an_explicit_resume_of_a_disagreeing_checkpoint_needs_a_flag(tmp_path):
    from tests.support.fleet import run_fleet

    run = tmp_path / "run"
    assert train(_tiny(run, updates=2, checkpoint_every=2), DisagreeingCluster(FakeGroup())) == 4
    path = str(catalog.step_dir(run, 2))
    args = ("train", "--resume", path, "--run-dir", str(run), "--updates", "3")
    refused = run_fleet(*args, check=False)
    assert refused.returncode == 2
    assert "replicas_agree: false" in refused.stderr and "--resume-disagreeing" in refused.stderr
    taken = run_fleet(*args, "--resume-disagreeing")
    assert "whose replicas disagreed" in taken.stderr


def test_a_resume_refuses_a_changed_seed(tmp_path):
    from tests.support.fleet import run_fleet

    run = tmp_path / "run"
    assert train(_tiny(run, updates=2, seed=3), Cluster(FakeGroup())) == 0
    args = ("train", "--resume", "latest", "--run-dir", str(run), "--updates", "3")
    proc = run_fleet(*args, "--seed", "5", check=False)
    assert proc.returncode == 2
    assert "--seed 5 differs from the run's seed 3" in proc.stderr
    assert "resumed from" in run_fleet(*args, "--seed", "3").stdout  # the same seed is fine
