"""`fleet prepare --train-tokenizer`: the trained BPE round-trips, is deterministic, names the
dataset's tokenizer, is checked on resume, and bad requests get a one-line error."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.corpus import DOCS, read_rows, run, small, text_corpus
from tests.support.fleet import run_fleet
from trainer.data import bpe
from trainer.data.tokenizer import TokenizerError, identity_digest_part, load_tokenizer

pytest.importorskip("tokenizers")

# Enough distinct text for a few hundred merges, in a few milliseconds of training.
CORPUS = [
    *DOCS,
    *(f"def function_{i}(value):\n    return value * {i} + {i * i}\n" for i in range(40)),
    "Ünïcödé again: naïve café, 東京, 🚀🚀, and tabs\tand  double  spaces.\n",
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def meta_of(out: Path) -> dict:
    return json.loads((out / "dataset.json").read_text())


def jsonl_corpus(root: Path, docs: list[str]) -> Path:
    """The documents as one JSONL file, in order."""
    path = root / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def prepare_bpe(capsys, corpus: Path, out: Path, vocab: int = 320, *extra: str) -> dict:
    code, _, err = run(
        capsys, "--source", str(corpus), *small(out), "--train-tokenizer", str(vocab), *extra
    )
    assert code == 0, err
    return meta_of(out)


def test_trained_tokenizer_round_trips_any_text(tmp_path):
    path = tmp_path / "tokenizer.json"
    bpe.train_bpe(iter(CORPUS), 320, path)
    tok = bpe.load_trained(path, path)
    assert tok.vocab_size == 320
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)  # the byte tokenizer's order
    unseen = "never seen: Ωμέγα ∑ 🦀 \x00\x7f and a line without an end"
    for text in [*CORPUS, unseen, "", " leading space", "\n\n\n"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert not {tok.bos_id, tok.eos_id, tok.pad_id} & set(ids.tolist())
    merged = tok.encode("def function_7(value):\n    return value")
    assert len(merged) < len("def function_7(value):\n    return value")  # it learnt merges
    assert tok.decode([tok.bos_id, *tok.encode("café").tolist(), tok.eos_id]) == "café"


def test_training_is_deterministic_across_processes(tmp_path):
    corpus = text_corpus(tmp_path, CORPUS)
    outs = [tmp_path / "one", tmp_path / "two"]
    for out in outs:  # fresh interpreters: a different hash seed for every set and dict
        run_fleet("prepare", "--source", str(corpus), *small(out), "--train-tokenizer", "400")
    names = sorted(p.name for p in outs[0].iterdir())
    assert "tokenizer.json" in names and names == sorted(p.name for p in outs[1].iterdir())
    for name in names:
        if name != "dataset.json":  # it records where its tokenizer.json is
            assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name
    one, two = meta_of(outs[0]), meta_of(outs[1])
    assert one["digest"] == two["digest"]
    assert identity_digest_part(one["tokenizer"]) == identity_digest_part(two["tokenizer"])


def test_the_datasets_tokenizer_identity_is_the_trained_file(tmp_path, capsys):
    corpus = jsonl_corpus(tmp_path, CORPUS)
    out = tmp_path / "ds"
    meta = prepare_bpe(capsys, corpus, out, 320, "--val-fraction", "0")
    identity = meta["tokenizer"]
    assert identity["kind"] == "tokenizers" and identity["vocab_size"] == 320
    assert identity["sha256"] == sha256(out / "tokenizer.json")
    assert identity["path"] == str((out / "tokenizer.json").resolve())
    assert meta["params"]["tokenizer"] == bpe.training_params(320)
    assert meta["dtype"] == "uint16"
    # The packed stream decodes back to the documents, one EOS after each.
    tok = load_tokenizer(identity)
    stream = read_rows(out, "train").reshape(-1)
    stream = stream[stream != tok.pad_id]
    cuts = np.flatnonzero(stream == tok.eos_id)
    assert len(cuts) == len(CORPUS)
    assert [tok.decode(d) for d in np.split(stream, cuts[:-1] + 1)] == CORPUS
    # The same file given with --tokenizer is the same tokenizer, so the same dataset.
    given = tmp_path / "given.json"
    shutil.copy(out / "tokenizer.json", given)
    code, _, err = run(
        capsys, "--source", str(corpus), *small(tmp_path / "ds2"), "--tokenizer", str(given),
        "--val-fraction", "0",
    )  # fmt: skip
    assert code == 0, err
    other = meta_of(tmp_path / "ds2")
    assert identity_digest_part(other["tokenizer"]) == identity_digest_part(identity)
    assert other["digest"] == meta["digest"]


def test_prepare_again_is_a_no_op_unless_the_tokenizer_file_changed(tmp_path, capsys):
    corpus = text_corpus(tmp_path, CORPUS)
    out = tmp_path / "ds"
    meta = prepare_bpe(capsys, corpus, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, stdout, _ = run(
        capsys, "--source", str(corpus), *small(out)[:-1], "--train-tokenizer", "320"
    )
    assert code == 0 and "up to date" in stdout
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # Another vocabulary is another dataset: refused without --force.
    code, _, err = run(capsys, "--source", str(corpus), *small(out), "--train-tokenizer", "300")
    assert code == 2 and "--force" in err
    # A tokenizer.json edited in place no longer matches the shards: damaged.
    (out / "tokenizer.json").write_text((out / "tokenizer.json").read_text() + " ")
    code, _, err = run(capsys, "--source", str(corpus), *small(out), "--train-tokenizer", "320")
    assert code == 2 and "damaged" in err
    with pytest.raises(TokenizerError, match="changed"):
        load_tokenizer(meta["tokenizer"])
    assert prepare_bpe(capsys, corpus, out, 320, "--force")["digest"] == meta["digest"]


def test_resume_with_a_different_trained_tokenizer_is_refused(tmp_path, capsys):
    from fleet.cli import main as fleet

    first, second = tmp_path / "first", tmp_path / "second"
    prepare_bpe(capsys, text_corpus(first, CORPUS), tmp_path / "a", 300)
    prepare_bpe(capsys, text_corpus(second, list(reversed(CORPUS))[:-3]), tmp_path / "b", 300)
    a, b = meta_of(tmp_path / "a")["tokenizer"], meta_of(tmp_path / "b")["tokenizer"]
    assert a["vocab_size"] == b["vocab_size"] and a["sha256"] != b["sha256"]
    runs = tmp_path / "run"
    tiny = ["--depth", "1", "--width", "64", "--heads", "1", "--telemetry-port-base", "0"]
    common = ["--run-dir", str(runs), *tiny, "--local-batch", "2"]
    assert fleet(["train", "--data", str(tmp_path / "a"), *common, "--updates", "1"]) == 0
    capsys.readouterr()
    rc = fleet(
        ["train", "--resume", "latest", "--data", str(tmp_path / "b"), *common, "--updates", "2"]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "tokenizer:" in err and "model architecture" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-tokenizer", "10"], "--train-tokenizer 10 is too small"),
        (["--train-tokenizer", "258"], "at least 259"),
        (["--train-tokenizer", "-1"], "at least 259"),
        (["--train-tokenizer", "512", "--tokenizer", "tok.json"], "--tokenizer tok.json"),
    ],
)
def test_bad_requests_get_a_one_line_error(tmp_path, capsys, args, message):
    corpus = text_corpus(tmp_path)
    code, _, err = run(capsys, "--source", str(corpus), *small(tmp_path / "ds"), *args)
    assert code == 2 and err.startswith("fleet prepare: error:") and message in err
    assert err.count("\n") == 1 and not (tmp_path / "ds").exists()


def test_training_without_the_library_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes the import fail
    code, _, err = run(
        capsys, "--source", str(text_corpus(tmp_path)), *small(tmp_path / "ds"),
        "--train-tokenizer", "300",
    )  # fmt: skip
    assert code == 2 and "pip install 'mlx-fleet[tokenizers]'" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]  # no temporary left


def test_a_moved_dataset_finds_its_trained_tokenizer(tmp_path):
    import shutil

    from trainer.data.dataset import Dataset
    from trainer.data.prepare import PrepareConfig, prepare
    from trainer.data.tokenizer import load_tokenizer

    src = tmp_path / "corpus"
    src.mkdir()
    (src / "a.txt").write_text("def f(x):\n    return x + 1\n" * 50)
    out = tmp_path / "data"
    prepare(PrepareConfig(out=out, sources=[str(src)], seq_len=16, train_tokenizer=300))
    moved = tmp_path / "elsewhere"
    shutil.copytree(out, moved)
    shutil.rmtree(out)
    ds = Dataset.open(moved)
    assert ds.tokenizer["path"] == str(moved / "tokenizer.json")
    assert (
        load_tokenizer(ds.tokenizer).decode(load_tokenizer(ds.tokenizer).encode("def f")) == "def f"
    )
