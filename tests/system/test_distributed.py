"""Real ranks over MLX's ring backend on localhost: the split never changes the math."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys

import numpy as np
import psutil
import pytest

from tests.support.fleet import fleet_env, free_port, launch_args, run_fleet
from tests.support.ranks import (
    TINY,
    assert_same_weights,
    launch,
    rank_pid,
    single,
    start,
    wait_for_updates,
    weights,
)

pytestmark = pytest.mark.slow


def test_any_split_of_the_global_batch_gives_the_same_update(tiny_data, tmp_path):
    both = ("--updates", "2", "--checkpoint-every", "1")
    single(tiny_data, tmp_path / "whole", "--local-batch", "6", *both)
    for split, buckets in (("3,2,1", "0"), ("1,2,3", "0.05")):  # one bucket, then many
        run = tmp_path / split.replace(",", "-")
        launch(3, tiny_data, run, "--local-batches", split, "--allreduce-bucket-mb", buckets, *both)
        for step in (1, 2):
            assert_same_weights(weights(tmp_path / "whole", step), weights(run, step))
    # The updates really moved every weight (zero-initialized projections move in update 1,
    # the rest from update 2), so the comparison is not one of initial values.
    still = tmp_path / "still"
    single(tiny_data, still, "--local-batch", "6", *both, "--lr", "1e-12", "--weight-decay", "0")
    reference, initial = weights(tmp_path / "whole", 2), weights(still, 2)
    moved = [
        k for k in reference if not np.allclose(reference[k], initial[k], atol=1e-5, rtol=1e-4)
    ]
    assert moved == list(reference)


def test_ranks_with_overlap_train_the_weights_of_one_rank(tiny_data, tmp_path):
    """--overlap on (the next update's first microstep built during the step; auto leaves it
    off on the CPU) on two real ranks over ring, two microsteps an update and a checkpoint
    every update: the replicas agree (checked at each save) and the weights are one rank's."""
    both = ("--updates", "3", "--checkpoint-every", "1", "--accum", "2")
    single(tiny_data, tmp_path / "whole", "--local-batch", "3", *both)
    run = tmp_path / "overlap"
    launch(2, tiny_data, run, "--local-batches", "2,1", "--overlap", "on", *both)
    for step in (1, 2, 3):
        assert_same_weights(weights(tmp_path / "whole", step), weights(run, step))


def test_resume_on_a_different_split_is_exact(tiny_data, tmp_path):
    single(tiny_data, tmp_path / "straight", "--local-batch", "6", "--updates", "3")
    legs = tmp_path / "legs"
    single(tiny_data, legs, "--local-batch", "6", "--updates", "3", "--stop-at", "1")
    proc = run_fleet(
        "launch",
        "-n",
        "2",
        "--starting-port",
        str(free_port(3)),
        "--",
        "train",
        "--resume",
        "latest",
        "--run-dir",
        str(legs),
        "--local-batches",
        "4,2",
        "--telemetry-port-base",
        "0",
    )
    assert "resumed from" in proc.stdout
    assert_same_weights(weights(tmp_path / "straight", 3), weights(legs, 3))


def test_launch_refuses_a_split_that_does_not_match_the_world(tiny_data, tmp_path):
    proc = launch(3, tiny_data, tmp_path / "r", "--local-batches", "3,3", check=False)
    assert proc.returncode == 2
    assert "--local-batches has 2 values" in proc.stderr and "Traceback" not in proc.stderr


def test_launch_refuses_a_bad_hostfile(tmp_path):
    bad = tmp_path / "hosts.json"
    bad.write_text('[{"ssh": "a", "ips": ["127.0.0.1"]}, {"ips": []}]')
    proc = run_fleet("launch", "--hostfile", str(bad), "--", "train", "--synthetic", check=False)
    assert proc.returncode == 2 and "entry 1 needs an `ssh` host name" in proc.stderr
    bad.write_text("{not json")
    proc = run_fleet("launch", "--hostfile", str(bad), "--", "train", "--synthetic", check=False)
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr


def test_a_killed_rank_is_named_and_the_others_exit(tiny_data, tmp_path):
    run = tmp_path / "run"
    proc = start(tiny_data, run)
    try:
        victim = rank_pid(run, 2)
        wait_for_updates(run)
        psutil.Process(victim).kill()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "rank 2 failed first" in err
    assert "lost contact with a peer rank" in err  # the survivors' own diagnosis
    assert "Traceback" not in err


def test_a_stalled_rank_trips_the_watchdog(tiny_data, tmp_path):
    run = tmp_path / "run"
    proc = start(tiny_data, run, "--collective-timeout", "4", grace="3")
    victim = None
    try:
        victim = rank_pid(run, 1)
        wait_for_updates(run)
        psutil.Process(victim).send_signal(signal.SIGSTOP)  # a hung or swapping machine
        # The others' watchdogs fire; mlx.launch would wait on the stopped rank forever, so
        # fleet launch ends it as soon as its heartbeat shows it stalled, and names it (not
        # the healthy rank whose watchdog fired first).
        _, err = proc.communicate(timeout=90)
        assert "no progress for" in err and "--collective-timeout 4" in err
        assert "fleet launch: rank 1 stopped responding" in err
        assert "the stalled rank was ended" in err
        assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == "zombie"
    finally:
        if victim is not None and psutil.pid_exists(victim):
            psutil.Process(victim).kill()
        proc.kill()
    assert proc.returncode == 1


def test_bench_balance_measures_scaling_and_allreduce_bandwidth(tmp_path):
    import json

    from trainer.model.config import ModelConfig
    from trainer.model.gpt import GPT

    proc = run_fleet(
        *("bench", "balance", "-n", "2", "--variant", "2,2", "--scaling", "--json"),
        *("--depth", "1", "--width", "64", "--heads", "2", "--vocab", "256", "--seq-len", "32"),
        *("--updates", "2", "--warmup", "1", "--device", "cpu", "--run-dir", str(tmp_path)),
        *("--starting-port", str(free_port()), "--train-args=--allreduce-bucket-mb 0.01"),
    )
    out = json.loads(proc.stdout)
    (row,) = out["variants"]
    assert row["split"] == [2, 2] and len(row["transfer_s"]) == 2 == len(row["optimizer_s"])
    params = GPT(ModelConfig.from_sizes(depth=1, width=64, heads=2, vocab=256, seq_len=32))
    assert row["allreduce"]["bytes"] == 4 * params.num_params()
    assert row["allreduce"]["busbw_GBps"] > 0
    scaling = out["scaling"]
    assert scaling["one_rank_split"] == [2]
    assert scaling["speedup"] == row["tokens_per_s"] / scaling["one_rank_tokens_per_s"]
    # The baseline ran the same loop on one rank: its own run folder and Arrow log exist.
    assert (tmp_path / "one-rank-2").is_dir()
    assert (tmp_path / "balance.csv").read_text().count("\n") == 2


def test_ranks_under_plain_mpirun_train_the_same_model(tiny_data, tmp_path):
    # MPI, the backend of clusters: `fleet train` started by mpirun itself (Debian's Open MPI
    # 4 lacks an option mlx.launch passes to mpirun, so this is how MPI runs there).
    from mlx._distributed_utils.launch import get_mpi_libname

    mpirun = shutil.which("mpirun")
    if mpirun is None:
        if os.environ.get("CI"):
            pytest.fail("mpirun missing in CI (.ci/run installs openmpi-bin)")
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    both = ("--updates", "2", "--checkpoint-every", "1")
    single(tiny_data, tmp_path / "whole", "--local-batch", "6", *both)
    run = tmp_path / "mpi"
    # Containers often forbid the cross-process memory copy Open MPI's shared-memory
    # transport tries first; "none" makes it copy through shared memory instead.
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
    proc = subprocess.run(
        [
            mpirun,
            *root,
            "--oversubscribe",
            "-np",
            "3",
            *exported,
            sys.executable,
            "-m",
            "fleet.cli",
            "train",
            "--data",
            str(tiny_data),
            "--run-dir",
            str(run),
            "--local-batches",
            "3,2,1",
            *TINY,
            *both,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "3 rank(s), split [3, 2, 1]" in proc.stdout
    for step in (1, 2):
        assert_same_weights(weights(tmp_path / "whole", step), weights(run, step))


def test_a_port_clash_names_its_rank_last_without_the_peers_noise(tiny_data, tmp_path):
    # issue 18: rank 1's telemetry port is taken; its peers lose it in their first collective
    base = free_port(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        proc = run_fleet(
            *launch_args(3, tiny_data, tmp_path / "r", *TINY[:-2], "--updates", "3"),
            "--telemetry-port-base",
            str(base),
            check=False,
        )
    err = proc.stderr
    assert proc.returncode == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("fleet launch: rank 1 failed first"), err[-3000:]
    assert f"telemetry port {base + 1} on 127.0.0.1 is taken" in last
    assert "Nothing was saved yet" in last and "--resume" not in err  # nothing to resume
    assert err.count("[ring]") <= 1 and "lost contact" not in err
