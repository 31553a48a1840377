"""The packing of `--optimizer-step flat`: AdamW's tensors end to end, one buffer per dtype.

AdamW is elementwise, so stepping the concatenation of its tensors is stepping each of them:
the same arithmetic on the same numbers (MLX's own `AdamW.apply_single`, given a tree of one
1-D buffer per dtype), in one fused kernel instead of one per tensor, and one reduction for the
gradient norm instead of one per tensor (the norm alone sums in another order: the weights
agree with the per-tensor step to FP32 rounding, bit for bit when no clip applies). Muon's
matrices stay whole and per tensor (its orthogonalization is not elementwise): only the
tensors the last optimizer of a MultiOptimizer (MuonAdamW's AdamW) steps are packed.

The moments stay packed between updates; checkpoints keep today's per-tensor format
(`unpacked_state` on the way out, `pack_state` on the way in), so a checkpoint moves between
the two steps either way. Costs per update: the gradients and the weights are copied into
their buffers (two passes over them, and that much more memory during the step); the new
weights are views of the stepped buffer (no copy back).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

Tree = dict
KEY = "flat"  # the buffers' place in the trees AdamW sees: {"flat": {"float32": buffer}}
MOMENTS = ("m", "v")


@dataclass(frozen=True, slots=True)
class Group:
    """The tensors of one dtype, in tree order, end to end in one buffer."""

    dtype: str  # the parameters' dtype (the gradients' buffer is FP32 whatever it is)
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def path(self) -> str:
        return f"{KEY}.{self.dtype}"

    @property
    def cuts(self) -> list[int]:
        """Where one tensor ends and the next starts (for `mx.split`)."""
        sizes = [_size(s) for s in self.shapes]
        return list(accumulate(sizes))[:-1]

    def pack(self, items: dict[str, mx.array], suffix: str = "") -> mx.array:
        return mx.concatenate([items[n + suffix].reshape(-1) for n in self.names])

    def unpack(self, buffer: mx.array, suffix: str = "") -> list[tuple[str, mx.array]]:
        parts = mx.split(buffer, self.cuts) if len(self.names) > 1 else [buffer]
        return [
            (n + suffix, p.reshape(s))
            for n, s, p in zip(self.names, self.shapes, parts, strict=True)
        ]


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]  # mlx.core.float32 -> float32


def last_optimizer(optimizer: optim.Optimizer) -> optim.Optimizer:
    """The optimizer the packed tensors go to: the fallback of a MultiOptimizer, or itself."""
    if isinstance(optimizer, optim.MultiOptimizer):
        return optimizer.optimizers[-1]
    return optimizer


class Packing:
    """Which tensors are packed, by dtype, and the ways into and out of the packed trees."""

    def __init__(self, params: Tree, optimizer: optim.Optimizer) -> None:
        if not isinstance(last_optimizer(optimizer), optim.Adam):
            kind = type(last_optimizer(optimizer)).__name__
            raise ValueError(f"the flat optimizer step packs AdamW's tensors, not {kind}'s")
        # A MultiOptimizer's earlier optimizers (Muon) keep their tensors, per tensor.
        others = optimizer.filters[:-1] if isinstance(optimizer, optim.MultiOptimizer) else []
        self.kept: list[str] = []
        groups: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        for name, p in tree_flatten(params):
            if any(f(name, p) for f in others):
                self.kept.append(name)
            else:
                groups.setdefault(_dtype_name(p.dtype), []).append((name, tuple(p.shape)))
        self.groups = [
            Group(dtype, tuple(n for n, _ in v), tuple(s for _, s in v))
            for dtype, v in groups.items()
        ]

    # --- parameters and gradients
    def pack(self, tree: Tree) -> Tree:
        """`tree` (shaped like the parameters) with the packed tensors as one 1-D buffer per
        group, concatenated (a copy: one pass over them)."""
        items = dict(tree_flatten(tree))
        out = [(n, items[n]) for n in self.kept]
        out += [(g.path, g.pack(items)) for g in self.groups]
        return tree_unflatten(out)

    def unpack(self, tree: Tree) -> Tree:
        """A packed tree back in the parameters' shape (views of the buffers: no copy)."""
        items = dict(tree_flatten(tree))
        out = [(n, items[n]) for n in self.kept]
        for g in self.groups:
            out += g.unpack(items[g.path])
        return tree_unflatten(out)

    # --- the optimizer state: packed while training, per tensor in checkpoints
    def pack_state(self, optimizer: optim.Optimizer) -> None:
        """Pack the moments of the packed tensors in `optimizer`'s state, in place (a fresh
        optimizer, freshly initialized, or one given a checkpoint's per-tensor state).
        Already packed, or not yet initialized (the first step makes packed zeros): as it is."""
        part = last_optimizer(optimizer)
        items = dict(tree_flatten(part.state))
        wanted = [n + "." + k for g in self.groups for n in g.names for k in MOMENTS]
        if not all(w in items for w in wanted):
            return
        packed = [(f"{g.path}.{k}", g.pack(items, "." + k)) for g in self.groups for k in MOMENTS]
        rest = [(n, a) for n, a in items.items() if n not in set(wanted)]
        part.state = tree_unflatten(rest + packed)

    def unpacked_state(self, optimizer: optim.Optimizer) -> Tree:
        """`optimizer.state` as the per-tensor step keeps it (what a checkpoint saves): the
        packed moments split back into views, one per tensor; the live state is untouched."""
        part = last_optimizer(optimizer)
        items = dict(tree_flatten(part.state))
        out = [(n, a) for n, a in items.items() if not n.startswith(KEY + ".")]
        for g in self.groups:
            for k in MOMENTS:
                if f"{g.path}.{k}" in items:
                    out += g.unpack(items[f"{g.path}.{k}"], "." + k)
        state = tree_unflatten(out)
        if part is optimizer:
            return state
        return {"states": [o.state for o in optimizer.optimizers[:-1]] + [state]}
