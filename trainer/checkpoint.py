"""Checkpoints that cannot lie: atomic folders, a manifest of sha256 digests, exact resume."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

FORMAT = 1
WEIGHTS, OPTIMIZER, STATE, CONFIG, MANIFEST = (
    "weights.safetensors",
    "optimizer.safetensors",
    "state.json",
    "config.json",
    "manifest.json",
)
LATEST = "latest"
_TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt or does not fit this run."""


def root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: str | Path, step: int) -> Path:
    return root(run_dir) / f"step-{step:06d}"


# --- digests ------------------------------------------------------------------------------
def file_digest(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def replica_digest(*trees: Any) -> bytes:
    """sha256 over every array's name, dtype, shape and bytes: equal replicas, equal digests."""
    h = hashlib.sha256()
    for tree in trees:
        for name, a in tree_flatten(tree):
            if not isinstance(a, mx.array):
                continue
            h.update(f"{name}:{a.dtype}:{a.shape}".encode())
            # bf16 has no numpy dtype; view its bits as uint16 to hash them exactly.
            bits = a.view(mx.uint16) if a.dtype == mx.bfloat16 else a
            h.update(memoryview(bits).tobytes())
    return h.digest()


# --- writing ------------------------------------------------------------------------------
def _fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    # Directory fsync makes the rename durable on POSIX; some platforms refuse it, harmlessly.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save(
    run_dir: str | Path,
    step: int,
    *,
    params: dict,
    optimizer_state: dict,
    state: dict,
    config: dict,
    identity: dict,
    keep: int = 0,
    make_latest: bool = True,
) -> Path:
    """Write `step-NNNNNN/` atomically, point `latest` at it and prune old ones.

    Every file goes into a temporary sibling first and is fsynced with its folder before the
    rename, so a crash leaves either the old set of checkpoints or the new one, never half.
    (mx.save_safetensors truncates its target in place; writing into a fresh folder is what
    keeps an existing checkpoint intact.)
    """
    ckpts = root(run_dir)
    ckpts.mkdir(parents=True, exist_ok=True)
    final = step_dir(run_dir, step)
    tmp = ckpts / f"{_TMP_PREFIX}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    mx.save_safetensors(str(tmp / WEIGHTS), dict(tree_flatten(params)))
    mx.save_safetensors(str(tmp / OPTIMIZER), dict(tree_flatten(optimizer_state)))
    _write_json(tmp / STATE, state)
    _write_json(tmp / CONFIG, config)
    files = {}
    for name in (WEIGHTS, OPTIMIZER, STATE, CONFIG):
        _fsync_file(tmp / name)
        files[name] = {"sha256": file_digest(tmp / name), "size": (tmp / name).stat().st_size}
    manifest = {
        "format": FORMAT,
        "step": step,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "mlx": mx.__version__,
        "files": files,
        **identity,
    }
    _write_json(tmp / MANIFEST, manifest)
    _fsync_file(tmp / MANIFEST)
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (e.g. a stop right after a checkpoint)
        old = ckpts / f"{_TMP_PREFIX}old-{final.name}-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    _fsync_dir(ckpts)
    if make_latest:
        point_latest(run_dir, final)
    if keep > 0:
        prune(run_dir, keep)
    return final


def point_latest(run_dir: str | Path, target: Path) -> None:
    """Replace the `latest` link atomically (a new link renamed over the old one)."""
    ckpts = root(run_dir)
    link = ckpts / LATEST
    tmp = ckpts / f"{_TMP_PREFIX}latest-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target.name)
    os.replace(tmp, link)
    _fsync_dir(ckpts)


def complete(run_dir: str | Path) -> list[Path]:
    """Checkpoint folders with a manifest, oldest first (not verified)."""
    ckpts = root(run_dir)
    if not ckpts.is_dir():
        return []
    found = [p for p in ckpts.glob("step-*") if p.is_dir() and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.name)


def prune(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints, never the one `latest` points to."""
    link = root(run_dir) / LATEST
    pinned = link.resolve() if link.is_symlink() else None
    doomed = [p for p in complete(run_dir)[:-keep] if p.resolve() != pinned]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed


def clear_orphans(run_dir: str | Path) -> list[Path]:
    """Remove temporary folders left by a crash mid-save; returns what was removed."""
    ckpts = root(run_dir)
    if not ckpts.is_dir():
        return []
    orphans = [p for p in ckpts.iterdir() if p.name.startswith(_TMP_PREFIX)]
    for p in orphans:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return orphans


# --- reading ------------------------------------------------------------------------------
def verify(path: str | Path) -> dict:
    """Check every file against the manifest; returns the manifest or raises naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{path / MANIFEST}: missing (the checkpoint was never completed)"
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path / MANIFEST}: corrupt ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path / MANIFEST}: unknown checkpoint format")
    for name in (WEIGHTS, OPTIMIZER, STATE, CONFIG):
        entry = manifest.get("files", {}).get(name)
        f = path / name
        if entry is None:
            raise CheckpointError(f"{path / MANIFEST}: does not list {name}")
        if not f.is_file():
            raise CheckpointError(f"{f}: missing")
        size = f.stat().st_size
        if size != entry["size"]:
            raise CheckpointError(f"{f}: size {size} bytes, manifest says {entry['size']}")
        if file_digest(f) != entry["sha256"]:
            raise CheckpointError(f"{f}: sha256 does not match the manifest (corrupt file)")
    return manifest


def resolve(run_dir: str | Path, which: str) -> tuple[Path, dict, list[str]]:
    """Find and verify the checkpoint to resume: a folder, or `latest` with fallback.

    `latest` falls back to the newest checkpoint that verifies, reporting each one skipped;
    an explicit folder that fails verification is an error.
    """
    if which != LATEST:
        path = Path(which)
        return path, verify(path), []
    warnings: list[str] = []
    link = root(run_dir) / LATEST
    candidates = list(reversed(complete(run_dir)))
    if link.is_symlink() or link.exists():
        target = link.resolve()
        candidates = [target] + [p for p in candidates if p.resolve() != target]
    for path in candidates:
        try:
            manifest = verify(path)
        except CheckpointError as e:
            warnings.append(f"skipping {path.name}: {e}")
            continue
        if manifest.get("replicas_agree") is False:
            warnings.append(f"skipping {path.name}: its ranks' replicas disagreed")
            continue
        return path, manifest, warnings
    detail = ("; ".join(warnings)) if warnings else "none found"
    raise CheckpointError(f"no complete checkpoint in {root(run_dir)} to resume ({detail})")


def read_json(path: Path, name: str) -> dict:
    return json.loads((path / name).read_text())


def load_arrays(path: Path) -> tuple[dict, dict]:
    """(params, optimizer state) as nested trees, from a verified checkpoint."""
    params = tree_unflatten(list(mx.load(str(path / WEIGHTS)).items()))
    opt = tree_unflatten(list(mx.load(str(path / OPTIMIZER)).items()))
    return params, opt


def check_compatible(manifest: dict, expected: dict, path: Path) -> None:
    """Refuse a checkpoint whose architecture, tokenizer, dataset or global batch differ."""
    labels = {
        "architecture": "model architecture",
        "tokenizer": "tokenizer",
        "dataset": "dataset",
        "global_batch": "global batch",
    }
    problems = []
    for key, label in labels.items():
        have, want = manifest.get(key), expected.get(key)
        if have != want:
            problems.append(f"{label}: checkpoint has {have!r}, this run has {want!r}")
    if problems:
        raise CheckpointError(
            f"{path} does not fit this run:\n  "
            + "\n  ".join(problems)
            + "\n(resume with the same settings, or start a new --run-dir)"
        )
