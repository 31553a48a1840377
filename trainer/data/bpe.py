"""Byte-level BPE trained on the corpus: `fleet prepare --train-tokenizer VOCAB`.

Hugging Face `tokenizers` (the library mlx-lm's and nanochat's users already have) trains
it: GPT-2's byte-level pre-tokenizer and decoder, so every UTF-8 text encodes (no unknown
token) and decodes back exactly. The three special tokens take ids 0, 1 and 2 in the byte
tokenizer's order (BOS, EOS, PAD), then come the 256 byte symbols, then the merges.

Training streams the texts it is given: its memory is the count of each distinct pre-token
(word), not the corpus. It is deterministic: the same texts and vocabulary give the same
tokenizer.json bytes, whatever the number of threads (checked with 1, 2 and 8:
`tokenizers` breaks ties between equally frequent pairs by their ids, and the symbols' ids
are sorted), so a prepared dataset that trained its tokenizer is as reproducible as one
that did not.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from telemetry.files import atomic_write, file_sha256
from trainer.data.tokenizer import INSTALL_HINT, HFTokenizer, TokenizerError

# BOS, EOS, PAD: names HFTokenizer recognises (trainer.data.tokenizer's _BOS/_EOS/_PAD_NAMES).
SPECIAL_TOKENS = ("<|startoftext|>", "<|endoftext|>", "<|pad|>")
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # the byte alphabet and the specials, before any merge
TOKENIZER_FILE = "tokenizer.json"  # its name in the dataset folder


def training_params(vocab: int) -> dict[str, Any]:
    """What decides the trained tokenizer besides the texts: dataset.json's params.tokenizer."""
    return {"kind": "bpe", "vocab_size": vocab, "special_tokens": list(SPECIAL_TOKENS)}


def check_vocab(vocab: int) -> None:
    """Raise TokenizerError unless `vocab` has room for the byte alphabet and the specials."""
    if vocab < MIN_VOCAB:
        raise TokenizerError(
            f"--train-tokenizer {vocab} is too small: the 256 bytes and the "
            f"{len(SPECIAL_TOKENS)} special tokens need at least {MIN_VOCAB} (0 = off)"
        )


def train_bpe(texts: Iterable[str], vocab: int, path: Path) -> None:
    """Train a byte-level BPE of at most `vocab` ids on `texts` and write it to `path`.

    A small corpus may run out of pairs to merge first: the vocabulary is then smaller.
    """
    check_vocab(vocab)
    try:  # optional extra, imported only when used
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError as e:
        raise TokenizerError(
            f"--train-tokenizer needs the `tokenizers` package: {INSTALL_HINT}"
        ) from e
    tok = Tokenizer(models.BPE())
    # No prefix space: a text piece cut at a line end must encode as it reads, or decoding
    # the packed stream would add a space at every cut.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256, seen or not
        show_progress=False,  # its own bar would fight ours on stderr
    )
    tok.train_from_iterator(texts, trainer)
    atomic_write(path, tok.to_str(pretty=True) + "\n")


def load_trained(path: Path, home: Path) -> HFTokenizer:
    """The tokenizer trained into `path`, named by `home`: where the file will live once the
    dataset's temporary folder is renamed into place (its identity records that path)."""
    tok = HFTokenizer(path)
    tok.path = home.expanduser().resolve()
    return tok


def trained_intact(folder: Path, meta: dict[str, Any]) -> bool:
    """Whether `folder` still holds the tokenizer.json that dataset.json `meta` was made with."""
    try:
        return file_sha256(folder / TOKENIZER_FILE) == meta["tokenizer"]["sha256"]
    except (OSError, KeyError, TypeError):
        return False
