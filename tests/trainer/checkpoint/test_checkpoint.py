"""Checkpoints: atomic, verified, exact on resume, refused when corrupt or foreign."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from fleet.cli import main as fleet
from telemetry.arrowlog import read_updates
from trainer.checkpoint import catalog, store
from trainer.checkpoint.manifest import digest as manifest_digest

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
    return {k: np.array(v) for k, v in mx.load(str(path / catalog.WEIGHTS)).items()}


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
    assert catalog.resolve(split, "latest")[0].name == "step-000003"
    before = tree_hashes(split / "checkpoints" / "step-000003")
    assert fleet(["train", "--resume", "latest", "--run-dir", str(split)]) == 0
    return straight, split, before


def test_resume_is_exact(interrupted):
    straight, split, _ = interrupted
    a = weights(catalog.step_dir(straight, 6))
    b = weights(catalog.step_dir(split, 6))
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-9, err_msg=name)
    la, lb = losses(straight), losses(split)
    assert sorted(lb) == list(range(1, 7))  # the log kept the first leg and the resumed one
    for step in range(1, 7):
        assert lb[step] == pytest.approx(la[step], rel=1e-6), step
    sa = json.loads((catalog.step_dir(straight, 6) / "state.json").read_text())
    sb = json.loads((catalog.step_dir(split, 6) / "state.json").read_text())
    assert (sa["cursor"], sa["tokens"]) == (sb["cursor"], sb["tokens"])


def test_resume_never_modifies_the_original(interrupted):
    _, split, before = interrupted
    assert tree_hashes(split / "checkpoints" / "step-000003") == before


def test_manifest_lists_every_file_with_its_digest(interrupted):
    straight, _, _ = interrupted
    path = catalog.step_dir(straight, 6)
    manifest = json.loads((path / catalog.MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        assert hashlib.sha256((path / name).read_bytes()).hexdigest() == entry["sha256"]
        assert (path / name).stat().st_size == entry["size"]
    assert manifest["architecture"]["depth"] == 2
    assert manifest["global_batch"] == {"microbatch": 3, "accum": 2}
    assert manifest["replicas_agree"] is True
    state = json.loads((path / catalog.STATE).read_text())
    assert state["step"] == 6 and state["cursor"] == 6 * 3 * 2 and state["split"] == [3]


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.mark.parametrize(
    "damage, file",
    [
        ("truncate", catalog.WEIGHTS),
        ("flip", catalog.OPTIMIZER),
        ("flip", catalog.STATE),
        ("delete", catalog.MANIFEST),
    ],
)
def test_damaged_checkpoint_is_named_and_latest_falls_back(interrupted, tmp_path, damage, file):
    straight, _, _ = interrupted
    run = _copy_run(straight, tmp_path / "run")
    newest = catalog.step_dir(run, 6)
    target = newest / file
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    elif damage == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    else:
        target.unlink()
    with pytest.raises(catalog.CheckpointError, match=file.replace(".", r"\.")):
        catalog.verify(newest)
    path, _, warnings = catalog.resolve(run, "latest")
    assert path.name == "step-000003"
    assert any("step-000006" in w for w in warnings)


def test_explicit_corrupt_checkpoint_is_refused_by_train(interrupted, tmp_path, capsys):
    straight, _, _ = interrupted
    run = _copy_run(straight, tmp_path / "run")
    target = catalog.step_dir(run, 6) / catalog.WEIGHTS
    target.write_bytes(target.read_bytes()[:100])
    rc = fleet(["train", "--resume", str(catalog.step_dir(run, 6)), "--run-dir", str(run)])
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
    from trainer.data.prepare import PrepareConfig, prepare

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
    (orphan / catalog.WEIGHTS).write_bytes(b"half")
    incomplete = ckpts / "step-000009"  # a folder without a manifest: never completed
    incomplete.mkdir()
    assert catalog.complete(run) == []
    assert train(tiny_data, run, "--updates", "1") == 0
    assert not orphan.exists()
    assert [p.name for p in catalog.complete(run)] == ["step-000001"]


def test_save_is_atomic_and_prunes(tmp_path):
    params = {"w": mx.arange(6, dtype=mx.float32).reshape(2, 3)}
    opt = {"step": mx.array(1, dtype=mx.uint64), "w": {"m": mx.zeros((2, 3))}}
    ident = {"architecture": {"d": 1}, "tokenizer": {}, "dataset": "x", "global_batch": {}}
    for step in (1, 2, 3, 4):
        store.save(
            tmp_path,
            step,
            params=params,
            optimizer_state=opt,
            state={"step": step},
            config={},
            identity=ident,
            keep=2,
        )
    names = [p.name for p in catalog.complete(tmp_path)]
    assert names == ["step-000003", "step-000004"]
    link = catalog.root(tmp_path) / catalog.LATEST
    assert os.readlink(link) == "step-000004"
    assert not [p for p in catalog.root(tmp_path).iterdir() if p.name.startswith(".tmp-")]
    loaded, opt_loaded = store.load_arrays(catalog.step_dir(tmp_path, 4))
    assert np.array_equal(np.array(loaded["w"]), np.array(params["w"]))
    assert int(opt_loaded["step"].item()) == 1


def test_replica_digest_sees_one_bit():
    a = {"w": mx.ones((4, 4))}
    b = {"w": mx.ones((4, 4)) + mx.array(1e-7)}
    c = {"w": mx.ones((4, 4), dtype=mx.bfloat16)}
    assert store.replica_digest(a) == store.replica_digest({"w": mx.ones((4, 4))})
    assert store.replica_digest(a) != store.replica_digest(b)
    assert store.replica_digest(a) != store.replica_digest(c)


# --- crash-proof saves: a kill at any file operation (issue 11, defects 2-5) ---------------
IDENT = {"architecture": {"d": 1}, "tokenizer": {}, "dataset": "x", "global_batch": {}}


def tiny_save(run: Path, step: int, version: str = "a", *, agree: bool = True, keep: int = 0):
    """A tiny checkpoint: weights depend on the step, state on the version (a rebalance)."""
    return store.save(
        run,
        step,
        params={"w": mx.full((2, 3), float(step))},
        optimizer_state={"step": mx.array(step, dtype=mx.uint64)},
        state={"step": step, "version": version},
        config={},
        identity={**IDENT, "replicas_agree": agree},
        keep=keep,
        make_latest=agree,
    )


class Killed(BaseException):
    """A kill -9 at a file operation: a BaseException, so no `except OSError` swallows it."""


class Faults:
    """Counts file operations and raises Killed instead of performing the `at`-th one.

    fsync is counted but not performed: a killed process loses nothing the page cache holds,
    and a thousand real fsyncs would make this test slow.
    """

    OPS = ("rename", "replace", "symlink", "unlink", "rmdir", "mkdir", "fsync")

    def __init__(self, mp: pytest.MonkeyPatch, at: int = 0) -> None:
        self.at, self.count = at, 0
        for name in self.OPS:
            real = (lambda fd: None) if name == "fsync" else getattr(os, name)
            mp.setattr(os, name, self._wrap(real))
        mp.setattr(mx, "save_safetensors", self._wrap(mx.save_safetensors))

    def _wrap(self, fn):
        def op(*args, **kwargs):
            self.count += 1
            if self.count == self.at:
                raise Killed(f"killed at file operation {self.at} ({fn.__name__})")
            return fn(*args, **kwargs)

        return op


# step, version, replicas agree: a new step, the same step saved again unchanged (a stop right
# after a periodic save), again with another state (a rebalance while paused), older steps
# saved again (a run resumed from an older checkpoint: unchanged, then changed), and a save
# whose replicas disagreed (never latest).
PLAN = [(1, "a", True), (2, "a", True), (2, "a", True), (2, "b", True), (3, "a", True)]
PLAN += [(3, "a", True), (2, "b", True), (1, "r", True), (4, "a", False)]


def kill_every_operation(tmp_path: Path, keep: int):
    """For a kill at each file operation of PLAN in turn: (run folder, saves that returned).

    PLAN runs once, keeping a copy of the folder as it was before each save; each kill then
    replays only the save it cuts short, on a copy of that.
    """
    base, before, counts = tmp_path / "base", [], []
    for j, entry in enumerate(PLAN):
        before.append(tmp_path / f"before-{j}")
        if base.exists():
            shutil.copytree(base, before[j], symlinks=True)
        with pytest.MonkeyPatch.context() as mp:
            faults = Faults(mp)
            tiny_save(base, *entry[:2], agree=entry[2], keep=keep)
        counts.append(faults.count)
    for j, entry in enumerate(PLAN):
        for at in range(1, counts[j] + 1):
            run = tmp_path / f"kill-{j}-{at}"
            if before[j].exists():  # hard links: a save never writes into an existing file
                shutil.copytree(before[j], run, symlinks=True, copy_function=os.link)
            with pytest.MonkeyPatch.context() as mp, pytest.raises(Killed):
                Faults(mp, at)
                tiny_save(run, *entry[:2], agree=entry[2], keep=keep)
            yield run, PLAN[:j], f"killed at file operation {at} of {counts[j]} of {entry}"


def verified_copies(run: Path) -> dict[int, set[str]]:
    """Every folder that verifies, whatever its name: {step: {versions}}."""
    found: dict[int, set[str]] = {}
    folders = catalog.root(run).iterdir() if catalog.root(run).is_dir() else []
    for p in folders:
        try:
            manifest = catalog.verify(p)
        except catalog.CheckpointError:
            continue
        version = catalog.read_json(p, catalog.STATE)["version"]
        found.setdefault(manifest["step"], set()).add(version)
    return found


@pytest.mark.parametrize("keep", [0, 1])
def test_a_kill_at_any_file_operation_keeps_the_newest_checkpoint(tmp_path, keep):
    kills = 0
    for run, done, where in kill_every_operation(tmp_path, keep):
        kills += 1
        flying = PLAN[len(done)]
        before = verified_copies(run)
        last = [(s, v) for s, v, agree in done if agree][-1:]
        newest = last[0][0] if last else None  # the last save that returned, not the top step
        if newest is None:
            with contextlib.suppress(catalog.CheckpointError):
                catalog.resolve(run, "latest")
            continue
        # at the instant of the kill a complete, verified copy of the newest one exists (or
        # of the one being saved: a kill while pruning comes after its folder is in place)
        assert newest in before or (flying[2] and flying[0] in before), where
        link = catalog.root(run) / catalog.LATEST
        named = os.readlink(link) if link.is_symlink() else None
        path, manifest, warnings = catalog.resolve(run, "latest")
        version = catalog.read_json(path, catalog.STATE)["version"]
        allowed = set(last) | ({flying[:2]} if flying[2] else set())
        assert (manifest["step"], version) in allowed, where
        assert manifest["replicas_agree"] is True, where
        if named != path.name:  # `latest` did not name it: a warning says what was taken
            assert any(path.name in w for w in warnings), (where, warnings)
        # start-up clean-up (after the resolve, as `fleet train` does) loses nothing verified
        catalog.clear_orphans(run)
        catalog.verify(path)
        after = verified_copies(run)
        for step in before:
            assert catalog.verify(catalog.step_dir(run, step))["step"] == step, where
        assert set(after) == set(before), where
        assert catalog.resolve(run, "latest")[0] == path, where
    assert kills > 150


def test_saving_a_step_again_unchanged_renames_nothing(tmp_path, monkeypatch):
    tiny_save(tmp_path, 1)
    folder = catalog.step_dir(tmp_path, 1)
    inode = folder.stat().st_ino
    renames = []
    real = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: (renames.append((a, b)), real(a, b)))
    tiny_save(tmp_path, 1, keep=1)
    assert not [r for r in renames if Path(r[0]).name == folder.name]
    assert folder.stat().st_ino == inode
    catalog.verify(folder)
    assert catalog.clear_orphans(tmp_path) == []


def test_a_step_saved_again_with_another_state_replaces_it(tmp_path):
    tiny_save(tmp_path, 1)
    tiny_save(tmp_path, 1, "rebalanced")
    path, _, warnings = catalog.resolve(tmp_path, "latest")
    assert catalog.read_json(path, catalog.STATE)["version"] == "rebalanced"
    assert warnings == []
    assert not [p for p in catalog.root(tmp_path).iterdir() if p.name.startswith(".tmp-")]


def test_latest_left_behind_by_a_kill_resolves_to_the_newer_checkpoint(tmp_path, monkeypatch):
    tiny_save(tmp_path, 1)
    with monkeypatch.context() as mp:
        mp.setattr(store, "point_latest", lambda *a: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            tiny_save(tmp_path, 2)
    assert os.readlink(catalog.root(tmp_path) / catalog.LATEST) == "step-000001"
    path, _, warnings = catalog.resolve(tmp_path, "latest")
    assert path.name == "step-000002"
    assert any("step-000001" in w and "resuming from step-000002" in w for w in warnings)


def test_a_run_resumed_from_an_older_step_keeps_its_own_latest(tmp_path):
    for step in (1, 2, 3):
        tiny_save(tmp_path, step)
    tiny_save(tmp_path, 2, "branch")  # resumed from step 1 with other settings: step 2 differs
    path, _, warnings = catalog.resolve(tmp_path, "latest")
    assert path.name == "step-000002" and warnings == []
    assert catalog.read_json(path, catalog.STATE)["version"] == "branch"


def test_an_older_step_saved_again_unchanged_is_still_the_last_save(tmp_path, monkeypatch):
    tiny_save(tmp_path, 1)
    tiny_save(tmp_path, 2)
    tiny_save(tmp_path, 3, "rebalanced")
    with monkeypatch.context() as mp:  # resumed from step 1, step 2 replayed bit for bit
        mp.setattr(store, "point_latest", lambda *a: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            tiny_save(tmp_path, 2)
    path, _, warnings = catalog.resolve(tmp_path, "latest")
    assert path.name == "step-000002"
    assert any("saved after it" in w and "resuming from step-000002" in w for w in warnings)


def test_clear_orphans_adopts_a_verified_copy_left_between_renames(tmp_path):
    tiny_save(tmp_path, 1)
    tiny_save(tmp_path, 2)
    ckpts = catalog.root(tmp_path)
    parked = ckpts / ".tmp-old-step-000002-999"
    os.rename(catalog.step_dir(tmp_path, 2), parked)  # the kill between a re-save's renames
    assert catalog.clear_orphans(tmp_path) == []
    assert not parked.exists()
    assert catalog.resolve(tmp_path, "latest")[0].name == "step-000002"
    # reported by adopt when start-up asks first
    os.rename(catalog.step_dir(tmp_path, 2), parked)
    assert [(a.name, b.name) for a, b in catalog.adopt(tmp_path)] == [(parked.name, "step-000002")]


def test_clear_orphans_keeps_the_newer_copy_and_removes_a_duplicate(tmp_path):
    tiny_save(tmp_path, 1)
    ckpts = catalog.root(tmp_path)
    shutil.copytree(catalog.step_dir(tmp_path, 1), ckpts / ".tmp-step-000001-999")
    assert [p.name for p in catalog.clear_orphans(tmp_path)] == [".tmp-step-000001-999"]
    # a verified copy beside a corrupt folder of its step takes its place
    tiny_save(tmp_path, 2)
    shutil.copytree(catalog.step_dir(tmp_path, 2), ckpts / ".tmp-step-000002-999")
    (catalog.step_dir(tmp_path, 2) / catalog.WEIGHTS).write_bytes(b"rot")
    removed = catalog.clear_orphans(tmp_path)
    assert [p.name for p in removed] == [f".tmp-corrupt-step-000002-{os.getpid()}"]
    catalog.verify(catalog.step_dir(tmp_path, 2))


def two_checkpoints(run: Path) -> Path:
    """Steps 1 and 2; returns the newest one's manifest path."""
    tiny_save(run, 1)
    tiny_save(run, 2)
    return catalog.step_dir(run, 2) / catalog.MANIFEST


def assert_falls_back(run: Path) -> None:
    path, _, warnings = catalog.resolve(run, "latest")
    assert path.name == "step-000001"
    assert any("skipping step-000002" in w for w in warnings), warnings
    assert any("resuming from step-000001" in w for w in warnings), warnings


MALFORMED = {
    "entry without size": lambda m: m["files"][catalog.WEIGHTS].pop("size"),
    "entry without sha256": lambda m: m["files"][catalog.STATE].pop("sha256"),
    "size as a string": lambda m: m["files"][catalog.STATE].update(size="12"),
    "files as a list": lambda m: m.update(files=list(m["files"].values())),
    "entry as a string": lambda m: m["files"].update({catalog.CONFIG: "deadbeef"}),
    "no files": lambda m: m.pop("files"),
    "no step": lambda m: m.pop("step"),
    "another step": lambda m: m.update(step=7),
    "no format": lambda m: m.pop("format"),
}


@pytest.mark.parametrize("sign", ["digest kept", "digest redone", "old format"])
@pytest.mark.parametrize("damage", MALFORMED)
def test_malformed_manifest_is_corrupt_and_latest_falls_back(tmp_path, damage, sign):
    where = two_checkpoints(tmp_path)
    manifest = json.loads(where.read_text())
    MALFORMED[damage](manifest)
    if sign == "old format":  # a format-1 manifest has no digest: the fields are checked alone
        manifest.pop("digest"), manifest.update(format=1) if "format" in manifest else None
    elif sign == "digest redone":
        manifest["digest"] = manifest_digest(manifest)
    where.write_text(json.dumps(manifest))
    with pytest.raises(catalog.CheckpointError, match="manifest"):
        catalog.verify(where.parent)
    assert_falls_back(tmp_path)


@pytest.mark.parametrize("text", ["[]", '"step"', "null", "{", "\xff"])
def test_manifest_that_is_not_an_object_is_corrupt(tmp_path, text):
    where = two_checkpoints(tmp_path)
    where.write_bytes(text.encode("latin-1"))
    with pytest.raises(catalog.CheckpointError, match="corrupt"):
        catalog.verify(where.parent)
    assert_falls_back(tmp_path)


@pytest.mark.parametrize(
    "field, value",
    [
        ("architecture", {"d": 2}),
        ("dataset", "y"),
        ("tokenizer", {"vocab": 1}),
        ("global_batch", {"accum": 9}),
        ("replicas_agree", False),
        ("serial", 99),
    ],
)
def test_a_damaged_manifest_field_fails_its_digest(tmp_path, field, value):
    where = two_checkpoints(tmp_path)
    manifest = json.loads(where.read_text())
    manifest[field] = value
    where.write_text(json.dumps(manifest))
    with pytest.raises(catalog.CheckpointError, match="own digest"):
        catalog.verify(where.parent)
    assert_falls_back(tmp_path)


def flip_trials(tmp_path: Path, flips) -> None:
    """Apply each damage to the newest manifest; resolve must fall back, or read the same."""
    where = two_checkpoints(tmp_path)
    original = where.read_bytes()
    parsed = json.loads(original)
    for n, damage in enumerate(flips):
        data = bytearray(original)
        damage(data)
        where.write_bytes(bytes(data))
        try:
            path, manifest, warnings = catalog.resolve(tmp_path, "latest")
        except catalog.CheckpointError as e:  # allowed, but step 1 is intact: never expected
            raise AssertionError(f"trial {n}: no fallback: {e}") from None
        if path.name == "step-000002":  # only a change that reads as the very same manifest
            assert manifest == parsed, f"trial {n}: took the damaged manifest"
        else:
            assert path.name == "step-000001", n
            assert any("step-000002" in w for w in warnings), (n, warnings)
    where.write_bytes(original)


def test_any_single_bit_flip_in_the_manifest_falls_back(tmp_path):
    rng = random.Random(11)
    size = len((two_checkpoints(tmp_path / "probe")).read_bytes())
    bits = rng.sample(range(size * 8), 600)

    def flip(bit: int):
        return lambda data: data.__setitem__(bit // 8, data[bit // 8] ^ (1 << bit % 8))

    flip_trials(tmp_path / "run", [flip(b) for b in bits])


def test_random_byte_damage_in_the_manifest_falls_back(tmp_path):
    rng = random.Random(12)
    size = len((two_checkpoints(tmp_path / "probe")).read_bytes())

    def smash(at: int, value: int):
        return lambda data: data.__setitem__(at, value)

    trials = [smash(rng.randrange(size), rng.randrange(256)) for _ in range(300)]
    trials += [lambda data, n=n: data.__delitem__(slice(n, None)) for n in range(0, size, 97)]
    flip_trials(tmp_path / "run", trials)


def test_a_format_1_checkpoint_is_accepted_with_a_warning(tmp_path):
    where = two_checkpoints(tmp_path)
    for p in (where, catalog.step_dir(tmp_path, 1) / catalog.MANIFEST):
        manifest = json.loads(p.read_text())
        for key in ("digest", "serial"):
            manifest.pop(key)
        p.write_text(json.dumps({**manifest, "format": 1}))
    path, manifest, warnings = catalog.resolve(tmp_path, "latest")
    assert path.name == "step-000002" and manifest["format"] == 1
    assert any("step-000002" in w and "no digest of its own" in w for w in warnings)
    tiny_save(tmp_path, 3)  # a new save in an old run directory is the newest
    path, _, warnings = catalog.resolve(tmp_path, "latest")
    assert path.name == "step-000003" and warnings == []


def test_a_latest_link_out_of_the_run_is_refused_and_prunes_nothing(tmp_path):
    ra, rb = tmp_path / "ra", tmp_path / "rb"
    for step in (1, 2):
        tiny_save(ra, step)
    for step in (1, 2, 3, 30):
        tiny_save(rb, step, "rb")  # saved after ra's: by serial alone it would win
    link = catalog.root(ra) / catalog.LATEST
    link.unlink()
    link.symlink_to("../../rb/checkpoints/step-000030")  # ln -sfn, as in the issue
    path, _, warnings = catalog.resolve(ra, "latest")
    assert path == catalog.step_dir(ra, 2).resolve()
    assert any("outside this run's checkpoints: ignored" in w for w in warnings), warnings
    assert catalog.read_json(path, catalog.STATE)["version"] == "a"
    tiny_save(ra, 3, keep=2)  # the next save re-points latest; prune keeps ra's own newest
    assert [p.name for p in catalog.complete(ra)] == ["step-000002", "step-000003"]
    assert os.readlink(link) == "step-000003"


def test_a_latest_link_to_itself_falls_back_with_a_warning(tmp_path):
    tiny_save(tmp_path, 1)
    link = catalog.root(tmp_path) / catalog.LATEST
    link.unlink()
    link.symlink_to(catalog.LATEST)  # a loop: was a traceback
    path, _, warnings = catalog.resolve(tmp_path, "latest")
    assert path.name == "step-000001"
    assert warnings == [
        "latest points to itself: ignored; resuming from the newest verified checkpoint of this run"
    ]
    assert catalog.prune(tmp_path, 1) == []
    best = catalog.root(tmp_path) / catalog.BEST
    best.symlink_to("/etc")
    with pytest.raises(catalog.CheckpointError, match="best points to /etc, outside"):
        catalog.resolve(tmp_path, "best")


def test_a_fifo_in_place_of_a_manifest_never_blocks_a_save(tmp_path):
    import threading

    tiny_save(tmp_path, 1)
    older = catalog.step_dir(tmp_path, 0)
    older.mkdir()
    os.mkfifo(older / catalog.MANIFEST)  # nobody will ever write to it
    done = threading.Event()
    thread = threading.Thread(target=lambda: (tiny_save(tmp_path, 2), done.set()), daemon=True)
    thread.start()
    assert done.wait(30), "a save blocked on a FIFO"
    path, _, warnings = catalog.resolve(tmp_path, "latest")
    assert path.name == "step-000002"
    with pytest.raises(catalog.CheckpointError, match="not a regular file"):
        catalog.verify(older)
