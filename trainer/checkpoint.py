"""Checkpoints that cannot lie: atomic folders, a manifest of sha256 digests, exact resume.

A kill at any instant of a save leaves at least one complete, verified copy of every
checkpoint that was complete before it, and of the newest one once its folder is whole:

- Every file goes into a temporary sibling `.tmp-...` first and is fsynced before the folder
  is renamed into place; the manifest is written last and lists every file's digest, and
  carries a digest of its own fields, so damage anywhere makes the folder fail `verify`.
- Saving a step again with the same bytes (a `stop` right after a periodic save) renames no
  folder: only its manifest is replaced, atomically, with a new serial (the count of saves in
  the run directory). Saving it with other bytes (a rebalance while paused) swaps the folders
  in two renames; between them both copies verify under temporary names, and `adopt` gives
  the step's name back to the newer one.
- `latest` is a hint, not the truth: a kill between the rename and the link leaves it on an
  older checkpoint, so `resolve` takes the checkpoint saved last that verifies and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from telemetry.files import atomic_write, file_sha256, fsync_dir, fsync_file
from trainer import manifest as mf
from trainer.manifest import CONFIG as CONFIG  # the names every caller knows, re-exported
from trainer.manifest import FORMAT as FORMAT
from trainer.manifest import MANIFEST as MANIFEST
from trainer.manifest import OPTIMIZER as OPTIMIZER
from trainer.manifest import STATE as STATE
from trainer.manifest import WEIGHTS as WEIGHTS

LATEST = "latest"
BEST = "best"  # the checkpoint of the lowest validation loss (kept by --eval-every)
_TMP_PREFIX = ".tmp-"


class NoSpace(OSError):
    """The disk cannot hold the checkpoint: nothing of it is left behind."""


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt or does not fit this run."""


def root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: str | Path, step: int) -> Path:
    return root(run_dir) / f"step-{step:06d}"


# --- digests ------------------------------------------------------------------------------
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
def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


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

    (mx.save_safetensors truncates its target in place; writing into a fresh folder is what
    keeps an existing checkpoint intact.)
    """
    ckpts = root(run_dir)
    ckpts.mkdir(parents=True, exist_ok=True)
    final = step_dir(run_dir, step)
    tmp = ckpts / f"{_TMP_PREFIX}{final.name}-{os.getpid()}"
    need = _array_bytes(params) + _array_bytes(optimizer_state) + (1 << 20)
    free = shutil.disk_usage(ckpts).free
    if free < need:
        raise NoSpace(
            f"no space for checkpoint {final.name} in {ckpts}: it needs about {_mib(need)}, "
            f"{_mib(free)} free"
        )
    fields = {**identity, "step": step, "serial": _next_serial(ckpts), "mlx": mx.__version__}
    try:
        manifest = _write_folder(tmp, params, optimizer_state, state, config, fields)
    except (OSError, RuntimeError) as e:  # MLX says "[write] Unable to write N bytes"
        shutil.rmtree(tmp, ignore_errors=True)  # the partial goes at once, not at next start
        free = shutil.disk_usage(ckpts).free
        raise NoSpace(
            f"could not write checkpoint {final.name} in {ckpts} ({e}); {_mib(free)} free"
        ) from None
    _commit(ckpts, tmp, final, manifest)
    if make_latest:
        point_latest(run_dir, final)
    if keep > 0:
        prune(run_dir, keep)
    return final


def _array_bytes(tree: Any) -> int:
    return sum(a.nbytes for _, a in tree_flatten(tree))


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _write_folder(
    tmp: Path, params: dict, optimizer_state: dict, state: dict, config: dict, fields: dict
) -> dict:
    """Every file of a checkpoint into `tmp`, fsynced, the manifest last; returns it."""
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    mx.save_safetensors(str(tmp / WEIGHTS), dict(tree_flatten(params)))
    mx.save_safetensors(str(tmp / OPTIMIZER), dict(tree_flatten(optimizer_state)))
    fsync_file(tmp / WEIGHTS)
    fsync_file(tmp / OPTIMIZER)
    atomic_write(tmp / STATE, _dumps(state))
    atomic_write(tmp / CONFIG, _dumps(config))
    files = {
        n: {"sha256": file_sha256(tmp / n), "size": (tmp / n).stat().st_size} for n in mf.FILES
    }
    manifest = mf.stamp(fields, files)
    atomic_write(tmp / MANIFEST, _dumps(manifest))  # also fsyncs the folder
    return manifest


def _commit(ckpts: Path, tmp: Path, final: Path, manifest: dict) -> None:
    """Rename the finished `tmp` to `final`, never leaving the step without a verified copy."""
    if not final.exists():
        os.rename(tmp, final)
        fsync_dir(ckpts)
        return
    have = _verified(final)
    if have is not None and mf.same(have, manifest):
        # Saved again unchanged (a `stop` right after a periodic save): no folder is renamed;
        # only the manifest is replaced, in one atomic rename, so that its serial marks this
        # as the last save (a run resumed from an older step may have saved newer ones).
        atomic_write(final / MANIFEST, _dumps(manifest))
        shutil.rmtree(tmp, ignore_errors=True)
        return
    # Other bytes for this step (a rebalance while paused; a run resumed from an older
    # checkpoint) or a corrupt copy. Between the renames the step has no folder, but both
    # copies verify; `adopt` gives the step's name back to the newer one (higher serial).
    old = ckpts / f"{_TMP_PREFIX}old-{final.name}-{os.getpid()}"
    if old.exists():
        shutil.rmtree(old)
    os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(ckpts)
    shutil.rmtree(old, ignore_errors=True)


def _next_serial(ckpts: Path) -> int:
    """One more than any serial in the folder: orders saves even across a resumed older step."""
    serials = [mf.serial(_peek(p)) for p in ckpts.iterdir() if p.is_dir()]
    return max((s for s in serials if s is not None), default=0) + 1


def point_latest(run_dir: str | Path, target: Path) -> None:
    """Replace the `latest` link atomically (a new link renamed over the old one)."""
    _point(run_dir, LATEST, target)


def point_best(run_dir: str | Path, target: Path) -> None:
    """Replace the `best` link atomically; `prune` never removes what it points to."""
    _point(run_dir, BEST, target)


def _point(run_dir: str | Path, name: str, target: Path) -> None:
    ckpts = root(run_dir)
    link = ckpts / name
    tmp = ckpts / f"{_TMP_PREFIX}{name}-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.name)
    os.replace(tmp, link)
    fsync_dir(ckpts)


def complete(run_dir: str | Path) -> list[Path]:
    """Checkpoint folders with a manifest, oldest first (not verified)."""
    ckpts = root(run_dir)
    if not ckpts.is_dir():
        return []
    found = [p for p in ckpts.glob("step-*") if p.is_dir() and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.name)


def prune(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints, never one `latest` or `best` points to."""
    links = (root(run_dir) / name for name in (LATEST, BEST))
    pinned = {link.resolve() for link in links if link.is_symlink()}
    doomed = [p for p in complete(run_dir)[:-keep] if p.resolve() not in pinned]
    for p in doomed:
        # Renamed away first: a kill mid-delete leaves a `.tmp-` folder that start-up clears,
        # never a step folder with some of its files gone.
        gone = p.with_name(f"{_TMP_PREFIX}pruned-{p.name}-{os.getpid()}")
        try:
            os.rename(p, gone)
        except OSError:
            continue
        shutil.rmtree(gone, ignore_errors=True)
    return doomed


# --- recovering ---------------------------------------------------------------------------
def _temporaries(ckpts: Path) -> list[Path]:
    if not ckpts.is_dir():
        return []
    found = [p for p in ckpts.iterdir() if p.name.startswith(_TMP_PREFIX)]
    return sorted(p for p in found if p.is_dir() and not p.is_symlink())


def adopt(run_dir: str | Path) -> list[tuple[Path, Path]]:
    """Name again the verified copies a kill left under temporary names: (from, to) each.

    A temporary folder that verifies becomes its step's folder when that is missing (a kill
    between a re-save's two renames) or fails to verify (the corrupt one is set aside for
    `clear_orphans`); among copies of one step the newest save wins. Safe to race: a rename
    another process made first just fails here.
    """
    ckpts = root(run_dir)
    copies = [(p, m) for p in _temporaries(ckpts) if (m := _verified(p)) is not None]
    copies.sort(key=lambda c: (mf.serial(c[1]) or 0, c[0].name), reverse=True)
    adopted = []
    for tmp, manifest in copies:
        dest = step_dir(run_dir, manifest["step"])
        try:
            if dest.exists():
                if _verified(dest) is not None:
                    continue  # a duplicate; `clear_orphans` removes it
                os.rename(dest, ckpts / f"{_TMP_PREFIX}corrupt-{dest.name}-{os.getpid()}")
            os.rename(tmp, dest)
        except OSError:
            continue
        adopted.append((tmp, dest))
    if adopted:
        fsync_dir(ckpts)
    return adopted


def clear_orphans(run_dir: str | Path) -> list[Path]:
    """Remove what a kill mid-save left behind; returns what was removed.

    Verified copies are adopted first (`adopt`); a temporary folder is removed only when it
    fails to verify or its step's folder verifies as well, so no verified checkpoint is lost.
    """
    ckpts = root(run_dir)
    if not ckpts.is_dir():
        return []
    adopt(run_dir)
    removed = []
    for p in sorted(ckpts.iterdir()):
        if not p.name.startswith(_TMP_PREFIX):
            continue
        if p.is_dir() and not p.is_symlink():
            manifest = _verified(p)
            if manifest is not None and _verified(step_dir(run_dir, manifest["step"])) is None:
                continue  # the only verified copy of its step (adopt could not rename it)
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


# --- reading ------------------------------------------------------------------------------
def _read_manifest(path: Path) -> dict:
    where = path / MANIFEST
    try:
        manifest = json.loads(where.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{where}: missing (the checkpoint was never completed)") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{where}: corrupt ({e})") from None
    except OSError as e:
        raise CheckpointError(f"{where}: unreadable ({e})") from None
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{where}: corrupt (not a JSON object)")
    return manifest


def verify(path: str | Path) -> dict:
    """Check the manifest and every file against it; returns it or raises naming the file."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    manifest = _read_manifest(path)
    problem = mf.problem(manifest, path.name)
    if problem:
        raise CheckpointError(f"{path / MANIFEST}: {problem}")
    for name in mf.FILES:
        entry, f = manifest["files"][name], path / name
        try:
            if not f.is_file():
                raise CheckpointError(f"{f}: missing")
            size = f.stat().st_size
            if size != entry["size"]:
                raise CheckpointError(f"{f}: size {size} bytes, manifest says {entry['size']}")
            if file_sha256(f) != entry["sha256"]:
                raise CheckpointError(f"{f}: sha256 does not match the manifest (corrupt file)")
        except OSError as e:
            raise CheckpointError(f"{f}: unreadable ({e})") from None
    return manifest


def _verified(path: Path) -> dict | None:
    try:
        return verify(path)
    except CheckpointError:
        return None


def _peek(path: Path) -> dict | None:
    """The manifest as it reads, unverified; None if it does not parse."""
    try:
        return _read_manifest(path)
    except CheckpointError:
        return None


def _recency(path: Path) -> tuple[float, int]:
    """Sort key, newest save first when reversed: (serial, step).

    Format 1 had no serial (0: older than any newer save); a manifest that does not read
    sorts first, so its damage is reported rather than silently passed over.
    """
    manifest = _peek(path)
    serial: float = mf.serial(manifest) or 0
    if manifest is None or ("serial" in manifest and mf.serial(manifest) is None):
        serial = float("inf")
    step = mf.step_of(path.name)
    return serial, -1 if step is None else step


def _legacy(path: Path, manifest: dict) -> list[str]:
    if "digest" in manifest:
        return []
    return [
        f"{path.name}: saved by an older fleet, its manifest has no digest of its own: "
        "its files are verified, its own fields are not"
    ]


def resolve(run_dir: str | Path, which: str) -> tuple[Path, dict, list[str]]:
    """Find and verify the checkpoint to resume: a folder, `best`, or `latest` with fallback.

    `latest` is the checkpoint saved last (highest serial, then step) that verifies and whose
    replicas agreed; each one skipped, and a `latest` link that points elsewhere, is reported.
    Copies a kill left under temporary names are adopted first. An explicit folder that fails
    verification is an error.
    """
    if which == BEST:
        link = root(run_dir) / BEST
        if not link.is_symlink():
            raise CheckpointError(
                f"{run_dir}: this run kept no best checkpoint: it needs --eval-every"
            )
        path = link.resolve()
        manifest = verify(path)
        return path, manifest, _legacy(path, manifest)
    if which != LATEST:
        path = Path(which)
        manifest = verify(path)
        return path, manifest, _legacy(path, manifest)
    warnings = [
        f"recovered {dest.name} from {tmp.name}, where a save cut short had left it"
        for tmp, dest in adopt(run_dir)
    ]
    link = root(run_dir) / LATEST
    pointed = link.resolve() if link.is_symlink() or link.exists() else None
    candidates = {p.resolve(): p for p in complete(run_dir)}
    if pointed is not None and pointed.is_dir():
        candidates.setdefault(pointed, pointed)
    tried: set[Path] = set()
    for path in sorted(candidates.values(), key=_recency, reverse=True):
        path = path.resolve()
        tried.add(path)
        manifest, skip = _usable(path)
        if manifest is None:
            warnings.append(f"skipping {path.name}: {skip}")
            continue
        warnings += _legacy(path, manifest)
        if pointed != path:
            warnings += _stale_link(pointed, path, tried)
        return path, manifest, warnings
    detail = ("; ".join(warnings)) if warnings else "none found"
    raise CheckpointError(f"no complete checkpoint in {root(run_dir)} to resume ({detail})")


def _usable(path: Path) -> tuple[dict | None, str]:
    """(manifest, "") for a checkpoint a resume may take, else (None, why not)."""
    try:
        manifest = verify(path)
    except CheckpointError as e:
        return None, str(e)
    if manifest.get("replicas_agree") is False:
        return None, "its ranks' replicas disagreed"
    return manifest, ""


def _stale_link(pointed: Path | None, taken: Path, tried: set[Path]) -> list[str]:
    """Why `latest` does not name the checkpoint taken, and which one was taken."""
    if pointed is None:
        return [f"no {LATEST} link: resuming from {taken.name}, the newest good checkpoint"]
    if not pointed.is_dir():
        return [f"{LATEST} names {pointed.name}, which does not exist: resuming from {taken.name}"]
    if pointed in tried:  # its failure is already reported
        return [f"resuming from {taken.name}, the newest good checkpoint"]
    manifest, skip = _usable(pointed)
    if manifest is None:
        return [f"skipping {pointed.name} ({LATEST}): {skip}; resuming from {taken.name}"]
    return [
        f"{LATEST} names {pointed.name}, but {taken.name} was saved after it (a save cut short "
        f"before it moved {LATEST}): resuming from {taken.name}"
    ]


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
