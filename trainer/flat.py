"""The packing of `--optimizer-step flat`: AdamW's tensors end to end in a few buffers.

AdamW is elementwise, so stepping the concatenation of its tensors is stepping each of them:
the same arithmetic on the same numbers (MLX's own `AdamW.apply_single`, given a tree of 1-D
buffers by dtype), in a handful of fused kernels (one a buffer) instead of one per tensor,
and a handful of reductions for the gradient norm (the norm alone sums in another order: the
weights agree with the per-tensor step to FP32 rounding, bit for bit when no clip applies).
Muon's matrices stay whole and per tensor (its orthogonalization is not elementwise): only
the tensors the last optimizer of a MultiOptimizer (MuonAdamW's AdamW) steps are packed.

The moments stay packed between updates; checkpoints keep today's per-tensor format
(`unpacked_state` on the way out, `pack_state` on the way in), so a checkpoint moves between
the two steps either way. The weights stay packed too (`Stepper` keeps the stepped buffers;
the model's tensors are views of them, no copy back) and are packed again only when something
else gave the model its weights (a checkpoint, a rebalance's broadcast). The gradients are
packed where they are made, in the microstep (a copy each, sent while the GPU is busy with
the backward pass). So the optimizer phase, where the GPU waits for every kernel the CPU
sends, is a handful of kernels: on an H200 its ~150 copies had cost more in sending than in
running (benchmarks/RESULTS.md, issue 23). Differentiating the packed weights instead (a cast
a buffer, the gradients concatenated by the backward pass of the unpacking) measured 15%
slower there, so the microsteps see the model's tensors as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

Tree = dict
KEY = "flat"  # the buffers' place in the trees AdamW sees: {"flat": {"float32": [buffers]}}
MOMENTS = ("m", "v")
# Elements a buffer holds at most (whole tensors; a larger tensor is a buffer of its own). On
# the CPU, MLX's AdamW on one buffer of 3.4M FP32 elements took 10x as long as on two of
# 1.7M (171 ms against 17; 4-128 buffers of the same total: 16-26 ms), so a handful of
# buffers there; on a GPU a 135M-parameter model is three.
MAX_ELEMENTS = {"cpu": 2**20, "gpu": 2**26}


@dataclass(frozen=True, slots=True)
class Group:
    """Consecutive tensors of one dtype, in tree order, end to end in one buffer."""

    dtype: str  # the parameters' dtype (the gradients' buffer is FP32 whatever it is)
    index: int  # the buffer's place among its dtype's
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @property
    def path(self) -> str:
        return f"{KEY}.{self.dtype}.{self.index}"

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


def _buckets(tensors: list, max_elements: int) -> list[list]:
    """Consecutive tensors, whole, in buffers of at most `max_elements` (or one tensor)."""
    out: list[list] = []
    held = max_elements
    for name, shape in tensors:
        if held + _size(shape) > max_elements:
            out.append([])
            held = 0
        out[-1].append((name, shape))
        held += _size(shape)
    return out


def _dtype_name(dtype: mx.Dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]  # mlx.core.float32 -> float32


class Slots:
    """Where named tensors sit in a module tree, to read them without walking it: a few
    hundred lookups, where `Module.trainable_parameters()` walks every submodule (about a
    millisecond of Python a call at 135M parameters, while the GPU waits for the next kernel).
    `Module.update` replaces a tensor in its place, so a read sees weights given from outside."""

    def __init__(self, module: dict, names: list[str]) -> None:
        self.places: list[tuple] = []
        for name in names:
            *path, key = name.split(".")
            node = module
            for part in path:
                node = node[int(part)] if isinstance(node, list) else node[part]
            self.places.append((node, int(key) if isinstance(node, list) else key))

    def read(self) -> list[mx.array]:
        return [node[key] for node, key in self.places]


def is_packed(tree: Tree) -> bool:
    """Whether `tree` is a packed tree (its packed tensors in buffers under KEY)."""
    return isinstance(tree, dict) and isinstance(tree.get(KEY), dict)


def last_optimizer(optimizer: optim.Optimizer) -> optim.Optimizer:
    """The optimizer the packed tensors go to: the fallback of a MultiOptimizer, or itself."""
    if isinstance(optimizer, optim.MultiOptimizer):
        return optimizer.optimizers[-1]
    return optimizer


class Packing:
    """Which tensors are packed, by dtype, and the ways into and out of the packed trees."""

    def __init__(
        self, params: Tree, optimizer: optim.Optimizer, max_elements: int | None = None
    ) -> None:
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
        if max_elements is None:
            max_elements = MAX_ELEMENTS["cpu" if mx.default_device() == mx.cpu else "gpu"]
        self.groups = [
            Group(dtype, i, tuple(n for n, _ in b), tuple(s for _, s in b))
            for dtype, tensors in groups.items()
            for i, b in enumerate(_buckets(tensors, max_elements))
        ]

    # --- parameters and gradients
    def pack(self, tree: Tree) -> Tree:
        """`tree` (shaped like the parameters) with the packed tensors as one 1-D buffer per
        group, concatenated (a copy: one pass over them); a tree already packed, as it is."""
        if is_packed(tree):
            return tree
        items = dict(tree_flatten(tree))
        out = [(n, items[n]) for n in self.kept]
        out += [(g.path, g.pack(items)) for g in self.groups]
        return tree_unflatten(out)

    def buffers(self, tree: Tree) -> Tree:
        """The packed part of `pack(tree)` alone: {dtype: [buffers]}."""
        return self.pack(tree)[KEY]

    def join(self, kept: list[mx.array], buffers: Tree) -> Tree:
        """A packed tree from the kept tensors (in `kept`'s order) and `buffers` (a
        `buffers()` of the same shapes)."""
        return tree_unflatten([*zip(self.kept, kept, strict=True), (KEY, buffers)])

    @property
    def names(self) -> list[str]:
        """The packed tensors' names, in the buffers' order."""
        return [n for g in self.groups for n in g.names]

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
