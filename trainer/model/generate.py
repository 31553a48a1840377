"""Generation with a KV cache: token ids one at a time, and their text as it comes.

Each new token costs one position of attention per block (`GPT.extend`), not a forward pass
over the whole prefix again. The context is the model's own `seq_len`, as in training: when
it is full, the newest half is read again into a fresh cache (one pass every seq_len / 2
tokens), so rotary distances never exceed what the model was trained on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from trainer.model.cache import KVCache

if TYPE_CHECKING:
    from trainer.data.tokenizer import Tokenizer
    from trainer.model.gpt import GPT


def new_cache(model: GPT) -> list[KVCache]:
    """An empty cache for every block of `model`."""
    return [KVCache() for _ in model.blocks]


def pick(logits: mx.array, temperature: float, top_k: int, key: mx.array) -> int:
    """The next token id from one position's logits: greedy at temperature 0, else sampled
    from the `top_k` most likely (0 = all) at that temperature."""
    logits = logits.astype(mx.float32)
    if temperature <= 0:
        return int(mx.argmax(logits).item())
    if 0 < top_k < logits.shape[-1]:
        kth = mx.topk(logits, top_k).min()
        logits = mx.where(logits < kth, -mx.inf, logits)
    return int(mx.random.categorical(logits / temperature, key=key).item())


def generate(
    model: GPT, prompt: list[int], max_new: int, temperature: float = 0.8, seed: int = 0
) -> list[int]:
    """Up to `max_new` token ids sampled after `prompt`, as a list (the loop's test sentence)."""
    return list(generate_ids(model, prompt, max_new, temperature=temperature, seed=seed))


def generate_ids(
    model: GPT,
    prompt: list[int],
    max_new: int,
    *,
    temperature: float = 0.8,
    top_k: int = 0,
    seed: int = 0,
    stop: int | None = None,
) -> Iterator[int]:
    """Up to `max_new` token ids after `prompt` (not empty), yielded as each is chosen;
    ends early after `stop` (say, the end-of-text id) when given. The same `seed` gives the
    same ids."""
    window = model.cfg.seq_len
    ids = [int(t) for t in prompt][-window:]
    if not ids:
        raise ValueError("generation needs at least one prompt token")
    if max_new <= 0:
        return
    key = mx.random.key(seed)
    cache = new_cache(model)
    logits = model.extend(mx.array([ids]), cache)[0, -1]
    for left in range(max_new - 1, -1, -1):
        key, sub = mx.random.split(key)
        nxt = pick(logits, temperature, top_k, sub)
        yield nxt
        if nxt == stop or not left:
            return
        ids.append(nxt)
        if cache[0].offset < window:
            logits = model.extend(mx.array([[nxt]]), cache)[0, -1]
        else:  # the context is full: keep its newest half, read once into a fresh cache
            ids = ids[-max(1, window // 2) :]
            cache = new_cache(model)
            logits = model.extend(mx.array([ids]), cache)[0, -1]


class TextStream:
    """Text of a growing list of ids, handed out as new pieces.

    A character split across tokens (a UTF-8 sequence cut between byte tokens) decodes to
    U+FFFD until it is complete, so text ending in one is held back until the next token.
    Every call decodes all ids so far: O(n²) in the sample's length, negligible next to the
    model for the few thousand tokens a sample has.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token: int) -> str:
        """The text that `token` completes ("" while it is held back)."""
        self.ids.append(token)
        text = self.decode(self.ids)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) :], text
        return piece

    def finish(self) -> str:
        """Whatever is still held back, as it decodes now."""
        text = self.decode(self.ids)
        piece = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent = text
        return piece


def stream(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: str,
    max_new: int,
    write: Callable[[str], object],
    **sampling: Any,
) -> str:
    """Write `prompt`, then the text generated after it piece by piece as each token comes
    (`sampling`: generate_ids's keywords); stops at the end-of-text token. Returns it all."""
    # An empty prompt starts a new document: documents follow an end-of-text token.
    ids = [int(i) for i in tokenizer.encode(prompt)] or [tokenizer.eos_id]
    write(prompt)
    text = TextStream(tokenizer.decode)
    pieces = [prompt]
    for token in generate_ids(model, ids, max_new, stop=tokenizer.eos_id, **sampling):
        if piece := text.add(token):
            write(piece)
            pieces.append(piece)
    if rest := text.finish():
        write(rest)
        pieces.append(rest)
    return "".join(pieces)
