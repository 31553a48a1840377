"""--optimizer muon: Muon for the blocks' matrices, AdamW for the embedding and the head;
resume is exact and the split never changes the update, as with AdamW."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from trainer.config import TrainConfig
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.optim import MuonAdamW, make_optimizer


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = GPT(ModelConfig.from_sizes(depth=1, width=64, heads=1, vocab=128, seq_len=16))
    opt = make_optimizer(TrainConfig(synthetic=True, optimizer="muon", lr=1e-3, muon_lr=0.02))
    assert isinstance(opt, MuonAdamW)
    opt.init(model.trainable_parameters())
    muon, adamw = (dict(tree_flatten(s)) for s in opt.state["states"])
    assert {k for k in muon if k.endswith(".v")} == {
        f"blocks.0.{n}.weight.v"
        for n in ("attn.c_q", "attn.c_k", "attn.c_v", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }
    assert {k.rsplit(".", 1)[0] for k in adamw if k.endswith((".m", ".v"))} == {
        "wte.weight",
        "lm_head.weight",
    }
    opt.learning_rate = mx.array(5e-4)  # the schedule's rate scales both, in proportion
    assert np.isclose(opt.optimizers[0].learning_rate.item(), 0.01)
    assert np.isclose(opt.optimizers[1].learning_rate.item(), 5e-4)
