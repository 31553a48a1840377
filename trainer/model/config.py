"""The GPT's architecture as plain numbers: sizes, their checks, the parameter count (no MLX)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

HEAD_DIM = 64  # default head size when --heads is 0
VOCAB_MULTIPLE = 64  # the embedding and head are padded to this for friendlier matmul shapes
LOGIT_SOFTCAP = 15.0  # nanochat caps logits smoothly; keeps early training stable


@dataclass(frozen=True)
class ModelConfig:
    """The architecture; two runs may share weights only if these are equal."""

    depth: int
    width: int
    heads: int
    vocab: int
    seq_len: int
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @classmethod
    def from_sizes(
        cls, *, depth: int, width: int = 0, heads: int = 0, vocab: int, seq_len: int
    ) -> ModelConfig:
        """nanochat sizing: width 64 x depth unless given; heads of 64 unless given."""
        width = width or 64 * depth
        heads = heads or max(1, width // HEAD_DIM)
        if depth < 1 or width < 1 or vocab < 2 or seq_len < 1:
            raise ValueError(f"impossible model size: depth={depth} width={width} vocab={vocab}")
        if width % heads:
            raise ValueError(f"width {width} is not divisible by heads {heads}")
        if (width // heads) % 2:
            raise ValueError(f"head size {width // heads} must be even for rotary embeddings")
        return cls(depth=depth, width=width, heads=heads, vocab=vocab, seq_len=seq_len)

    def to_dict(self) -> dict:
        return asdict(self)

    def num_params(self) -> int:
        """Weights of the GPT this describes, counted from the shapes alone (no arrays): the
        embedding and the untied head (vocab x width each), and per block q, k, v and the
        output projection (width x width each) and the MLP (two of width x 4 width)."""
        return 2 * self.vocab * self.width + self.depth * 12 * self.width * self.width


def padded_vocab(n: int) -> int:
    """The tokenizer's vocabulary rounded up to VOCAB_MULTIPLE."""
    return -(-n // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
