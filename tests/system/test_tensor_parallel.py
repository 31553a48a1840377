"""Tensor parallelism on real ranks: the same model as one rank, checkpoints that any mode
resumes, samples and exports from them, replicas of groups over MPI (slow: real ranks)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support.fleet import fleet_env, run_fleet
from tests.support.ranks import TINY, assert_close_weights, launch, single, weights

pytestmark = pytest.mark.slow

# Four heads, so that 2 and 4 ranks split them; the byte vocabulary pads to 320.
TP = [*TINY, "--heads", "4", "--local-batch", "4", "--checkpoint-every", "2"]


def test_two_ranks_of_tensor_parallelism_train_what_one_rank_trains(tiny_data, tmp_path):
    single(tiny_data, tmp_path / "one", *TP, "--updates", "4")
    out = launch(2, tiny_data, tmp_path / "tp", *TP, "--updates", "4", "--parallel", "tensor")
    assert "tensor parallel (each holds 1/2 of the model)" in out.stdout
    for step in (2, 4):
        assert_close_weights(weights(tmp_path / "one", step), weights(tmp_path / "tp", step))


def test_checkpoints_of_either_mode_resume_in_the_other(tiny_data, tmp_path):
    single(tiny_data, tmp_path / "one", *TP, "--updates", "4")
    # Tensor parallel for two updates, then one rank resumes it to four; with the flat
    # optimizer step (a GPU's default), whose packed moments are saved per tensor, gathered...
    launch(
        2,
        tiny_data,
        tmp_path / "a",
        *TP,
        "--updates",
        "4",
        "--stop-at",
        "2",
        "--parallel",
        "tensor",
        "--optimizer-step",
        "flat",
    )
    single(tiny_data, tmp_path / "a", *TP, "--updates", "4", "--resume", "latest")
    assert_close_weights(weights(tmp_path / "one", 4), weights(tmp_path / "a", 4))
    # ...and the other way: one rank for two updates, two tensor-parallel ranks on from there.
    single(tiny_data, tmp_path / "b", *TP, "--updates", "4", "--stop-at", "2")
    launch(
        2,
        tiny_data,
        tmp_path / "b",
        *TP,
        "--updates",
        "4",
        "--resume",
        "latest",
        "--parallel",
        "tensor",
    )
    assert_close_weights(weights(tmp_path / "one", 4), weights(tmp_path / "b", 4))


def test_a_tensor_parallel_checkpoint_samples_and_exports(tiny_data, tmp_path):
    run = tmp_path / "tp"
    launch(2, tiny_data, run, *TP, "--updates", "2", "--parallel", "tensor")
    out = run_fleet("sample", str(run), "--latest", "--prompt", "def ", "--tokens", "8")
    assert out.stdout.startswith("def ")
    run_fleet("export", str(run), "--latest", "--out", str(tmp_path / "model"))
    assert (tmp_path / "model" / "config.json").exists()


def test_replicas_of_tensor_groups_over_mpi_train_what_one_rank_trains(tiny_data, tmp_path):
    # tensor:2 over 4 ranks: two replicas of two tensor-parallel ranks, with unequal local
    # batches (3 and 1) against one rank's 4. MPI splits groups (ring cannot).
    from mlx._distributed_utils.launch import get_mpi_libname

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        if os.environ.get("CI"):
            pytest.fail("mpirun missing in CI (.ci/run installs openmpi-bin)")
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    single(tiny_data, tmp_path / "one", *TP, "--updates", "2")
    env = fleet_env(
        MLX_MPI_LIBNAME=get_mpi_libname() or "libmpi.so",
        OMPI_MCA_btl_vader_single_copy_mechanism="none",
    )
    exported = [
        a
        for k in ("MLX_MPI_LIBNAME", "PYTHONPATH", "LD_PRELOAD", "FLEET_BLAS")
        if k in env
        for a in ("-x", k)
    ]
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    run = tmp_path / "mpi"
    proc = subprocess.run(
        [mpirun, *root, "--oversubscribe", "-np", "4", *exported, sys.executable, "-m",
         "fleet.cli", "train", "--data", str(tiny_data), "--run-dir", str(run), *TP,
         "--local-batches", "3,1", "--updates", "2", "--parallel", "tensor:2"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 replicas of 2 tensor-parallel ranks, split [3, 1]" in proc.stdout
    assert_close_weights(weights(tmp_path / "one", 2), weights(run, 2))
