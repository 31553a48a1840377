"""--shard-optimizer on real ranks over ring: the same weights as an unsharded run, bit for bit;
one logical checkpoint that resumes sharded, with new shares, on fewer ranks, unsharded, and
exports; every rank's share and resident bytes in its telemetry (slow)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from telemetry.arrowlog import read_updates
from tests.support.fleet import run_fleet
from tests.support.ranks import assert_same_weights, launch, single, weights
from trainer.checkpoint import catalog

pytestmark = pytest.mark.slow

SHARDED = ("--shard-optimizer", "--optimizer-shares", "2,1,1")


def _arrays(run, step: int, name: str) -> dict[str, mx.array]:
    return mx.load(str(catalog.step_dir(run, step) / name))


def _assert_bit_identical(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert mx.array_equal(a[k], b[k]).item(), k
        if a[k].dtype == mx.float32:  # as bits: -0.0 and NaN payloads included
            assert np.array_equal(np.array(a[k]).view(np.uint32), np.array(b[k]).view(np.uint32))


@pytest.mark.parametrize("precision, optimizer", [("fp32", "adamw"), ("mixed", "muon")])
def test_sharded_updates_are_bit_identical_to_unsharded(tiny_data, tmp_path, precision, optimizer):
    common = ("--local-batches", "3,2,1", "--updates", "3", "--precision", precision)
    common += ("--optimizer", optimizer)
    launch(3, tiny_data, tmp_path / "whole", *common)
    launch(3, tiny_data, tmp_path / "sharded", *common, *SHARDED)
    for name in (catalog.WEIGHTS, catalog.OPTIMIZER):  # one logical checkpoint, the same bytes
        _assert_bit_identical(
            _arrays(tmp_path / "whole", 3, name), _arrays(tmp_path / "sharded", 3, name)
        )
    manifest = catalog.verify(catalog.step_dir(tmp_path / "sharded", 3))
    assert manifest["replicas_agree"] is True
    # every rank says what it steps and holds; shares 2,1,1 hold about half and a quarter
    table = read_updates(tmp_path / "sharded").to_pylist()
    last = {r["rank"]: r for r in table if r["step"] == 3}
    shares = [last[r]["opt_share"] for r in range(3)]
    assert sum(shares) == pytest.approx(1.0) and shares[0] > shares[1] > 0 and shares[2] > 0
    whole = {r["rank"]: r for r in read_updates(tmp_path / "whole").to_pylist() if r["step"] == 3}
    assert {whole[r]["opt_share"] for r in range(3)} == {1.0}
    if precision == "mixed":  # the FP32 masters and AdamW/Muon state: the share's only
        for r in range(3):
            assert last[r]["resident_mem"] < 0.8 * whole[r]["resident_mem"]
        assert last[1]["resident_mem"] < 0.6 * last[0]["resident_mem"] + 1


def test_a_sharded_checkpoint_resumes_anyhow_and_exports(tiny_data, tmp_path):
    """Sharded on 3 ranks, then sharded on 2 with new shares, then unsharded on 1: the
    weights of a straight unsharded run (fp32; the splits' summation orders differ)."""
    run, both = tmp_path / "legs", ("--updates", "4", "--checkpoint-every", "1")
    single(tiny_data, tmp_path / "straight", "--local-batch", "6", *both)
    launch(3, tiny_data, run, "--local-batches", "3,2,1", *both, *SHARDED, "--stop-at", "2")
    proc = launch(
        2, tiny_data, run, "--resume", "latest", "--local-batches", "4,2", "--stop-at", "3",
        "--shard-optimizer", "--optimizer-shares", "1,3",
    )  # fmt: skip
    assert "resumed from" in proc.stdout and "steps 25.0% of it" in proc.stdout
    single(tiny_data, run, "--resume", "latest", "--local-batches", "6", "--no-shard-optimizer")
    for step in (2, 3, 4):
        assert_same_weights(weights(tmp_path / "straight", step), weights(run, step))
    out = tmp_path / "exported"
    run_fleet("export", str(run), "--out", str(out))
    assert (out / "config.json").is_file()


def test_shares_that_do_not_fit_the_world_are_refused_in_one_line(tiny_data, tmp_path):
    proc = launch(
        3, tiny_data, tmp_path / "r", "--local-batches", "2,2,2", "--shard-optimizer",
        "--optimizer-shares", "4,1", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--optimizer-shares has 2 values (4,1) but the run has 3 rank(s)" in proc.stderr
