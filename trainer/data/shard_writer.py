"""Token rows of one dataset subset written as Parquet shards, a row group at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from telemetry.files import file_sha256


class ShardWriter:
    """Writes one subset's rows as `{subset}-00000.parquet`, ... in row groups as they fill.

    Holds less than one row group of rows at a time. Each shard's dataset.json entry (file,
    rows, and once closed its bytes and sha256) is in `shards`.
    """

    def __init__(
        self,
        folder: Path,
        subset: str,
        width: int,
        dtype: type[np.unsignedinteger],
        rows_per_shard: int,
        rows_per_group: int,
    ) -> None:
        self.folder, self.subset, self.width = folder, subset, width
        self.per_shard, self.per_group = rows_per_shard, rows_per_group
        value = pa.uint16() if dtype == np.uint16 else pa.uint32()
        self.schema = pa.schema([("tokens", pa.list_(value, width))])
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self.writer: pq.ParquetWriter | None = None
        self.shard_rows = 0
        self.shards: list[dict[str, Any]] = []
        self.rows = 0

    def add(self, rows: np.ndarray) -> None:
        """Append rows (n, width); whole row groups are written as soon as they fill."""
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
            name = f"{self.subset}-{len(self.shards):05d}.parquet"
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
        """Write what is buffered, close the last shard, record each shard's size and sha256."""
        while self.buffered:
            self._write_group(min(self.buffered, self._room()))
        self._close_shard()
        for entry in self.shards:
            entry["bytes"] = (self.folder / entry["file"]).stat().st_size
            entry["sha256"] = file_sha256(self.folder / entry["file"])
