"""Building a run: its folder, device and memory limits, data, model and optimizer, the loop
state (fresh or from a verified checkpoint), the compiled update, telemetry."""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import psutil

from telemetry import rundir
from telemetry.control import CommandQueue
from telemetry.files import atomic_write
from telemetry.hub import Hub, ServerOptions
from telemetry.records import PROTOCOL_VERSION, Hello, run_id_of
from telemetry.reporter import Reporter
from trainer import cuda_graphs, heap, heartbeat, memory, run_ahead
from trainer.alerts import Alerts
from trainer.autopilot import Autopilot
from trainer.checkpoint import catalog, store
from trainer.config import ConfigError, TrainConfig
from trainer.data.dataset import Dataset, SyntheticStream, TrainStream
from trainer.distributed import Cluster, Watchdog
from trainer.keeper import Keeper
from trainer.model import tensor
from trainer.model.config import ModelConfig, padded_vocab
from trainer.model.gpt import GPT
from trainer.optim import make_optimizer
from trainer.parallel import Layout, LayoutError, make_layout, probe_collectives
from trainer.run import Data, Run
from trainer.shard import open_shard
from trainer.state import LoopState
from trainer.step import SlowedStepper, Stepper

SYNTHETIC_VOCAB, SYNTHETIC_SEQ_LEN = 512, 256


def warn(message: str) -> None:
    print(f"fleet train: warning: {message}", file=sys.stderr, flush=True)


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
    keeper = Keeper(run_dir, warn) if cluster.is_root else None  # the key, kept in memory
    if keeper is not None:
        for tmp, dest in catalog.adopt(run_dir):
            say(f"recovered checkpoint {dest.name} from {tmp.name}, left by a save cut short")
        for p in catalog.clear_orphans(run_dir):
            say(f"removed an unfinished checkpoint left by a crash: {p}")
        # The resolved config, as this session runs it (checkpoints keep their own copy).
        resolved = json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"
        config = rundir.at(run_dir).config
        try:
            atomic_write(config, resolved)
            keeper.keep(config, resolved.encode())
        except OSError as e:  # a full disk: the run goes on (each checkpoint has its own copy)
            warn(f"could not write {config} ({e.strerror or e}); going on")

    # --- device, memory limits, data, model and its layout over the ranks
    graphs = cuda_graphs.apply(cfg.cuda_graphs)  # before MLX's first kernel
    ahead = run_ahead.apply()  # likewise
    if cfg.device != "auto":
        mx.set_default_device(mx.cpu if cfg.device == "cpu" else mx.gpu)
    limit = memory.Limit.from_setting(cfg.memory_limit(world, rank), ranks_here(cluster))
    applied = [line] if (line := limit.apply()) else []
    applied += memory.apply_limits(
        cfg.per_rank("cache_limit_gb", world, rank), cfg.per_rank("wired_limit_gb", world, rank)
    )
    applied += [line] if (line := heap.hold()) else []  # before the model's first arrays
    if mx.cuda.is_available():
        applied += [graphs, ahead]
    data = open_data(cfg)
    model = build_model(cfg, data)  # the whole model, on every rank alike
    try:
        layout = make_layout(cfg, cluster)
        if layout.tensor_group is not None:
            tensor.check_divisible(model.cfg, layout.tensor)
    except (LayoutError, ValueError) as e:
        raise ConfigError(str(e)) from None

    # --- the loop state, fresh or resumed
    split = resumed_split(cfg, world, resume, explicit)
    identity = {
        "architecture": model.cfg.to_dict(),
        "tokenizer": data.tokenizer_identity,
        "dataset": data.identity,
        "global_batch": {"microbatch": sum(split), "accum": cfg.accum},
        "precision": cfg.precision,
        "world_size": world,
        "split": split,
        "parallel": layout.mode,  # informational: any mode resumes any other
    }
    state, opt_state = LoopState(split=split), None
    if resume is not None:
        catalog.check_compatible(catalog.verify(resume), identity, resume)
        if not cfg.shard_optimizer:  # sharded, open_shard reads this rank's rows
            params, opt_state = store.load_arrays(resume)
            model.update(params)
        state = LoopState.from_json(catalog.read_json(resume, catalog.STATE), split)
    # Tensor parallelism: each rank keeps its slice of the whole model (and of its moments).
    if layout.tensor_group is not None:
        tensor.shard_gpt(model, layout.tensor_group)
        if opt_state is not None:
            opt_state = tensor.slice_state(opt_state, layout.tensor_group)
    optimizer = make_optimizer(cfg)
    optimizer.init(model.trainable_parameters())
    if opt_state is not None:
        optimizer.state = opt_state
    if resume is not None:
        say(
            f"resumed from {resume} at update {state.step} "
            f"({state.tokens:,} tokens, data cursor {state.cursor:,})"
        )

    # --- the compiled update (it captures the optimizer state: build it once that is final)
    slowdown = cfg.slowdown(world, rank)

    def factor() -> float:  # the simulated slowdown of the update in progress
        return cfg.slowdown_at(slowdown, state.step + 1)

    slowed = any(f > 1 for _, f in slowdown)
    shard = templates = None
    if "optimizer_shares" in explicit and not cfg.shard_optimizer:
        raise ConfigError(
            "--optimizer-shares applies to a sharded optimizer: add --shard-optimizer, or "
            "leave the shares out"
        )
    if cfg.shard_optimizer:
        shard, templates = open_shard(cfg, cluster, model, optimizer, limit.budget, resume)
        applied.append(f"optimizer sharded: this rank steps {shard.fraction:.1%} of it")
    mx.eval(model.parameters(), optimizer.state)
    stepper = (SlowedStepper if slowed else Stepper)(
        model,
        optimizer,
        precision=cfg.precision,
        pad_id=data.pad_id,
        grad_clip=cfg.grad_clip,
        loss_chunk=cfg.loss_chunk,
        loss_head=cfg.loss_head,
        attention=cfg.attention,
        grad_checkpoint=cfg.grad_checkpoint,
        optimizer_step=cfg.optimizer_step,
        overlap=cfg.overlap,
        shard=shard,
        templates=templates,
        tensor_group=layout.tensor_group,
        **({"factor": factor, "busy": cfg.simulate_slowdown_busy} if slowed else {}),
    )
    stepper.limit = limit
    commands = CommandQueue()
    reporter = open_telemetry(
        cfg, cluster, commands, split[layout.replica], layout, say, explicit, keeper
    )
    if cfg.report_to and cluster.is_root:  # once per run, not once per rank
        from telemetry.trackers import TrackerReporter

        project, config = cfg.project_name, cfg.to_dict()
        reporter = TrackerReporter.open(reporter, cfg.report_to, project, run_dir, config)
    run = Run(
        cfg=cfg,
        cluster=cluster,
        layout=layout,
        model=model,
        optimizer=optimizer,
        stepper=stepper,
        state=state,
        data=data,
        identity=identity,
        banner=banner(cfg, model, data, layout, split, applied),
        reporter=reporter,
        commands=commands,
        saved_at=state.step if resume is not None else None,
        last_saved=resume,  # a resumed run has a checkpoint to go back to from the start
        keeper=keeper,
    )
    run.pilot = Autopilot(
        world,
        enabled=cfg.autopilot and layout.tensor == 1,
        min_gain=cfg.autopilot_min_gain,
        window=cfg.autopilot_window,
        cooldown=cfg.autopilot_cooldown,
        pause_on_pressure=cfg.on_memory_pressure == "pause",
    )
    run.collective_s = cfg.accum * probe_collectives(
        layout,
        split[layout.replica] * data.seq_len,
        model.cfg.width,
        model.cfg.depth,
        mx.float32 if cfg.precision == "fp32" else mx.bfloat16,
    )
    who = {"run_id": run_id_of(run_dir), "run_dir": str(run_dir.resolve()), "rank": rank}
    run.alerts = Alerts(
        cfg.alert_command, cfg.alert_every, run.tell, identity={**who, "host": socket.gethostname()}
    )
    run.extra_peak = (cfg.per_rank("simulate_peak_gb", world, rank) or 0.0) * memory.GiB
    run.watchdog = Watchdog(
        cfg.collective_timeout,
        rank,
        on_expire=run.on_fatal,
        beat=run.beat,
        diagnose=run.culprit,
        world=world,
    )
    if cluster.is_root:  # beats of ranks a larger fleet left behind would name ghosts
        for r in range(world, world + 64):
            heartbeat.clear(run_dir, r)
    run.beat("starting", time.time())
    return run


def ranks_here(cluster: Cluster) -> int:
    """How many of the run's ranks share this machine (and so its memory): a collective."""
    mine = hashlib.sha256(socket.gethostname().encode()).digest()[:8]
    return cluster.gather_bytes(mine).count(mine)


def build_model(cfg: TrainConfig, data: Data) -> GPT:
    """A freshly initialized GPT sized for the data: the whole model, the same on every rank
    (the seed decides), in the dtype of its master weights."""
    try:
        mcfg = ModelConfig.from_sizes(
            depth=cfg.depth,
            width=cfg.width,
            heads=cfg.heads,
            vocab=cfg.vocab or padded_vocab(data.vocab),
            seq_len=data.seq_len,
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    model = GPT(mcfg)
    model.init_weights(cfg.seed)
    if cfg.precision == "bf16":
        model.set_dtype(mx.bfloat16)
    return model


def banner(
    cfg: TrainConfig, model: GPT, data: Data, layout: Layout, split: list[int], applied: list[str]
) -> str:
    """What the run is, in a few lines: printed at the start and sent as the first event."""
    m = model.cfg
    return (
        f"run {cfg.run_dir}: GPT {m.num_params() / 1e6:.2f}M params (depth {m.depth}, "
        f"width {m.width}, heads {m.heads}, vocab {m.vocab}, seq {data.seq_len}), "
        f"{cfg.precision}, {cfg.accum_mode} accumulation\n"
        f"  {_ranks(layout)}, split {split} x {cfg.accum} microsteps = "
        f"{sum(split) * cfg.accum} samples/update; data {data.description}"
        + (f"\n  memory: {', '.join(applied)}" if applied else "")
        + (
            f"\n  SIMULATED slowdown per rank: {cfg.simulate_slowdown} (for tests and demos)"
            if cfg.simulate_slowdown
            else ""
        )
    )


def _ranks(layout: Layout) -> str:
    """The ranks as the banner says them: "3 rank(s)", or how tensor parallelism groups them."""
    if layout.tensor == 1:
        return f"{layout.replicas} rank(s)"
    world = layout.tensor * layout.replicas
    if layout.replicas == 1:
        return f"{world} rank(s), tensor parallel (each holds 1/{layout.tensor} of the model)"
    return f"{world} rank(s): {layout.replicas} replicas of {layout.tensor} tensor-parallel ranks"


def open_data(cfg: TrainConfig) -> Data:
    """The prepared dataset (and its tokenizer), or synthetic tokens."""
    if cfg.synthetic:
        seq_len = cfg.seq_len or SYNTHETIC_SEQ_LEN
        vocab = cfg.vocab or SYNTHETIC_VOCAB
        return Data(
            stream=SyntheticStream(vocab, seq_len, cfg.seed),
            seq_len=seq_len,
            vocab=vocab,
            pad_id=-1,  # synthetic tokens are never padding
            identity=f"synthetic:vocab={vocab}:seq={seq_len}",
            tokenizer_identity={"kind": "synthetic"},
            description=f"synthetic tokens (vocab {vocab})",
        )
    from trainer.data.tokenizer import identity_digest_part, load_tokenizer

    dataset = Dataset.open(cfg.data)
    if cfg.seq_len and cfg.seq_len != dataset.seq_len:
        raise ConfigError(
            f"--seq-len {cfg.seq_len} differs from the dataset's {dataset.seq_len} "
            f"({cfg.data}); prepare the data again with --seq-len {cfg.seq_len}"
        )
    return Data(
        stream=TrainStream(dataset, cfg.seed),
        seq_len=dataset.seq_len,
        vocab=dataset.vocab_size,
        pad_id=dataset.pad_id,
        identity=dataset.digest,
        tokenizer_identity=identity_digest_part(dataset.tokenizer),
        description=f"{cfg.data} ({dataset.num_train:,} train / {dataset.num_val:,} val samples)",
        dataset=dataset,
        tokenizer=load_tokenizer(dataset.tokenizer),
    )


def resumed_split(
    cfg: TrainConfig, world: int, resume: Path | None, explicit: frozenset[str]
) -> list[int]:
    """The batch split this session starts with: the flags', or, on resume without them, the
    split in force at the checkpoint (a rebalance may have changed it)."""
    split = cfg.split(world)
    if resume is None or "local_batches" in explicit or "local_batch" in explicit:
        return split
    saved = catalog.read_json(resume, catalog.STATE)["split"]
    if len(saved) == cfg.replicas(world):
        return saved
    if sum(split) != sum(saved):
        raise ConfigError(
            f"{resume} was saved by {len(saved)} rank(s) with split {saved}; this run has "
            f"{world}: give --local-batches with the same global batch ({sum(saved)})"
        )
    return split


def open_telemetry(
    cfg: TrainConfig,
    cluster: Cluster,
    commands: CommandQueue,
    local_batch: int,
    layout: Layout,
    say: Callable[[str], None],
    explicit: frozenset[str] = frozenset(),
    keeper: Keeper | None = None,
) -> Reporter:
    """This rank's telemetry hub (socket and Arrow log); rank 0's takes commands.

    With the default port base (not given), every rank moves to the first base whose ports
    are free on all of them, and rank 0 records it in RUN/telemetry/ports.json for the
    console and `fleet telemetry`. An explicit --telemetry-port-base is used as given.
    """
    from telemetry import ports

    rank, run_dir = cluster.rank, Path(cfg.run_dir)
    hello = Hello(
        protocol=PROTOCOL_VERSION,
        run_id=run_id_of(run_dir),
        rank=rank,
        world_size=cluster.size,
        host=socket.gethostname(),
        platform=f"{platform.system()} {platform.machine()}",
        chip=memory.device_name(),
        memory_total=psutil.virtual_memory().total,
        local_batch=local_batch,
        parallel=layout.mode,
        config_digest=cfg.digest(),
    )
    base = cfg.telemetry_port_base
    if base == ports.DEFAULT_PORT_BASE and "telemetry_port_base" not in explicit:
        # Every rank takes part (a collective per candidate); none free: bind fails as before.
        base = (
            ports.agree_base(base, cluster.size, rank, cluster.all_sum_floats, cfg.telemetry_bind)
            or base
        )
    port = base + rank if base else None
    hub = Hub(
        options=ServerOptions(bind=cfg.telemetry_bind, allow_remote=cfg.telemetry_remote),
        run_dir=run_dir,
        hello=hello,
        port=port,
        unix_socket=cfg.telemetry_unix_socket,
        commands=commands if cluster.is_root else None,
        key=keeper.control_key() if keeper is not None else None,  # kept across resumes
    )
    hub.start()
    if cluster.is_root:
        served = ports.RecordedPorts(
            base, cluster.size, cfg.telemetry_bind, hello.host, hello.run_id
        )
        where = ports.keep(run_dir, served if port else None)
        if where is not None:
            if keeper is not None:  # its copy, as written (trainer/keeper.py)
                keeper.keep(where, ports.encode(served).encode())
            moved = (
                f" (the default {cfg.telemetry_port_base} is taken)"
                if base != cfg.telemetry_port_base
                else ""
            )
            say(
                f"  telemetry: ranks on {cfg.telemetry_bind}:{base}+rank{moved}, recorded in "
                f"{where}; control key {rundir.at(run_dir).control_key}"
            )
    return hub
