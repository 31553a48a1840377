"""Which distributed backend a rank joins, and a clear refusal when the group is not the one the
launcher announced (fast: no ranks are started)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.fleet import fleet_env
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
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0"}, "mpi"),  # plain mpirun
        ({"PMI_SIZE": "4"}, "mpi"),  # MPICH
    ],
)
def test_the_backend_follows_what_the_launcher_set(env, backend):
    assert backend_from_env(env) == backend


def test_expected_world_reads_the_launcher_size():
    assert expected_world({"MLX_WORLD_SIZE": "4"}) == 4
    assert expected_world({}) is None
    assert expected_world({"MLX_WORLD_SIZE": "four"}) is None
    assert expected_world({"OMPI_COMM_WORLD_SIZE": "3"}) == 3


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


def test_mpirun_without_a_loadable_libmpi_is_refused_with_the_fix(tmp_path):
    # What Debian's Open MPI does to MLX: libmpi.so is not on the loader path, so each rank
    # would silently train alone. The rank says so and how to fix it.
    env = fleet_env(OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0", MLX_MPI_LIBNAME="nope.so")
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "train", "--synthetic", "--run-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 3
    assert "launched as one of 2 ranks, but the mpi backend formed a group of 1" in proc.stderr
    assert "MLX_MPI_LIBNAME" in proc.stderr


def test_launch_with_mpi_says_what_this_mpirun_cannot_do(tmp_path):
    import re
    import shutil

    mpirun = shutil.which("mpirun")
    version = ""
    if mpirun:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True)
        version = out.stdout + out.stderr
    m = re.search(r"Open MPI\)?\s+(\d+)", version)
    if m and int(m.group(1)) >= 5:
        pytest.skip("Open MPI 5: mlx.launch's MPI mode works here")
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "launch", "-n", "2", "--backend", "mpi", "--"]
        + ["train", "--synthetic", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        env=fleet_env(),
    )
    assert proc.returncode == 2
    if mpirun is None:
        assert "needs mpirun on PATH" in proc.stderr
    elif m:
        assert "needs Open MPI 5" in proc.stderr and "MLX_MPI_LIBNAME=" in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_one_rank_launch_is_a_group_of_one_not_a_ring_to_parse(tmp_path):
    # mlx.launch -n 1 names a hostfile that holds only a newline; the ring backend would fail
    # to parse it ("[json.exception.parse_error.101]") and `fleet launch -n 1` exited 3.
    from trainer.distributed import backend_from_env, one_rank_launch

    empty, ring = tmp_path / "empty", tmp_path / "ring"
    empty.write_text("\n")
    ring.write_text('[["127.0.0.1:5000"], ["127.0.0.1:5001"]]')
    assert one_rank_launch({"MLX_HOSTFILE": str(empty), "MLX_RANK": "0"})
    assert backend_from_env({"MLX_HOSTFILE": str(empty), "FLEET_BACKEND": "ring"}) == "any"
    assert not one_rank_launch({"MLX_HOSTFILE": str(ring)})
    assert backend_from_env({"MLX_HOSTFILE": str(ring)}) == "ring"


def test_fleet_launch_of_one_rank_trains(tmp_path):
    from tests.support.fleet import run_fleet

    out = run_fleet(
        "launch", "-n", "1", "--", "train", "--synthetic", "--depth", "1", "--width", "32",
        "--updates", "1", "--run-dir", str(tmp_path / "run"), "--telemetry-port-base", "0",
    )  # fmt: skip
    assert "done: 1 updates" in out.stdout


@pytest.mark.parametrize("world, blamed", [(1, "this rank itself is stuck"), (2, "a peer rank")])
def test_the_watchdog_blames_a_peer_only_when_there_is_one(world, blamed):
    code = (
        "import time; from trainer.distributed import Watchdog; "
        f"Watchdog(0.4, 0, world={world}).start(); time.sleep(30)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=fleet_env(), timeout=60
    )
    assert out.returncode == 3
    assert blamed in out.stderr
