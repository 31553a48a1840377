"""Everything a training run holds besides its loop: folder, data, model, resume, telemetry."""

from __future__ import annotations

import json
import platform
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
import psutil

from telemetry import sysmem
from telemetry.control import CommandQueue
from telemetry.files import atomic_write
from telemetry.records import PROTOCOL_VERSION, Event, Hello, run_id_of
from telemetry.reporter import FanOut, NullReporter, Reporter
from trainer import checkpoint, memory
from trainer.config import ConfigError, TrainConfig
from trainer.data import Dataset, SyntheticStream, TrainStream, val_batches
from trainer.distributed import Cluster
from trainer.model import GPT, ModelConfig, padded_vocab
from trainer.optim import make_optimizer

SYNTHETIC_VOCAB, SYNTHETIC_SEQ_LEN = 512, 256
SYNTHETIC_VAL_OFFSET = 1 << 40  # held-out synthetic samples live far beyond any cursor


@dataclass
class Run:
    """The pieces of a run that the loop in train.py uses."""

    cfg: TrainConfig
    cluster: Cluster
    model: GPT
    optimizer: optim.Optimizer
    state: dict[str, Any]  # step, tokens, cursor, split, ...: saved as state.json
    stream: Any  # TrainStream or SyntheticStream
    seq_len: int
    pad_id: int
    identity: dict[str, Any]  # what a checkpoint must share with this run to resume it
    banner: str
    reporter: Reporter = field(default_factory=NullReporter)
    commands: CommandQueue | None = None
    mem_caps: list[int | None] | None = None
    dataset: Dataset | None = None
    tokenizer: Any = None

    def evaluate(self, stepper) -> tuple[float, int]:
        """Token-weighted loss on the held-out split; ranks share the batches, then sum."""
        c, batch = self.cluster, max(self.state["split"])
        limit = self.cfg.eval_samples or None
        if self.dataset is not None:
            batches = val_batches(self.dataset, batch, limit)
        else:
            n = limit or 64
            batches = (
                self.stream.batch(SYNTHETIC_VAL_OFFSET + i, n, 0, min(batch, n - i))
                for i in range(0, n, batch)
            )
        loss, tokens = 0.0, 0.0
        for i, b in enumerate(batches):
            if i % c.size == c.rank:
                ls, nt = stepper.eval_sums(mx.array(b))
                mx.eval(ls, nt)
                loss, tokens = loss + ls.item(), tokens + nt.item()
        loss, tokens = c.all_sum_floats([loss, tokens])
        return loss / max(tokens, 1.0), int(tokens)

    def sample(self, model: GPT) -> str:
        """Text generated from the prompt (rank 0 only; no collectives)."""
        if self.tokenizer is None:
            return "(no tokenizer: synthetic data)"
        prompt = [int(t) for t in self.tokenizer.encode(self.cfg.prompt)]
        ids = model.generate(
            prompt, self.cfg.sample_tokens, seed=self.cfg.seed + self.state["step"]
        )
        return self.cfg.prompt + self.tokenizer.decode(ids)

    def system_memory(self) -> dict[str, Any]:
        return sysmem.sample().update_fields()

    def on_fatal(self, message: str) -> None:
        """Tell the operator before the process ends."""
        self.reporter.on_event(Event("error", self.cluster.rank, self.state["step"], message))
        self.reporter.close()


def open_run(
    cfg: TrainConfig,
    cluster: Cluster,
    resume: Path | None,
    say: Callable[[str], None],
    explicit: frozenset[str] = frozenset(),
) -> Run:
    """Build a Run: fresh, or from the verified checkpoint at `resume`."""
    rank, world = cluster.rank, cluster.size
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if cluster.is_root:
        for p in checkpoint.clear_orphans(run_dir):
            say(f"removed an unfinished checkpoint left by a crash: {p}")
        # The resolved config, as this session runs it (checkpoints keep their own copy).
        atomic_write(
            run_dir / "config.json", json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"
        )

    # --- device, and memory limits per rank
    if cfg.device != "auto":
        mx.set_default_device(mx.cpu if cfg.device == "cpu" else mx.gpu)
    notes = memory.apply_limits(
        cfg.per_rank("cache_limit_gb", world, rank),
        cfg.per_rank("memory_limit_gb", world, rank),
        cfg.per_rank("wired_limit_gb", world, rank),
    )

    # --- data
    dataset = tokenizer = None
    if cfg.synthetic:
        seq_len = cfg.seq_len or SYNTHETIC_SEQ_LEN
        vocab = cfg.vocab or SYNTHETIC_VOCAB
        stream = SyntheticStream(vocab, seq_len, cfg.seed)
        pad_id = -1  # synthetic tokens are never padding
        data_id, tok_id = f"synthetic:vocab={vocab}:seq={seq_len}", {"kind": "synthetic"}
        data_desc = f"synthetic tokens (vocab {vocab})"
    else:
        from trainer.tokenizer import identity_digest_part, load_tokenizer

        dataset = Dataset.open(cfg.data)
        if cfg.seq_len and cfg.seq_len != dataset.seq_len:
            raise ConfigError(
                f"--seq-len {cfg.seq_len} differs from the dataset's {dataset.seq_len} "
                f"({cfg.data}); prepare the data again with --seq-len {cfg.seq_len}"
            )
        seq_len, vocab, pad_id = dataset.seq_len, dataset.vocab_size, dataset.pad_id
        stream = TrainStream(dataset, cfg.seed)
        tokenizer = load_tokenizer(dataset.tokenizer)
        data_id, tok_id = dataset.digest, identity_digest_part(dataset.tokenizer)
        data_desc = f"{cfg.data} ({dataset.num_train:,} train / {dataset.num_val:,} val samples)"

    # --- model and optimizer
    try:
        mcfg = ModelConfig.from_sizes(
            depth=cfg.depth,
            width=cfg.width,
            heads=cfg.heads,
            vocab=cfg.vocab or padded_vocab(vocab),
            seq_len=seq_len,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    model = GPT(mcfg)
    model.init_weights(cfg.seed)
    if cfg.precision == "bf16":
        model.set_dtype(mx.bfloat16)
    optimizer = make_optimizer(cfg)
    optimizer.init(model.trainable_parameters())

    # --- the loop state, fresh or resumed
    split = cfg.split(world)
    state: dict[str, Any] = {"step": 0, "tokens": 0, "cursor": 0, "split": split, "lr": 0.0}
    if resume is not None:
        manifest = checkpoint.verify(resume)
        saved = checkpoint.read_json(resume, checkpoint.STATE)
        if "local_batches" not in explicit and "local_batch" not in explicit:
            # keep the split the run had at the checkpoint (a rebalance may have changed it)
            if len(saved["split"]) == world:
                split = saved["split"]
            elif sum(split) != sum(saved["split"]):
                raise ConfigError(
                    f"{resume} was saved by {len(saved['split'])} rank(s) with split "
                    f"{saved['split']}; this run has {world}: give --local-batches with the "
                    f"same global batch ({sum(saved['split'])})"
                )
    identity = {
        "architecture": mcfg.to_dict(),
        "tokenizer": tok_id,
        "dataset": data_id,
        "global_batch": {"microbatch": sum(split), "accum": cfg.accum},
        "precision": cfg.precision,
        "world_size": world,
        "split": split,
    }
    if resume is not None:
        checkpoint.check_compatible(manifest, identity, resume)
        params, opt_state = checkpoint.load_arrays(resume)
        model.update(params)
        optimizer.state = opt_state
        mx.eval(model.parameters(), optimizer.state)
        state = {**saved, "split": split}
        say(
            f"resumed from {resume} at update {state['step']} "
            f"({state['tokens']:,} tokens, data cursor {state['cursor']:,})"
        )
    state["start_step"] = state["step"]

    # --- telemetry and control
    commands = CommandQueue() if cluster.is_root else None
    reporter = open_telemetry(cfg, cluster, commands, split, mcfg, say)

    banner = (
        f"run {run_dir}: GPT {model.num_params() / 1e6:.2f}M params (depth {mcfg.depth}, "
        f"width {mcfg.width}, heads {mcfg.heads}, vocab {mcfg.vocab}, seq {seq_len}), "
        f"{cfg.precision}, {cfg.accum_mode} accumulation\n"
        f"  {world} rank(s), split {split} x {cfg.accum} microsteps = "
        f"{sum(split) * cfg.accum} samples/update; data {data_desc}"
        + (f"\n  memory: {', '.join(notes)}" if notes else "")
        + (
            f"\n  SIMULATED slowdown per rank: {cfg.simulate_slowdown} (for tests and demos)"
            if cfg.simulate_slowdown
            else ""
        )
    )
    return Run(
        cfg=cfg,
        cluster=cluster,
        model=model,
        optimizer=optimizer,
        state=state,
        stream=stream,
        seq_len=seq_len,
        pad_id=pad_id,
        identity=identity,
        banner=banner,
        reporter=reporter,
        commands=commands,
        mem_caps=None,
        dataset=dataset,
        tokenizer=tokenizer,
    )


def open_telemetry(
    cfg: TrainConfig,
    cluster: Cluster,
    commands: CommandQueue | None,
    split: list[int],
    mcfg: ModelConfig,
    say: Callable[[str], None],
) -> Reporter:
    """This rank's telemetry hub (socket + Arrow log), or a null reporter when turned off."""
    try:  # TEMPORARY until telemetry.hub lands
        from telemetry import auth
        from telemetry.hub import Hub
    except ImportError:
        return NullReporter()

    rank = cluster.rank
    run_dir = Path(cfg.run_dir)
    key = auth.ensure_key(run_dir) if cluster.is_root else None  # kept across resumes
    hello = Hello(
        protocol=PROTOCOL_VERSION,
        run_id=run_id_of(run_dir),
        rank=rank,
        world_size=cluster.size,
        host=socket.gethostname(),
        platform=f"{platform.system()} {platform.machine()}",
        chip=memory.device_name(),
        memory_total=psutil.virtual_memory().total,
        local_batch=split[rank],
        config_digest=cfg.digest(),
    )
    port = cfg.telemetry_port_base + rank if cfg.telemetry_port_base else None
    hub = Hub(
        bind=cfg.telemetry_bind,
        allow_remote=cfg.telemetry_remote,
        run_dir=run_dir,
        hello=hello,
        port=port,
        unix_socket=cfg.telemetry_unix_socket,
        commands=commands,
        key=key,
    )
    hub.start()
    if port and cluster.is_root:
        say(
            f"  telemetry: ranks on {cfg.telemetry_bind}:{cfg.telemetry_port_base}+rank; "
            f"control key {run_dir / 'control.key'}"
        )
    return FanOut(hub)
