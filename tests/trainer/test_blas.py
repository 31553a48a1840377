"""OpenBLAS preloaded on Linux CPU computes the same update as MLX's bundled BLAS."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.fleet import fleet_env
from trainer import blas

SNIPPET = """
import json, mlx.core as mx
from trainer.model.config import ModelConfig
from trainer.model.gpt import GPT
from trainer.data.dataset import SyntheticStream
from trainer.step import Stepper, zeros_f32
import mlx.optimizers as optim
cfg = ModelConfig.from_sizes(depth=2, width=64, heads=2, vocab=128, seq_len=32)
m = GPT(cfg); m.init_weights(0)
opt = optim.AdamW(1e-3); opt.init(m.trainable_parameters())
s = Stepper(m, opt, precision="fp32", pad_id=-1, grad_clip=1.0)
acc = zeros_f32(m.trainable_parameters()); loss = mx.array(0.0); n = mx.array(0.0)
for i in range(2):
    b = mx.array(SyntheticStream(128, 32, 0).batch(i * 4, 4, 0, 4))
    acc, loss, n = s.microstep(acc, loss, n, b); mx.eval(acc, loss, n)
norm = s.apply(acc, n, 1e-3); mx.eval(m.parameters(), norm)
w = m.parameters()["blocks"][0]["mlp"]["c_fc"]["weight"]
print(json.dumps([loss.item(), norm.item(), mx.sum(w * w).item()]))
"""


def _figures(env: dict[str, str]) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", SNIPPET], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux CPU only")
def test_openblas_gives_the_same_update():
    if blas.openblas_path() is None:
        pytest.skip("libopenblas0-pthread is not installed (.ci/run installs it)")
    reference = fleet_env(FLEET_BLAS="reference")
    reference.pop("LD_PRELOAD", None)
    fast = blas.preload_env(fleet_env(FLEET_BLAS=""))
    assert "openblas" in fast["LD_PRELOAD"]
    a, b = _figures(reference), _figures(fast)
    assert b == pytest.approx(a, rel=1e-5)


def test_preload_env_respects_the_opt_out():
    env = blas.preload_env({"FLEET_BLAS": "reference"})
    assert "LD_PRELOAD" not in env


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux CPU only")
def test_a_user_preloaded_openblas_is_not_preloaded_again():
    # LD_PRELOAD set by hand (the README's tip) without fleet's mark: fleet must run, not
    # re-execute itself forever.
    lib = blas.openblas_path()
    if lib is None:
        pytest.skip("libopenblas0-pthread is not installed (.ci/run installs it)")
    env = fleet_env(LD_PRELOAD=lib)
    env.pop("FLEET_BLAS", None)
    out = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "bench", "balance", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "--scaling" in out.stdout
    assert blas.preload_env(env)["LD_PRELOAD"].count(lib) == 1
