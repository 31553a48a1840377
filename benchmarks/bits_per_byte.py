"""Validation bits per byte: the byte tokenizer against trained BPEs, at equal training compute.

    python benchmarks/bits_per_byte.py --out /tmp/fleet-bpb                 # byte, BPE 4k, 16k
    python benchmarks/bits_per_byte.py --out /tmp/fleet-bpb --vocabs 0,4096 --updates 50

For each vocabulary (0 = the byte tokenizer): `fleet prepare --stdlib` (the same files and the
same --seq-len in tokens; `--train-tokenizer VOCAB` trains the BPE on them), then `fleet train`
of the same model body (depth, width, heads) for the same number of updates of the same number
of tokens, on the CPU, evaluated on every held-out row after the last update.

Loss per token is not comparable across tokenizers, since a BPE token holds several bytes; bits
per byte is: the loss summed over the held-out targets, in nats, / ln 2 / the UTF-8 bytes of
those targets (EOS and PAD hold none; PAD targets are not scored, EOS targets are, for every
tokenizer alike). The bytes are counted from the held-out shards with a table of each id's
byte length, so they are exactly the scored targets' bytes.

What "equal compute" leaves unequal, and the table shows: the embedding and the head are
vocab x width each, so a larger vocabulary has more parameters and more FLOPs per token (at
width 128 the 16k head alone costs more than the two blocks); and a row of seq_len BPE tokens
holds several times the text of a byte row, so the BPE runs read more of the corpus for the
same updates. Each dataset holds out its own rows (1% by a hash of the row index), so the three
are scored on different random samples of the same corpus, not on the same text.

The trainer evaluates before an update, so each run is planned for --updates + 1 updates and
the evaluation at update --updates measures the model after that many (the learning-rate
schedule is stretched by one update in --updates, the same for all).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
EVAL_LINE = re.compile(r"eval  step (\d+): val loss ([0-9.]+) over ([0-9,]+) tokens")


def fleet(*args: str) -> tuple[str, float]:
    """`fleet ARGS` in a fresh interpreter from this checkout; (stdout, seconds)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args], cwd=ROOT, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"bits_per_byte: fleet {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout, time.perf_counter() - start


def byte_lengths(data: Path, meta: dict[str, Any]) -> np.ndarray:
    """UTF-8 bytes of each token id (0 for the special tokens)."""
    identity = meta["tokenizer"]
    lengths = np.zeros(identity["vocab_size"], dtype=np.int64)
    if identity["kind"] == "byte":
        lengths[:256] = 1
        return lengths
    from tokenizers import Tokenizer, pre_tokenizers

    tok = Tokenizer.from_file(str(data / "tokenizer.json"))
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())  # one character per byte
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    for token, i in tok.get_vocab().items():
        if token in special:
            continue
        if not set(token) <= alphabet:
            sys.exit(f"bits_per_byte: {data}: token {token!r} is not byte-level")
        lengths[i] = len(token)
    return lengths


def held_out_bytes(data: Path) -> tuple[int, int]:
    """(scored targets, their bytes) over every held-out row of a prepared dataset."""
    meta = json.loads((data / "dataset.json").read_text())
    lengths = byte_lengths(data, meta)
    pad, width = meta["tokenizer"]["pad_id"], meta["seq_len"] + 1
    targets = bytes_ = 0
    for shard in meta["shards"]["val"]:
        column = pq.read_table(data / shard["file"]).column("tokens").combine_chunks()
        rows = column.flatten().to_numpy().reshape(-1, width)[:, 1:]
        scored = rows[rows != pad]
        targets += int(scored.size)
        bytes_ += int(lengths[scored].sum())
    return targets, bytes_


def param_count(run: Path) -> int:
    """Parameters in the run's last checkpoint, from the safetensors header (no MLX needed)."""
    weights = sorted((run / "checkpoints").glob("step-*/weights.safetensors"))[-1]
    with open(weights, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


def measure(vocab: int, a: argparse.Namespace) -> dict[str, Any]:
    """Prepare, train and score one tokenizer."""
    name = "byte" if vocab == 0 else f"bpe-{vocab}"
    data, run = a.out / f"data-{name}", a.out / f"run-{name}"
    prep = ["prepare", "--stdlib", "--out", str(data), "--seq-len", str(a.seq_len), "--quiet"]
    if a.max_files:
        prep += ["--max-files", str(a.max_files)]
    if vocab:
        prep += ["--train-tokenizer", str(vocab)]
    _, prepare_s = fleet(*prep)
    meta = json.loads((data / "dataset.json").read_text())
    shutil.rmtree(run, ignore_errors=True)  # a fresh run each time, never a resumed one
    out, train_s = fleet(
        "train", "--data", str(data), "--run-dir", str(run), "--device", "cpu",
        "--depth", str(a.depth), "--width", str(a.width), "--heads", str(a.heads),
        "--local-batch", str(a.local_batch), "--updates", str(a.updates + 1),
        "--eval-every", str(a.updates), "--eval-samples", "0", "--seed", str(a.seed),
        "--telemetry-port-base", "0", "--log-every", str(max(1, a.updates // 4)),
    )  # fmt: skip
    evals = [m for m in EVAL_LINE.finditer(out) if int(m.group(1)) == a.updates]
    if not evals:
        sys.exit(f"bits_per_byte: no evaluation at update {a.updates} in:\n{out}")
    loss, scored = float(evals[-1].group(2)), int(evals[-1].group(3).replace(",", ""))
    targets, nbytes = held_out_bytes(data)
    if targets != scored:
        sys.exit(f"bits_per_byte: {data}: the trainer scored {scored} targets, we count {targets}")
    params = param_count(run)
    return {
        "tokenizer": name,
        "vocab": meta["tokenizer"]["vocab_size"],
        "params": params,
        "flops_per_token": 6 * params + 12 * a.depth * a.width * a.seq_len,
        "corpus_tokens": meta["counts"]["tokens"],
        "val_targets": targets,
        "val_bytes": nbytes,
        "bytes_per_token": nbytes / targets,
        "val_loss_nats_per_token": loss,
        "val_bits_per_byte": loss * targets / (nbytes * math.log(2)),
        "train_bytes_seen": round(a.updates * a.local_batch * a.seq_len * nbytes / targets),
        "prepare_s": round(prepare_s, 1),
        "train_s": round(train_s, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| tokenizer | vocab | params | FLOPs/token | bytes/token | val loss (nats/token) "
        "| **val bits/byte** | text seen in training | prepare | train |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [
        f"| {r['tokenizer']} | {r['vocab']:,} | {r['params'] / 1e6:.2f}M"
        f" | {r['flops_per_token'] / 1e6:.1f}M | {r['bytes_per_token']:.2f}"
        f" | {r['val_loss_nats_per_token']:.4f} | **{r['val_bits_per_byte']:.3f}**"
        f" | {r['train_bytes_seen'] / 1e6:.2f} MB | {r['prepare_s']:.0f} s | {r['train_s']:.0f} s |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="folder for datasets, runs, results")
    p.add_argument("--vocabs", default="0,4096,16384", help="vocabularies (0 = byte tokenizer)")
    p.add_argument("--max-files", type=int, default=0, help="stdlib files to use (0 = all)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per row, for every tokenizer")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--local-batch", type=int, default=16, help="rows per update")
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for vocab in (int(v) for v in a.vocabs.split(",")):
        rows.append(measure(vocab, a))
        print(f"bits_per_byte: {rows[-1]['tokenizer']}: {rows[-1]['val_bits_per_byte']:.3f}")
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    result = {"config": config, "command": " ".join(sys.argv), "results": rows}
    (a.out / "bits_per_byte.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    print(f"(JSON: {a.out / 'bits_per_byte.json'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
