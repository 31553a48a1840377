"""The CUDA-graphs setting reaches MLX's environment variable, and `auto` defers to the user."""

from __future__ import annotations

import pytest

from trainer import cuda_graphs
from trainer.config import TrainConfig


def test_on_and_off_set_the_variable():
    env: dict[str, str] = {"MLX_USE_CUDA_GRAPHS": "1"}
    assert cuda_graphs.apply("off", env) == "CUDA graphs off"
    assert env == {"MLX_USE_CUDA_GRAPHS": "0"}
    assert cuda_graphs.apply("on", env) == "CUDA graphs on"
    assert env == {"MLX_USE_CUDA_GRAPHS": "1"}


@pytest.mark.parametrize("value, word", [("0", "off"), ("1", "on"), ("2", "on"), ("no", "off")])
def test_auto_keeps_the_users_value(value, word):
    env = {"MLX_USE_CUDA_GRAPHS": value}
    assert cuda_graphs.apply("auto", env).startswith(f"CUDA graphs {word} ")
    assert env == {"MLX_USE_CUDA_GRAPHS": value}  # MLX reads it with atoi: "no" is off


def test_auto_applies_the_measured_default(monkeypatch):
    env: dict[str, str] = {}
    monkeypatch.setattr(cuda_graphs, "DEFAULT", None)
    cuda_graphs.apply("auto", env)
    assert env == {}  # MLX's own default
    monkeypatch.setattr(cuda_graphs, "DEFAULT", False)
    assert cuda_graphs.apply("auto", env) == "CUDA graphs off"
    assert env == {"MLX_USE_CUDA_GRAPHS": "0"}


def test_the_config_field_takes_the_same_settings():
    assert TrainConfig().cuda_graphs == "auto"
    assert (
        TrainConfig.__dataclass_fields__["cuda_graphs"].metadata["choices"] == cuda_graphs.SETTINGS
    )
    with pytest.raises(ValueError):
        cuda_graphs.apply("sometimes", {})
