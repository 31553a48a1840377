"""Small text corpora for `fleet prepare`, and reading its rows back."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from trainer.data import prepare as prep

DOCS = [
    "The quick brown fox jumps over the lazy dog.\n" * 3,
    "Ünïcödé text: naïve café, 東京, emoji 🚀.\n",
    "short",
    "def f(x):\n    return x * 2\n" * 4,
]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `fleet prepare` with these arguments; returns (exit code, stdout, stderr)."""
    parser = argparse.ArgumentParser()
    prep.add_arguments(parser)
    code = prep.main(parser.parse_args(list(argv)))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def text_corpus(root: Path, docs: list[str] = DOCS) -> Path:
    """One document a file, named so that sorted order is the order of `docs`."""
    for i, doc in enumerate(docs):
        path = root / "corpus" / f"part{i // 2}" / f"{i:02d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(doc, encoding="utf-8")
    return root / "corpus"


def read_rows(out: Path, subset: str) -> np.ndarray:
    """All rows of a subset ("train" or "val"), in shard order."""
    meta = json.loads((out / "dataset.json").read_text())
    width = meta["seq_len"] + 1
    parts = [
        pq.read_table(out / s["file"]).column("tokens").combine_chunks().flatten().to_numpy()
        for s in meta["shards"][subset]
    ]
    return np.concatenate(parts).reshape(-1, width) if parts else np.zeros((0, width))


def small(out: Path, *extra: str) -> list[str]:
    return ["--out", str(out), "--seq-len", "16", "--rows-per-group", "4", "--quiet", *extra]
