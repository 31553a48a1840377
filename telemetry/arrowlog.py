"""Each rank's durable log: updates and events appended to Arrow IPC stream files, and read back.

Layout, in the run folder::

    telemetry/rank-N.arrow          updates of rank N, first session
    telemetry/rank-N.1.arrow        ... of the session after a resume, and so on
    telemetry/events-rank-N.arrow   events of rank N (same segment numbering)

A stream file is written one small record batch at a time and flushed after each, so a rank
that crashes leaves a readable prefix: readers stop at the first incomplete batch. A resumed
run never reopens an old segment; it starts the next one, and readers concatenate segments
in order. Event `data` maps are stored as a JSON string column.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from telemetry import rundir
from telemetry.errors import TelemetryError
from telemetry.records import Event, Update

log = logging.getLogger(__name__)


_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "float | None": pa.float64()}
_ARROW_TYPES |= {"bool": pa.bool_(), "str": pa.string()}
_CONVERT = {"int": int, "float": float, "bool": bool, "str": str}


def _update_schema() -> pa.Schema:
    fields = [
        pa.field(f.name, _ARROW_TYPES[str(f.type)], nullable=str(f.type).endswith("None"))
        for f in dataclasses.fields(Update)
    ]
    return pa.schema(fields, metadata={"fleet.record": "update", "fleet.protocol": "1"})


UPDATE_SCHEMA = _update_schema()
EVENT_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("rank", pa.int64(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("data", pa.string(), nullable=False),  # JSON
        pa.field("time", pa.float64(), nullable=False),
    ],
    metadata={"fleet.record": "event", "fleet.protocol": "1"},
)
# (name, converter) per Update field: the trainer may hand numpy / mlx scalars.
_UPDATE_COLUMNS = [
    (f.name, _CONVERT.get(str(f.type).removesuffix(" | None"), lambda v: v), str(f.type))
    for f in dataclasses.fields(Update)
]


def log_dir(run_dir: str | Path) -> Path:
    """Where a run's telemetry logs live."""
    return rundir.at(run_dir).telemetry


def update_stem(rank: int) -> str:
    return f"rank-{rank}"


def event_stem(rank: int) -> str:
    return f"events-rank-{rank}"


def segments(directory: Path, stem: str) -> list[Path]:
    """The segments of one log, oldest first: `stem.arrow`, `stem.1.arrow`, `stem.2.arrow`, ..."""
    pattern = re.compile(rf"^{re.escape(stem)}(?:\.(\d+))?\.arrow$")
    found = []
    if directory.is_dir():
        for path in directory.iterdir():
            m = pattern.match(path.name)
            if m:
                found.append((int(m.group(1) or 0), path))
    return [p for _, p in sorted(found)]


def _next_segment(directory: Path, stem: str) -> tuple[int, Path]:
    existing = segments(directory, stem)
    n = 0
    if existing:
        last = existing[-1].name.removesuffix(".arrow").removeprefix(stem)
        n = int(last[1:]) + 1 if last else 1
    return n, directory / (f"{stem}.arrow" if n == 0 else f"{stem}.{n}.arrow")


def update_row(record: Update) -> dict[str, Any]:
    """One Update as a row of UPDATE_SCHEMA (values coerced to plain Python numbers)."""
    row = {}
    for name, convert, kind in _UPDATE_COLUMNS:
        value = getattr(record, name)
        row[name] = None if value is None and kind.endswith("None") else convert(value)
    return row


def event_row(event: Event) -> dict[str, Any]:
    """One Event as a row of EVENT_SCHEMA."""
    return {
        "kind": str(event.kind),
        "rank": int(event.rank),
        "step": int(event.step),
        "message": str(event.message),
        "data": json.dumps(event.data, default=str),
        "time": float(event.time),
    }


class SegmentWriter:
    """Appends record batches to one new stream file, opened on the first write."""

    def __init__(self, directory: Path, stem: str, schema: pa.Schema) -> None:
        self.directory = directory
        self.stem = stem
        self.schema = schema
        self.path: Path | None = None
        self._file: BinaryIO | None = None
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Write `rows` as one batch and flush it to the OS (a crash after this keeps them)."""
        if not rows:
            return
        batch = pa.RecordBatch.from_pylist(rows, schema=self.schema)
        if self._writer is None:
            self._open()
        assert self._writer is not None and self._file is not None
        self._writer.write_batch(batch)
        self._file.flush()

    def _open(self) -> None:
        for _ in range(100):  # another process may take the same number: take the next
            _, path = _next_segment(self.directory, self.stem)
            try:
                self._file = open(path, "xb")  # noqa: SIM115 - closed in close()
            except FileExistsError:
                continue
            self.path = path
            self._writer = pa.ipc.new_stream(self._file, self.schema)
            return
        raise TelemetryError(f"cannot find a free segment name for {self.directory}/{self.stem}")

    def close(self) -> None:
        """Write the end-of-stream marker and close the file."""
        try:
            if self._writer is not None:
                self._writer.close()
        finally:
            if self._file is not None:
                self._file.close()
            self._writer = self._file = None


class ArrowLog:
    """One rank's log writer: `put` from any thread; a daemon thread writes every `interval`.

    A write costs about a millisecond of CPU whatever its size (cold caches after the sleep),
    so the thread writes once a second: a crash loses at most the last second of records.

    `put` never blocks: records wait in a bounded queue (the oldest is dropped and counted if
    the writer falls behind). A write error (disk full) is logged once and stops the log; it
    never reaches the training loop.
    """

    def __init__(
        self, run_dir: str | Path, rank: int, *, queue_size: int = 4096, interval: float = 1.0
    ) -> None:
        self.directory = log_dir(run_dir)
        self.rank = rank
        self.interval = interval
        self.dropped = 0
        self.written = 0
        self.failed: str | None = None
        self.cpu_s = 0.0
        self._queue: collections.deque[Update | Event] = collections.deque(maxlen=queue_size)
        self._updates = SegmentWriter(self.directory, update_stem(rank), UPDATE_SCHEMA)
        self._events = SegmentWriter(self.directory, event_stem(rank), EVENT_SCHEMA)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ArrowLog:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TelemetryError(f"cannot create the log folder {self.directory}: {e}") from None
        self._thread = threading.Thread(
            target=self._run, name=f"telemetry-log-{self.rank}", daemon=True
        )
        self._thread.start()
        return self

    def put(self, record: Update | Event) -> None:
        """Queue a record for the file; never blocks, never raises."""
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1  # deque drops the oldest itself; the count may race by one
        self._queue.append(record)

    @property
    def paths(self) -> list[Path]:
        """The segment files this writer has opened."""
        return [w.path for w in (self._updates, self._events) if w.path is not None]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()
            self.cpu_s = time.thread_time()  # this thread's CPU so far (for benchmarks)
        self.flush()

    def flush(self) -> None:
        """Write whatever is queued, now (the thread does this every `interval`)."""
        batch = []
        while self._queue:
            try:
                batch.append(self._queue.popleft())
            except IndexError:
                break
        if batch:
            self.write(batch)

    def write(self, records: Iterable[Update | Event]) -> None:
        """Write records synchronously (the thread's work; also usable without the thread)."""
        if self.failed:
            self.dropped += sum(1 for _ in records)
            return
        updates, events = [], []
        for r in records:
            try:
                if isinstance(r, Update):
                    updates.append(update_row(r))
                elif isinstance(r, Event):
                    events.append(event_row(r))
            except (TypeError, ValueError) as e:
                self.dropped += 1
                log.warning("rank %d: a %s record cannot be logged: %s", self.rank, r.type, e)
        try:
            self._updates.write(updates)
            self._events.write(events)
            self.written += len(updates) + len(events)
        except (OSError, pa.ArrowException, TelemetryError) as e:
            self.failed = str(e)
            self.dropped += len(updates) + len(events)
            log.error("rank %d: telemetry log stopped: %s", self.rank, e)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, end the files cleanly, and stop the thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush()
        for w in (self._updates, self._events):
            try:
                w.close()
            except (OSError, pa.ArrowException) as e:
                log.error("rank %d: closing %s: %s", self.rank, w.path, e)


# --- reading ----------------------------------------------------------------------------------


def read_stream(path: Path) -> tuple[list[pa.RecordBatch], bool]:
    """The record batches of one stream file, and whether it ended on a whole batch.

    An unclosed file (a crash between batches) reads whole; one cut off mid-batch gives the
    batches before the cut, and False.
    """
    batches: list[pa.RecordBatch] = []
    try:
        with open(path, "rb") as f:
            try:
                reader = pa.ipc.open_stream(f)
            except (pa.ArrowInvalid, OSError):
                return batches, False  # cut off inside the schema: nothing was logged yet
            while True:
                try:
                    batches.append(reader.read_next_batch())
                except StopIteration:
                    return batches, True
                except (pa.ArrowInvalid, OSError):
                    return batches, False
    except OSError as e:
        raise TelemetryError(f"cannot read telemetry log {path}: {e.strerror}") from None


def _read_log(directory: Path, stem: str, schema: pa.Schema) -> pa.Table:
    tables = []
    for path in segments(directory, stem):
        batches, _ = read_stream(path)
        if batches:
            tables.append(pa.Table.from_batches(batches))
    if not tables:
        return schema.empty_table()
    # Segments written by an older version may lack newer columns: those read as nulls.
    return pa.concat_tables(tables, promote_options="default")


def log_ranks(run_dir: str | Path) -> list[int]:
    """The ranks that have an update or event log in this run folder."""
    ranks = set()
    directory = log_dir(run_dir)
    if directory.is_dir():
        for path in directory.iterdir():
            m = re.match(r"^(?:events-)?rank-(\d+)(?:\.\d+)?\.arrow$", path.name)
            if m:
                ranks.add(int(m.group(1)))
    return sorted(ranks)


def read_updates(run_dir: str | Path, rank: int | None = None) -> pa.Table:
    """All logged updates of one rank (or of every rank, rank by rank), all segments in order."""
    ranks = [rank] if rank is not None else log_ranks(run_dir)
    tables = [_read_log(log_dir(run_dir), update_stem(r), UPDATE_SCHEMA) for r in ranks]
    if not tables:
        return UPDATE_SCHEMA.empty_table()
    return pa.concat_tables(tables, promote_options="default")


def read_events(run_dir: str | Path, rank: int | None = None) -> list[Event]:
    """All logged events of one rank (or every rank), as Event records, oldest segment first."""
    ranks = [rank] if rank is not None else log_ranks(run_dir)
    out = []
    for r in ranks:
        for row in _read_log(log_dir(run_dir), event_stem(r), EVENT_SCHEMA).to_pylist():
            try:
                data = json.loads(row.get("data") or "{}")
            except ValueError:
                data = {"unparsed": row.get("data")}
            row["data"] = data if isinstance(data, dict) else {"value": data}
            out.append(Event(**{k: v for k, v in row.items() if k in Event.__dataclass_fields__}))
    return out
