"""Training data: a prepared dataset read in one seeded global order that any rank split shares.

The data cursor is a single integer, the number of samples the run has consumed. Global
position g is sample `order(g // N)[g % N]` of the N training samples, so a run crosses
epochs without a seam, and rank r of a split takes its contiguous slice of each global
microbatch: positions [cursor + offset, cursor + offset + local_batch). Any split of the same
global batch therefore sees the same samples, which is what lets a run rebalance its ranks.

Nothing here holds the dataset in memory: rows are read a Parquet row group at a time
through a bounded LRU, and an epoch's order is built one window of row groups at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from telemetry.files import file_sha256
from trainer.data.dataset_format import (
    META_NAME,
    SUBSETS,
    DatasetError,
    dataset_digest,
    read_meta,
    shard_entries,
)


@dataclass(frozen=True)
class RowGroup:
    """One Parquet row group: where it is, and which samples of its subset it holds."""

    file: Path
    index: int  # row group number within the file
    start: int  # index of its first row within its subset (train or val)
    rows: int


class Dataset:
    """A dataset folder made by `fleet prepare`, checked on opening."""

    def __init__(
        self, path: Path, meta: dict[str, Any], train: list[RowGroup], val: list[RowGroup]
    ) -> None:
        self.path = path
        self.meta = meta
        self.train_groups = train
        self.val_groups = val
        self.digest: str = meta["digest"]
        self.val_digest: str = meta["val_digest"]
        self.seq_len: int = meta["seq_len"]
        self.tokenizer: dict[str, Any] = dict(meta["tokenizer"])
        beside = self.path / "tokenizer.json"
        if (
            self.tokenizer.get("sha256")
            and beside.is_file()
            and file_sha256(beside) == self.tokenizer["sha256"]
        ):
            # A tokenizer trained into the dataset travels with it: a moved or copied dataset
            # (another host, another path) finds it here. Digests ignore the path.
            self.tokenizer["path"] = str(beside)
        self.vocab_size: int = self.tokenizer["vocab_size"]
        self.pad_id: int = self.tokenizer["pad_id"]
        self.eos_id: int = self.tokenizer["eos_id"]
        self.bos_id: int = self.tokenizer["bos_id"]
        self.num_train = sum(g.rows for g in train)
        self.num_val = sum(g.rows for g in val)

    @classmethod
    def open(cls, path: str | Path) -> Dataset:
        """Open and validate a dataset folder; raises DatasetError naming what is wrong."""
        path = Path(path)
        meta = read_meta(path)
        width = meta["seq_len"] + 1
        groups = {subset: _row_groups(path, meta["shards"][subset], width) for subset in SUBSETS}
        if not groups["train"]:
            raise DatasetError(f"{path / META_NAME}: the dataset has no training rows")
        return cls(path, meta, groups["train"], groups["val"])

    def verify(self) -> None:
        """Hash every shard and compare with dataset.json (reads the whole dataset once)."""
        for entry in shard_entries(self.meta):
            if file_sha256(self.path / entry["file"]) != entry["sha256"]:
                raise DatasetError(f"{self.path / entry['file']}: sha256 differs from {META_NAME}")
        digest = dataset_digest(self.tokenizer, self.seq_len, self.meta["shards"])
        if digest != self.digest:
            raise DatasetError(f"{self.path / META_NAME}: digest does not match its shards")

    def read_group(self, group: RowGroup) -> np.ndarray:
        """The rows of one row group, (rows, seq_len + 1), in the file's integer dtype."""
        return read_row_group(group, self.seq_len + 1)

    def __repr__(self) -> str:
        return (
            f"Dataset({str(self.path)!r}, train={self.num_train}, val={self.num_val},"
            f" seq_len={self.seq_len}, digest={self.digest[:12]})"
        )


def _row_groups(folder: Path, entries: list[dict[str, Any]], width: int) -> list[RowGroup]:
    """The row groups of one subset's shards, checked against dataset.json (footers only)."""
    groups: list[RowGroup] = []
    start = 0
    for entry in entries:
        file = folder / entry["file"]
        try:
            md = pq.ParquetFile(file).metadata
            schema = md.schema.to_arrow_schema()
        except FileNotFoundError as e:
            raise DatasetError(f"{file}: shard missing (listed in {META_NAME})") from e
        except (OSError, pa.ArrowException) as e:
            raise DatasetError(f"{file}: not a readable Parquet file ({e})") from e
        if md.num_rows != entry["rows"]:
            raise DatasetError(f"{file}: {md.num_rows} rows, but {META_NAME} says {entry['rows']}")
        kind = schema.field("tokens").type if "tokens" in schema.names else None
        if not (pa.types.is_fixed_size_list(kind) and kind.list_size == width):
            raise DatasetError(f"{file}: column 'tokens' should be {width} ids a row, is {kind}")
        for i in range(md.num_row_groups):
            rows = md.row_group(i).num_rows
            groups.append(RowGroup(file, i, start, rows))
            start += rows
    return groups


def read_row_group(group: RowGroup, width: int) -> np.ndarray:
    """Decode one row group into a (rows, width) array."""
    try:
        table = pq.ParquetFile(group.file).read_row_group(group.index, columns=["tokens"])
    except (OSError, pa.ArrowException) as e:
        raise DatasetError(f"{group.file}: cannot read row group {group.index} ({e})") from e
    column = table.column(0).combine_chunks()
    rows = column.flatten().to_numpy().reshape(-1, width)
    if len(rows) != group.rows:
        raise DatasetError(f"{group.file}: row group {group.index} changed since opening")
    return rows


# --- the global sample order ---------------------------------------------------------------


class SampleOrder:
    """One seeded permutation of the sample indices per epoch, built a window at a time.

    For epoch e the row groups are permuted with `default_rng([seed, e])` and cut into
    windows of `window` groups; the samples of window k are permuted with
    `default_rng([seed, e, k, 1])`. Seeding each window on its own (rather than drawing
    them in turn from one generator) lets any window be built without the ones before it,
    so an epoch costs O(row groups) memory plus a few windows' rows, whatever its size.
    Reading a window touches only its `window` row groups, which keeps the row-group cache
    hot while the shuffle still mixes samples across files.
    """

    def __init__(
        self, num_samples: int, group_sizes: list[int] | np.ndarray, seed: int, window: int = 16
    ) -> None:
        sizes = np.asarray(group_sizes, dtype=np.int64).reshape(-1)
        if num_samples < 1 or int(sizes.sum()) != num_samples or (sizes < 1).any():
            raise ValueError(
                f"group sizes {sizes.tolist()[:8]}... must be >= 1 and sum to {num_samples}"
            )
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.num_samples, self.seed, self.window = num_samples, int(seed), int(window)
        self._sizes = sizes
        self._starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._plans: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._windows: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's group permutation and where each window starts (two epochs cached)."""
        if epoch in self._plans:
            self._plans.move_to_end(epoch)
            return self._plans[epoch]
        groups = np.random.default_rng([self.seed, epoch]).permutation(len(self._sizes))
        per_window = np.add.reduceat(self._sizes[groups], np.arange(0, len(groups), self.window))
        bounds = np.concatenate([[0], np.cumsum(per_window)])
        self._plans[epoch] = (groups, bounds)
        while len(self._plans) > 2:
            self._plans.popitem(last=False)
        return groups, bounds

    def _window(self, epoch: int, k: int) -> np.ndarray:
        key = (epoch, k)
        if key in self._windows:
            self._windows.move_to_end(key)
            return self._windows[key]
        groups, _ = self._plan(epoch)
        chosen = groups[k * self.window : (k + 1) * self.window]
        samples = np.concatenate(
            [np.arange(self._starts[g], self._starts[g] + self._sizes[g]) for g in chosen]
        )
        np.random.default_rng([self.seed, epoch, k, 1]).shuffle(samples)
        self._windows[key] = samples
        while len(self._windows) > 2:  # a batch spans at most a window boundary or two
            self._windows.popitem(last=False)
        return samples

    def indices(self, start: int, count: int) -> np.ndarray:
        """Sample indices at global positions [start, start + count), across epochs."""
        if start < 0 or count < 0:
            raise ValueError(f"positions must be >= 0, got start={start} count={count}")
        out = np.empty(count, dtype=np.int64)
        done = 0
        while done < count:
            epoch, pos = divmod(start + done, self.num_samples)
            _, bounds = self._plan(epoch)
            k = int(np.searchsorted(bounds, pos, side="right")) - 1
            samples = self._window(epoch, k)
            lo = pos - int(bounds[k])
            take = min(count - done, len(samples) - lo)
            out[done : done + take] = samples[lo : lo + take]
            done += take
        return out

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The whole order of one epoch (O(num_samples) memory: for tests and tools)."""
        return self.indices(epoch * self.num_samples, self.num_samples)


# --- streams -------------------------------------------------------------------------------


def _check_slice(cursor: int, global_batch: int, offset: int, local_batch: int) -> None:
    if cursor < 0 or offset < 0 or local_batch < 0 or offset + local_batch > global_batch:
        raise ValueError(
            f"bad batch slice: cursor={cursor} offset={offset} local_batch={local_batch}"
            f" global_batch={global_batch} (need 0 <= offset, offset + local <= global)"
        )


class TrainStream:
    """Training batches from a Dataset in the global order, through an LRU of row groups."""

    def __init__(self, dataset: Dataset, seed: int, window: int = 16, cache_groups: int = 32):
        if cache_groups < 1:
            raise ValueError(f"cache_groups must be at least 1, got {cache_groups}")
        self.dataset = dataset
        self.seq_len = dataset.seq_len
        groups = dataset.train_groups
        self.order = SampleOrder(dataset.num_train, [g.rows for g in groups], seed, window)
        self._starts = np.array([g.start for g in groups], dtype=np.int64)
        self.cache_groups = cache_groups
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        self.groups_read = 0  # row groups decoded so far: a cache-miss count for benchmarks

    @property
    def cached_groups(self) -> int:
        """Row groups held in the cache now (never more than `cache_groups`)."""
        return len(self._cache)

    def epoch(self, cursor: int) -> int:
        """The epoch that global position `cursor` lies in."""
        return cursor // self.dataset.num_train

    def position(self, cursor: int) -> int:
        """Where global position `cursor` lies within its epoch."""
        return cursor % self.dataset.num_train

    def batch(self, cursor: int, global_batch: int, offset: int, local_batch: int) -> np.ndarray:
        """Samples at positions [cursor + offset, cursor + offset + local_batch): int32
        of shape (local_batch, seq_len + 1); inputs are [:, :-1] and targets [:, 1:]."""
        _check_slice(cursor, global_batch, offset, local_batch)
        index = self.order.indices(cursor + offset, local_batch)
        out = np.empty((local_batch, self.seq_len + 1), dtype=np.int32)
        group_of = np.searchsorted(self._starts, index, side="right") - 1
        for g in np.unique(group_of):  # one group at a time, so the cache bound holds
            pick = group_of == g
            out[pick] = self._group(int(g))[index[pick] - self._starts[g]]
        return out

    def _group(self, g: int) -> np.ndarray:
        rows = self._cache.get(g)
        if rows is not None:
            self._cache.move_to_end(g)
            return rows
        rows = self.dataset.read_group(self.dataset.train_groups[g])
        self.groups_read += 1
        self._cache[g] = rows
        while len(self._cache) > self.cache_groups:
            self._cache.popitem(last=False)
        return rows


class SyntheticStream:
    """Random tokens with the TrainStream interface: sample g comes from rng (seed, g).

    Every sample is a row of real-looking ids (no PAD), the same whatever the rank split,
    so benchmarks and tests can run without a dataset.
    """

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
        if vocab_size < 1 or seq_len < 1 or seed < 0:
            raise ValueError(f"bad synthetic stream: {vocab_size=} {seq_len=} {seed=}")
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def epoch(self, cursor: int) -> int:
        """Synthetic data has no epochs: always 0."""
        return 0

    def position(self, cursor: int) -> int:
        return cursor

    def batch(self, cursor: int, global_batch: int, offset: int, local_batch: int) -> np.ndarray:
        """Same contract as TrainStream.batch."""
        _check_slice(cursor, global_batch, offset, local_batch)
        first = cursor + offset
        out = np.empty((local_batch, self.seq_len + 1), dtype=np.int32)
        for i in range(local_batch):  # one generator per sample costs ~10 us: fine per batch
            rng = np.random.default_rng([self.seed, first + i])
            out[i] = rng.integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int32)
        return out


def val_batches(
    dataset: Dataset, batch_size: int, max_samples: int | None = None
) -> Iterator[np.ndarray]:
    """The validation rows in file order, as int32 batches of at most `batch_size` rows."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    left = dataset.num_val if max_samples is None else min(max_samples, dataset.num_val)
    pending: list[np.ndarray] = []
    held = 0
    for group in dataset.val_groups:
        if left <= 0:
            break
        rows = dataset.read_group(group)[:left]
        left -= len(rows)
        pending.append(rows)
        held += len(rows)
        if held < batch_size:
            continue
        rows = np.concatenate(pending) if len(pending) > 1 else pending[0]
        whole = held - held % batch_size
        for i in range(0, whole, batch_size):
            yield rows[i : i + batch_size].astype(np.int32)
        pending, held = [rows[whole:]], held - whole
    if held:
        yield np.concatenate(pending).astype(np.int32)
