"""A checkpoint's arrays: written into a fresh folder, committed atomically, read back, digested.

The folder logic (where checkpoints live, which verify, `latest`, pruning) is catalog.py's;
this module is the part that needs MLX.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from telemetry.files import atomic_write, file_sha256, fsync_dir, fsync_file
from telemetry.units import MiB
from trainer.checkpoint import manifest as mf
from trainer.checkpoint.catalog import (
    CONFIG,
    MANIFEST,
    OPTIMIZER,
    STATE,
    TMP_PREFIX,
    WEIGHTS,
    LatestNotMoved,
    NoSpace,
    next_serial,
    point_latest,
    prune,
    root,
    step_dir,
    verified,
)


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
    tmp = ckpts / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    need = _array_bytes(params) + _array_bytes(optimizer_state) + MiB
    free = shutil.disk_usage(ckpts).free
    if free < need:
        raise NoSpace(
            f"no space for checkpoint {final.name} in {ckpts}: it needs about {_mib(need)}, "
            f"{_mib(free)} free"
        )
    fields = {**identity, "step": step, "serial": next_serial(ckpts), "mlx": mx.__version__}
    try:
        manifest = _write_folder(tmp, params, optimizer_state, state, config, fields)
    except (OSError, RuntimeError) as e:  # MLX says "[write] Unable to write N bytes"
        shutil.rmtree(tmp, ignore_errors=True)  # the partial goes at once, not at next start
        free = shutil.disk_usage(ckpts).free
        raise NoSpace(
            f"could not write checkpoint {final.name} in {ckpts} ({e}); {_mib(free)} free"
        ) from None
    try:
        _commit(ckpts, tmp, final, manifest)
    except OSError as e:  # a rename or the manifest's rewrite refused: nothing half-named
        shutil.rmtree(tmp, ignore_errors=True)  # (a step moved aside is adopted at start)
        raise NoSpace(f"could not commit checkpoint {final.name} in {ckpts} ({e})") from None
    moved = ""
    if make_latest:
        try:
            point_latest(run_dir, final)
        except OSError as e:
            moved = e.strerror or str(e)
    if keep > 0:
        with contextlib.suppress(OSError):  # pruning is tidying: it may wait for next time
            prune(run_dir, keep)
    if moved:
        raise LatestNotMoved(final, moved)
    return final


def _array_bytes(tree: Any) -> int:
    return sum(a.nbytes for _, a in tree_flatten(tree))


def _mib(n: int) -> str:
    return f"{n / MiB:,.1f} MiB"


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
    have = verified(final)
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
    old = ckpts / f"{TMP_PREFIX}old-{final.name}-{os.getpid()}"
    if old.exists():
        shutil.rmtree(old)
    os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(ckpts)
    shutil.rmtree(old, ignore_errors=True)


def load_arrays(path: Path) -> tuple[dict, dict]:
    """(params, optimizer state) as nested trees, from a verified checkpoint."""
    params = tree_unflatten(list(mx.load(str(path / WEIGHTS)).items()))
    opt = tree_unflatten(list(mx.load(str(path / OPTIMIZER)).items()))
    return params, opt
