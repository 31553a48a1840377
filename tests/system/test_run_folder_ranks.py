"""Every rank refuses a run folder that holds a run on its own (issue 18, defect 1), also when
nothing checked it first (mlx.launch started directly, as `fleet launch --hostfile --no-check`
does on other hosts); with --overwrite the ranks sharing a folder move it aside once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.files import snapshot
from tests.support.fleet import ROOT, fleet_env, free_port
from tests.support.ranks import TINY, single
from trainer.checkpoint import catalog

pytestmark = pytest.mark.slow


def mlx_launch(n: int, data, run, *train_args: str) -> subprocess.CompletedProcess:
    """N ranks under mlx.launch itself: no `fleet launch` plan checks the folder first."""
    argv = [
        *(sys.executable, "-c", "from mlx._distributed_utils.launch import main; main()"),
        *("--python", sys.executable, "--starting-port", str(free_port(n + 1)), "-n", str(n)),
        *("--", "-m", "fleet.cli", "train", "--data", str(data), "--run-dir", str(run)),
        *(*TINY, "--local-batch", "2", *train_args),
    ]
    env = fleet_env(FLEET_BACKEND="ring", OPENBLAS_NUM_THREADS="1")
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_every_rank_refuses_and_one_says_why(tiny_data, tmp_path):
    run = tmp_path / "run1"
    single(tiny_data, run, "--updates", "2", "--local-batch", "4")
    before = snapshot(run)
    out = mlx_launch(2, tiny_data, run, "--updates", "2")
    text = out.stdout + out.stderr
    assert text.count("already holds a run") == 1, text  # rank 0 speaks for both
    assert "rank 0: error:" in text
    assert "rank 1" not in text.replace("Node with rank 1", ""), text
    assert snapshot(run) == before
    assert "done:" not in text


def test_overwrite_moves_the_folder_once_for_the_ranks_that_share_it(tiny_data, tmp_path):
    run = tmp_path / "run1"
    single(tiny_data, run, "--updates", "2", "--local-batch", "4")
    before = snapshot(run)
    out = mlx_launch(2, tiny_data, run, "--updates", "3", "--overwrite")
    text = out.stdout + out.stderr
    assert "done: 3 updates" in text, text
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run1.old-")]
    assert len(aside) == 1 and snapshot(aside[0]) == before
    assert catalog.resolve(run, "latest")[1]["step"] == 3
