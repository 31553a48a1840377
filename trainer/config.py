"""Training arguments: one dataclass whose fields carry their help, read from flags and TOML."""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPLITTING_BACKENDS = ("mpi", "nccl")  # backends whose groups split into sub-groups (MLX 0.32)


class ConfigError(ValueError):
    """A configuration that cannot run; the message says which key and why."""


def _f(default: Any, help: str, **extra: Any) -> Any:
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class TrainConfig:
    """Every knob of `fleet train`; flags, `--config run.toml` and checkpoints share these names."""

    # --- data and run folder
    data: str = _f("", "dataset folder written by `fleet prepare`")
    run_dir: str = _f("runs/default", "run folder: config, checkpoints, telemetry logs")
    overwrite: bool = _f(
        False,
        "start a new run in a --run-dir that holds one: the old run is first moved aside to "
        "RUN.old-<time> (nothing is deleted); without it a new run refuses such a folder",
    )
    synthetic: bool = _f(False, "random tokens and fresh weights, for benchmarks (no --data)")
    seq_len: int = _f(0, "sequence length (0 = the dataset's; 256 with --synthetic)")
    seed: int = _f(0, "seed for weights, sample order and sampling")
    device: str = _f(
        "auto", "auto (the GPU where MLX has one), gpu, or cpu", choices=("auto", "gpu", "cpu")
    )
    cuda_graphs: str = _f(
        "auto",
        "MLX's CUDA graphs: on, off, or auto (MLX_USE_CUDA_GRAPHS if set, else the measured "
        "default); CUDA only",
        choices=("auto", "on", "off"),
    )
    # --- model
    depth: int = _f(4, "transformer blocks")
    width: int = _f(0, "model width (0 = 64 x depth, as nanochat)")
    heads: int = _f(0, "attention heads (0 = width / 64)")
    vocab: int = _f(0, "vocabulary size (0 = the tokenizer's, padded to a multiple of 64)")
    precision: str = _f(
        "fp32",
        "fp32, bf16, or mixed (FP32 master weights and optimizer state, bf16 compute)",
        choices=("fp32", "bf16", "mixed"),
    )
    loss_head: str = _f(
        "auto",
        "the loss head: fused (the loss and its gradients in one pass, chunk by chunk: one "
        "chunk's logits at a time, in the compute dtype, none kept for the backward pass; "
        "FP32 log-sum-exp), plain (autodiff, FP32 logits), or auto (fused from a vocabulary "
        "of 4096 on)",
        choices=("auto", "fused", "plain"),
    )
    attention: str = _f(
        "auto",
        "how attention runs QK-norm and rotary: plain (MLX's rms_norm and rope, heads-first "
        "copies), strided (the same kernels, no layout copies), fused (one custom-kernel pass "
        "over q and k, forward and backward, token-major), fused-qkv (fused, with q, k and v "
        "from one matmul), or auto (fused-qkv on CUDA, where it measured 1.12x the plain "
        "update on an H200; plain elsewhere: the CPU gains nothing and the Metal kernel is "
        "unmeasured). The same math on every path",
        choices=("auto", "plain", "strided", "fused", "fused-qkv"),
    )
    loss_chunk: int = _f(
        0,
        "tokens per chunk of the fused loss head (0 = sized by the vocabulary: one chunk's "
        "logits hold at most 2**28 entries on a GPU, 2**22 on the CPU); a number asks for the "
        "fused head under --loss-head auto",
    )
    grad_checkpoint: bool = _f(
        False,
        "recompute each block's forward pass in the backward pass instead of keeping its "
        "activations (less memory, about one more forward pass of compute)",
    )
    # --- batch
    local_batch: int = _f(8, "samples per microstep on this rank (one rank)")
    local_batches: str = _f("", "samples per microstep, one per rank, e.g. 6,4,2 (sum = global)")
    parallel: str = _f(
        "data",
        "data: every rank a replica with its own local batch; tensor: every rank holds 1/N of "
        "each block, the embedding and the head, and all read the same rows (--local-batch is "
        "the group's); tensor:K: groups of K consecutive ranks, each group one replica with "
        "its own local batch (needs --backend mpi or nccl)",
    )
    accum: int = _f(1, "microsteps per optimizer update")
    accum_mode: str = _f(
        "sequential",
        "sequential: one compiled microbatch at a time, FP32 accumulators materialized each "
        "microstep; unrolled: one lazy graph over all microsteps (the baseline)",
        choices=("sequential", "unrolled"),
    )
    updates: int = _f(100, "train until this many optimizer updates have been made in all")
    stop_at: int = _f(
        0, "checkpoint and exit at this update, keeping the schedule of --updates (0 = never)"
    )
    # --- optimizer
    optimizer: str = _f(
        "adamw",
        "adamw on every weight, or muon: Muon for the blocks' matrices and AdamW for the "
        "embedding and the head, as nanochat",
        choices=("adamw", "muon"),
    )
    lr: float = _f(2e-3, "peak learning rate (AdamW)")
    muon_lr: float = _f(0.02, "peak learning rate of Muon's matrices (--optimizer muon)")
    min_lr_ratio: float = _f(0.1, "final learning rate as a fraction of --lr")
    warmup: float = _f(0.05, "warmup as a fraction of the run's planned tokens")
    decay: str = _f(
        "cosine",
        "decay after warmup, driven by tokens seen",
        choices=("cosine", "linear", "constant"),
    )
    weight_decay: float = _f(0.1, "AdamW weight decay (every weight is a matrix here)")
    beta1: float = _f(0.9, "AdamW beta1")
    beta2: float = _f(0.95, "AdamW beta2")
    grad_clip: float = _f(1.0, "clip gradients to this global norm (0 = never)")
    optimizer_step: str = _f(
        "auto",
        "AdamW's step: per-tensor (one fused kernel a tensor), flat (its tensors end to end "
        "in a few buffers by dtype, moments kept so: a norm and an AdamW kernel a buffer; the same "
        "math, the weights equal to FP32 rounding; Muon's matrices stay per tensor; "
        "checkpoints per tensor either way; not with --shard-optimizer), or auto (flat on a "
        "GPU, where it measured 1.05x the update on an H200; per-tensor on the CPU, where it "
        "is slower, and when sharded)",
        choices=("auto", "per-tensor", "flat"),
    )
    overlap: str = _f(
        "auto",
        "build the next update's first microstep (a compiled graph's replay: milliseconds "
        "of CPU) while this update's optimizer step runs, not with the GPU idle at the next "
        "update's start; the same arithmetic: on, off, or auto (on with a GPU, where it "
        "measured 1.05x the update on an H200); data parallel, sequential accumulation",
        choices=("auto", "on", "off"),
    )
    # --- memory
    cache_limit_gb: str = _f("", "MLX allocation cache cap in GiB: one value, or one per rank")
    memory_limit_gb: str = _f(
        "auto",
        "MLX memory limit in GiB, one value or one per rank: auto (each rank measures its "
        "update's live set at its first update (and at a smaller local batch, under a lower "
        "bound of it; beyond the largest measured, an estimate at or above it), sets the "
        "limit to 5%% above it, and lowers it by what the next update's peak passed it by "
        "(never below it), so the peak is the live set; never above what its machine gives "
        "without swapping: its memory less 15%% (at least 2 GiB) for the OS, shared by the "
        "ranks on it; on the CPU, measured alike but the limit left at that share, as a limit "
        "at the live set costs 17-30%% of an update there), a number, or 0 (none: MLX's "
        "own). The memory guard, rebalance caps and "
        "the console use the budget: the number, or auto's machine share. On CUDA, MLX "
        "commits 10 kernels a batch (MLX_MAX_OPS_PER_BUFFER, unless set: what runs ahead)",
    )
    wired_limit_gb: str = _f("", "Metal wired-memory limit in GiB (macOS only; ignored elsewhere)")
    shard_optimizer: bool = _f(
        False,
        "shard the optimizer across ranks (ZeRO-1): each rank keeps the FP32 master weights "
        "(mixed) and the optimizer state of its share of the parameters only, steps it, and "
        "sends the new weights to every rank; the same math (FP32: bit-identical weights); "
        "checkpoints stay one (gathered into rank 0), resumable sharded or not",
    )
    optimizer_shares: str = _f(
        "auto",
        "each rank's share of the optimizer (--shard-optimizer), e.g. 4,4,1,1,1 (relative), or "
        "auto (in proportion to each rank's memory budget). Muon's matrices stay whole; AdamW's "
        "are split by rows. A rebalance of the batch split does not move shares; a resume "
        "with other shares does",
    )
    # --- evaluation and samples
    eval_every: int = _f(0, "token-weighted loss on the held-out split every N updates (0 = never)")
    eval_samples: int = _f(256, "held-out samples per evaluation (0 = all)")
    sample_every: int = _f(0, "generate text from --prompt every N updates (0 = never)")
    early_stop_patience: int = _f(
        0,
        "stop (with a checkpoint) after this many evaluations without a new best validation "
        "loss (0 = never); a resume starts counting again",
    )
    early_stop_min_delta: float = _f(
        0.0,
        "how much lower a validation loss must be than the last one that counted, to count as "
        "progress for --early-stop-patience (`best` is always the lowest validation loss)",
    )
    prompt: str = _f("def ", "prompt for generated samples")
    sample_tokens: int = _f(64, "tokens to generate per sample")
    # --- checkpoints
    checkpoint_every: int = _f(0, "checkpoint every N updates (0 = only at the end)")
    keep_checkpoints: int = _f(3, "checkpoints to keep (0 = all)")
    on_checkpoint_error: str = _f(
        "continue",
        "when a checkpoint cannot be written (disk full): continue training and try again at "
        "the next one, or stop (with one more try)",
        choices=("continue", "stop"),
    )
    resume: str = _f("", "resume from a checkpoint folder, or `latest` in --run-dir")
    resume_disagreeing: bool = _f(
        False,
        "allow --resume FOLDER of a checkpoint whose ranks' weights disagreed "
        "(replicas_agree: false in its manifest); refused otherwise",
    )
    # --- distributed, telemetry and diagnosis
    collective_timeout: float = _f(300.0, "exit if no progress for this many seconds (0 = never)")
    allreduce_bucket_mb: float = _f(
        0.0, "gradient all-reduce bucket in MiB (0 = the backend's: 1024 on NCCL, else 32)"
    )
    simulate_slowdown: str = _f(
        "",
        "per-rank factors, e.g. 1,1,2: wait (f-1) x compute per microstep (asleep, or "
        "spinning with --simulate-slowdown-busy); a schedule "
        "changes them from an update on: 2,1,1,1@0;1,1,3,1@50 (for tests and demos)",
    )
    simulate_slowdown_busy: bool = _f(
        False,
        "a slowed rank waits on its core (spins) instead of sleeping, as a slower machine "
        "would keep its own: for ranks that each have a core of this machine",
    )
    simulate_peak_gb: str = _f(
        "", "GiB added to the peak memory each rank reports, e.g. 0,0,3 (tests and demos)"
    )
    autopilot: bool = _f(
        False,
        "rank 0 rebalances by itself when the balancer's predicted gain holds, and moves "
        "samples off a rank under memory pressure (same global batch: same math)",
    )
    autopilot_min_gain: float = _f(
        0.03,
        "smallest predicted gain the autopilot acts on (more within --autopilot-cooldown "
        "of a move)",
    )
    autopilot_window: int = _f(
        10,
        "recent updates the memory guard reads; a rank's cost per sample is read from up to "
        "twice as many (at least 20) since it last changed",
    )
    autopilot_cooldown: int = _f(
        20,
        "updates after a change in which the autopilot moves samples again only for a "
        "predicted 10%% (or twice --autopilot-min-gain), unless a rank's speed changed since",
    )
    on_memory_pressure: str = _f(
        "warn",
        "when no split relieves a rank under memory pressure: warn, or checkpoint and pause",
        choices=("warn", "pause"),
    )
    alert_command: str = _f(
        "",
        "shell command run with each alert as JSON on its standard input (a notifier, a "
        "webhook): a rank lost, memory pressure, a NaN or spiking loss, throughput down, a "
        "checkpoint that cannot be written",
    )
    alert_every: float = _f(300.0, "seconds between two alerts of the same kind")
    telemetry_port_base: int = _f(
        47800,
        "rank r serves telemetry on 127.0.0.1:(base + r) (0 = off). Left out, the run moves "
        "to the next free base when this one is taken; the base served is recorded in "
        "RUN/telemetry/ports.json, where the console and `fleet telemetry` find it",
    )
    telemetry_bind: str = _f(
        "127.0.0.1", "address telemetry binds; anything but loopback needs --telemetry-remote"
    )
    telemetry_remote: bool = _f(
        False, "allow a non-loopback --telemetry-bind (anyone who reaches it sees the run)"
    )
    telemetry_unix_socket: bool = _f(
        False, "also serve telemetry on a Unix socket in the run folder"
    )
    log_every: int = _f(1, "print the progress line every N updates")
    report_to: str = _f(
        "",
        "trackers rank 0 logs the run to, once per run: wandb, trackio, swanlab, tensorboard, "
        "comma-separated (each its own extra); mlx-lm's keys, plus each update's compute, "
        "wait and split",
    )
    project_name: str = _f("", "the trackers' project (default: mlx-fleet)")

    # Keys that describe the run's math; a resume must agree on these (see checkpoint.py).
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """Short identity of the resolved config, shown in telemetry hellos."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # --- per-rank values
    def replicas(self, world_size: int) -> int:
        """How many data-parallel replicas `world_size` ranks make under --parallel: each
        replica takes one local batch of the split (every rank, in data parallelism)."""
        if self.parallel == "data":
            return world_size
        if self.parallel == "tensor":
            return 1
        k = int(self.parallel.partition(":")[2])
        if world_size % k:
            raise ConfigError(
                f"--parallel {self.parallel}: {world_size} rank(s) do not make groups of {k}; "
                f"launch a multiple of {k} ranks"
            )
        return world_size // k

    def needs_split_groups(self, world_size: int, backend: str) -> str | None:
        """Why `backend` cannot give this --parallel over `world_size` ranks, or None: replicas
        of tensor-parallel groups are groups split out of the world, which MLX does on MPI and
        NCCL only (ring and JACCL cannot split a group)."""
        replicas = self.replicas(world_size)
        if 1 < replicas < world_size and backend not in SPLITTING_BACKENDS:
            return (
                f"--parallel {self.parallel} over {world_size} ranks makes {replicas} groups "
                f"split out of the world, which the {backend} backend cannot do (MLX splits "
                "groups on MPI and NCCL only): use --parallel tensor (one group of every rank) "
                "or data, or launch with --backend mpi or nccl"
            )
        return None

    def split(self, world_size: int) -> list[int]:
        """The local batch of every replica (of every rank, in data parallelism)."""
        n = self.replicas(world_size)
        if self.local_batches:
            split = parse_ints(self.local_batches, "local_batches")
            if len(split) != n:
                who = f"{n} rank(s)" if n == world_size else f"{n} replica(s) (--parallel)"
                raise ConfigError(
                    f"--local-batches has {len(split)} values ({_short(self.local_batches)}) "
                    f"but the run has {who}: give one per "
                    f"{'rank' if n == world_size else 'replica'}"
                )
        else:
            split = [self.local_batch] * n
        if any(b < 1 for b in split):
            raise ConfigError(f"every local batch must be at least 1, got {_short(split)}")
        if any(b > LIMITS["local_batch"] for b in split):
            raise ConfigError(
                f"--local-batches {_short(split)}: a local batch beyond any machine (at most "
                f"{LIMITS['local_batch']})"
            )
        return split

    def per_rank(self, name: str, world_size: int, rank: int) -> float | str | None:
        """One value for all ranks or one per rank (--cache-limit-gb 16,16,4); None if unset.
        --memory-limit-gb: "auto", GiB, or None for 0 (see memory_limit)."""
        if name == "memory_limit_gb":
            return self.memory_limit(world_size, rank)
        raw = getattr(self, name)
        if raw in ("", None):
            return None
        values = per_rank_values(name, raw)
        if len(values) == 1:
            return values[0]
        if len(values) != world_size:
            raise ConfigError(
                f"--{name.replace('_', '-')} has {len(values)} values but the run has "
                f"{world_size} rank(s): give one value, or one per rank"
            )
        return values[rank]

    def memory_limit(self, world_size: int, rank: int) -> float | str | None:
        """This rank's --memory-limit-gb: "auto", a limit in GiB, or None (0 or empty: none)."""
        raw = [p.strip() for p in str(self.memory_limit_gb).split(",") if p.strip()]
        if not raw:
            return None
        if len(raw) not in (1, world_size):
            raise ConfigError(
                f"--memory-limit-gb has {len(raw)} values ({_short(self.memory_limit_gb)}) but "
                f"the run has {world_size} rank(s): give one value, or one per rank"
            )
        mine = raw[0] if len(raw) == 1 else raw[rank]
        if mine == "auto":
            return "auto"
        try:
            gib = float(mine)
        except ValueError:
            raise ConfigError(
                f"--memory-limit-gb: {mine!r} is neither auto nor a number of GiB "
                "(e.g. auto, 24, or 0 for none)"
            ) from None
        if not math.isfinite(gib) or gib < 0:
            raise ConfigError(
                f"--memory-limit-gb must be auto, 0 (none) or a positive number of GiB, got {mine}"
            )
        return gib or None

    def slowdown(self, world_size: int, rank: int) -> list[tuple[int, float]]:
        """This rank's simulated slowdown as (from update, factor), in order ([] = none);
        `slowdown_at` reads it."""
        out: list[tuple[int, float]] = []
        for part in filter(None, (p.strip() for p in self.simulate_slowdown.split(";"))):
            factors, _, start = part.partition("@")
            try:
                at = int(start) if start else 0
            except ValueError:
                raise ConfigError(
                    f"--simulate-slowdown: bad update {start!r} in {part!r}"
                ) from None
            values = parse_floats(factors, "simulate_slowdown")
            if len(values) not in (1, world_size):
                raise ConfigError(
                    f"--simulate-slowdown {part!r} has {len(values)} values but the run has "
                    f"{world_size} rank(s): give one value, or one per rank"
                )
            factor = values[0] if len(values) == 1 else values[rank]
            if factor < 1:
                raise ConfigError(f"--simulate-slowdown factors must be >= 1, got {factor}")
            if out and at <= out[-1][0]:
                raise ConfigError("--simulate-slowdown: each @update must be later than the last")
            out.append((at, factor))
        return out

    @staticmethod
    def slowdown_at(schedule: list[tuple[int, float]], update: int) -> float:
        """The factor of update `update`, numbered as the log numbers them (the first is 1):
        `@50` slows update 50 on."""
        return next((f for at, f in reversed(schedule) if update >= at), 1.0)

    def validate(self) -> None:
        """Refuse every value that cannot run, naming its key (before anything is built)."""
        if not self.synthetic and not self.data:
            raise ConfigError("give --data DIR (made by `fleet prepare`) or --synthetic")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{_flag(f.name)} must be a finite number, got {value}")
        for name in PER_RANK_LOW:  # the values themselves; their count needs the world size
            if getattr(self, name) not in ("", None):
                per_rank_values(name, getattr(self, name))
        limits = [p for p in str(self.memory_limit_gb).split(",") if p.strip()]
        for rank in range(len(limits)):  # auto, 0 (none) or GiB, each (memory_limit says why)
            self.memory_limit(len(limits), rank)
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"--seed must be a whole number in [0, 2**32), got {self.seed}")
        for name, high in LIMITS.items():
            if getattr(self, name) > high:
                raise ConfigError(
                    f"--{_flag(name)} {getattr(self, name)} is beyond any machine (at most {high})"
                )
        for name in ("depth", "accum", "updates", "local_batch"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        for name in (
            "width",
            "heads",
            "vocab",
            "seq_len",
            "eval_every",
            "sample_every",
            "checkpoint_every",
            "keep_checkpoints",
            "eval_samples",
            "allreduce_bucket_mb",
            "loss_chunk",
            "collective_timeout",
            "stop_at",
            "weight_decay",
            "grad_clip",
            "telemetry_port_base",
            "early_stop_patience",
            "early_stop_min_delta",
            "autopilot_min_gain",
            "autopilot_window",
            "autopilot_cooldown",
            "alert_every",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must not be negative")
        if not re.fullmatch(r"data|tensor(:[1-9][0-9]*)?", self.parallel):
            raise ConfigError(
                f"--parallel {self.parallel!r}: give data, tensor, or tensor:K (K ranks a group)"
            )
        if self.parallel != "data" and self.optimizer == "muon":
            raise ConfigError(
                "--optimizer muon orthogonalizes whole matrices, which tensor parallelism splits "
                "over ranks (gathering each one every update would cost what the split saves): "
                "use --optimizer adamw with --parallel tensor"
            )
        if self.parallel != "data" and self.shard_optimizer:
            raise ConfigError(
                "--shard-optimizer splits the optimizer over data-parallel ranks; with "
                f"--parallel {self.parallel} each rank already holds only its slice of the "
                "weights and of their optimizer state: leave --shard-optimizer out"
            )
        if not 0 <= self.warmup <= 1:
            raise ConfigError(f"--warmup is a fraction of the run, got {self.warmup}")
        if self.lr <= 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        if self.muon_lr <= 0:
            raise ConfigError(f"--muon-lr must be positive, got {self.muon_lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"--min-lr-ratio is a fraction of --lr, got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if self.log_every < 1:
            raise ConfigError("--log-every must be at least 1")
        if self.optimizer_step not in FIELDS["optimizer_step"].metadata["choices"]:
            got = _short(repr(self.optimizer_step))
            raise ConfigError(f"--optimizer-step must be auto, per-tensor or flat, got {got}")
        if self.optimizer_step == "flat" and self.shard_optimizer:
            raise ConfigError(
                "--optimizer-step flat packs an unsharded optimizer's tensors: leave it out "
                "with --shard-optimizer (whose rows are stepped per tensor)"
            )
        from telemetry.trackers import TrackerError, check

        try:
            check(self.report_to)
        except TrackerError as e:
            raise ConfigError(str(e)) from None


def per_rank_values(name: str, raw: Any) -> list[float]:
    """The values of a per-rank field, each finite and within its bound (PER_RANK_LOW)."""
    values = parse_floats(str(raw), name)
    low, inclusive = PER_RANK_LOW.get(name, (0.0, True))
    for v in values:
        if v < low or (v == low and not inclusive):
            need = f"at least {low:g}" if inclusive else f"more than {low:g}"
            raise ConfigError(f"--{_flag(name)}: every value must be {need}, got {v:g}")
    return values


def parse_ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--{name.replace('_', '-')}: expected integers like 4,2,2, got {_short(text)}"
        ) from None


def parse_floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--{name.replace('_', '-')}: expected numbers like 16,4, got {_short(text)}"
        ) from None
    for v in values:
        if not math.isfinite(v):
            raise ConfigError(f"--{name.replace('_', '-')}: {v} is not a finite number")
    return values


def _short(value: Any, limit: int = 60) -> str:
    """A bounded echo of what was given: an error line never grows with the input."""
    text = str(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text):,} characters)"


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}

# Per-rank values (one, or one per rank) and the least each may be: (bound, inclusive).
PER_RANK_LOW = {
    "cache_limit_gb": (0.0, True),  # 0: no cache
    "wired_limit_gb": (0.0, True),
    "simulate_peak_gb": (0.0, True),
}

# Upper bounds no run reaches: a larger value is a typo (depth = 1e20), refused by name
# instead of failing deep inside MLX.
LIMITS = {
    "depth": 1024,
    "width": 1 << 16,
    "heads": 1024,
    "vocab": 1 << 24,
    "seq_len": 1 << 22,
    "local_batch": 1 << 20,
    "accum": 1 << 16,
    "updates": 1 << 40,
    "telemetry_port_base": 65535,
}


def _flag(name: str) -> str:
    return name.replace("_", "-")


# `fleet train --help` in groups, in this order; every field is in exactly one (checked below).
GROUPS: dict[str, tuple[str, ...]] = {
    "data and run folder": (
        "data",
        "run_dir",
        "overwrite",
        "synthetic",
        "seq_len",
        "seed",
        "device",
        "cuda_graphs",
    ),
    "model": (
        "depth",
        "width",
        "heads",
        "vocab",
        "precision",
        "attention",
        "loss_head",
        "loss_chunk",
        "grad_checkpoint",
    ),
    "optimization": (
        "local_batch",
        "local_batches",
        "accum",
        "accum_mode",
        "updates",
        "stop_at",
        "optimizer",
        "lr",
        "muon_lr",
        "min_lr_ratio",
        "warmup",
        "decay",
        "weight_decay",
        "beta1",
        "beta2",
        "grad_clip",
        "optimizer_step",
        "overlap",
    ),
    "memory": (
        "cache_limit_gb",
        "memory_limit_gb",
        "wired_limit_gb",
        "shard_optimizer",
        "optimizer_shares",
    ),
    "evaluation and samples": (
        "eval_every",
        "eval_samples",
        "sample_every",
        "prompt",
        "sample_tokens",
        "early_stop_patience",
        "early_stop_min_delta",
    ),
    "checkpoints": (
        "checkpoint_every",
        "keep_checkpoints",
        "on_checkpoint_error",
        "resume",
        "resume_disagreeing",
    ),
    "distributed": ("parallel", "collective_timeout", "allreduce_bucket_mb"),
    "telemetry": (
        "telemetry_port_base",
        "telemetry_bind",
        "telemetry_remote",
        "telemetry_unix_socket",
        "log_every",
        "report_to",
        "project_name",
    ),
    "autopilot and alerts": (
        "autopilot",
        "autopilot_min_gain",
        "autopilot_window",
        "autopilot_cooldown",
        "on_memory_pressure",
        "alert_command",
        "alert_every",
    ),
    "demo aids": ("simulate_slowdown", "simulate_slowdown_busy", "simulate_peak_gb"),
}
_grouped = [name for names in GROUPS.values() for name in names]
assert sorted(_grouped) == sorted(FIELDS), "every TrainConfig field belongs to one help group"


class DefaultsHelp(argparse.HelpFormatter):
    """Help that shows every option's default, except where there is none to show (None,
    off, empty) or its help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default is argparse.SUPPRESS
            or default is None
            or default is False
            or default in ("", [])
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per field, in help groups; defaults are suppressed so explicit flags can be
    told apart (the help shows each field's own default)."""
    parser.formatter_class = DefaultsHelp
    parser.add_argument("--config", metavar="FILE", help="TOML (or JSON) file with the same keys")
    for title, names in GROUPS.items():
        group = parser.add_argument_group(title)
        for f in (FIELDS[name] for name in names):
            flag = "--" + f.name.replace("_", "-")
            help_ = f"{f.metadata['help']} [default: {f.default!r}]"
            if f.type == "bool" or isinstance(f.default, bool):
                group.add_argument(
                    flag,
                    action=argparse.BooleanOptionalAction,
                    default=argparse.SUPPRESS,
                    help=help_,
                )
            else:
                group.add_argument(
                    flag,
                    type=type(f.default),
                    default=argparse.SUPPRESS,
                    choices=f.metadata.get("choices"),
                    help=help_,
                    metavar=f.name.upper(),
                )


def load_file(path: str | Path) -> dict[str, Any]:
    """Keys from a TOML or JSON config file; unknown keys and wrong types are errors."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a TOML or JSON config is text)") from None
    kind = "JSON" if path.suffix == ".json" else "TOML"
    try:
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not valid {kind}: {_short(e, 200)}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nests too deeply to be a config") from None
    if not isinstance(raw, dict):
        what = type(raw).__name__
        raise ConfigError(f"{path}: a config is a {kind} object of keys, got a {what}")
    return check_keys(raw, str(path))


def check_keys(raw: dict[str, Any], where: str) -> dict[str, Any]:
    out = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in FIELDS:
            from telemetry.typos import nearest

            best = nearest(name, FIELDS)  # in the spelling the file uses
            hint = f" (did you mean {(best.replace('_', '-') if '-' in key else best)!r}?)"
            raise ConfigError(f"{where}: unknown key {_short(repr(key))}{hint if best else ''}")
        default = FIELDS[name].default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ConfigError(f"{where}: {key} must be true or false, got {_short(repr(value))}")
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (
            isinstance(default, str)
            and isinstance(value, (list, int, float))
            and not isinstance(value, bool)
        ):  # per-rank lists may be written as TOML arrays
            value = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        if type(value) is not type(default):
            kind = type(default).__name__
            raise ConfigError(f"{where}: {key} must be {kind}, got {_short(repr(value))}")
        choices = FIELDS[name].metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(
                f"{where}: {key} must be one of {', '.join(choices)}, got {_short(repr(value))}"
            )
        out[name] = value
    return out


def from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults < `base` (a resumed checkpoint's config) < --config file < explicit flags."""
    values: dict[str, Any] = dict(base or {})
    if getattr(args, "config", None):
        values.update(load_file(args.config))
    values.update({k: v for k, v in vars(args).items() if k in FIELDS})
    cfg = TrainConfig(**values)
    cfg.validate()
    return cfg


def explicit(args: argparse.Namespace) -> dict[str, Any]:
    """The fields given on the command line or in --config (not defaults)."""
    values = load_file(args.config) if getattr(args, "config", None) else {}
    values.update({k: v for k, v in vars(args).items() if k in FIELDS})
    return values
