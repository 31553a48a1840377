"""Checkpoints: atomic, verified, exact on resume, refused when corrupt or foreign."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from fleet.cli import main as fleet
from telemetry.arrowlog import read_updates
from trainer import checkpoint

TINY = ["--depth", "2", "--width", "64", "--heads", "2", "--telemetry-port-base", "0"]


def train(data: Path, run: Path, *extra: str) -> int:
    return fleet(
        [
            "train",
            "--data",
            str(data),
            "--run-dir",
            str(run),
            *TINY,
            "--local-batch",
            "3",
            "--accum",
            "2",
            "--seed",
            "1",
            *extra,
        ]
    )


def weights(path: Path) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in mx.load(str(path / checkpoint.WEIGHTS)).items()}


def losses(run: Path) -> dict[int, float]:
    table = read_updates(run, 0).to_pydict()
    return dict(zip(table["step"], table["loss"], strict=True))


def tree_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


@pytest.fixture(scope="module")
def interrupted(tiny_data, tmp_path_factory):
    """One run of 6 updates straight through; one stopped at 3 and resumed to 6."""
    root = tmp_path_factory.mktemp("runs")
    straight, split = root / "straight", root / "split"
    assert (
        train(tiny_data, straight, "--updates", "6", "--eval-every", "3", "--checkpoint-every", "3")
        == 0
    )
    assert train(tiny_data, split, "--updates", "6", "--stop-at", "3", "--eval-every", "3") == 0
    assert checkpoint.resolve(split, "latest")[0].name == "step-000003"
    before = tree_hashes(split / "checkpoints" / "step-000003")
    assert fleet(["train", "--resume", "latest", "--run-dir", str(split)]) == 0
    return straight, split, before


def test_resume_is_exact(interrupted):
    straight, split, _ = interrupted
    a = weights(checkpoint.step_dir(straight, 6))
    b = weights(checkpoint.step_dir(split, 6))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-9, err_msg=name)
    la, lb = losses(straight), losses(split)
    assert sorted(lb) == list(range(1, 7))  # the log kept the first leg and the resumed one
    for step in range(1, 7):
        assert lb[step] == pytest.approx(la[step], rel=1e-6), step
    sa = json.loads((checkpoint.step_dir(straight, 6) / "state.json").read_text())
    sb = json.loads((checkpoint.step_dir(split, 6) / "state.json").read_text())
    assert (sa["cursor"], sa["tokens"]) == (sb["cursor"], sb["tokens"])


def test_resume_never_modifies_the_original(interrupted):
    _, split, before = interrupted
    assert tree_hashes(split / "checkpoints" / "step-000003") == before


def test_manifest_lists_every_file_with_its_digest(interrupted):
    straight, _, _ = interrupted
    path = checkpoint.step_dir(straight, 6)
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == entry["sha256"]
        assert (path / name).stat().st_size == entry["size"]
    assert manifest["architecture"]["depth"] == 2
    assert manifest["global_batch"] == {"microbatch": 3, "accum": 2}
    assert manifest["replicas_agree"] is True
    state = json.loads((path / checkpoint.STATE).read_text())
    assert state["step"] == 6 and state["cursor"] == 6 * 3 * 2 and state["split"] == [3]


def _copy_run(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.mark.parametrize(
    "damage, file",
    [
        ("truncate", checkpoint.WEIGHTS),
        ("flip", checkpoint.OPTIMIZER),
        ("flip", checkpoint.STATE),
        ("delete", checkpoint.MANIFEST),
    ],
)
def test_damaged_checkpoint_is_named_and_latest_falls_back(interrupted, tmp_path, damage, file):
    straight, _, _ = interrupted
    run = _copy_run(straight, tmp_path / "run")
    newest = checkpoint.step_dir(run, 6)
    target = newest / file
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    with pytest.raises(checkpoint.CheckpointError, match=file.replace(".", r"\.")):
        checkpoint.verify(newest)
    path, _, warnings = checkpoint.resolve(run, "latest")
    assert path.name == "step-000003"
    assert any("step-000006" in w for w in warnings)


def test_explicit_corrupt_checkpoint_is_refused_by_train(interrupted, tmp_path, capsys):
    straight, _, _ = interrupted
    run = _copy_run(straight, tmp_path / "run")
    target = checkpoint.step_dir(run, 6) / checkpoint.WEIGHTS
    target.write_bytes(target.read_bytes()[:100])
    rc = fleet(["train", "--resume", str(checkpoint.step_dir(run, 6)), "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert rc == 2
    assert "weights.safetensors" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "flags, what",
    [
        (["--depth", "3"], "model architecture"),
        (["--local-batch", "4"], "global batch"),
        (["--accum", "3"], "global batch"),
    ],
)
def test_resume_refuses_a_different_run(interrupted, tmp_path, capsys, flags, what):
    straight, _, _ = interrupted
    run = _copy_run(straight, tmp_path / "run")
    rc = fleet(["train", "--resume", "latest", "--run-dir", str(run), "--updates", "8", *flags])
    assert rc == 2
    assert what in capsys.readouterr().err


def test_resume_refuses_a_different_dataset(interrupted, tmp_path, capsys):
    from trainer.prepare import PrepareConfig, prepare

    straight, _, _ = interrupted
    other = tmp_path / "other-data"
    prepare(PrepareConfig(out=other, stdlib=True, max_files=3, seq_len=32, rows_per_group=64))
    run = _copy_run(straight, tmp_path / "run")
    rc = fleet(["train", "--resume", "latest", "--run-dir", str(run), "--data", str(other)])
    assert rc == 2
    assert "dataset" in capsys.readouterr().err


def test_orphaned_temporary_folders_are_cleared_and_ignored(tiny_data, tmp_path):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    orphan = ckpts / ".tmp-step-000009-12345"
    orphan.mkdir(parents=True)
    (orphan / checkpoint.WEIGHTS).write_bytes(b"half")
    incomplete = ckpts / "step-000009"  # a folder without a manifest: never completed
    incomplete.mkdir()
    assert checkpoint.complete(run) == []
    assert train(tiny_data, run, "--updates", "1") == 0
    assert not orphan.exists()
    assert [p.name for p in checkpoint.complete(run)] == ["step-000001"]


def test_save_is_atomic_and_prunes(tmp_path):
    params = {"w": mx.arange(6, dtype=mx.float32).reshape(2, 3)}
    opt = {"step": mx.array(1, dtype=mx.uint64), "w": {"m": mx.zeros((2, 3))}}
    ident = {"architecture": {"d": 1}, "tokenizer": {}, "dataset": "x", "global_batch": {}}
    for step in (1, 2, 3, 4):
        checkpoint.save(
            tmp_path,
            step,
            params=params,
            optimizer_state=opt,
            state={"step": step},
            config={},
            identity=ident,
            keep=2,
        )
    names = [p.name for p in checkpoint.complete(tmp_path)]
    assert names == ["step-000003", "step-000004"]
    link = checkpoint.root(tmp_path) / checkpoint.LATEST
    assert os.readlink(link) == "step-000004"
    assert not [p for p in checkpoint.root(tmp_path).iterdir() if p.name.startswith(".tmp-")]
    loaded, opt_loaded = checkpoint.load_arrays(checkpoint.step_dir(tmp_path, 4))
    assert np.array_equal(np.array(loaded["w"]), np.array(params["w"]))
    assert int(opt_loaded["step"].item()) == 1


def test_replica_digest_sees_one_bit():
    a = {"w": mx.ones((4, 4))}
    b = {"w": mx.ones((4, 4)) + mx.array(1e-7)}
    c = {"w": mx.ones((4, 4), dtype=mx.bfloat16)}
    assert checkpoint.replica_digest(a) == checkpoint.replica_digest({"w": mx.ones((4, 4))})
    assert checkpoint.replica_digest(a) != checkpoint.replica_digest(b)
    assert checkpoint.replica_digest(a) != checkpoint.replica_digest(c)
