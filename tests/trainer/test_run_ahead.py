"""The run-ahead setting reaches MLX's environment on Linux, and the user's value wins."""

from __future__ import annotations

from trainer import run_ahead


def test_linux_gets_the_measured_batch_and_the_users_value_wins():
    env: dict[str, str] = {}
    assert run_ahead.apply(env, "Linux") == "CUDA run-ahead: 10 kernels a batch"
    assert env == {"MLX_MAX_OPS_PER_BUFFER": "10"}
    mine = {"MLX_MAX_OPS_PER_BUFFER": "100"}
    assert "MLX_MAX_OPS_PER_BUFFER=100 (from the environment)" in run_ahead.apply(mine, "Linux")
    assert mine == {"MLX_MAX_OPS_PER_BUFFER": "100"}


def test_a_mac_keeps_metals_own():
    env: dict[str, str] = {}
    assert "Metal" in run_ahead.apply(env, "Darwin")
    assert env == {}
