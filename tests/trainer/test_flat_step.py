"""--optimizer-step flat: the same weights as the per-tensor step (to FP32 rounding; bit for
bit where no clip applies), checkpoints that move between the two steps either way, and the
values refused."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from fleet.cli import main as fleet
from tests.support.tiny_run import OneRank, saved
from trainer.checkpoint import catalog
from trainer.config import ConfigError, TrainConfig, load_file
from trainer.data.dataset import SyntheticStream
from trainer.distributed import Cluster
from trainer.flat import Packing
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.optim import make_optimizer
from trainer.step import Stepper
from trainer.train import train

TINY = ModelConfig.from_sizes(depth=2, width=64, heads=2, vocab=256, seq_len=16)


def _trained(step: str, precision: str, optimizer: str, clip: float, updates: int = 4):
    """The weights (FP32 numpy) and the checkpoint's optimizer state after `updates`."""
    model = GPT(TINY)
    model.init_weights(0)
    if precision == "bf16":
        model.set_dtype(mx.bfloat16)
    opt = make_optimizer(TrainConfig(synthetic=True, optimizer=optimizer))
    opt.init(model.trainable_parameters())
    s = Stepper(model, opt, precision=precision, pad_id=-1, grad_clip=clip, optimizer_step=step)
    stream = SyntheticStream(TINY.vocab, TINY.seq_len, 0)
    for i in range(updates):
        s.update([mx.array(stream.batch(4 * i, 4, 0, 4))], 1e-2)
    weights = {k: np.array(v.astype(mx.float32)) for k, v in tree_flatten(model.parameters())}
    state = dict(tree_flatten(s.checkpoint_trees(None)[1]))
    return weights, state


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


@pytest.mark.parametrize("precision", ["fp32", "mixed", "bf16"])
def test_adamw_flat_gives_the_per_tensor_weights(precision):
    """Clipped (the norm is summed in another order): to FP32 rounding; unclipped: bit for bit."""
    for clip, tol in ((1.0, 1e-6), (0.0, 0.0)):
        want, want_state = _trained("per-tensor", precision, "adamw", clip)
        got, got_state = _trained("flat", precision, "adamw", clip)
        diff = _max_diff(want, got)
        print(f"adamw {precision} clip {clip}: max weight difference {diff:.3g}")
        assert diff <= tol
        # the checkpoint's optimizer state: the same names, shapes and dtypes
        assert {k: (v.shape, v.dtype) for k, v in want_state.items()} == {
            k: (v.shape, v.dtype) for k, v in got_state.items()
        }


def test_weights_given_from_outside_are_packed_anew():
    """The flat step keeps its buffers between updates; weights the model gets from elsewhere
    between two updates (a checkpoint, a broadcast) are what the next update steps."""
    runs = {}
    for step in ("per-tensor", "flat"):
        model = GPT(TINY)
        model.init_weights(0)
        opt = make_optimizer(TrainConfig(synthetic=True))
        opt.init(model.trainable_parameters())
        s = Stepper(model, opt, precision="mixed", pad_id=-1, grad_clip=0.0, optimizer_step=step)
        stream = SyntheticStream(TINY.vocab, TINY.seq_len, 0)
        s.update([mx.array(stream.batch(0, 4, 0, 4))], 1e-2)
        other = GPT(TINY)
        other.init_weights(7)
        model.update(other.trainable_parameters())  # as a checkpoint loaded would
        s.update([mx.array(stream.batch(4, 4, 0, 4))], 1e-2)
        s.update([mx.array(stream.batch(8, 4, 0, 4))], 1e-2)
        runs[step] = {k: np.array(v) for k, v in tree_flatten(model.parameters())}
    assert _max_diff(runs["per-tensor"], runs["flat"]) == 0.0


def test_many_buffers_step_as_one(monkeypatch):
    from trainer import flat

    monkeypatch.setitem(flat.MAX_ELEMENTS, "cpu", 5000)  # more than 3 buffers
    want, _ = _trained("per-tensor", "mixed", "adamw", 0.0)
    got, _ = _trained("flat", "mixed", "adamw", 0.0)
    assert _max_diff(want, got) == 0.0


def test_muons_adamw_part_goes_flat_and_its_matrices_stay():
    """Muon's orthogonalization magnifies a last-bit change of the clip scale (a 2e-6 change of
    the norm moves today's own weights by about 2e-2 in four updates), so the comparison is
    unclipped, where the flat step is the per-tensor step bit for bit."""
    want, want_state = _trained("per-tensor", "mixed", "muon", 0.0)
    got, got_state = _trained("flat", "mixed", "muon", 0.0)
    diff = _max_diff(want, got)
    print(f"muon mixed clip 0: max weight difference {diff:.3g}")
    assert diff == 0.0
    assert want_state.keys() == got_state.keys()
    model = GPT(TINY)
    packing = Packing(model.parameters(), make_optimizer(TrainConfig(optimizer="muon")))
    assert all(n.startswith("blocks.") for n in packing.kept)  # Muon's, per tensor
    assert [n for g in packing.groups for n in g.names] == ["wte.weight", "lm_head.weight"]


def test_many_buffers_pack_and_unpack_to_the_same_tensors():
    """Buffers of at most 5,000 elements: whole tensors, in order; the state's round trip."""
    model = GPT(TINY)
    model.init_weights(0)
    opt = make_optimizer(TrainConfig(synthetic=True))
    opt.init(model.trainable_parameters())
    opt.state = tree_map(lambda a: a + 1.0, opt.state)  # moments that are not zeros
    want_state = dict(tree_flatten(opt.state))
    packing = Packing(model.trainable_parameters(), opt, max_elements=5000)
    assert len(packing.groups) > 3
    names = [n for g in packing.groups for n in g.names]
    assert names == [n for n, _ in tree_flatten(model.trainable_parameters())]
    packed = packing.pack(model.trainable_parameters())
    back = dict(tree_flatten(packing.unpack(packed)))
    for n, p in tree_flatten(model.trainable_parameters()):
        assert np.array_equal(np.array(back[n]), np.array(p)), n
    packing.pack_state(opt)
    assert not any(k.endswith(".m") and k.startswith("wte") for k, _ in tree_flatten(opt.state))
    got_state = dict(tree_flatten(packing.unpacked_state(opt)))
    assert got_state.keys() == want_state.keys()
    for k in want_state:
        assert np.array_equal(np.array(got_state[k]), np.array(want_state[k])), k


def _cfg(run, step: str, **kw) -> TrainConfig:
    return TrainConfig(
        synthetic=True, run_dir=str(run), depth=1, width=32, heads=1, seq_len=16, vocab=64,
        local_batch=2, updates=4, grad_clip=0.0, telemetry_port_base=0, optimizer_step=step,
        **kw,
    )  # fmt: skip


@pytest.mark.parametrize("first, then", [("flat", "per-tensor"), ("per-tensor", "flat")])
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_a_checkpoint_resumes_in_the_other_step_to_the_same_weights(
    tmp_path, first, then, precision
):
    """Unclipped, both steps are one: 2 updates of one and 2 of the other give a straight
    per-tensor run's weights and optimizer state bit for bit, in today's checkpoint format."""
    straight = tmp_path / "straight"
    assert train(_cfg(straight, "per-tensor", precision=precision), Cluster(OneRank())) == 0
    mixed = tmp_path / "mixed"
    cluster = Cluster(OneRank())
    assert train(_cfg(mixed, first, precision=precision, stop_at=2), cluster) == 0
    resume = catalog.step_dir(mixed, 2)
    assert train(_cfg(mixed, then, precision=precision), Cluster(OneRank()), resume=resume) == 0
    want, got = saved(straight, 4), saved(mixed, 4)
    for name in want:
        assert want[name].keys() == got[name].keys(), name
        for k in want[name]:
            assert np.array_equal(want[name][k], got[name][k]), (name, k)


def test_bad_values_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit):  # argparse: usage, one error line, the --help hint
        fleet(["train", "--synthetic", "--optimizer-step", "fused"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert "--optimizer-step: 'fused' is not one of auto, per-tensor, flat" in lines[1]
    toml = tmp_path / "run.toml"
    toml.write_text('optimizer-step = "fused"\n')
    with pytest.raises(ConfigError, match="optimizer-step must be one of auto, per-tensor, flat"):
        load_file(toml)
    with pytest.raises(ConfigError, match="must be auto, per-tensor or flat, got 'fused'"):
        TrainConfig(synthetic=True, optimizer_step="fused").validate()
    with pytest.raises(ConfigError, match="leave it out with --shard-optimizer") as e:
        TrainConfig(synthetic=True, optimizer_step="flat", shard_optimizer=True).validate()
    assert "\n" not in str(e.value)
    # auto under --shard-optimizer is the sharded step's own (per tensor), not a refusal
    TrainConfig(synthetic=True, shard_optimizer=True).validate()


def test_auto_is_flat_on_a_gpu_and_per_tensor_on_the_cpu():
    model = GPT(ModelConfig.from_sizes(depth=1, width=32, heads=1, vocab=64, seq_len=8))
    cfg = TrainConfig(synthetic=True)
    opt = make_optimizer(cfg)
    opt.init(model.trainable_parameters())
    stepper = Stepper(model, opt, precision="fp32", pad_id=-1, grad_clip=1.0)
    on_gpu = mx.default_device() == mx.gpu
    assert (stepper.packing is not None) == on_gpu  # auto: where it measured faster
