"""`fleet prepare`: text files, JSONL or Parquet in; fixed-length Parquet token shards out.

    fleet prepare --stdlib --out data/stdlib --seq-len 256
    fleet prepare --source corpus/ notes.jsonl --tokenizer tokenizer.json --out data/mine

Documents are tokenized, each followed by one EOS (no BOS: the EOS before a document marks
its start, and saves a token per document), packed back to back, and cut into consecutive
rows of seq_len + 1 ids (inputs row[:-1], targets row[1:]). Only the very last row is padded
with PAD. Rows, not documents, are split into train and validation by a hash of the row
index, so a corpus of a few large files still gets the requested fraction; the cost is that
a validation row's neighbours in its document may be in the training split.

Memory stays bounded whatever the corpus: files are read in chunks, at most one row group
of rows is buffered per split, and shards are written as they fill. Everything is written
into a temporary sibling folder that replaces --out only when complete, so a crash never
leaves a half dataset that looks whole. The same inputs give byte-identical output.
"""

from __future__ import annotations

import argparse
import codecs
import hashlib
import json
import os
import shutil
import sys
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from telemetry.files import file_sha256, replace_dir
from trainer.dataset_format import (
    META_NAME,
    VERSION,
    existing_meta,
    new_meta,
    shards_intact,
    write_meta,
)
from trainer.tokenizer import Tokenizer, TokenizerError, identity_digest_part, load_tokenizer

READ_CHUNK = 4 << 20  # bytes of a text file tokenized at once
ROW_HASH_SALT = 0x9E3779B97F4A7C15  # splitmix64's increment: the val split's row hash


class PrepareError(Exception):
    """Bad input or output for `fleet prepare`; the message names the file, field or value."""


@dataclass(frozen=True)
class Source:
    """One input file, with the size and sha256 it had when listed."""

    path: Path
    display: str  # the path as the user gave it (or as found under a folder they gave)
    kind: str  # "text", "jsonl" or "parquet"
    size: int
    sha256: str

    def record(self) -> dict[str, Any]:
        return {"path": self.display, "kind": self.kind, "size": self.size, "sha256": self.sha256}


@dataclass
class PrepareConfig:
    """What `fleet prepare` was asked to do."""

    out: Path
    sources: list[str] = field(default_factory=list)
    stdlib: bool = False
    glob: str = "**/*.txt"
    text_field: str = "text"
    tokenizer: str = "byte"
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
        "--force", action="store_true", help="replace a different dataset already in --out"
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
    shards = len(meta["shards"]["train"]) + len(meta["shards"]["val"])
    text = (
        f"fleet prepare: {out}: {counts['documents']:,} documents, {counts['tokens']:,} tokens"
        f" -> {counts['train_rows']:,} train + {counts['val_rows']:,} val rows of"
        f" {meta['seq_len']}+1 tokens in {shards} shards (digest {meta['digest'][:12]})"
    )
    if counts["skipped_files"]:
        text += f"\nfleet prepare: skipped {counts['skipped_files']} unreadable or non-UTF-8 files"
    return text


# --- the pipeline ------------------------------------------------------------------------


def prepare(config: PrepareConfig, progress: bool = False) -> PrepareResult:
    """Make (or confirm) the dataset `config` describes; raises PrepareError on bad input."""
    _check_config(config)
    tokenizer = load_tokenizer(config.tokenizer)
    dtype = np.uint16 if tokenizer.vocab_size <= 65535 else np.uint32
    params = _params(config, tokenizer)
    out = config.out
    with _Progress(progress) as bar:
        sources, skipped = list_sources(config, bar)
        if not sources:
            raise PrepareError("no input files (nothing matched, or every file was skipped)")
        existing = existing_meta(out)
        if existing is not None and not config.force:
            if _same_inputs(existing, params, sources, skipped):
                if shards_intact(out, existing):
                    return PrepareResult(existing, up_to_date=True)
                raise PrepareError(f"{out} holds a damaged dataset; use --force to rebuild it")
            raise PrepareError(
                f"{out} already holds a different dataset (digest {existing.get('digest')!s:.12});"
                " use --force to replace it"
            )
        if out.exists() and not out.is_dir():
            raise PrepareError(f"--out {out} is a file, not a folder")
        if existing is None and out.exists() and not config.force and any(out.iterdir()):
            raise PrepareError(f"{out} is not empty and holds no {META_NAME}; use --force")
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            meta = _build(config, tokenizer, dtype, params, sources, skipped, tmp, bar)
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


def _params(c: PrepareConfig, tokenizer: Tokenizer) -> dict[str, Any]:
    """Everything besides the sources that decides the output bytes."""
    return {
        "glob": c.glob,
        "max_files": c.max_files,
        "rows_per_group": c.rows_per_group,
        "rows_per_shard": c.rows_per_shard,
        "seq_len": c.seq_len,
        "stdlib": c.stdlib,
        "text_field": c.text_field,
        "tokenizer": identity_digest_part(tokenizer.identity()),
        "val_fraction": c.val_fraction,
        "version": VERSION,
    }


# --- sources -----------------------------------------------------------------------------


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".jsonl": "jsonl", ".parquet": "parquet"}.get(suffix, "text")


def list_sources(config: PrepareConfig, bar: _Progress | None = None) -> tuple[list[Source], int]:
    """The input files in order, each hashed, and how many stdlib files were skipped."""
    files: list[tuple[Path, str]] = []
    for given in config.sources:
        path = Path(given).expanduser()
        if path.is_dir():
            found = sorted(
                (p for p in path.glob(config.glob) if p.is_file()),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not found:
                raise PrepareError(f"no files match {config.glob!r} under {given}")
            files += [(p, str(Path(given) / p.relative_to(path))) for p in found]
        elif path.exists():
            files.append((path, given))
        else:
            raise PrepareError(f"no such file or folder: {given}")
    limit = config.max_files or None
    if limit is not None:
        files = files[:limit]
    task = bar.add("hashing", total=len(files)) if bar and files else None
    sources = []
    for path, display in files:
        try:
            size, digest = path.stat().st_size, file_sha256(path)
        except OSError as e:
            raise PrepareError(f"cannot read {display}: {e.strerror or e}") from e
        sources.append(Source(path, display, _kind(path), size, digest))
        if bar:
            bar.advance(task)
    skipped = 0
    if config.stdlib:
        room = None if limit is None else limit - len(sources)
        found, skipped = _stdlib_sources(room, bar)
        sources += found
    return sources, skipped


def _stdlib_sources(limit: int | None, bar: _Progress | None) -> tuple[list[Source], int]:
    """The running Python's standard-library .py files, minus site-packages and bad files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names = []
    for folder, dirs, filenames in os.walk(root):
        # site-packages lives inside the stdlib folder on most installs; it is not stdlib.
        dirs[:] = [d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__")]
        rel = Path(folder).relative_to(root)
        names += [(rel / f).as_posix() for f in filenames if f.endswith(".py")]
    names.sort()
    task = bar.add("stdlib", total=len(names) if limit is None else limit) if bar else None
    sources, skipped = [], 0
    for name in names:
        if limit is not None and len(sources) >= limit:
            break
        path = root / name
        try:
            data = path.read_bytes()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            skipped += 1  # some test files are latin-1 or unreadable on purpose
            continue
        sources.append(Source(path, str(path), "text", len(data), hashlib.sha256(data).hexdigest()))
        if bar:
            bar.advance(task)
    return sources, skipped


# --- reading documents -------------------------------------------------------------------


def _pieces(src: Source, text_field: str, advance: Callable[[int], None]) -> Iterator[str | None]:
    """The source's text in pieces; None marks the end of a document.

    Files are hashed as they are read and must match the sha256 they were listed with,
    so dataset.json never describes bytes other than the ones tokenized.
    """
    if src.kind == "parquet":
        yield from _parquet_pieces(src, text_field, advance)
        actual = file_sha256(src.path)  # pyarrow reads the file itself: hash it again after
    else:
        h = hashlib.sha256()
        if src.kind == "text":
            yield from _text_pieces(src, h, advance)
        else:
            yield from _jsonl_pieces(src, text_field, h, advance)
        actual = h.hexdigest()
    if actual != src.sha256:
        raise PrepareError(f"{src.display} changed while it was being read")


def _open(src: Source):
    try:
        return open(src.path, "rb")
    except OSError as e:
        raise PrepareError(f"cannot read {src.display}: {e.strerror or e}") from e


def _text_pieces(src: Source, h, advance: Callable[[int], None]) -> Iterator[str | None]:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    carry, offset = "", 0
    with _open(src) as f:
        while block := f.read(READ_CHUNK):
            h.update(block)
            try:
                text = carry + decoder.decode(block)
            except UnicodeDecodeError as e:
                at = offset + max(e.start - len(decoder.getstate()[0]), 0)
                raise PrepareError(f"{src.display}: not UTF-8 text (near byte {at})") from e
            offset += len(block)
            advance(len(block))
            # Tokenize whole lines only, so a subword tokenizer never sees a word cut in two;
            # a file without newlines is still cut, or it would have to fit in memory.
            cut = text.rfind("\n") + 1 or (len(text) if len(text) > READ_CHUNK else 0)
            if cut:
                yield text[:cut]
            carry = text[cut:]
        try:
            carry += decoder.decode(b"", final=True)
        except UnicodeDecodeError as e:
            raise PrepareError(f"{src.display}: not UTF-8 text (ends mid-character)") from e
    if carry:
        yield carry
    if offset:
        yield None


def _jsonl_pieces(src: Source, text_field: str, h, advance) -> Iterator[str | None]:
    with _open(src) as f:
        for lineno, line in enumerate(f, 1):
            h.update(line)
            advance(len(line))
            if not line.strip():
                continue
            where = f"{src.display}:{lineno}"
            try:
                row = json.loads(line)
            except UnicodeDecodeError as e:
                raise PrepareError(f"{where}: not UTF-8 text") from e
            except json.JSONDecodeError as e:
                raise PrepareError(f"{where}: not valid JSON ({e.msg})") from e
            if not isinstance(row, dict) or text_field not in row:
                raise PrepareError(f"{where}: no {text_field!r} field (see --text-field)")
            text = row[text_field]
            if not isinstance(text, str):
                raise PrepareError(f"{where}: field {text_field!r} is not a string")
            if text:
                yield text
                yield None


def _parquet_pieces(src: Source, text_field: str, advance) -> Iterator[str | None]:
    try:
        pf = pq.ParquetFile(src.path)
    except (pa.ArrowException, OSError) as e:
        raise PrepareError(f"{src.display}: not a readable Parquet file ({e})") from e
    schema = pf.schema_arrow
    if text_field not in schema.names:
        raise PrepareError(
            f"{src.display}: no column {text_field!r} (columns: {', '.join(schema.names)};"
            " see --text-field)"
        )
    kind = schema.field(text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise PrepareError(f"{src.display}: column {text_field!r} is {kind}, not text")
    row = 0
    for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
        column = batch.column(0)
        if column.null_count:
            first = row + column.is_null().to_pylist().index(True)
            raise PrepareError(f"{src.display}: row {first}: {text_field!r} is null")
        for text in column.to_pylist():
            if text:
                yield text
                yield None
        row += len(column)
    advance(src.size)


# --- rows and shards ---------------------------------------------------------------------


def row_hash(index: np.ndarray) -> np.ndarray:
    """splitmix64 of each row index: a fixed, well-mixed hash that decides the val split."""
    z = index.astype(np.uint64) + np.uint64(ROW_HASH_SALT)  # uint64 arrays wrap silently
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def is_val_row(index: np.ndarray, fraction: float) -> np.ndarray:
    """Whether each row index belongs to the validation split (row 0 never does)."""
    index = np.asarray(index, dtype=np.int64).reshape(-1)
    chosen = (row_hash(index) >> np.uint64(11)) < np.uint64(int(fraction * (1 << 53)))
    return chosen & (index != 0)


class _ShardWriter:
    """Writes one split's rows as `{split}-00000.parquet`, ... in row groups as they fill."""

    def __init__(self, folder: Path, split: str, width: int, dtype, c: PrepareConfig) -> None:
        self.folder, self.split, self.width = folder, split, width
        self.per_shard, self.per_group = c.rows_per_shard, c.rows_per_group
        value = pa.uint16() if dtype == np.uint16 else pa.uint32()
        self.schema = pa.schema([("tokens", pa.list_(value, width))])
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.writer: pq.ParquetWriter | None = None
        self.shard_rows = 0
        self.shards: list[dict[str, Any]] = []
        self.rows = 0

    def add(self, rows: np.ndarray) -> None:
        if len(rows):
            self.buffer.append(rows)
            self.buffered += len(rows)
        while self.buffered >= self._room():
            self._write_group(self._room())

    def _room(self) -> int:
        return min(self.per_group, self.per_shard - self.shard_rows)

    def _write_group(self, n: int) -> None:
        rows = np.concatenate(self.buffer) if len(self.buffer) > 1 else self.buffer[0]
        group, rest = rows[:n], rows[n:]
        self.buffer, self.buffered = ([rest], len(rest)) if len(rest) else ([], 0)
        if self.writer is None:
            name = f"{self.split}-{len(self.shards):05d}.parquet"
            self.shards.append({"file": name, "rows": 0})
            self.writer = pq.ParquetWriter(self.folder / name, self.schema, compression="zstd")
        flat = pa.array(np.ascontiguousarray(group).reshape(-1))
        tokens = pa.FixedSizeListArray.from_arrays(flat, self.width)
        self.writer.write_table(pa.table({"tokens": tokens}, schema=self.schema), n)
        self.shard_rows += n
        self.rows += n
        self.shards[-1]["rows"] += n
        if self.shard_rows == self.per_shard:
            self._close_shard()

    def _close_shard(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer, self.shard_rows = None, 0

    def close(self) -> None:
        while self.buffered:
            self._write_group(min(self.buffered, self._room()))
        self._close_shard()


class _Packer:
    """Packs token arrays into rows of `width` and routes them to the train or val writer.

    Holds fewer than one row group of tokens, plus the newest whole row: that row is routed
    only once the next one exists, so the final row can go to validation when the hash gave
    it no rows at all (small corpora must still get a validation set).
    """

    def __init__(self, width: int, dtype, pad: int, fraction: float, train, val, group: int):
        self.width, self.dtype, self.pad, self.fraction = width, dtype, pad, fraction
        self.train, self.val = train, val
        self.flush_at = width * group
        self.parts: list[np.ndarray] = []
        self.pending = 0
        self.held: np.ndarray | None = None
        self.next_row = 0  # global index of the held row (rows before it are routed)
        self.tokens = 0
        self.pad_tokens = 0

    def add(self, ids: np.ndarray) -> None:
        self.parts.append(ids)
        self.pending += len(ids)
        self.tokens += len(ids)
        if self.pending >= self.flush_at:
            self._cut(final=False)

    def _cut(self, final: bool) -> None:
        if not self.parts:
            self.parts = [np.zeros(0, dtype=self.dtype)]
        stream = np.concatenate(self.parts).astype(self.dtype, copy=False)
        whole = len(stream) // self.width
        rows = stream[: whole * self.width].reshape(whole, self.width)
        rest = stream[whole * self.width :]
        self.parts, self.pending = ([rest], len(rest)) if len(rest) else ([], 0)
        if final and len(rest) >= 2:  # a lone trailing EOS has no target to learn: dropped
            last = np.full((1, self.width), self.pad, dtype=self.dtype)
            last[0, : len(rest)] = rest
            self.pad_tokens += self.width - len(rest)
            rows = np.concatenate([rows, last])
        if final and len(rest) == 1:
            self.tokens -= 1
        if not len(rows):
            return
        if self.held is not None:
            rows = np.concatenate([self.held[None], rows])
        self.held = rows[-1].copy()
        self._route(rows[:-1])

    def _route(self, rows: np.ndarray) -> None:
        index = np.arange(self.next_row, self.next_row + len(rows))
        val = is_val_row(index, self.fraction)
        self.train.add(rows[~val])
        self.val.add(rows[val])
        self.next_row += len(rows)

    def finish(self) -> None:
        self._cut(final=True)
        if self.held is None:
            return
        index = self.next_row
        to_val = bool(is_val_row(np.array([index]), self.fraction)[0]) or (
            self.fraction > 0 and index >= 1 and self.val.rows == 0
        )
        (self.val if to_val else self.train).add(self.held[None])
        self.next_row += 1
        self.held = None


def _build(
    c: PrepareConfig,
    tokenizer: Tokenizer,
    dtype,
    params: dict[str, Any],
    sources: list[Source],
    skipped: int,
    folder: Path,
    bar: _Progress,
) -> dict[str, Any]:
    """Tokenize every source into shards under `folder` and write its dataset.json."""
    width = c.seq_len + 1
    train = _ShardWriter(folder, "train", width, dtype, c)
    val = _ShardWriter(folder, "val", width, dtype, c)
    packer = _Packer(width, dtype, tokenizer.pad_id, c.val_fraction, train, val, c.rows_per_group)
    eos = np.array([tokenizer.eos_id], dtype=dtype)
    task = bar.add("tokenizing", total=sum(s.size for s in sources))
    documents = 0
    for src in sources:
        for piece in _pieces(src, c.text_field, lambda n: bar.advance(task, n)):
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
    shards = {"train": train.shards, "val": val.shards}
    for entry in (*train.shards, *val.shards):
        entry["bytes"] = (folder / entry["file"]).stat().st_size
        entry["sha256"] = file_sha256(folder / entry["file"])
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
        shards=shards,
    )
    write_meta(folder, meta)
    return meta


# --- the output folder -------------------------------------------------------------------


def _same_inputs(meta: dict[str, Any], params, sources: list[Source], skipped: int) -> bool:
    """Whether `meta` was made from these very bytes with these parameters (paths aside)."""
    try:
        theirs = [(s["kind"], s["size"], s["sha256"]) for s in meta["sources"]]
        same_skips = meta["counts"]["skipped_files"] == skipped
    except (KeyError, TypeError):
        return False
    ours = [(s.kind, s.size, s.sha256) for s in sources]
    return meta.get("params") == params and theirs == ours and same_skips


# --- progress ----------------------------------------------------------------------------


class _Progress:
    """A rich progress bar on stderr when wanted; a no-op otherwise."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.bar = None

    def __enter__(self) -> _Progress:
        if self.wanted and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description:>10}"),
                BarColumn(),
                TaskProgressColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def add(self, description: str, total: int) -> int:
        return self.bar.add_task(description, total=total) if self.bar else 0

    def advance(self, task: int, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.advance(task, n)
