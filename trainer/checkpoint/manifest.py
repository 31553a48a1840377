"""The checkpoint manifest: its file names, its own digest, and what makes one well-formed.

A manifest lists every file of a checkpoint with its size and sha256, the run's identity
(architecture, tokenizer, dataset, global batch, ...), a `serial` that orders saves in a run
directory, and a `digest` of all of that, so a damaged field is caught as surely as a damaged
file. Standard library only: the folder logic is in `trainer.checkpoint.store`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time

FORMAT = 2  # 2: a digest of its own and a save serial; 1 (still read) had neither
FORMATS = (1, 2)
WEIGHTS, OPTIMIZER, STATE, CONFIG, MANIFEST = (
    "weights.safetensors",
    "optimizer.safetensors",
    "state.json",
    "config.json",
    "manifest.json",
)
FILES = (WEIGHTS, OPTIMIZER, STATE, CONFIG)
# Fields a save of the very same bytes may change: a re-save that differs only here is moot.
VOLATILE = frozenset({"created", "mlx", "serial", "digest"})
_STEP_NAME = re.compile(r"step-(\d+)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def digest(manifest: dict) -> str:
    """sha256 of the manifest's fields in canonical JSON, its own `digest` left out."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def stamp(fields: dict, files: dict) -> dict:
    """A new manifest: `fields`, the time, the file table and the digest over all of them."""
    manifest = {
        **fields,
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
    }
    manifest["digest"] = digest(manifest)
    return manifest


def problem(manifest: dict, folder: str) -> str | None:
    """What is wrong with a parsed manifest's own fields (in folder `folder`), or None."""
    fmt = manifest.get("format")
    if type(fmt) is not int or fmt not in FORMATS:
        return "unknown checkpoint format"
    if "digest" in manifest:  # checked whatever the format says, so damage cannot skip it
        if manifest["digest"] != digest(manifest):
            return "corrupt (its fields do not match its own digest)"
    elif fmt >= 2:
        return "corrupt (it has lost its own digest)"
    step = manifest.get("step")
    if type(step) is not int or step < 0:
        return f"corrupt (step {step!r})"
    if (named := step_of(folder)) is not None and named != step:
        return f"corrupt (it says step {step}, its folder is {folder})"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "corrupt (its list of files is not a table)"
    for name in FILES:
        entry = files.get(name)
        if entry is None:
            return f"does not list {name}"
        if (
            not isinstance(entry, dict)
            or type(entry.get("size")) is not int
            or not isinstance(entry.get("sha256"), str)
            or not _SHA256.fullmatch(entry["sha256"])
        ):
            return f"corrupt (its entry for {name} is not a size and a sha256)"
    return None


def same(a: dict, b: dict) -> bool:
    """Do two manifests describe the same files and identity?"""
    return {k: v for k, v in a.items() if k not in VOLATILE} == {
        k: v for k, v in b.items() if k not in VOLATILE
    }


def serial(manifest: dict | None) -> int | None:
    """The save's serial; None for format 1 or a damaged value."""
    value = (manifest or {}).get("serial")
    return value if type(value) is int else None


def step_of(folder: str) -> int | None:
    """The step a `step-NNNNNN` folder name says, else None."""
    named = _STEP_NAME.fullmatch(folder)
    return int(named[1]) if named else None
