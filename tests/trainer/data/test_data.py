"""Reading prepared data: the global sample order, rank-split independence, bounded memory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.fleet import fleet_env
from trainer.data.dataset import (
    Dataset,
    DatasetError,
    SampleOrder,
    SyntheticStream,
    TrainStream,
    val_batches,
)
from trainer.data.prepare import PrepareConfig, prepare

SPLITS = [[6], [3, 2, 1], [1, 2, 3], [2, 2, 2]]


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory) -> Path:
    """A tiny dataset with many small row groups spread over several shards."""
    root = tmp_path_factory.mktemp("data")
    for i in range(30):
        (root / f"{i:02d}.txt").write_text(f"document {i}: " + "lorem ipsum dolor " * (i % 7 + 1))
    out = root / "ds"
    config = PrepareConfig(
        out=out,
        sources=[str(root)],
        seq_len=16,
        val_fraction=0.1,
        rows_per_shard=20,
        rows_per_group=6,  # shards of 6 + 6 + 6 + 2 rows: uneven groups on purpose
    )
    prepare(config)
    return out


@pytest.fixture(scope="module")
def dataset(dataset_dir) -> Dataset:
    return Dataset.open(dataset_dir)


def split_batch(stream, cursor: int, split: list[int]) -> np.ndarray:
    """The global batch at `cursor` as ranks of these local batch sizes read it, concatenated."""
    offsets = np.concatenate([[0], np.cumsum(split)[:-1]])
    return np.concatenate(
        [stream.batch(cursor, sum(split), int(o), n) for o, n in zip(offsets, split, strict=True)]
    )


def all_rows(ds: Dataset, groups) -> np.ndarray:
    return np.concatenate([ds.read_group(g) for g in groups])


def test_dataset_open_reads_its_metadata(dataset):
    assert dataset.seq_len == 16 and dataset.vocab_size == 259
    assert (dataset.bos_id, dataset.eos_id, dataset.pad_id) == (256, 257, 258)
    counts = dataset.meta["counts"]
    assert (dataset.num_train, dataset.num_val) == (counts["train_rows"], counts["val_rows"])
    assert dataset.num_val > 0 and len(dataset.train_groups) > 8
    assert len({g.rows for g in dataset.train_groups}) > 1
    assert dataset.tokenizer["kind"] == "byte" and dataset.digest != dataset.val_digest
    dataset.verify()


def test_sample_order_is_a_reproducible_permutation_per_epoch():
    sizes = [5, 3, 8, 1, 7, 6, 2, 4]
    order = SampleOrder(sum(sizes), sizes, seed=7, window=3)
    epochs = [order.epoch_order(e) for e in range(3)]
    for e in epochs:
        np.testing.assert_array_equal(np.sort(e), np.arange(sum(sizes)))
    assert not np.array_equal(epochs[0], epochs[1])
    assert not np.array_equal(epochs[1], epochs[2])
    again = SampleOrder(sum(sizes), sizes, seed=7, window=3)
    np.testing.assert_array_equal(again.epoch_order(1), epochs[1])
    other = SampleOrder(sum(sizes), sizes, seed=8, window=3)
    assert not np.array_equal(other.epoch_order(0), epochs[0])


def test_sample_order_windows_keep_reads_local():
    sizes = [4] * 12
    order = SampleOrder(48, sizes, seed=1, window=3)
    first_window = order.indices(0, 12)  # the first 3 groups' worth of positions
    assert len(set((first_window // 4).tolist())) == 3  # ... come from exactly 3 groups


def test_sample_order_crosses_epochs_seamlessly():
    sizes = [4, 4, 4, 3]
    order = SampleOrder(15, sizes, seed=3, window=2)
    seam = order.indices(12, 7)  # last 3 of epoch 0, first 4 of epoch 1
    fresh = SampleOrder(15, sizes, seed=3, window=2)
    expected = np.concatenate([fresh.epoch_order(0)[12:], fresh.epoch_order(1)[:4]])
    np.testing.assert_array_equal(seam, expected)
    np.testing.assert_array_equal(order.indices(15 * 5 + 2, 1), fresh.epoch_order(5)[2:3])


def test_sample_order_rejects_bad_arguments():
    with pytest.raises(ValueError, match="sum"):
        SampleOrder(10, [4, 4], seed=0)
    with pytest.raises(ValueError, match="window"):
        SampleOrder(8, [4, 4], seed=0, window=0)


def test_batches_follow_the_order_and_hold_the_dataset_rows(dataset):
    stream = TrainStream(dataset, seed=5, window=4)
    rows = all_rows(dataset, dataset.train_groups)
    cursor = dataset.num_train - 4  # straddles the epoch boundary
    batch = stream.batch(cursor, 10, 0, 10)
    assert batch.dtype == np.int32 and batch.shape == (10, 17)
    expected = rows[stream.order.indices(cursor, 10)]
    np.testing.assert_array_equal(batch, expected)
    assert stream.epoch(cursor) == 0 and stream.epoch(cursor + 4) == 1
    assert stream.position(cursor + 4) == 0 and stream.position(cursor) == dataset.num_train - 4


@pytest.mark.parametrize("cursor_at", ["start", "seam", "later"])
def test_any_rank_split_sees_the_same_samples(dataset, cursor_at):
    cursor = {"start": 0, "seam": dataset.num_train - 3, "later": 5 * dataset.num_train + 11}
    results = []
    for split in SPLITS:
        stream = TrainStream(dataset, seed=11, window=4)
        results.append(split_batch(stream, cursor[cursor_at], split))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0], other)
    seeds = TrainStream(dataset, seed=12, window=4).batch(cursor[cursor_at], 6, 0, 6)
    assert not np.array_equal(seeds, results[0])


def test_row_group_cache_stays_within_its_cap(dataset):
    stream = TrainStream(dataset, seed=2, window=4, cache_groups=3)
    rows = all_rows(dataset, dataset.train_groups)
    cursor = 0
    for _ in range(3 * dataset.num_train // 7):  # about three epochs of batches of 7
        batch = stream.batch(cursor, 7, 0, 7)
        assert stream.cached_groups <= 3
        np.testing.assert_array_equal(batch, rows[stream.order.indices(cursor, 7)])
        cursor += 7
    assert stream.groups_read > len(dataset.train_groups)  # it evicted and read again


def test_bad_batch_slices_are_refused(dataset):
    stream = TrainStream(dataset, seed=0)
    with pytest.raises(ValueError, match="offset"):
        stream.batch(0, 4, 3, 2)
    with pytest.raises(ValueError, match="cursor"):
        stream.batch(-1, 4, 0, 4)


def test_synthetic_stream_is_split_independent_and_seeded():
    full = SyntheticStream(vocab_size=50, seq_len=8, seed=3).batch(100, 6, 0, 6)
    assert full.dtype == np.int32 and full.shape == (6, 9)
    assert full.min() >= 0 and full.max() < 50
    for split in SPLITS[1:]:
        stream = SyntheticStream(vocab_size=50, seq_len=8, seed=3)
        np.testing.assert_array_equal(split_batch(stream, 100, split), full)
    other = SyntheticStream(vocab_size=50, seq_len=8, seed=4).batch(100, 6, 0, 6)
    assert not np.array_equal(other, full)
    assert not np.array_equal(full[:3], full[3:])


def test_val_batches_cover_the_validation_rows_in_order(dataset):
    rows = all_rows(dataset, dataset.val_groups)
    batches = list(val_batches(dataset, batch_size=4))
    assert all(len(b) <= 4 and b.dtype == np.int32 for b in batches)
    np.testing.assert_array_equal(np.concatenate(batches), rows)
    limited = list(val_batches(dataset, batch_size=2, max_samples=3))
    np.testing.assert_array_equal(np.concatenate(limited), rows[:3])


@pytest.fixture
def broken(dataset_dir, tmp_path) -> Path:
    """A private copy of the dataset for a test to damage."""
    return Path(shutil.copytree(dataset_dir, tmp_path / "ds"))


def edit_meta(folder: Path, change) -> None:
    meta = json.loads((folder / "dataset.json").read_text())
    change(meta)
    (folder / "dataset.json").write_text(json.dumps(meta))


def test_open_names_a_missing_or_malformed_dataset_json(tmp_path, broken):
    with pytest.raises(DatasetError, match="no such folder"):
        Dataset.open(tmp_path / "nowhere")
    with pytest.raises(DatasetError, match="dataset.json"):
        Dataset.open(tmp_path)
    (broken / "dataset.json").write_text("{not json")
    with pytest.raises(DatasetError, match=r"dataset\.json: not valid JSON"):
        Dataset.open(broken)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.pop("seq_len"), "'seq_len'"),
        (lambda m: m.update(version=99), "version"),
        (lambda m: m["tokenizer"].pop("pad_id"), "tokenizer.pad_id"),
        (lambda m: m["shards"].pop("val"), "shards.val"),
        (lambda m: m["shards"]["train"][0].update(rows=999), "train-00000.parquet: .* rows"),
        (lambda m: m.update(seq_len=8), "train-00000.parquet: column 'tokens'"),
        (lambda m: m["shards"]["train"][0].update(file="../x.parquet"), "plain file name"),
    ],
)
def test_open_names_a_bad_field(broken, change, message):
    edit_meta(broken, change)
    with pytest.raises(DatasetError, match=message):
        Dataset.open(broken)


def test_open_names_a_missing_shard_and_verify_a_changed_one(broken):
    (broken / "train-00001.parquet").unlink()
    with pytest.raises(DatasetError, match="train-00001.parquet: shard missing"):
        Dataset.open(broken)
    shutil.copy(broken / "train-00000.parquet", broken / "train-00001.parquet")
    edit_meta(broken, lambda m: m["shards"]["train"][1].update(rows=20))
    ds = Dataset.open(broken)  # row counts agree, contents do not
    with pytest.raises(DatasetError, match="train-00001.parquet: sha256"):
        ds.verify()


def test_a_huge_order_is_built_a_window_at_a_time():
    order = SampleOrder(10_000_000, [1000] * 10_000, seed=4, window=16)
    far = order.indices(123 * 10_000_000 + 9_999_990, 20)  # crosses into epoch 124
    assert len(set(far.tolist())) == 20 and far.min() >= 0 and far.max() < 10_000_000
    held = sum(len(w) for w in order._windows.values())
    assert held <= 2 * 16 * 1000  # two windows of rows, not an epoch of 10 million


def test_reading_data_never_imports_mlx():
    code = "import sys, trainer.data.dataset, trainer.data.prepare; sys.exit('mlx' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_reading_data_never_imports_the_writer():
    writer = [
        "trainer.data.prepare",
        "trainer.data.sources",
        "trainer.data.packer",
        "trainer.data.shard_writer",
    ]
    code = f"import sys, trainer.data.dataset; print(sorted(set({writer!r}) & set(sys.modules)))"
    run = subprocess.run(
        [sys.executable, "-c", code], env=fleet_env(), capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]"
