"""A run's checkpoints as folders: where they are, which verify, `latest` and `best`, resume.

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

import json
import os
import shutil
from pathlib import Path

from telemetry import rundir
from telemetry.files import NotRegular, file_sha256, fsync_dir, read_regular
from trainer.checkpoint import manifest as mf
from trainer.checkpoint.manifest import CONFIG as CONFIG  # the names every caller knows
from trainer.checkpoint.manifest import FORMAT as FORMAT
from trainer.checkpoint.manifest import MANIFEST as MANIFEST
from trainer.checkpoint.manifest import OPTIMIZER as OPTIMIZER
from trainer.checkpoint.manifest import STATE as STATE
from trainer.checkpoint.manifest import WEIGHTS as WEIGHTS

LATEST = "latest"
BEST = "best"  # the checkpoint of the lowest validation loss (kept by --eval-every)
TMP_PREFIX = ".tmp-"
MANIFEST_LIMIT = 1 << 20  # a manifest lists five files: anything this large is not one


class NoSpace(OSError):
    """The disk cannot hold the checkpoint: nothing of it is left behind."""


class LatestNotMoved(OSError):
    """The checkpoint `path` is saved and verified, but `latest` could not be pointed at it
    (a full disk, a folder in its way): `resolve` still finds it, as the newest save."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path.name} is saved, but {LATEST} could not be moved to it ({why})")
        self.path = path


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete, corrupt or does not fit this run."""


def root(run_dir: str | Path) -> Path:
    return rundir.at(run_dir).checkpoints


def step_dir(run_dir: str | Path, step: int) -> Path:
    return root(run_dir) / f"step-{step:06d}"


def next_serial(ckpts: Path) -> int:
    """One more than any serial in the folder: orders saves even across a resumed older step."""
    serials = [mf.serial(_peek(p)) for p in ckpts.iterdir() if p.is_dir()]
    return max((s for s in serials if s is not None), default=0) + 1


def newest_serial(run_dir: str | Path) -> int:
    """The serial of the run's newest save (0: none): what `last_saved_step` counts from."""
    ckpts = root(run_dir)
    return next_serial(ckpts) - 1 if ckpts.is_dir() else 0


def last_saved_step(run_dir: str | Path, after: int) -> int:
    """The step of the newest complete save with a serial above `after` (-1: none), read
    without verifying: that the update was done, not that the save can be resumed."""
    saved = [(mf.serial(_peek(p)) or 0, mf.step_of(p.name)) for p in complete(run_dir)]
    newer = [(serial, step) for serial, step in saved if serial > after and step is not None]
    return max(newer)[1] if newer else -1


def point_latest(run_dir: str | Path, target: Path) -> None:
    """Replace the `latest` link atomically (a new link renamed over the old one)."""
    _point(run_dir, LATEST, target)


def point_best(run_dir: str | Path, target: Path) -> None:
    """Replace the `best` link atomically; `prune` never removes what it points to."""
    _point(run_dir, BEST, target)


def _point(run_dir: str | Path, name: str, target: Path) -> None:
    ckpts = root(run_dir)
    link = ckpts / name
    tmp = ckpts / f"{TMP_PREFIX}{name}-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.name)
    os.replace(tmp, link)
    fsync_dir(ckpts)


def link_target(run_dir: str | Path, name: str) -> tuple[Path | None, str]:
    """Where the `latest` or `best` link leads: (a step folder of this run, "") or, for a
    link that leaves the run or loops, (None, why it is ignored); (None, "") with no link.

    A link is a hint this run wrote (a step's name beside it); one that leads anywhere else
    (`ln -sfn ../../other/checkpoints/step-000030 latest`) would resume another run's
    weights and seed and then prune this run's own checkpoints.
    """
    ckpts = root(run_dir)
    link = ckpts / name
    if not link.is_symlink():
        return None, (f"{name} is not a link: ignored" if link.exists() else "")
    try:
        raw = os.readlink(link)
    except OSError as e:
        return None, f"{name} cannot be read ({e.strerror}): ignored"
    target = Path(os.path.realpath(ckpts / raw))  # never raises, not even on a loop
    home = Path(os.path.realpath(ckpts))
    if target == home / name:
        return None, f"{name} points to itself: ignored"
    if target.parent != home or mf.step_of(target.name) is None:
        return None, f"{name} points to {raw}, outside this run's checkpoints: ignored"
    return target, ""


def complete(run_dir: str | Path) -> list[Path]:
    """Checkpoint folders with a manifest, oldest first (not verified)."""
    ckpts = root(run_dir)
    if not ckpts.is_dir():
        return []
    found = [p for p in ckpts.glob("step-*") if p.is_dir() and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.name)


def prune(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints, never one `latest` or `best` points to."""
    pinned = {target for name in (LATEST, BEST) if (target := link_target(run_dir, name)[0])}
    doomed = [p for p in complete(run_dir)[:-keep] if p.resolve() not in pinned]
    for p in doomed:
        # Renamed away first: a kill mid-delete leaves a `.tmp-` folder that start-up clears,
        # never a step folder with some of its files gone.
        gone = p.with_name(f"{TMP_PREFIX}pruned-{p.name}-{os.getpid()}")
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
    found = [p for p in ckpts.iterdir() if p.name.startswith(TMP_PREFIX)]
    return sorted(p for p in found if p.is_dir() and not p.is_symlink())


def adopt(run_dir: str | Path) -> list[tuple[Path, Path]]:
    """Name again the verified copies a kill left under temporary names: (from, to) each.

    A temporary folder that verifies becomes its step's folder when that is missing (a kill
    between a re-save's two renames) or fails to verify (the corrupt one is set aside for
    `clear_orphans`); among copies of one step the newest save wins. Safe to race: a rename
    another process made first just fails here.
    """
    ckpts = root(run_dir)
    copies = [(p, m) for p in _temporaries(ckpts) if (m := verified(p)) is not None]
    copies.sort(key=lambda c: (mf.serial(c[1]) or 0, c[0].name), reverse=True)
    adopted = []
    for tmp, manifest in copies:
        dest = step_dir(run_dir, manifest["step"])
        try:
            if dest.exists():
                if verified(dest) is not None:
                    continue  # a duplicate; `clear_orphans` removes it
                os.rename(dest, ckpts / f"{TMP_PREFIX}corrupt-{dest.name}-{os.getpid()}")
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
        if not p.name.startswith(TMP_PREFIX):
            continue
        if p.is_dir() and not p.is_symlink():
            manifest = verified(p)
            if manifest is not None and verified(step_dir(run_dir, manifest["step"])) is None:
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
        manifest = json.loads(read_regular(where, MANIFEST_LIMIT))
    except FileNotFoundError:
        raise CheckpointError(f"{where}: missing (the checkpoint was never completed)") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise CheckpointError(f"{where}: corrupt ({e})") from None
    except NotRegular:
        raise CheckpointError(f"{where}: not a regular file (corrupt)") from None
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


def verified(path: Path) -> dict | None:
    """The manifest if the folder verifies, else None."""
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
        path, why = link_target(run_dir, BEST)
        if path is None:
            raise CheckpointError(
                f"{run_dir}: {why}"
                if why
                else f"{run_dir}: this run kept no best checkpoint: it needs --eval-every"
            )
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
    pointed, why = link_target(run_dir, LATEST)
    if why:
        warnings.append(f"{why}; resuming from the newest verified checkpoint of this run")
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
        if pointed != path and not why:  # (an ignored link was already reported)
            warnings += _stale_link(pointed, path, tried)
        return path, manifest, warnings
    detail = ("; ".join(warnings)) if warnings else "none found"
    raise CheckpointError(f"no complete checkpoint in {root(run_dir)} to resume ({detail})")


def newest_verified(run_dir: str | Path) -> Path | None:
    """The checkpoint saved last that verifies and whose replicas agreed, found without
    moving anything (no adoption): what advice names ("resume from ...")."""
    for path in sorted(complete(run_dir), key=_recency, reverse=True):
        if _usable(path)[0] is not None:
            return path
    return None


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
    return json.loads(read_regular(path / name))


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
