"""Tokenizers: the built-in byte tokenizer and Hugging Face `tokenizer.json` files.

Neither imports mlx, so `fleet prepare` starts fast. A tokenizer describes itself with
`identity()`, which `fleet prepare` stores in dataset.json and `load_tokenizer` turns back
into a tokenizer (the trainer does this to print samples as text).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

BYTE_VOCAB = 256
BYTE_BOS, BYTE_EOS, BYTE_PAD = 256, 257, 258

# Special tokens we recognise in a tokenizer.json, most common spelling first.
_EOS_NAMES = ("<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]")
_BOS_NAMES = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]")
_PAD_NAMES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>", "<|finetune_right_pad_id|>")

INSTALL_HINT = "pip install 'mlx-fleet[tokenizers]'"


class TokenizerError(ValueError):
    """A tokenizer spec or file that cannot be used; the message names it."""


class Tokenizer:
    """What every tokenizer offers: encode, decode, the special ids and an identity."""

    kind: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> np.ndarray:
        """Token ids of `text` (an integer array), without any special tokens."""
        raise NotImplementedError

    def decode(self, ids: Any) -> str:
        """Text of `ids`; special tokens are dropped."""
        raise NotImplementedError

    def hf_files(self, max_length: int) -> dict[str, str]:
        """tokenizer.json and tokenizer_config.json: this tokenizer as transformers'
        AutoTokenizer (and so mlx-lm) loads it, encoding and decoding as we do."""
        raise NotImplementedError

    def identity(self) -> dict[str, Any]:
        """A JSON-ready description that `load_tokenizer` rebuilds this tokenizer from."""
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
        }


class ByteTokenizer(Tokenizer):
    """Ids 0..255 are the UTF-8 bytes; then BOS=256, EOS=257, PAD=258. Needs no file."""

    kind = "byte"
    vocab_size = BYTE_VOCAB + 3
    bos_id, eos_id, pad_id = BYTE_BOS, BYTE_EOS, BYTE_PAD

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: Any) -> str:
        arr = np.asarray(ids).reshape(-1)
        return arr[arr < BYTE_VOCAB].astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def hf_files(self, max_length: int) -> dict[str, str]:
        # split_special_tokens: "<|endoftext|>" in a text is its 13 bytes, as encode() has it.
        names = BYTE_TOKEN_NAMES
        return {
            "tokenizer.json": json.dumps(byte_tokenizer_json(), ensure_ascii=False, indent=2),
            "tokenizer_config.json": _hf_config(
                names[self.bos_id], names[self.eos_id], names[self.pad_id], max_length, True
            ),
        }


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer.json (the optional `tokenizers` extra)."""

    kind = "tokenizers"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser().resolve()
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise TokenizerError(f"cannot read tokenizer file {path}: {e.strerror or e}") from e
        try:
            from tokenizers import Tokenizer as _HF  # optional extra, imported only when used
        except ImportError as e:
            raise TokenizerError(
                f"tokenizer {path} needs the `tokenizers` package: {INSTALL_HINT}"
            ) from e
        try:
            self._tok = _HF.from_str(data.decode("utf-8"))
        except Exception as e:  # the library raises plain Exception subclasses
            raise TokenizerError(f"{path} is not a valid tokenizer.json: {e}") from e
        self.sha256 = hashlib.sha256(data).hexdigest()
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        eos = self._find(_EOS_NAMES)
        if eos is None:
            raise TokenizerError(
                f"{path}: found no end-of-text token (looked for {', '.join(_EOS_NAMES)})"
            )
        # Without a BOS or PAD token of its own, EOS stands in: documents are separated by
        # EOS anyway, and the trainer masks PAD targets (which then also masks EOS targets).
        self.eos_id = eos
        self.bos_id = self._find(_BOS_NAMES, default=eos)
        self.pad_id = self._find(_PAD_NAMES, default=eos)
        self._special = {self.bos_id, self.eos_id, self.pad_id}

    def _find(self, names: tuple[str, ...], default: int | None = None) -> int | None:
        for name in names:
            found = self._tok.token_to_id(name)
            if found is not None:
                return int(found)
        return default

    def encode(self, text: str) -> np.ndarray:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, dtype=np.uint32)

    def decode(self, ids: Any) -> str:
        keep = [int(i) for i in np.asarray(ids).reshape(-1) if int(i) not in self._special]
        return self._tok.decode(keep, skip_special_tokens=True)

    def hf_files(self, max_length: int) -> dict[str, str]:
        data = self.path.read_bytes()  # copied byte for byte: the very file we trained with
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise TokenizerError(f"{self.path} changed while in use; run the command again")
        bos, eos, pad = (self._tok.id_to_token(i) for i in (self.bos_id, self.eos_id, self.pad_id))
        return {
            "tokenizer.json": data.decode("utf-8"),
            # encode() matches special tokens inside a text, as transformers does by default.
            "tokenizer_config.json": _hf_config(bos, eos, pad, max_length, False),
        }

    def identity(self) -> dict[str, Any]:
        return super().identity() | {"path": str(self.path), "sha256": self.sha256}


def load_tokenizer(spec: str | dict[str, Any]) -> Tokenizer:
    """A tokenizer from a CLI spec ("byte" or a tokenizer.json path) or an `identity()` dict.

    Rebuilding from an identity checks that the tokenizer.json still has the recorded sha256,
    so samples are never decoded with a tokenizer other than the one the data was made with.
    """
    if isinstance(spec, dict):
        kind = spec.get("kind")
        if kind == "byte":
            return ByteTokenizer()
        if kind == "tokenizers":
            path = spec.get("path")
            if not isinstance(path, str):
                raise TokenizerError("tokenizer identity of kind 'tokenizers' lacks its 'path'")
            tok = HFTokenizer(path)
            if spec.get("sha256") not in (None, tok.sha256):
                raise TokenizerError(
                    f"tokenizer {path} changed since the dataset was prepared "
                    f"(sha256 {tok.sha256[:12]}..., recorded {str(spec['sha256'])[:12]}...)"
                )
            return tok
        raise TokenizerError(f"unknown tokenizer kind {kind!r} (expected 'byte' or 'tokenizers')")
    if spec == "byte":
        return ByteTokenizer()
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"tokenizer {spec!r} is neither 'byte' nor a tokenizer.json file")
    return HFTokenizer(path)


def identity_digest_part(identity: dict[str, Any]) -> dict[str, Any]:
    """The identity without its machine-specific path: what digests and up-to-date checks use."""
    return {k: v for k, v in identity.items() if k != "path"}


# --- the byte tokenizer as a Hugging Face tokenizer.json (for `fleet export`) ---------------
BYTE_TOKEN_NAMES = {BYTE_BOS: "<s>", BYTE_EOS: "<|endoftext|>", BYTE_PAD: "<pad>"}


def byte_level_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255: how a ByteLevel tokenizer.json spells
    bytes (printable Latin-1 stands for itself; the rest map to U+0100 onwards, in order)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars, extra = [], 0
    for b in range(BYTE_VOCAB):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(BYTE_VOCAB + extra))
            extra += 1
    return chars


def byte_tokenizer_json() -> dict[str, Any]:
    """A tokenizer.json equivalent to ByteTokenizer: the same ids for every text, the same
    text for every ids (invalid UTF-8 included: both replace it as Python's "replace" does).

    A BPE model without merges over the 256 byte tokens, behind a ByteLevel pre-tokenizer
    that neither splits nor adds a prefix space; BOS, EOS and PAD are special tokens at our
    ids, under names our HFTokenizer (and transformers) recognise. The decoder is a
    one-element Sequence around ByteLevel rather than ByteLevel itself: mlx-lm then streams
    with tokenizer.decode (exact) instead of its BPE detokenizer, which drops a leading
    space and mis-decodes byte 0.
    """
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    added = [
        {
            "id": i,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, name in sorted(BYTE_TOKEN_NAMES.items())
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": level | {"use_regex": False},
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [level | {"use_regex": False}]},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {c: b for b, c in enumerate(byte_level_chars())},
            "merges": [],
        },
    }


def _hf_config(bos: str, eos: str, pad: str, max_length: int, split_special: bool) -> str:
    """tokenizer_config.json: names the class (so AutoTokenizer never needs a model config it
    does not know) and the special tokens; no space clean-up, which our decode() never does."""
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": split_special,
    }
    return json.dumps(config, ensure_ascii=False, indent=2) + "\n"
