"""`fleet prepare`: inputs, packing, the held-out rows, determinism, and its error messages."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from telemetry.files import replace_dir
from tests.support.corpus import DOCS, read_rows, run, small, text_corpus
from tests.support.files import snapshot
from trainer.data import prepare as prep
from trainer.data.packer import is_val_row
from trainer.data.tokenizer import BYTE_EOS, BYTE_PAD, ByteTokenizer, TokenizerError, load_tokenizer


def test_text_folder_is_packed_with_eos_and_padded_only_at_the_end(tmp_path, capsys):
    out = tmp_path / "ds"
    code, _, err = run(capsys, "--source", str(text_corpus(tmp_path)), *small(out))
    assert code == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    rows = np.concatenate([read_rows(out, "train"), read_rows(out, "val")])
    assert len(rows) == meta["counts"]["train_rows"] + meta["counts"]["val_rows"]
    assert meta["counts"]["documents"] == len(DOCS)
    # The train rows and val rows together, put back in row order, are the packed stream.
    index = np.arange(len(rows))
    is_val = is_val_row(index, 0.01)
    if not is_val.any():  # small corpora: the final row moves to validation
        is_val[-1] = True
    stream = np.empty_like(rows)
    stream[~is_val] = read_rows(out, "train")
    stream[is_val] = read_rows(out, "val")
    flat = stream.reshape(-1)
    pads = np.flatnonzero(flat == BYTE_PAD)
    assert len(pads) == meta["counts"]["pad_tokens"]
    assert len(pads) < rows.shape[1] and (len(pads) == 0 or pads[0] == len(flat) - len(pads))
    tokens = flat[: len(flat) - len(pads)]
    assert len(tokens) == meta["counts"]["tokens"]
    cuts = np.flatnonzero(tokens == BYTE_EOS)
    assert len(cuts) == len(DOCS) and cuts[-1] == len(tokens) - 1
    docs = np.split(tokens, cuts[:-1] + 1)
    tok = load_tokenizer(meta["tokenizer"])
    assert [tok.decode(d) for d in docs] == DOCS
    assert tok.decode(docs[0][:-1]) == DOCS[0]


def test_rows_held_out_by_hash_and_none_lost(tmp_path, capsys):
    corpus = text_corpus(tmp_path, [f"document number {i} " * 5 for i in range(60)])
    whole, held_out = tmp_path / "whole", tmp_path / "held_out"
    assert run(capsys, "--source", str(corpus), *small(whole, "--val-fraction", "0"))[0] == 0
    assert run(capsys, "--source", str(corpus), *small(held_out, "--val-fraction", "0.2"))[0] == 0
    everything = read_rows(whole, "train")
    assert len(read_rows(whole, "val")) == 0
    train, val = read_rows(held_out, "train"), read_rows(held_out, "val")
    assert 0 < len(val) < len(train)
    is_val = is_val_row(np.arange(len(everything)), 0.2)
    np.testing.assert_array_equal(train, everything[~is_val])
    np.testing.assert_array_equal(val, everything[is_val])


def test_tiny_corpus_still_gets_a_validation_row(tmp_path, capsys):
    corpus = text_corpus(tmp_path, ["x" * 20])  # 21 tokens: two rows of 17
    out = tmp_path / "ds"
    assert run(capsys, "--source", str(corpus), *small(out))[0] == 0
    meta = json.loads((out / "dataset.json").read_text())
    assert (meta["counts"]["train_rows"], meta["counts"]["val_rows"]) == (1, 1)
    assert meta["val_digest"] != meta["digest"]


def test_text_jsonl_and_parquet_give_the_same_dataset(tmp_path, capsys):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    table = pa.table({"body": DOCS, "n": list(range(len(DOCS)))})
    parquet = tmp_path / "docs.parquet"
    pq.write_table(table, parquet, row_group_size=2)
    outs = [tmp_path / name for name in ("a", "b", "c")]
    assert run(capsys, "--source", str(text_corpus(tmp_path)), *small(outs[0]))[0] == 0
    assert run(capsys, "--source", str(jsonl), *small(outs[1]))[0] == 0
    assert run(capsys, "--source", str(parquet), "--text-field", "body", *small(outs[2]))[0] == 0
    metas = [json.loads((o / "dataset.json").read_text()) for o in outs]
    assert [m["sources"][0]["kind"] for m in metas] == ["text", "jsonl", "parquet"]
    assert len({m["digest"] for m in metas}) == 1
    assert {m["counts"]["documents"] for m in metas} == {len(DOCS)}


def test_same_inputs_give_byte_identical_output(tmp_path, capsys):
    corpus = text_corpus(tmp_path, [f"doc {i}: " + "abc " * i for i in range(40)])
    outs = [tmp_path / "one", tmp_path / "two"]
    for out in outs:
        args = small(out, "--rows-per-shard", "8", "--val-fraction", "0.1")
        assert run(capsys, "--source", str(corpus), *args)[0] == 0
    names = sorted(p.name for p in outs[0].iterdir())
    assert len([n for n in names if n.startswith("train-")]) > 1  # several shards
    assert names == sorted(p.name for p in outs[1].iterdir())
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    meta = json.loads((outs[0] / "dataset.json").read_text())
    pf = pq.ParquetFile(outs[0] / "train-00000.parquet")
    assert pf.metadata.num_rows == 8 and pf.metadata.num_row_groups == 2
    assert pf.schema_arrow.field("tokens").type == pa.list_(pa.uint16(), 17)
    assert str(tmp_path) not in json.dumps(meta["params"]) + meta["digest"]


def test_same_dataset_is_a_no_op_and_a_different_one_is_refused(tmp_path, capsys):
    corpus = text_corpus(tmp_path)
    out = tmp_path / "ds"
    assert run(capsys, "--source", str(corpus), *small(out))[0] == 0
    meta_file = out / "dataset.json"
    before = (meta_file.read_bytes(), meta_file.stat().st_mtime_ns)

    code, stdout, _ = run(
        capsys,
        "--source",
        str(corpus),
        "--out",
        str(out),
        "--seq-len",
        "16",
        "--rows-per-group",
        "4",
    )
    assert code == 0 and "up to date" in stdout
    assert (meta_file.read_bytes(), meta_file.stat().st_mtime_ns) == before

    code, _, err = run(capsys, "--source", str(corpus), *small(out)[:-1], "--seq-len", "8")
    assert code == 2 and str(out) in err and "--force" in err
    assert meta_file.read_bytes() == before[0]

    (corpus / "part0" / "00.txt").write_text("changed content")
    assert run(capsys, "--source", str(corpus), *small(out))[0] == 2

    code, _, err = run(capsys, "--source", str(corpus), *small(out), "--force")
    assert code == 0, err
    assert json.loads(meta_file.read_text())["digest"] != json.loads(before[0])["digest"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "ds"]  # no temp left


@pytest.mark.parametrize("force", [(), ("--force",)])
def test_force_replaces_only_a_dataset_and_refuses_anything_else(tmp_path, capsys, force):
    """Issue 18, defect 2: `--force` used to delete whatever --out held (a run's checkpoints,
    a user's files). Now a run folder, a non-dataset folder, and a dataset with a stranger's
    file in it are refused, forced or not, with nothing touched."""
    corpus = text_corpus(tmp_path)
    run_dir = tmp_path / "run1"  # what a training run leaves
    (run_dir / "checkpoints" / "step-000010").mkdir(parents=True)
    (run_dir / "checkpoints" / "step-000010" / "manifest.json").write_text("{}")
    (run_dir / "config.json").write_text("{}")
    mine = tmp_path / "mine"  # a user's folder
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    dataset = tmp_path / "ds"  # a dataset, with a file the user put beside its shards
    assert run(capsys, "--source", str(corpus), *small(dataset))[0] == 0
    (dataset / "README.md").write_text("my notes on this dataset")
    for out, why in (
        (run_dir, "holds a training run (config.json, 1 checkpoint up to step-000010)"),
        (mine, "is not empty and holds no dataset (dataset.json)"),
        (dataset, "holds a dataset and other files (README.md): replacing it would delete"),
    ):
        before = snapshot(out)
        code, _, err = run(capsys, "--source", str(corpus), *small(out, "--seq-len", "8"), *force)
        assert code == 2 and f"{out} {why}" in err, err
        assert "use --force" not in err and err.count("\n") == 1
        assert snapshot(out) == before
    (dataset / "README.md").unlink()  # a dataset alone: --force replaces it
    code, _, err = run(capsys, "--source", str(corpus), *small(dataset, "--seq-len", "8"), *force)
    assert code == (0 if force else 2), err


def test_a_failed_rebuild_keeps_the_old_dataset(tmp_path, capsys):
    out = tmp_path / "ds"
    assert run(capsys, "--source", str(text_corpus(tmp_path)), *small(out))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    good = tmp_path / "a.jsonl"
    good.write_text(json.dumps({"text": "fine " * 50}) + "\n")
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "ok"}\n\n{"text": broken\n')
    code, _, err = run(capsys, "--source", str(good), str(bad), *small(out), "--force")
    assert code == 2 and f"{bad}:3" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl", "corpus", "ds"]


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"txt": "wrong field"}', "no 'text' field"),
        ('["not", "an", "object"]', "no 'text' field"),
        ('{"text": 42}', "not a string"),
        ("not json at all", "not valid JSON"),
    ],
)
def test_bad_jsonl_lines_are_named_by_file_and_line(tmp_path, capsys, line, message):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "first"}) + "\n" + line + "\n")
    code, _, err = run(capsys, "--source", str(src), *small(tmp_path / "ds"))
    assert code == 2 and f"{src}:2" in err and message in err
    assert not (tmp_path / "ds").exists()


def test_empty_inputs_are_refused(tmp_path, capsys):
    folder = tmp_path / "empty"
    folder.mkdir()
    (folder / "a.md").write_text("not matched by the glob")
    code, _, err = run(capsys, "--source", str(folder), *small(tmp_path / "ds"))
    assert code == 2 and "no files match" in err and str(folder) in err
    (folder / "b.txt").write_text("")
    code, _, err = run(capsys, "--source", str(folder), *small(tmp_path / "ds"))
    assert code == 2 and "zero tokens" in err
    code, _, err = run(capsys, *small(tmp_path / "ds"))
    assert code == 2 and "--source" in err and "--stdlib" in err
    assert not (tmp_path / "ds").exists()


def test_unreadable_inputs_are_named(tmp_path, capsys):
    missing = tmp_path / "nope.txt"
    code, _, err = run(capsys, "--source", str(missing), *small(tmp_path / "ds"))
    assert code == 2 and str(missing) in err
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9 au lait".encode("latin-1"))
    code, _, err = run(capsys, "--source", str(latin), *small(tmp_path / "ds"))
    assert code == 2 and str(latin) in err and "UTF-8" in err
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": ["x"]}), table)
    code, _, err = run(capsys, "--source", str(table), *small(tmp_path / "ds"))
    assert code == 2 and str(table) in err and "'text'" in err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_file_without_read_permission_is_named(tmp_path, capsys):
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")
    locked.chmod(0)
    code, _, err = run(capsys, "--source", str(locked), *small(tmp_path / "ds"))
    assert code == 2 and str(locked) in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seq-len", "0"], "--seq-len"),
        (["--val-fraction", "1"], "--val-fraction"),
        (["--rows-per-group", "0"], "--rows-per-group"),
        (["--tokenizer", "no/such/tokenizer.json"], "tokenizer"),
    ],
)
def test_bad_parameters_are_refused(tmp_path, capsys, args, message):
    corpus = text_corpus(tmp_path)
    code, _, err = run(capsys, "--source", str(corpus), *small(tmp_path / "ds"), *args)
    assert code == 2 and message in err and err.startswith("fleet prepare: error:")


def test_out_that_holds_other_files_is_refused(tmp_path, capsys):
    out = tmp_path / "ds"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    code, _, err = run(capsys, "--source", str(text_corpus(tmp_path)), *small(out))
    assert code == 2 and str(out) in err
    assert (out / "precious.txt").read_text() == "keep me"


def test_stdlib_subset(tmp_path, capsys):
    out = tmp_path / "ds"
    code, _, err = run(capsys, "--stdlib", "--max-files", "5", *small(out))
    assert code == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    assert len(meta["sources"]) == meta["counts"]["documents"] == 5
    paths = [s["path"] for s in meta["sources"]]
    assert all(p.endswith(".py") and "site-packages" not in p for p in paths)
    assert meta["counts"]["train_rows"] > 0 and meta["counts"]["val_rows"] > 0


def test_byte_tokenizer_round_trips_and_drops_specials():
    tok = ByteTokenizer()
    text = "naïve 🚀 text"
    ids = tok.encode(text)
    assert ids.max() < 256 and tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *ids.tolist(), tok.eos_id, tok.pad_id]) == text
    assert tok.decode([0xE6, 0x9D]) == "\ufffd"  # a cut character decodes, replaced
    assert load_tokenizer(tok.identity()).identity() == tok.identity()
    with pytest.raises(TokenizerError, match="unknown tokenizer kind"):
        load_tokenizer({"kind": "sentencepiece"})


def test_tokenizer_json_without_the_library_says_how_to_install(tmp_path, monkeypatch):
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes the import fail
    with pytest.raises(TokenizerError, match=r"pip install 'mlx-fleet\[tokenizers\]'"):
        load_tokenizer(str(path))


def test_tokenizer_json(tmp_path, capsys):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    words = sorted({w for d in DOCS for w in d.split()})
    vocab = {w: i for i, w in enumerate(["[UNK]", "<|endoftext|>", "<pad>", *words])}
    hf = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    hf.add_special_tokens(["<|endoftext|>", "<pad>"])
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    out = tmp_path / "ds"
    code, _, err = run(
        capsys,
        "--source",
        str(text_corpus(tmp_path)),
        "--tokenizer",
        str(path),
        *small(out),
        "--val-fraction",
        "0",
    )
    assert code == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    identity = meta["tokenizer"]
    assert identity["kind"] == "tokenizers" and (identity["eos_id"], identity["pad_id"]) == (1, 2)
    assert Path(identity["path"]).is_absolute() and len(identity["sha256"]) == 64
    tok = load_tokenizer(identity)
    stream = read_rows(out, "train").reshape(-1)
    first = stream[: np.flatnonzero(stream == 1)[0]]
    assert tok.decode(first) == " ".join(DOCS[0].split())
    path.write_text(path.read_text().replace("quick", "quack"))
    with pytest.raises(TokenizerError, match="changed"):
        load_tokenizer(identity)


def test_vocab_over_65535_is_stored_as_uint32(tmp_path, capsys, monkeypatch):
    class WideBytes(ByteTokenizer):
        vocab_size = 70_000
        pad_id = 69_999  # above uint16: it must survive the round trip

    monkeypatch.setattr(prep, "load_tokenizer", lambda spec: WideBytes())
    out = tmp_path / "ds"
    assert run(capsys, "--source", str(text_corpus(tmp_path)), *small(out))[0] == 0
    pf = pq.ParquetFile(out / "train-00000.parquet")
    assert pf.schema_arrow.field("tokens").type == pa.list_(pa.uint32(), 17)
    rows = np.concatenate([read_rows(out, "train"), read_rows(out, "val")])
    assert (rows == 69_999).any()


def test_replace_dir_swaps_a_whole_folder_and_leaves_no_temporary(tmp_path):
    out, new = tmp_path / "out", tmp_path / ".out.tmp"
    out.mkdir()
    (out / "old.txt").write_text("old")
    new.mkdir()
    (new / "new.txt").write_text("new")
    replace_dir(new, out)
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    fresh = tmp_path / ".fresh.tmp"
    fresh.mkdir()
    replace_dir(fresh, tmp_path / "fresh")  # nothing to replace: one rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out"]
