"""`fleet prepare`: text files, JSONL or Parquet in; fixed-length Parquet token shards out.

    fleet prepare --stdlib --out data/stdlib --seq-len 256
    fleet prepare --source corpus/ notes.jsonl --tokenizer tokenizer.json --out data/mine
    fleet prepare --stdlib --train-tokenizer 4096 --out data/stdlib-bpe4k --seq-len 256

With --train-tokenizer, a byte-level BPE is first trained on the same inputs (`bpe`; one more
streaming read of them) and saved as tokenizer.json in the dataset folder; its identity, with
its sha256, is the dataset's tokenizer identity, as for a tokenizer.json given with --tokenizer.

Documents are tokenized, each followed by one EOS (no BOS: the EOS before a document marks
its start, and saves a token per document), packed back to back, and cut into consecutive
rows of seq_len + 1 ids (inputs row[:-1], targets row[1:]). Only the very last row is padded
with PAD. Rows, not documents, are held out for validation, by a hash of the row index, so a
corpus of a few large files still gets the requested fraction; the cost is that a validation
row's neighbours in its document may be training rows.

Memory stays bounded whatever the corpus: files are read in chunks, at most one row group
of rows is buffered per subset (train, val), and shards are written as they fill. Everything
is written into a temporary sibling folder that replaces --out only when complete, so a crash
never leaves a half dataset that looks whole. The same inputs give byte-identical output.

This module is the command and the order of the steps; the steps are nouns beside it:
`sources` (list and read the inputs), `bpe` (the trained tokenizer), `packer` (token rows),
`shard_writer` (Parquet shards) and `dataset_format` (dataset.json, shared with the reader,
`trainer.data.dataset`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from telemetry.files import replace_dir
from trainer.data.bpe import TOKENIZER_FILE, check_vocab, load_trained, train_bpe, trained_intact
from trainer.data.bpe import training_params as bpe_params
from trainer.data.dataset_format import (
    META_NAME,
    SUBSETS,
    VERSION,
    existing_meta,
    new_meta,
    shard_entries,
    shards_intact,
    write_meta,
)
from trainer.data.packer import Packer
from trainer.data.progress_bar import ProgressBar
from trainer.data.shard_writer import ShardWriter
from trainer.data.sources import PrepareError, Source, list_sources, pieces, texts
from trainer.data.tokenizer import Tokenizer, TokenizerError, identity_digest_part, load_tokenizer

__all__ = [
    "PrepareConfig",
    "PrepareError",
    "PrepareResult",
    "add_arguments",
    "main",
    "prepare",
    "summary",
]


@dataclass
class PrepareConfig:
    """What `fleet prepare` was asked to do."""

    out: Path
    sources: list[str] = field(default_factory=list)
    stdlib: bool = False
    glob: str = "**/*.txt"
    text_field: str = "text"
    tokenizer: str = "byte"
    train_tokenizer: int = 0  # vocabulary of a BPE to train on the sources (0 = off)
    seq_len: int = 1024
    val_fraction: float = 0.01
    rows_per_shard: int = 65536
    rows_per_group: int = 1024
    max_files: int = 0
    force: bool = False


@dataclass
class PrepareResult:
    """The dataset's metadata, and whether --out was already up to date."""

    meta: dict[str, Any]
    up_to_date: bool


# --- command line ------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `fleet prepare`."""
    from trainer.config import DefaultsHelp

    parser.formatter_class = DefaultsHelp  # every default in --help
    parser.add_argument(
        "--source",
        metavar="PATH",
        nargs="+",
        action="extend",
        default=[],
        help="text, .jsonl or .parquet files, or folders (walked with --glob)",
    )
    parser.add_argument(
        "--stdlib",
        action="store_true",
        help="use this Python's standard-library source files (a corpus every machine has)",
    )
    parser.add_argument("--glob", default="**/*.txt", help="files to take from a folder")
    parser.add_argument(
        "--text-field", default="text", help="the text field of .jsonl rows / .parquet columns"
    )
    parser.add_argument(
        "--tokenizer", default="byte", help="'byte' (259 ids) or a tokenizer.json path"
    )
    parser.add_argument(
        "--train-tokenizer",
        metavar="VOCAB",
        type=int,
        default=0,
        help="train a byte-level BPE of VOCAB ids on the inputs and save it as tokenizer.json"
        " in --out (0 = off: use --tokenizer)",
    )
    parser.add_argument("--out", required=True, type=Path, help="dataset folder to write")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per training sample")
    parser.add_argument(
        "--val-fraction", type=float, default=0.01, help="share of rows held out for validation"
    )
    parser.add_argument("--rows-per-shard", type=int, default=65536, help="rows per Parquet file")
    parser.add_argument(
        "--rows-per-group",
        type=int,
        default=1024,
        help="rows per Parquet row group (training reads whole groups: keep them small)",
    )
    parser.add_argument(
        "--max-files", type=int, default=0, help="use only the first N files (0 = all)"
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace a different (or damaged) dataset already in --out; a folder holding "
        "anything but a dataset is refused all the same",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar or summary")


def main(args: argparse.Namespace) -> int:
    """Run `fleet prepare`; returns the exit code (2 on bad input, with a one-line error)."""
    config = PrepareConfig(
        out=Path(args.out),
        sources=list(args.source or []),
        stdlib=bool(args.stdlib),
        glob=args.glob,
        text_field=args.text_field,
        tokenizer=args.tokenizer,
        train_tokenizer=args.train_tokenizer,
        seq_len=args.seq_len,
        val_fraction=args.val_fraction,
        rows_per_shard=args.rows_per_shard,
        rows_per_group=args.rows_per_group,
        max_files=args.max_files,
        force=args.force,
    )
    quiet = bool(args.quiet)
    try:
        result = prepare(config, progress=not quiet)
    except (PrepareError, TokenizerError) as e:
        print(f"fleet prepare: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, permissions on --out: not worth a traceback
        where = e.filename or config.out
        print(f"fleet prepare: error: {where}: {e.strerror or e}", file=sys.stderr)
        return 2
    if not quiet:
        print(summary(config.out, result))
    return 0


def summary(out: Path, result: PrepareResult) -> str:
    """The one or two lines `fleet prepare` prints when done."""
    meta, counts = result.meta, result.meta["counts"]
    if result.up_to_date:
        return f"fleet prepare: {out} is up to date (digest {meta['digest'][:12]})"
    shards = len(shard_entries(meta))
    text = (
        f"fleet prepare: {out}: {counts['documents']:,} documents, {counts['tokens']:,} tokens"
        f" -> {counts['train_rows']:,} train + {counts['val_rows']:,} val rows of"
        f" {meta['seq_len']}+1 tokens in {shards} shards (digest {meta['digest'][:12]})"
    )
    if meta["params"]["tokenizer"].get("kind") == "bpe":
        text += (
            f"\nfleet prepare: trained a byte-level BPE of {meta['tokenizer']['vocab_size']:,}"
            f" ids: {out / TOKENIZER_FILE}"
        )
    if counts["skipped_files"]:
        text += f"\nfleet prepare: skipped {counts['skipped_files']} unreadable or non-UTF-8 files"
    return text


# --- the pipeline ------------------------------------------------------------------------


def prepare(config: PrepareConfig, progress: bool = False) -> PrepareResult:
    """Make (or confirm) the dataset `config` describes; raises PrepareError on bad input."""
    _check_config(config)
    trained = config.train_tokenizer != 0
    tokenizer = None if trained else load_tokenizer(config.tokenizer)
    params = _params(config, tokenizer)
    out = config.out
    with ProgressBar(progress) as bar:
        sources, skipped = list_sources(
            config.sources, config.glob, config.max_files, config.stdlib, bar
        )
        if not sources:
            raise PrepareError("no input files (nothing matched, or every file was skipped)")
        existing = existing_meta(out)
        if _up_to_date(out, existing, config.force, params, sources, skipped, trained):
            return PrepareResult(existing, up_to_date=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            if trained:
                tokenizer = _train_tokenizer(config, sources, tmp, bar)
            meta = _build(config, tokenizer, params, sources, skipped, tmp, bar)
            replace_dir(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return PrepareResult(meta, up_to_date=False)


def _check_config(c: PrepareConfig) -> None:
    if not c.sources and not c.stdlib:
        raise PrepareError("no input: give --source PATH ... or --stdlib")
    for name, value, low in (
        ("--seq-len", c.seq_len, 1),
        ("--rows-per-shard", c.rows_per_shard, 1),
        ("--rows-per-group", c.rows_per_group, 1),
        ("--max-files", c.max_files, 0),
    ):
        if value < low:
            raise PrepareError(f"{name} must be at least {low}, got {value}")
    if not 0.0 <= c.val_fraction < 1.0:
        raise PrepareError(f"--val-fraction must be in [0, 1), got {c.val_fraction}")
    if c.train_tokenizer != 0:
        if c.tokenizer != "byte":
            raise PrepareError(
                f"--train-tokenizer makes the tokenizer, --tokenizer {c.tokenizer} names one:"
                " give one of them"
            )
        check_vocab(c.train_tokenizer)


def _params(c: PrepareConfig, tokenizer: Tokenizer | None) -> dict[str, Any]:
    """Everything besides the sources that decides the output bytes (tokenizer None: the
    one --train-tokenizer will train, described by how it is trained)."""
    return {
        "glob": c.glob,
        "max_files": c.max_files,
        "rows_per_group": c.rows_per_group,
        "rows_per_shard": c.rows_per_shard,
        "seq_len": c.seq_len,
        "stdlib": c.stdlib,
        "text_field": c.text_field,
        "tokenizer": (
            bpe_params(c.train_tokenizer)
            if tokenizer is None
            else identity_digest_part(tokenizer.identity())
        ),
        "val_fraction": c.val_fraction,
        "version": VERSION,
    }


def _train_tokenizer(
    c: PrepareConfig, sources: list[Source], folder: Path, bar: ProgressBar
) -> Tokenizer:
    """Train the BPE on every source into `folder`/tokenizer.json: one more read of the inputs."""
    task = bar.add("BPE", total=sum(s.size for s in sources))
    path = folder / TOKENIZER_FILE
    train_bpe(texts(sources, c.text_field, lambda n: bar.advance(task, n)), c.train_tokenizer, path)
    return load_trained(path, c.out / TOKENIZER_FILE)


def _build(
    c: PrepareConfig,
    tokenizer: Tokenizer,
    params: dict[str, Any],
    sources: list[Source],
    skipped: int,
    folder: Path,
    bar: ProgressBar,
) -> dict[str, Any]:
    """Tokenize every source into shards under `folder` and write its dataset.json."""
    dtype = np.uint16 if tokenizer.vocab_size <= 65535 else np.uint32
    width = c.seq_len + 1
    train = ShardWriter(folder, "train", width, dtype, c.rows_per_shard, c.rows_per_group)
    val = ShardWriter(folder, "val", width, dtype, c.rows_per_shard, c.rows_per_group)
    packer = Packer(width, dtype, tokenizer.pad_id, c.val_fraction, train, val, c.rows_per_group)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    task = bar.add("tokenizing", total=sum(s.size for s in sources))
    documents = 0
    for src in sources:
        for piece in pieces(src, c.text_field, lambda n: bar.advance(task, n)):
            if piece is None:
                packer.add(eos)
                documents += 1
            else:
                packer.add(tokenizer.encode(piece))
    packer.finish()
    train.close()
    val.close()
    if packer.next_row == 0:
        raise PrepareError("the input holds no text (zero tokens)")
    meta = new_meta(
        params=params,
        sources=[s.record() for s in sources],
        tokenizer=tokenizer.identity(),
        seq_len=c.seq_len,
        dtype=np.dtype(dtype).name,
        rows_per_group=c.rows_per_group,
        counts={
            "documents": documents,
            "tokens": packer.tokens,
            "pad_tokens": packer.pad_tokens,
            "train_rows": train.rows,
            "val_rows": val.rows,
            "skipped_files": skipped,
        },
        shards={"train": train.shards, "val": val.shards},
    )
    write_meta(folder, meta)
    return meta


# --- the output folder -------------------------------------------------------------------


def _up_to_date(
    out: Path,
    existing: dict[str, Any] | None,
    force: bool,
    params: dict[str, Any],
    sources: list[Source],
    skipped: int,
    trained: bool,
) -> bool:
    """Whether `out` already holds this very dataset; raises PrepareError if it holds
    something else. --force replaces only a dataset (as `fleet export --force` replaces only
    an export): a folder with anything else in it is refused, forced or not."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {out} is a file, not a folder")
    if out.is_dir() and (why := _not_a_dataset(out, existing)):
        raise PrepareError(why)
    if existing is not None and not force:
        if _same_inputs(existing, params, sources, skipped):
            if shards_intact(out, existing) and (not trained or trained_intact(out, existing)):
                return True
            raise PrepareError(f"{out} holds a damaged dataset; use --force to rebuild it")
        raise PrepareError(
            f"{out} already holds a different dataset (digest {existing.get('digest')!s:.12});"
            " use --force to replace it"
        )
    return False


DATASET_FILE = re.compile(rf"^(?:{'|'.join(SUBSETS)})-\d+\.parquet$")  # shard_writer's names


def _not_a_dataset(out: Path, existing: dict[str, Any] | None) -> str:
    """Why `out` (a folder) is no dataset that prepare may write over, or "" when it is one
    (or empty). Replacing a folder deletes what it holds: only a dataset's own files may go."""
    from telemetry import rundir

    if held := rundir.held(out):
        return (
            f"{out} holds a training run ({', '.join(held)}), not a dataset: choose another "
            "--out (prepare replaces only a dataset)"
        )
    names = sorted(p.name for p in out.iterdir())
    if existing is None:
        if not names:
            return ""
        return (
            f"{out} is not empty and holds no dataset ({META_NAME}): choose another --out "
            "(prepare writes into an empty folder, or replaces a dataset)"
        )
    others = [
        n for n in names if n not in (META_NAME, TOKENIZER_FILE) and not DATASET_FILE.match(n)
    ]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return (
            f"{out} holds a dataset and other files ({shown}): replacing it would delete "
            "them; move them out, or choose another --out"
        )
    return ""


def _same_inputs(meta: dict[str, Any], params, sources: list[Source], skipped: int) -> bool:
    """Whether `meta` was made from these very bytes with these parameters (paths aside)."""
    try:
        theirs = [(s["kind"], s["size"], s["sha256"]) for s in meta["sources"]]
        same_skips = meta["counts"]["skipped_files"] == skipped
    except (KeyError, TypeError):
        return False
    ours = [(s.kind, s.size, s.sha256) for s in sources]
    return meta.get("params") == params and theirs == ours and same_skips
