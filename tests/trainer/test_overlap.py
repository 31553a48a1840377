"""--overlap: the next update's first microstep started behind this update's step gives the
same weights bit for bit as building it at the next update; a started microstep is used only
for the microbatch and the weights it was built from, and `fleet train` resumes alike."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from tests.support.tiny_run import OneRank, saved
from trainer.checkpoint import catalog
from trainer.config import TrainConfig
from trainer.data.dataset import SyntheticStream
from trainer.distributed import Cluster
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.optim import make_optimizer
from trainer.step import Stepper
from trainer.train import train

TINY = ModelConfig.from_sizes(depth=2, width=64, heads=2, vocab=256, seq_len=16)
B = 4


def _stepper(overlap: str, step: str = "flat", seed: int = 0) -> Stepper:
    model = GPT(TINY)
    model.init_weights(seed)
    opt = make_optimizer(TrainConfig(synthetic=True))
    opt.init(model.trainable_parameters())
    return Stepper(
        model,
        opt,
        precision="mixed",
        pad_id=-1,
        grad_clip=1.0,
        optimizer_step=step,
        overlap=overlap,
    )


def _counted(s: Stepper) -> list[bool]:
    """Whether each update of `s` took a started microstep, as they happen."""
    took, take = [], s._take_started

    def counted(key):
        started = take(key)
        took.append(started is not None)
        return started

    s._take_started = counted
    return took


def _weights(s: Stepper) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in tree_flatten(s.model.parameters())}


def _run(s: Stepper, updates: int, accum: int, between=None) -> list:
    """`updates` updates over a synthetic stream, keyed and ahead as train()'s loop passes
    them; `between(i)` runs before update i (a rebalance, a checkpoint loaded)."""
    stream = SyntheticStream(TINY.vocab, TINY.seq_len, 0)
    rows = {"B": B}

    def batch(i: int, m: int) -> mx.array:
        b = rows["B"]
        return mx.array(stream.batch((i * accum + m) * b, b, 0, b))

    figures = []
    for i in range(updates):
        if between:
            between(i, rows)
        key = (i, rows["B"])
        figures.append(
            s.update(
                [batch(i, m) for m in range(accum)],
                1e-2,
                key=key,
                ahead=lambda i=i: ((i + 1, rows["B"]), batch(i + 1, 0)),
            )
        )
    return figures


@pytest.mark.parametrize("step,accum", [("flat", 1), ("flat", 3), ("per-tensor", 2)])
def test_started_microsteps_give_the_same_weights(step, accum):
    want, got = _stepper("off", step), _stepper("on", step)
    took = _counted(got)
    fw, fg = _run(want, 5, accum), _run(got, 5, accum)
    assert took == [False, True, True, True, True]
    assert got._started is not None  # the last update started a sixth's microstep
    assert _weights(want).keys() == _weights(got).keys()
    for k, v in _weights(want).items():
        np.testing.assert_array_equal(v, _weights(got)[k], err_msg=k)
    assert [f.loss_sum for f in fw] == [f.loss_sum for f in fg]
    assert [f.grad_norm for f in fw] == [f.grad_norm for f in fg]
    assert all(f.compute_s > 0 and f.optimizer_s > 0 for f in fg)


def test_a_started_microstep_is_dropped_for_another_batch_or_other_weights():
    """A rebalance (another local batch: another key) and weights loaded from elsewhere
    between two updates: the next update builds its microstep anew, as without overlap."""
    donor = GPT(TINY)
    donor.init_weights(7)

    def between(i: int, rows: dict) -> None:
        if i == 2:
            rows["B"] = 2  # the split changed at this boundary
        if i == 4:
            s.model.update(donor.trainable_parameters())  # as a checkpoint loaded would

    ref = _stepper("off")
    s = ref
    _run(ref, 6, 1, between)
    want = _weights(ref)
    s = _stepper("on")
    took = _counted(s)
    _run(s, 6, 1, between)
    assert took == [False, True, False, True, False, True]
    for k, v in want.items():
        np.testing.assert_array_equal(v, _weights(s)[k], err_msg=k)


def test_overlap_auto_is_off_on_the_cpu_and_off_when_sharded_or_tensor_parallel():
    assert mx.default_device() == mx.cpu
    assert _stepper("auto").overlap is False
    assert _stepper("on").overlap is True


def _cfg(run, overlap: str, **kw) -> TrainConfig:
    return TrainConfig(
        synthetic=True, run_dir=str(run), depth=1, width=32, heads=1, seq_len=16, vocab=64,
        local_batch=2, accum=2, updates=6, telemetry_port_base=0, overlap=overlap, **kw,
    )  # fmt: skip


def test_train_with_overlap_resumes_to_the_weights_of_one_run(tmp_path):
    """fleet train --overlap on: 3 updates, stopped, and 3 more resumed end in the weights and
    optimizer state of --overlap off's 6 in one run, bit for bit."""
    straight, parted = tmp_path / "straight", tmp_path / "parted"
    assert train(_cfg(straight, "off"), Cluster(OneRank())) == 0
    assert train(_cfg(parted, "on", stop_at=3), Cluster(OneRank())) == 0
    resume = catalog.step_dir(parted, 3)
    assert train(_cfg(parted, "on"), Cluster(OneRank()), resume=resume) == 0
    want, got = saved(straight, 6), saved(parted, 6)
    for name in want:
        assert want[name].keys() == got[name].keys(), name
        for k in want[name]:
            assert np.array_equal(want[name][k], got[name][k]), (name, k)
