"""The dataset folder's format: dataset.json's fields, its digest, and reading it back.

`fleet prepare` (the writer) and `trainer.data.dataset` (the reader) both import this module, so
neither needs the other. A dataset has two subsets, "train" and "val" (held out for
validation); dataset.json lists each subset's shards under "shards".
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from trainer.data.tokenizer import identity_digest_part

FORMAT = "mlx-fleet-dataset"
VERSION = 1
META_NAME = "dataset.json"
SUBSETS = ("train", "val")  # the keys of dataset.json's "shards", and its shard names' prefixes


class DatasetError(Exception):
    """A dataset folder that cannot be used as it is; the message names the file."""


def dataset_digest(identity: dict[str, Any], seq_len: int, shards: dict[str, list]) -> str:
    """sha256 naming a dataset: tokenizer (without its path), seq_len and shard contents."""
    body = {
        "tokenizer": identity_digest_part(identity),
        "seq_len": seq_len,
        "shards": {subset: [s["sha256"] for s in entries] for subset, entries in shards.items()},
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def new_meta(
    *,
    params: dict[str, Any],
    sources: list[dict[str, Any]],
    tokenizer: dict[str, Any],
    seq_len: int,
    dtype: str,
    rows_per_group: int,
    counts: dict[str, int],
    shards: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """dataset.json's content for these shards, with the digests that name the dataset."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "params": params,
        "sources": sources,
        "tokenizer": tokenizer,
        "seq_len": seq_len,
        "dtype": dtype,
        "rows_per_group": rows_per_group,
        "counts": counts,
        "shards": shards,
        "digest": dataset_digest(tokenizer, seq_len, shards),
        "val_digest": dataset_digest(tokenizer, seq_len, {"val": shards["val"]}),
    }


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """Write `folder`/dataset.json; sorted keys, so the same dataset gives the same bytes."""
    (folder / META_NAME).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")


def read_meta(folder: Path) -> dict[str, Any]:
    """The checked dataset.json of `folder`; raises DatasetError naming what is wrong."""
    meta_path = folder / META_NAME
    if not meta_path.is_file():
        hint = "no such folder" if not folder.is_dir() else f"no {META_NAME}"
        raise DatasetError(f"{folder}: {hint} (make one with `fleet prepare`)")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{meta_path}: cannot read it ({e})") from e
    except json.JSONDecodeError as e:
        raise DatasetError(f"{meta_path}: not valid JSON ({e.msg}, line {e.lineno})") from e
    check_meta(meta, meta_path)
    return meta


def check_meta(meta: Any, where: Path) -> None:
    """Raise DatasetError unless `meta` has every field a reader relies on, of the right type."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DatasetError(f"{where}: not an mlx-fleet dataset (no format {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise DatasetError(f"{where}: format version {meta.get('version')!r}, expected {VERSION}")
    for key, kind in (("seq_len", int), ("digest", str), ("val_digest", str), ("tokenizer", dict)):
        if not isinstance(meta.get(key), kind):
            raise DatasetError(f"{where}: field {key!r} is missing or not a {kind.__name__}")
    if meta["seq_len"] < 1:
        raise DatasetError(f"{where}: seq_len must be at least 1, got {meta['seq_len']}")
    for key in ("vocab_size", "pad_id", "eos_id", "bos_id"):
        if not isinstance(meta["tokenizer"].get(key), int):
            raise DatasetError(f"{where}: field 'tokenizer.{key}' is missing or not an int")
    shards = meta.get("shards")
    if not isinstance(shards, dict):
        raise DatasetError(f"{where}: field 'shards' is missing or not a mapping")
    for subset in SUBSETS:
        entries = shards.get(subset)
        if not isinstance(entries, list):
            raise DatasetError(f"{where}: field 'shards.{subset}' is missing or not a list")
        for i, e in enumerate(entries):
            if not (
                isinstance(e, dict)
                and isinstance(e.get("file"), str)
                and isinstance(e.get("rows"), int)
            ):
                raise DatasetError(f"{where}: shards.{subset}[{i}] needs a 'file' and 'rows'")
            if Path(e["file"]).name != e["file"]:
                raise DatasetError(f"{where}: shard name {e['file']!r} must be a plain file name")


def shard_entries(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Every shard's entry in dataset.json, train shards first."""
    return [entry for subset in SUBSETS for entry in meta["shards"][subset]]


def existing_meta(folder: Path) -> dict[str, Any] | None:
    """`folder`'s dataset.json unchecked (for the writer): {} if unreadable, None if absent."""
    path = folder / META_NAME
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # unreadable: treated as a different dataset
    return meta if isinstance(meta, dict) else {}


def shards_intact(folder: Path, meta: dict[str, Any]) -> bool:
    """Whether every shard dataset.json lists is there with its size (a cheap check, no hashing)."""
    try:
        return all((folder / e["file"]).stat().st_size == e["bytes"] for e in shard_entries(meta))
    except (KeyError, TypeError, OSError):
        return False
