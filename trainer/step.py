"""The compiled pieces of an update: microbatch gradients, FP32 accumulation, optimizer step."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map

from trainer import memory
from trainer.checkpoint import store
from trainer.distributed import Cluster
from trainer.flat import KEY as FLAT
from trainer.flat import Packing, Slots
from trainer.model import kernels, tensor
from trainer.model.gpt import GPT, MLP, Block
from trainer.model.loss import head_loss
from trainer.shard import Shard

Tree = dict


def zeros_f32(params: Tree) -> Tree:
    """FP32 accumulators shaped like the parameters."""
    return tree_map(lambda p: mx.zeros(p.shape, dtype=mx.float32), params)


def global_norm(tree: Tree, group: mx.distributed.Group | None = None) -> mx.array:
    """The L2 norm of every array in the tree together, in FP32; with a tensor-parallel
    `group`, of the whole model's (each rank holds a slice: the squares are summed over it)."""
    squares = sum(mx.sum(mx.square(g.astype(mx.float32))) for _, g in tree_flatten(tree))
    if group is not None:
        squares = mx.distributed.all_sum(squares, group=group)
    return mx.sqrt(squares)


@dataclass(frozen=True, slots=True)
class UpdateFigures:
    """What one update did and how long each of its phases took."""

    loss_sum: float  # summed token loss over every rank
    tokens: int  # real tokens in the update, over every rank
    local_tokens: int  # this rank's share
    grad_norm: float  # before clipping
    compute_s: float  # microsteps (forward, backward, FP32 accumulation)
    wait_s: float  # waiting at the barrier for the slowest rank
    transfer_s: float  # the gradient all-reduce
    optimizer_s: float
    update_s: float

    @property
    def loss(self) -> float:
        return self.loss_sum / max(1, self.tokens)


def _no_stage(stage: str) -> None:
    pass


# The next update's first microbatch, for `Stepper.update(ahead=...)`: (its key, its tokens).
Ahead = Callable[[], tuple[Hashable, mx.array]]


@dataclass(slots=True)
class _Started:
    """The next update's first microstep, built (lazily) while this update's step runs."""

    key: Hashable  # the loop's name for its microbatch (cursor, split, rank)
    weights: list[mx.array]  # the weights it read: it counts only while they are the model's
    outputs: tuple  # (accumulators, loss sum, token count), lazy
    build_s: float  # the time its building took, credited to the update it belongs to


class CheckpointedBlock(Block):
    """A Block whose backward pass recomputes its forward (`mx.checkpoint`, as mlx-lm's
    --grad-checkpoint): the graph keeps the block's input for the backward pass, not its
    activations. Costs about one more forward pass of the block."""

    def __call__(self, x: mx.array) -> mx.array:
        def forward(params: Tree, x: mx.array) -> mx.array:
            self.update(params)
            return Block.__call__(self, x)

        return mx.checkpoint(forward)(self.trainable_parameters(), x)


def checkpoint_blocks(model: GPT) -> None:
    """Make every block of `model` a CheckpointedBlock: same parameters, same tree, same
    values; only this model's blocks change (mlx-lm patches the class, every model's)."""
    for block in model.blocks:
        block.__class__ = CheckpointedBlock


@mx.checkpoint
def relu2_proj(z: mx.array, weight: mx.array) -> mx.array:
    """ReLU²(z) @ weight.T, the MLP after c_fc. Checkpointed: the backward pass keeps z alone
    and recomputes the pointwise ReLU² from it, where plain autodiff keeps two more 4x-wide
    activations (ReLU(z) and its square); the matmul is not recomputed (nothing needs its
    output there). Bit-identical gradients."""
    return mx.square(nn.relu(z)) @ weight.T


class RecomputedMLP(MLP):
    """An MLP whose ReLU² the backward pass recomputes (relu2_proj); same parameters."""

    def __call__(self, x: mx.array) -> mx.array:
        y = relu2_proj(self.c_fc(x), self.c_proj.weight)  # c_proj(ReLU²(c_fc(x)))
        if isinstance(self.c_proj, nn.ShardedToAllLinear):  # tensor parallel: sum the parts
            y = mx.distributed.all_sum(y, group=self.c_proj.group)
        return y


def recompute_relu2(model: GPT) -> None:
    """Make every MLP of `model` a RecomputedMLP (this model's only)."""
    for block in model.blocks:
        block.mlp.__class__ = RecomputedMLP


def attention_path(setting: str) -> tuple[str, bool]:
    """--attention as (kernels.PATHS name, packed q, k, v): auto is fused-qkv where the CUDA
    kernel runs (benchmarks/RESULTS.md, issue 23: 1.12x the update on an H200), plain
    elsewhere."""
    if setting == "auto":
        setting = "fused-qkv" if kernels.gpu_backend() == "cuda" else "plain"
    if setting == "fused-qkv":
        return "fused", True
    return setting, False


class Stepper:
    """Owns the compiled functions for one model and optimizer.

    `model` holds the master weights (FP32 for fp32/mixed, bf16 for bf16). The forward pass
    runs on `twin`, a second GPT of the same shape that is only ever given (cast) traced
    parameters, so tracing and casting never touch the master weights.
    """

    def __init__(
        self,
        model: GPT,
        optimizer,
        *,
        precision: str,
        pad_id: int,
        grad_clip: float,
        loss_chunk: int = 0,
        loss_head: str = "auto",
        attention: str = "auto",
        grad_checkpoint: bool = False,
        relu2_recompute: bool | None = None,
        optimizer_step: str = "auto",
        overlap: str = "auto",
        shard: Shard | None = None,
        templates: tuple[Tree, Tree] | None = None,
        tensor_group: mx.distributed.Group | None = None,
    ):
        self.model, self.optimizer = model, optimizer
        # --overlap: the next update's first microstep is built (a compiled graph's replay:
        # 5-9 ms of CPU at 135M parameters, the GPU idle meanwhile at the start of an update)
        # while this update's step runs: 1.05x the update on an H200 (benchmarks/RESULTS.md,
        # session 7); nothing measurable on the CPU, where auto leaves it off. Data parallel
        # only: a tensor-parallel microstep holds collectives every rank of its group must
        # start alike, and a sharded step evaluates its rows inside.
        gpu = mx.default_device() == mx.gpu
        self.overlap = {"auto": gpu, "on": True, "off": False}[overlap]
        self.overlap &= shard is None and tensor_group is None
        self._started: _Started | None = None
        # --shard-optimizer: this rank steps its share (trainer/shard.py); `templates` are
        # the full parameter and optimizer-state trees' shapes (lazy, never evaluated), for
        # gathering a checkpoint.
        self.shard, self.templates = shard, templates
        # --optimizer-step flat (unsharded only: the sharded step keeps its rows per tensor):
        # AdamW's tensors packed into a few buffers per dtype, its moments packed from here on
        # (trainer/flat.py). Before the compiled step captures the optimizer state.
        self.packing = None
        # The flat step's weights, packed, between updates: {"flat": {dtype: [buffers]}}, a
        # compiled step's input and output. `_views` are the model's tensors whose values they
        # hold (after a step, views of them); packed anew when the model's are no longer those
        # (until the next step, the old buffers stay alive: a copy of the weights).
        self.flat: Tree = {}
        self._views: list[mx.array] | None = None
        if optimizer_step == "auto":  # flat where it wins (a GPU), never sharded
            gpu = mx.default_device() == mx.gpu
            optimizer_step = "flat" if gpu and shard is None else "per-tensor"
        if optimizer_step == "flat":
            if shard is not None:
                raise ValueError("the flat optimizer step is for an unsharded optimizer")
            self.packing = Packing(model.trainable_parameters(), optimizer)
            self.packing.pack_state(optimizer)
            self._packed = Slots(model, self.packing.names)
            self._kept = Slots(model, self.packing.kept)
        self.pad_id, self.grad_clip = pad_id, grad_clip
        self.limit = memory.Limit("none", None)  # --memory-limit-gb: the builder's
        self.loss_chunk = loss_chunk  # rows per chunk of the fused head (0: by vocabulary)
        self.fused_head = {"auto": None, "fused": True, "plain": False}[loss_head]
        self.compute_dtype = mx.float32 if precision == "fp32" else mx.bfloat16
        self.cast = precision == "mixed"
        self.twin = GPT(model.cfg)  # lazily initialized arrays: never evaluated, cost nothing
        # Tensor parallelism: the twin is sharded like the master weights (its slices of
        # lazy arrays cost nothing either), and the head reads this rank's vocabulary slice.
        self.tensor_group = tensor_group
        if tensor_group is not None:
            tensor.shard_gpt(self.twin, tensor_group)
        # The same attention path for the twin (trained) and the model (evaluated, sampled).
        path, packed = attention_path(attention)
        for m in (self.twin, model):
            m.set_attention(path, packed)
        # Only the twin runs forward passes that are differentiated: the memory levers that
        # trade compute for memory change its modules alone.
        if grad_checkpoint:
            checkpoint_blocks(self.twin)
        if relu2_recompute is None:
            # On a GPU (CUDA, Metal) the recomputed pointwise pass costs about 1% of a step;
            # on the CPU, whose elementwise kernels run on one thread, about 4%, for memory
            # that matters less there (benchmarks/RESULTS.md, issue 12).
            relu2_recompute = mx.default_device() != mx.cpu
        if relu2_recompute:
            recompute_relu2(self.twin)
        self._value_and_grad = mx.value_and_grad(self._loss_sums)
        self._first = mx.compile(self._first_impl)
        self._micro = mx.compile(self._micro_impl)
        self._unrolled = mx.compile(self._unrolled_impl)
        self._eval = mx.compile(partial(self._loss_sums, grad=False))
        if shard is None:
            state = [model.state, optimizer.state, self.flat]
            self._apply = partial(mx.compile, inputs=state, outputs=state)(self._apply_impl)
        else:  # the weights are read (the rows this rank steps), the masters written
            state = [shard.master, optimizer.state]
            compile_ = partial(mx.compile, inputs=[model.state, *state], outputs=state)
            self._apply = compile_(self._apply_impl)

    # --- one update: microsteps, barrier, all-reduce, optimizer (the only definition of it)
    def update(
        self,
        batches: Iterable[mx.array],
        lr: float,
        *,
        sequential: bool = True,
        cluster: Cluster | None = None,
        stage: Callable[[str], None] = _no_stage,
        key: Hashable | None = None,
        ahead: Ahead | None = None,
    ) -> UpdateFigures:
        """Accumulate FP32 gradients over `batches`, sum them over ranks, then step.

        `stage` hears each phase as it starts ("compute", "barrier", "all-reduce",
        "optimizer"): the watchdog's view of where a stuck update is. With overlap on,
        `ahead()` gives the next update's first microbatch and its key: its microstep's graph
        is built on the new (lazy) weights while this update's step runs, and the next update
        sends it when its `key` is that one and the weights are still the step's (else, after
        a rebalance or a checkpoint loaded, it is dropped and built again). The same
        arithmetic.
        """
        batches = iter(batches)
        first = next(batches, None)  # its size decides whether auto measures the live set
        if first is not None:
            batches = itertools.chain([first], batches)
        rows = None if first is None else first.shape[0]
        with self.limit.update(rows):  # resets the peak; auto may measure the live set
            return self._update(batches, lr, sequential, cluster, stage, key, ahead)

    def _update(
        self, batches: Iterator[mx.array], lr, sequential, cluster, stage, key, ahead
    ) -> UpdateFigures:
        stage("compute")
        t_start = time.perf_counter()
        credit = 0.0  # this update's share of the time spent in the last one
        started = self._take_started(key) if sequential else None
        ahead = ahead if sequential else None
        if sequential:
            acc = loss_sum = ntok = None  # the first microstep writes the accumulators
            if started is not None:  # its first microstep was built during the last step
                next(batches, None)
                credit = started.build_s
                acc, loss_sum, ntok = started.outputs
                mx.async_eval(started.outputs)
            for batch in batches:
                # Built (a compiled graph's replay: milliseconds on the CPU) while the previous
                # microstep runs, started once it has finished: one microbatch's graph at a time.
                nxt = self.microstep(acc, loss_sum, ntok, batch)
                if acc is not None:
                    mx.eval(acc, loss_sum, ntok)  # a sync point: frees its microbatch's graph
                mx.async_eval(nxt)
                acc, loss_sum, ntok = nxt
            if acc is None:  # no microbatch: nothing to add (every rank still steps)
                acc = self._accumulators(zeros_f32(self.model.trainable_parameters()))
                loss_sum, ntok = mx.array(0.0), mx.array(0.0)
        else:
            acc, loss_sum, ntok = self.unrolled(list(batches))
        sums = mx.stack([loss_sum, ntok])
        # Alone (one rank, unsharded), the optimizer step's graph is built while the GPU
        # computes, not while it waits: its sums need no all-reduce.
        alone = (cluster is None or cluster.size == 1) and self.shard is None
        grad_norm = self.apply(acc, sums[1], lr) if alone else None
        lent = self._start_next(ahead, grad_norm) if alone else 0.0
        mx.eval(acc, loss_sum, ntok)
        compute_s = time.perf_counter() - t_start - lent + credit

        wait_s = transfer_s = 0.0
        if cluster is not None and cluster.size > 1:
            stage("barrier")
            wait_s = cluster.barrier()  # time spent waiting for the slowest rank
            stage("all-reduce")
            t0 = time.perf_counter()
            acc, sums = cluster.sum_gradients(acc, sums)
            mx.eval(acc, sums)
            transfer_s = time.perf_counter() - t0

        stage("optimizer")
        t0 = time.perf_counter()
        if self.shard is None:
            if grad_norm is None:  # not alone: the sums have travelled since
                grad_norm = self.apply(acc, sums[1], lr)
                lent = self._start_next(ahead, grad_norm)
        else:
            # The step reads the accumulators, then they go before the new weights travel:
            # the rows' step and the sending never hold the FP32 sums at once.
            grad_norm, new = self.step_rows(acc, sums[1], lr)
            del acc
            self.send_rows(new, cluster)
        mx.eval(self._weights(), self.optimizer.state, grad_norm)
        loss_total, tokens = sums.tolist()
        t_end = time.perf_counter()
        return UpdateFigures(
            loss_sum=loss_total,
            tokens=int(tokens),
            local_tokens=int(ntok.item()),
            grad_norm=grad_norm.item(),
            compute_s=compute_s,
            wait_s=wait_s,
            transfer_s=transfer_s,
            optimizer_s=t_end - t0 - (0.0 if alone else lent),
            update_s=t_end - t_start,
        )

    def _start_next(self, ahead: Ahead | None, grad_norm: mx.array) -> float:
        """With overlap on: send this update's step to the GPU, then build the next update's
        first microstep on the step's (lazy) weights while it runs; the seconds the building
        took. Built, not sent: `async_eval` returns only once all but the last ten batches of
        kernels are on their way, which would hold this update until most of the next
        microstep had run."""
        if ahead is None or not self.overlap:
            return 0.0
        mx.async_eval(self._weights(), self.optimizer.state, grad_norm)
        t0 = time.perf_counter()
        key, batch = ahead()
        weights = self._leaves()
        outputs = self.microstep(None, None, None, batch)
        build_s = time.perf_counter() - t0
        self._started = _Started(key, weights, outputs, build_s)
        return build_s

    def _leaves(self) -> list[mx.array]:
        """The model's trainable tensors (the flat step's: read from their places, no walk)."""
        if self.packing is not None:
            return self._packed.read() + self._kept.read()
        return [a for _, a in tree_flatten(self.model.trainable_parameters())]

    def _take_started(self, key: Hashable | None) -> _Started | None:
        """The microstep built for this update during the last one, if it was built from this
        update's first microbatch and the weights it read are still the model's (else dropped:
        only its building is lost, nothing of it has run)."""
        started, self._started = self._started, None
        if started is None or key is None or started.key != key:
            return None
        now = self._leaves()
        same = len(now) == len(started.weights) and all(
            a is b for a, b in zip(now, started.weights, strict=True)
        )
        return started if same else None

    # --- what this rank holds, for telemetry; what it saves
    def resident_bytes(self) -> int:
        """Bytes of master weights and optimizer state this rank holds (sharded under mixed:
        its FP32 rows; otherwise the weights, which are the masters, whole)."""
        masters = self.model.trainable_parameters()
        if self.shard is not None and self.shard.precision == "mixed":
            masters = self.shard.master
        held = tree_flatten([masters, self.optimizer.state])
        return sum(a.nbytes for _, a in held if isinstance(a, mx.array))

    def memory_fields(self) -> dict:
        """The memory figures of `records.Update`: the limit's, the optimizer's share and the
        bytes of master weights and optimizer state this rank holds."""
        return {
            **self.limit.figures(),
            "opt_share": 1.0 if self.shard is None else self.shard.fraction,
            "resident_mem": self.resident_bytes(),
        }

    def replica_digest(self) -> bytes:
        """What every rank's replica must agree on: the weights and optimizer state, or,
        sharded, the weights, the layout, and that this rank's masters are its rows of the
        weights (the optimizer shards are disjoint: each is checked against the weights its
        owner sent, which every rank then holds)."""
        params = self.model.parameters()
        if self.shard is None:
            return store.replica_digest(params, self.optimizer.state)
        h = hashlib.sha256(store.replica_digest(params) + self.shard.layout.digest())
        if not self.shard.consistent(params):
            h.update(f"rank {self.shard.rank}: masters differ from the weights".encode())
        return h.digest()

    def checkpoint_trees(self, cluster: Cluster | None) -> tuple[Tree, Tree] | None:
        """(weights, optimizer state) as one logical checkpoint, on rank 0 (None elsewhere):
        sharded, every rank takes part in gathering the masters and the state (a collective),
        one tensor at a time."""
        if self.shard is None:
            if self.packing is not None:  # checkpoints keep the per-tensor format
                return self.model.parameters(), self.packing.unpacked_state(self.optimizer)
            return self.model.parameters(), self.optimizer.state
        group, world = (cluster.group, cluster.size) if cluster else (None, 1)
        root = cluster is None or cluster.is_root
        shape, state_shape = self.templates
        params = self.model.parameters()
        if self.shard.precision == "mixed":
            params = self.shard.gather(self.shard.master, shape, group, world, root)
        state = self.shard.gather(self.optimizer.state, state_shape, group, world, root)
        return (params, state) if root else None

    # --- loss: the sum of per-token cross-entropy over real tokens, and their count
    def _loss_sums(
        self, params: Tree, batch: mx.array, grad: bool = True
    ) -> tuple[mx.array, mx.array]:
        if self.cast:
            params = tree_map(lambda p: p.astype(self.compute_dtype), params)
        self.twin.update(params)
        h = self.twin.features(batch[:, :-1])
        targets = batch[:, 1:].reshape(-1)
        mask = (targets != self.pad_id).astype(mx.float32)
        h, weight = h.reshape(-1, h.shape[-1]), self.twin.lm_head.weight
        if self.tensor_group is not None:  # the vocabulary is split: the head's own loss
            loss = tensor.tp_head_loss(h, weight, targets, mask, self.tensor_group, self.loss_chunk)
        else:
            loss = head_loss(
                h, weight, targets, mask, self.loss_chunk, grad=grad, fused=self.fused_head
            )
        return loss, mask.sum()

    # --- sequential accumulation: one microbatch per call, accumulators materialized by caller
    def _accumulators(self, grads: Tree) -> Tree:
        """FP32 gradients as the accumulators hold them: per tensor, or packed for the flat
        step (the copy made here, in the microstep, where the GPU is busy anyway)."""
        acc = tree_map(lambda g: g.astype(mx.float32), grads)
        return acc if self.packing is None else self.packing.pack(acc)

    def _micro_impl(self, params, acc, loss_sum, ntok, batch):
        (loss, n), grads = self._value_and_grad(params, batch)
        if self.packing is None:  # one fused cast-and-add a tensor
            acc = tree_map(lambda a, g: a + g.astype(mx.float32), acc, grads)
        else:
            acc = tree_map(mx.add, acc, self._accumulators(grads))
        return acc, loss_sum + loss, ntok + n

    def _first_impl(self, params, batch):
        # The gradients become the accumulators: no zeros to allocate, fill and add to (the
        # same sums: 0 + g is g), and no FP32 gradients alive beside accumulators.
        (loss, n), grads = self._value_and_grad(params, batch)
        return self._accumulators(grads), loss, n

    def microstep(
        self, acc: Tree | None, loss_sum: mx.array | None, ntok: mx.array | None, batch: mx.array
    ):
        """Add one microbatch's gradient of its summed loss to the FP32 accumulators (lazy);
        `acc` None (the first microstep of an update) starts them from this gradient."""
        params = self.model.trainable_parameters()
        if acc is None:
            return self._first(params, batch)
        return self._micro(params, acc, loss_sum, ntok, batch)

    def _weights(self) -> list | Tree:
        """What an update's last eval evaluates of the weights (the flat step: without walking
        the model; the model's tensors are views, evaluated lest they hold the step's graph)."""
        if self.packing is None:
            return self.model.parameters()
        return [self._packed.read(), self._kept.read(), self.flat]

    # --- unrolled accumulation: one graph over every microbatch (the memory baseline)
    def _unrolled_impl(self, params, batches):
        def total(p):
            sums = [self._loss_sums(p, b) for b in batches]
            return sum(s[0] for s in sums), sum(s[1] for s in sums)

        (loss, n), grads = mx.value_and_grad(total)(params)
        return self._accumulators(grads), loss, n

    def unrolled(self, batches: list[mx.array]):
        """Gradients of the summed loss over all microbatches in one lazy computation."""
        return self._unrolled(self.model.trainable_parameters(), batches)

    def eval_sums(self, batch: mx.array) -> tuple[mx.array, mx.array]:
        return self._eval(self.model.trainable_parameters(), batch)

    # --- optimizer: divide by the update's global token count, clip, step
    def _apply_impl(self, grad_sum, ntok):
        # One pass reads the sums for the norm; the division by the token count and the clip
        # fold into a single scale that compile fuses into AdamW's elementwise update, so the
        # mean gradient is never written out on its own (a full pass over the weights saved).
        if self.packing is None:
            params = self.model.trainable_parameters()
        else:  # a few buffers: a few norms and AdamW kernels
            grad_sum = self.packing.pack(grad_sum)  # as it is when the microsteps packed it
            params = self.packing.join(self._kept.read(), self.flat[FLAT])
        norm = global_norm(grad_sum, self.tensor_group) / ntok
        scale = 1.0 / ntok
        if self.grad_clip > 0:
            scale = scale * mx.minimum(1.0, self.grad_clip / (norm + 1e-6))
        if self.shard is None:
            grads = tree_map(lambda g, p: (g * scale).astype(p.dtype), grad_sum, params)
            if self.packing is None:
                self.optimizer.update(self.model, grads)
            else:
                new = self.optimizer.apply_gradients(grads, params)
                self.flat[FLAT] = new[FLAT]
                self.model.update(self.packing.unpack(new))
            return norm
        # Sharded: the same arithmetic on this rank's rows (the norm is the whole gradient's:
        # every rank holds the same sums); the new rows go to every rank in apply().
        params = self.shard.params(params)
        grads = tree_map(
            lambda g, p: (g * scale).astype(p.dtype), self.shard.grads(grad_sum), params
        )
        new = self.optimizer.apply_gradients(grads, params)
        if self.shard.precision == "mixed":
            _assign(self.shard.master, new)
        return norm, new

    def apply(
        self, grad_sum: Tree, ntok: mx.array, lr: float, cluster: Cluster | None = None
    ) -> mx.array:
        """One optimizer update from summed FP32 gradients; returns the pre-clip grad norm.
        Sharded, a collective: the new rows of every rank reach every rank."""
        if self.shard is None:
            self.optimizer.learning_rate = mx.array(lr, dtype=mx.float32)
            if self.packing is None:
                return self._apply(grad_sum, ntok)
            self._keep_packed()
            norm = self._apply(grad_sum, ntok)
            self._views = self._packed.read()  # views of the new buffers
            return norm
        norm, new = self.step_rows(grad_sum, ntok, lr)
        self.send_rows(new, cluster)
        return norm

    def _keep_packed(self) -> None:
        """The flat step's buffers hold the model's weights: kept from the last step while the
        model's tensors are its views; packed anew (a copy) when the model got others (the
        first update, a checkpoint loaded, weights broadcast)."""
        views = self._packed.read()
        kept = self._views is not None and all(
            a is b for a, b in zip(views, self._views, strict=True)
        )
        if not kept:
            self.flat[FLAT] = self.packing.buffers(self.model.trainable_parameters())
            self._views = views

    def step_rows(self, grad_sum: Tree, ntok: mx.array, lr: float) -> tuple[mx.array, Tree]:
        """Sharded: step this rank's rows (evaluated); (the pre-clip grad norm, the new rows)."""
        self.optimizer.learning_rate = mx.array(lr, dtype=mx.float32)
        norm, new = self._apply(grad_sum, ntok)
        mx.eval(norm, new, self.shard.master, self.optimizer.state)
        return norm, new

    def send_rows(self, new: Tree, cluster: Cluster | None) -> None:
        """Sharded, a collective: every rank's new rows reach every rank's weights, a bucket
        at a time (each bucket's old weights go as its new ones arrive)."""
        dtype = next(p for _, p in tree_flatten(self.model.parameters())).dtype
        group, world, size = (
            (cluster.group, cluster.size, cluster.bucket_bytes) if cluster else (None, 1, 0)
        )
        for bucket in self.shard.distribute(new, dtype, group, world, size):
            self.model.update(bucket)


def _assign(tree, new) -> None:
    """Put `new`'s leaves into `tree`'s containers in place (compile's outputs are found there)."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, v in list(items):
        if isinstance(v, (dict, list)):
            _assign(v, new[k])
        else:
            tree[k] = new[k]


class SlowedStepper(Stepper):
    """A stand-in for a slower machine, for tests and demos: each microstep takes `factor()`
    times as long (it computes, then waits out the difference). `factor` is asked at each
    microstep, so a schedule can change it mid-run. It waits asleep, or with `busy` on its
    core (a spin): a slower machine keeps its own cores, and a sleeping rank frees one to the
    ranks beside it on this machine. Two ranks a core each on the project's 2-core box: with
    sleep, slowing one rank 1.5-3x widened the scatter of their time ratio from 0.02-0.05 to
    0.06-0.24 (log units; session 37, benchmarks/RESULTS.md)."""

    def __init__(self, *args, factor: Callable[[], float], busy: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.factor, self.busy = factor, busy

    def microstep(self, acc: Tree, loss_sum: mx.array, ntok: mx.array, batch: mx.array):
        t0 = time.perf_counter()
        out = super().microstep(acc, loss_sum, ntok, batch)
        mx.eval(out)
        now = time.perf_counter()
        extra = max(0.0, self.factor() - 1) * (now - t0)
        if self.busy:
            while time.perf_counter() < now + extra:
                pass  # a spin; the rank's other threads get the GIL every few ms all the same
        else:
            time.sleep(extra)
        return out
