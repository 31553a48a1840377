"""Which distributed backend a rank joins, and a clear refusal when the group is not the one the
launcher announced (fast: no ranks are started)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import fleet_env
from trainer.distributed import backend_from_env, expected_world


@pytest.mark.parametrize(
    "env, backend",
    [
        ({}, "any"),  # a plain single process
        ({"MLX_HOSTFILE": "/tmp/h.json", "MLX_RANK": "1"}, "ring"),
        ({"NCCL_HOST_IP": "10.0.0.1", "NCCL_PORT": "1", "MLX_WORLD_SIZE": "2"}, "nccl"),
        ({"MLX_IBV_DEVICES": "/tmp/d.json", "MLX_RANK": "0"}, "jaccl"),
        ({"MLX_JACCL_COORDINATOR": "10.0.0.1:5", "MLX_HOSTFILE": "x"}, "jaccl"),
        ({"FLEET_BACKEND": "mpi", "MLX_HOSTFILE": "x"}, "mpi"),  # fleet launch's own choice wins
    ],
)
def test_the_backend_follows_what_the_launcher_set(env, backend):
    assert backend_from_env(env) == backend


def test_expected_world_reads_the_launcher_size():
    assert expected_world({"MLX_WORLD_SIZE": "4"}) == 4
    assert expected_world({}) is None
    assert expected_world({"MLX_WORLD_SIZE": "four"}) is None


def test_a_rank_that_lands_in_a_one_rank_group_refuses_to_train(tmp_path):
    # Announced as one of two NCCL-style ranks, but nothing to join here: training alone
    # would silently produce a different run, so the rank stops and says why.
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "train", "--synthetic", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=fleet_env(MLX_WORLD_SIZE="2", MLX_RANK="1", FLEET_BACKEND="ring"),
    )
    assert proc.returncode == 3
    assert "launched as one of 2 ranks" in proc.stderr
    assert "a group of 1" in proc.stderr
    assert not (tmp_path / "checkpoints").exists()
