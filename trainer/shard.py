"""The optimizer sharded across ranks in unequal shares (ZeRO-1): `--shard-optimizer`.

Every rank still computes the gradient of every weight and the all-reduce still sums them
(exact, token-weighted: the split never changes the math). What is sharded is what the
optimizer keeps: each rank holds the FP32 master weights (under mixed precision) and the
optimizer state (AdamW's moments, Muon's momentum) of its share of the parameters only, steps
that share, and sends the new weights to every rank. DeepSpeed, FSDP and MLX's `fully_shard`
split equally; here a share follows each rank's memory (`--optimizer-shares 4,4,1,1,1`, or by
each rank's budget).

A share is counted in parameters. AdamW is elementwise, so a matrix may be split by rows:
the embedding and the head, which dominate a small model, can be shared between ranks. Muon
orthogonalizes whole matrices (Newton-Schulz on the matrix), so the matrices it steps are
kept whole and go, largest first, to the rank furthest below its share; the rows of the rest
then fill every rank up to its share. Every rank computes the same layout from the shapes and
the shares. A rank's part of each matrix is one run of rows.

The math does not change: every rank holds the same summed gradients, so the clip's global
norm is the same; the optimizer's arithmetic is elementwise on the same values (Muon's on the
same whole matrix); the new weights travel as their bits (a sum of unsigned integers in which
only the owner's are not zero), so they arrive exactly. FP32 weights after N updates are
bit-identical to an unsharded run's (tests/system/test_shard.py).

The new weights reach the other ranks through `all_sum`: ring, JACCL, MPI and NCCL all have
it (and `all_gather`); ring has neither `sum_scatter` nor `Group.split`, so nothing here uses
them. Checkpoints stay one logical checkpoint, the same files as an unsharded run's (the
shards are gathered into rank 0 for the save), so a sharded run resumes sharded, unsharded,
on fewer ranks or with new shares, and exports as any other.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from telemetry.units import MiB, gib_text
from trainer.checkpoint import store
from trainer.config import ConfigError, TrainConfig
from trainer.optim import make_optimizer, whole_matrices

Whole = Callable[[str, tuple[int, ...]], bool]  # (path, shape) -> must the matrix stay whole


class ShardError(ConfigError):
    """Shares that cannot apply to this run; the message says what to give instead."""


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows [start, stop) of the parameter `name` (rows in all: `rows`)."""

    name: str
    start: int
    stop: int
    rows: int
    cols: int  # elements a row

    @property
    def size(self) -> int:
        return (self.stop - self.start) * self.cols

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop == self.rows


@dataclass(frozen=True)
class Layout:
    """Which rank steps which rows of which parameter."""

    names: tuple[str, ...]  # every parameter, in tree_flatten order
    shapes: dict[str, tuple[int, ...]]
    pieces: tuple[tuple[Piece, ...], ...]  # per rank, in parameter order

    @property
    def world(self) -> int:
        return len(self.pieces)

    def total(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())

    def fractions(self) -> list[float]:
        """Each rank's share of the parameters, as stepped."""
        total = self.total()
        return [sum(p.size for p in mine) / total for mine in self.pieces]

    def owned(self, rank: int) -> dict[str, Piece]:
        return {p.name: p for p in self.pieces[rank]}

    def owners(self, name: str) -> list[tuple[int, Piece]]:
        return [(r, p) for r, mine in enumerate(self.pieces) for p in mine if p.name == name]

    def digest(self) -> bytes:
        """Equal on every rank that computed the same layout."""
        text = repr([[(p.name, p.start, p.stop) for p in mine] for mine in self.pieces])
        return hashlib.sha256(text.encode()).digest()


def plan(params: list[tuple[str, tuple[int, ...]]], shares: list[float], whole: Whole) -> Layout:
    """Split the parameters (name, shape) across len(shares) ranks in proportion to `shares`:
    matrices `whole` says must stay whole go to the rank furthest below its share, largest
    first; the rows of the rest fill every rank up to its share, in rank order."""
    n, sizes = len(shares), {name: math.prod(shape) for name, shape in params}
    target = [s / sum(shares) * sum(sizes.values()) for s in shares]
    held = [0.0] * n
    pieces: list[list[Piece]] = [[] for _ in range(n)]
    atoms = [(name, shape) for name, shape in params if whole(name, shape)]
    for name, shape in sorted(atoms, key=lambda a: (-sizes[a[0]], a[0])):
        r = max(range(n), key=lambda r: (target[r] - held[r], -r))
        pieces[r].append(_piece(name, shape, 0, shape[0]))
        held[r] += sizes[name]
    rest = [(name, shape) for name, shape in params if not whole(name, shape)]
    room = sum(sizes[name] for name, _ in rest)
    need = [max(0.0, t - h) for t, h in zip(target, held, strict=True)]
    if sum(need) <= 0:
        need = list(target)
    cuts = [0.0]
    for x in need:
        cuts.append(cuts[-1] + x * room / sum(need))
    cuts[-1] = room  # rounding must not leave a row behind
    offset = 0
    for name, shape in rest:
        rows, cols = shape[0], sizes[name] // max(1, shape[0])
        bounds = [min(rows, max(0, round((c - offset) / max(1, cols)))) for c in cuts]
        for r in range(n):
            if bounds[r + 1] > bounds[r]:
                pieces[r].append(_piece(name, shape, bounds[r], bounds[r + 1]))
        offset += sizes[name]
    order = {name: i for i, (name, _) in enumerate(params)}
    return Layout(
        names=tuple(name for name, _ in params),
        shapes={name: tuple(shape) for name, shape in params},
        pieces=tuple(tuple(sorted(mine, key=lambda p: order[p.name])) for mine in pieces),
    )


def _piece(name: str, shape: tuple[int, ...], start: int, stop: int) -> Piece:
    rows = shape[0] if shape else 1
    return Piece(name, start, stop, rows, math.prod(shape) // max(1, rows))


def parse_shares(text: str, world: int) -> list[float] | None:
    """--optimizer-shares: None for auto (by memory budget), else one positive number a rank."""
    text = str(text).strip()
    if text in ("", "auto"):
        return None
    try:
        shares = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ShardError(
            f"--optimizer-shares: expected numbers like 4,4,1,1,1 (or auto), got {text!r}"
        ) from None
    if len(shares) != world:
        raise ShardError(
            f"--optimizer-shares has {len(shares)} values ({text}) but the run has {world} "
            "rank(s): give one per rank, or auto (by each rank's memory)"
        )
    for r, s in enumerate(shares):
        if not math.isfinite(s) or s <= 0:
            raise ShardError(
                f"--optimizer-shares: rank {r}'s share is {text.split(',')[r].strip()}: every "
                "rank steps a part of the optimizer, so every share must be above 0"
            )
    return shares


def shares_from_budgets(budgets: list[float]) -> list[float]:
    """auto: shares in proportion to each rank's memory budget (bytes, 0 = none)."""
    missing = [r for r, b in enumerate(budgets) if b <= 0]
    if missing:
        raise ShardError(
            f"--optimizer-shares auto follows each rank's memory budget, and rank(s) "
            f"{missing} have none (--memory-limit-gb 0): give --optimizer-shares, e.g. "
            f"{','.join('1' for _ in budgets)}"
        )
    return list(budgets)


# --- the bits of the weights, summed: exact whatever the values -------------------------------
def bit_sum(flat: mx.array, group) -> mx.array:
    """all_sum of a flat array's bits as uint32 (2-byte dtypes padded to an even length): when
    every element is 0 on all ranks but one, the sum is that rank's value, bit for bit (-0.0
    and NaN included, where a float sum would turn -0.0 + 0.0 into 0.0)."""
    dtype, n = flat.dtype, flat.size
    if dtype.size == 2 and n % 2:
        flat = mx.concatenate([flat, mx.zeros((1,), dtype=dtype)])
    summed = mx.distributed.all_sum(flat.view(mx.uint32), group=group)
    return summed.view(dtype)[:n]


class Shard:
    """This rank's part of the optimizer: the layout, its pieces, the FP32 master slices
    (mixed) and the step that sends the new weights to every rank."""

    def __init__(self, layout: Layout, rank: int, precision: str, bucket_bytes: int = 32 * MiB):
        self.layout, self.rank, self.precision = layout, rank, precision
        self.mine = layout.owned(rank)
        self.master: dict = {}  # mixed: FP32 rows of the pieces (a tree like the parameters)
        self.bucket_bytes = bucket_bytes

    @property
    def fraction(self) -> float:
        return self.layout.fractions()[self.rank]

    # --- building: from the full weights (fresh, or a checkpoint's) ------------------------
    def take(self, model, full_params: dict | None = None) -> None:
        """Keep this rank's master rows and make the model's weights the compute copy: under
        mixed the FP32 masters of the pieces are kept and the model becomes bf16 (cast from
        the FP32 weights, one matrix at a time); otherwise the weights are the masters."""
        flat = dict(tree_flatten(full_params if full_params is not None else model.parameters()))
        if self.precision != "mixed":
            if full_params is not None:
                model.update(tree_unflatten(list(flat.items())))
            return
        masters, compute = [], []
        for name in self.layout.names:  # one matrix at a time: no second full FP32 copy
            p = flat.pop(name)
            compute.append((name, p.astype(mx.bfloat16)))
            if name in self.mine:
                piece = self.mine[name]
                masters.append((name, mx.contiguous(p[piece.start : piece.stop])))
            mx.eval(compute[-1][1], *(m for n, m in masters[-1:] if n == name))
        self.master.clear()  # in place: the compiled step holds this dict
        self.master.update(tree_unflatten(masters) if masters else {})
        model.update(tree_unflatten(compute))

    def local_state(self, full_state: dict) -> dict:
        """This rank's rows of a full optimizer state (a fresh one, or a checkpoint's): the
        per-parameter arrays sliced to the pieces, the counters and rates as they are."""
        out = []
        for path, value in tree_flatten(full_state):
            name = self.param_of(path)
            if name is None:
                out.append((path, value))
            elif name in self.mine:
                piece = self.mine[name]
                rows = mx.contiguous(value[piece.start : piece.stop])
                mx.eval(rows)  # one tensor at a time: a checkpoint's is read, sliced, let go
                out.append((path, rows))
        return tree_unflatten(out) if out else {}

    def param_of(self, path: str) -> str | None:
        """The parameter an optimizer-state path belongs to ("states.1.wte.weight.m" ->
        "wte.weight"), or None for counters and rates ("step", "learning_rate")."""
        parts = path.split(".")
        for i in range(len(parts)):
            name = ".".join(parts[i:-1])
            if name in self.layout.shapes:
                return name
        return None

    # --- the step's inputs and output --------------------------------------------------
    def params(self, model_params: dict) -> dict:
        """The parameters this rank steps: its FP32 masters (mixed), else its rows of the
        model's weights (a tree like the parameters)."""
        if self.precision == "mixed":
            return self.master
        flat = dict(tree_flatten(model_params))
        return self._rows(flat)

    def grads(self, grad_sum: dict) -> dict:
        """This rank's rows of the summed gradients."""
        return self._rows(dict(tree_flatten(grad_sum)))

    def _rows(self, flat: dict) -> dict:
        rows = [(n, flat[n][p.start : p.stop]) for n, p in self.mine.items()]
        return tree_unflatten(rows) if rows else {}

    def distribute(
        self, new: dict, dtype, group, world: int, bucket_bytes: int = 0
    ) -> Iterator[dict]:
        """Every parameter's new value, in `dtype`, on every rank, one bucket (a tree of some
        parameters) at a time: this rank's rows of `new` and the others' from their owners,
        as bits (bit_sum). A bucket costs two flat copies (this rank's rows in zeros, and the
        sum); the caller replaces its old weights with each bucket as it arrives."""
        flat_new = dict(tree_flatten(new))
        for bucket in self._buckets(dtype, bucket_bytes or self.bucket_bytes):
            sizes = [math.prod(self.layout.shapes[name]) for name in bucket]
            flat = mx.zeros((sum(sizes),), dtype=dtype)
            offset = 0
            for name, size in zip(bucket, sizes, strict=True):
                if (piece := self.mine.get(name)) is not None:
                    start = offset + piece.start * piece.cols
                    flat[start : start + piece.size] = flat_new[name].astype(dtype).reshape(-1)
                offset += size
            if world > 1:
                flat = bit_sum(flat, group)
            mx.eval(flat)
            out, offset = [], 0
            for name, size in zip(bucket, sizes, strict=True):
                out.append((name, flat[offset : offset + size].reshape(self.layout.shapes[name])))
                offset += size
            yield tree_unflatten(out)

    def _buckets(self, dtype, bucket_bytes: int) -> Iterator[list[str]]:
        bucket, size = [], 0
        for name in self.layout.names:
            bucket.append(name)
            size += math.prod(self.layout.shapes[name]) * dtype.size
            if size >= bucket_bytes:
                yield bucket
                bucket, size = [], 0
        if bucket:
            yield bucket

    # --- checkpoints: the shards gathered into one logical state -----------------------------
    def gather(self, local: dict, template: dict, group, world: int, root: bool) -> dict | None:
        """The full tree of `template`'s shape (a fresh optimizer's state, or the parameters)
        from every rank's `local` rows, on the root rank (None elsewhere): one tensor at a
        time, so only the root ever holds the whole."""
        have = dict(tree_flatten(local))
        out = []
        for path, like in tree_flatten(template):
            name = self.param_of(path) if path not in self.layout.shapes else path
            if name is None:  # a counter or a rate: the same on every rank
                out.append((path, have[path]))
                continue
            piece = self.mine.get(name)
            dtype = like.dtype  # the template's: every rank sums the same bytes
            flat = mx.zeros((like.size,), dtype=dtype)
            if piece is not None:
                start = piece.start * piece.cols
                flat[start : start + piece.size] = have[path].reshape(-1).astype(dtype)
            if world > 1:
                flat = bit_sum(flat, group)
            mx.eval(flat)
            if root:
                out.append((path, flat.reshape(like.shape)))
        return tree_unflatten(out) if root else None

    # --- what a rank holds, and proof that the replicas agree -----------------------------
    def consistent(self, model_params: dict) -> bool:
        """Do this rank's masters, cast, equal its rows of the compute weights (mixed)?"""
        if self.precision != "mixed":
            return True
        masters, weights = dict(tree_flatten(self.master)), dict(tree_flatten(model_params))
        for name, piece in self.mine.items():
            rows = weights[name][piece.start : piece.stop]
            if not mx.array_equal(masters[name].astype(rows.dtype), rows).item():
                return False
        return True


# --- building a run's shard -------------------------------------------------------------
def open_shard(
    cfg: TrainConfig, cluster, model, optimizer, budget: int | None, resume=None
) -> tuple[Shard, tuple[dict, dict]]:
    """This rank's Shard for `model` and `optimizer` (fresh, or from the checkpoint at
    `resume`), and the full trees' shapes for gathering checkpoints. A collective: every
    rank's memory budget reaches every rank (auto shares, and the check that each fits)."""
    world, rank = cluster.size, cluster.rank
    mine = [0.0] * world
    mine[rank] = (budget or 0) / MiB
    budgets = [b * MiB for b in cluster.all_sum_floats(mine)]
    shares = parse_shares(cfg.optimizer_shares, world) or shares_from_budgets(budgets)
    flat = tree_flatten(model.trainable_parameters())
    layout = plan([(n, p.shape) for n, p in flat], shares, whole_matrices(cfg))
    # Shapes of the full trees, never evaluated (lazy zeros cost nothing): what a checkpoint
    # gathers into, in the masters' dtype.
    master = flat[0][1].dtype
    shapes = tree_unflatten([(n, mx.zeros(p.shape, dtype=master)) for n, p in flat])
    fresh = make_optimizer(cfg)
    fresh.init(shapes)
    check_fit(layout, fresh.state, budgets, cfg.precision)
    shard = Shard(layout, rank, cfg.precision, cluster.bucket_bytes)
    if resume is None:
        shard.take(model)
        optimizer.state = shard.local_state(optimizer.state)
    else:
        params, state = store.load_arrays(resume)  # lazy: read one tensor at a time
        shard.take(model, params)
        optimizer.state = shard.local_state(state)
    return shard, (shapes, fresh.state)


def check_fit(layout: Layout, state_shapes: dict, budgets: list[float], precision: str) -> None:
    """Refuse a share that cannot fit its rank: its master rows and optimizer state beside
    what every rank holds whole (the compute weights and the FP32 accumulators)."""
    per_elem: dict[str, int] = {}  # optimizer-state bytes per parameter element
    probe = Shard(layout, 0, precision)
    for path, a in tree_flatten(state_shapes):
        if (name := probe.param_of(path)) is not None:
            per_elem[name] = per_elem.get(name, 0) + a.dtype.size
    total = layout.total()
    compute = 4 if precision == "fp32" else 2
    everyone = total * (compute + 4)
    master = 4 if precision == "mixed" else 0
    for r, budget in enumerate(budgets):
        part = sum(p.size * (master + per_elem.get(p.name, 0)) for p in layout.pieces[r])
        if budget > 0 and part + everyone > budget:
            raise ShardError(
                f"--optimizer-shares: rank {r}'s share ({gib_text(part)} of master weights and "
                f"optimizer state, beside {gib_text(everyone)} of weights and FP32 accumulators "
                f"every rank holds) does not fit its memory budget of {gib_text(budget)}: give "
                f"rank {r} a smaller share, or more memory (--memory-limit-gb)"
            )
