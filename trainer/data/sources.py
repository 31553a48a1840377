"""The input files of `fleet prepare`: listed and hashed, then read back as pieces of text.

Three readers: plain text files (UTF-8, read in chunks), JSONL (one document a line, in a
text field) and Parquet (a text column); plus the running Python's standard library as a
corpus every machine has. Every reader checks the file still has the sha256 it was listed
with, so dataset.json never describes bytes other than the ones tokenized.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from telemetry.files import file_sha256
from trainer.data.progress_bar import ProgressBar

READ_CHUNK = 4 << 20  # bytes of a text file tokenized at once


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
        """The source's entry in dataset.json."""
        return {"path": self.display, "kind": self.kind, "size": self.size, "sha256": self.sha256}


# --- listing -------------------------------------------------------------------------------


def _kind(path: Path) -> str:
    suffix = path.suffix.lower()
    return {".jsonl": "jsonl", ".parquet": "parquet"}.get(suffix, "text")


def list_sources(
    given: list[str],
    glob: str,
    max_files: int = 0,
    stdlib: bool = False,
    bar: ProgressBar | None = None,
) -> tuple[list[Source], int]:
    """The input files in order, each hashed, and how many stdlib files were skipped.

    `given` are files or folders (walked with `glob`); `max_files` keeps the first N of all
    the files (0 = all); `stdlib` adds the standard library's files after them.
    """
    files: list[tuple[Path, str]] = []
    for name in given:
        path = Path(name).expanduser()
        if path.is_dir():
            found = sorted(
                (p for p in path.glob(glob) if p.is_file()),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not found:
                raise PrepareError(f"no files match {glob!r} under {name}")
            files += [(p, str(Path(name) / p.relative_to(path))) for p in found]
        elif path.exists():
            files.append((path, name))
        else:
            raise PrepareError(f"no such file or folder: {name}")
    limit = max_files or None
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
    if stdlib:
        room = None if limit is None else limit - len(sources)
        found, skipped = _stdlib_sources(room, bar)
        sources += found
    return sources, skipped


def _stdlib_sources(limit: int | None, bar: ProgressBar | None) -> tuple[list[Source], int]:
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


# --- reading documents ---------------------------------------------------------------------


def pieces(src: Source, text_field: str, advance: Callable[[int], None]) -> Iterator[str | None]:
    """The source's text in pieces; None marks the end of a document.

    `advance(n)` is called as n more bytes of the file are read. Raises PrepareError if the
    file no longer has the sha256 it was listed with.
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


def texts(sources: list[Source], text_field: str, advance: Callable[[int], None]) -> Iterator[str]:
    """Every source's text, piece by piece and without the document ends: what a tokenizer
    trains on. Streams like `pieces`, so memory holds one piece at a time."""
    for src in sources:
        for piece in pieces(src, text_field, advance):
            if piece is not None:
                yield piece
