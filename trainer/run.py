"""Everything a training run holds besides its loop: folder, data, model, resume, telemetry."""

from __future__ import annotations

import json
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
import psutil

from telemetry import auth, sysmem
from telemetry.control import CommandQueue
from telemetry.files import atomic_write
from telemetry.hub import Hub, ServerOptions
from telemetry.records import PROTOCOL_VERSION, Event, Hello, Update, run_id_of
from telemetry.reporter import NullReporter, Reporter
from trainer import cuda_graphs, heartbeat, memory
from trainer.alerts import Alerts
from trainer.autopilot import Autopilot
from trainer.checkpoint import catalog, store
from trainer.config import ConfigError, TrainConfig
from trainer.controller import Controller
from trainer.data.dataset import Dataset, SyntheticStream, TrainStream, val_batches
from trainer.distributed import Cluster, Watchdog
from trainer.launch.restart import restart_note
from trainer.model.config import ModelConfig, padded_vocab
from trainer.model.generate import generate
from trainer.model.gpt import GPT
from trainer.optim import make_optimizer
from trainer.step import SlowedStepper, Stepper, UpdateFigures

SYNTHETIC_VOCAB, SYNTHETIC_SEQ_LEN = 512, 256
SYNTHETIC_VAL_OFFSET = 1 << 40  # held-out synthetic samples live far beyond any cursor


class ReplicaMismatch(RuntimeError):
    """Ranks that should hold identical weights do not."""


@dataclass
class Data:
    """Where samples come from, and what a checkpoint must share with them."""

    stream: Any  # TrainStream or SyntheticStream: .batch(cursor, global, offset, local)
    seq_len: int
    vocab: int
    pad_id: int
    identity: str  # the dataset's digest (or the synthetic stream's description)
    tokenizer_identity: dict[str, Any]
    description: str
    dataset: Dataset | None = None
    tokenizer: Any = None


@dataclass
class Run:
    """The pieces of a run that the loop in train.py uses."""

    cfg: TrainConfig
    cluster: Cluster
    model: GPT
    optimizer: optim.Optimizer
    stepper: Stepper
    state: dict[str, Any]  # step, tokens, cursor, split, ...: saved as state.json
    data: Data
    identity: dict[str, Any]  # what a checkpoint must share with this run to resume it
    banner: str
    reporter: Reporter = field(default_factory=NullReporter)
    commands: CommandQueue = field(default_factory=CommandQueue)
    watchdog: Watchdog = field(default_factory=lambda: Watchdog(0, 0))  # 0: never fires
    pilot: Autopilot = field(default_factory=lambda: Autopilot(1))  # rank 0 steers with it
    alerts: Alerts | None = None  # rank 0 raises them
    extra_peak: float = 0.0  # --simulate-peak-gb of this rank, in bytes
    measured: dict[str, float] = field(default_factory=dict)  # the last update, for rank 0
    stopping: bool = False  # a stop was applied at this boundary
    last_saved: Path | None = None
    saved_at: int | None = None  # the step of the newest checkpoint of this run

    # --- samples of the global order: this rank's slice of each microbatch of the update
    def batches(self):
        """The update's `accum` microbatches for this rank, read as they are consumed."""
        split, rank = self.state["split"], self.cluster.rank
        global_batch, offset = sum(split), sum(split[:rank])
        for m in range(self.cfg.accum):
            cursor = self.state["cursor"] + m * global_batch
            yield mx.array(self.data.stream.batch(cursor, global_batch, offset, split[rank]))

    def advance(self, figures: UpdateFigures, lr: float) -> None:
        """Move the loop state past one update."""
        s = self.state
        s.update(
            step=s["step"] + 1,
            tokens=s["tokens"] + figures.tokens,
            cursor=s["cursor"] + self.cfg.accum * sum(s["split"]),
            lr=lr,
        )

    # --- what every rank tells telemetry
    def event(self, kind: str, message: str, **data: Any) -> None:
        """One event of this rank at the current update."""
        self.reporter.on_event(Event(kind, self.cluster.rank, self.state["step"], message, data))

    def announce(self) -> None:
        """The `started` event, with what the report and the console show of the run; and
        `restarted`, when `fleet launch --restarts` relaunched it (rank 0)."""
        cfg = self.cfg
        self.event(
            "started",
            self.banner,
            world_size=self.cluster.size,
            split=self.state["split"],
            updates=cfg.updates,
            config_digest=cfg.digest(),
            architecture=self.identity["architecture"],
            params=self.model.num_params(),
            precision=cfg.precision,
            autopilot=cfg.autopilot,
        )
        if (note := restart_note()) and self.cluster.is_root:
            self.event("restarted", f"restart {note.get('attempt')}: {note.get('reason')}", **note)

    def controller(self) -> Controller:
        """The boundary's exchange for this run: memory caps from every rank's limit and
        peak, and (rank 0) the autopilot."""
        cfg, world = self.cfg, self.cluster.size
        limits = [cfg.per_rank("memory_limit_gb", world, r) for r in range(world)]
        return Controller(
            self.cluster,
            self.commands,
            caps_model=partial(memory.memory_caps, cfg),
            pilot=self.pilot if self.cluster.is_root else None,
            limits=[g * memory.GiB if g else None for g in limits],
            on_note=self.note,
        )

    def fail(self, message: str, code: int, alert: str = "lost") -> int:
        """End this rank on an error: say it, tell telemetry (and a person), return `code`."""
        text = f"fleet train: rank {self.cluster.rank}: {message}"
        print(text, file=sys.stderr, flush=True)
        self.on_fatal(text, alert)
        return code

    def note(self, kind: str, message: str, data: dict[str, Any]) -> None:
        """An event from the autopilot or the alerts (printed too: nobody may be watching)."""
        if self.cluster.is_root:
            print(f"fleet train: {kind}: {message}", file=sys.stderr, flush=True)
        if kind == "alert" and self.alerts is not None and "alert" not in data:
            self.alerts.raise_("memory", message, **data)  # the autopilot's: once per kind
            return
        self.event(kind, message, **data)

    def record(self, f: UpdateFigures, mem: memory.MemoryFigures) -> Update:
        """The update just finished, as telemetry's record (sent to every subscriber)."""
        s, rank = self.state, self.cluster.rank
        rec = Update(
            rank=rank,
            step=s["step"],
            tokens=s["tokens"],
            update_tokens=f.tokens,
            local_tokens=f.local_tokens,
            loss=f.loss,
            lr=s["lr"],
            grad_norm=f.grad_norm,
            local_batch=s["split"][rank],
            microsteps=self.cfg.accum,
            compute_s=f.compute_s,
            wait_s=f.wait_s,
            transfer_s=f.transfer_s,
            optimizer_s=f.optimizer_s,
            update_s=f.update_s,
            active_mem=mem.active,
            peak_mem=mem.peak + int(self.extra_peak),
            cache_mem=mem.cache,
            tokens_per_s=f.local_tokens / f.update_s if f.update_s > 0 else 0.0,
            simulated=isinstance(self.stepper, SlowedStepper),
            **sysmem.sample().update_fields(),
        )
        self.reporter.on_update(rec)
        self.measured = {
            "peak": rec.peak_mem,
            "compute_s": f.compute_s,
            "swap": rec.swap_used,
            "pressure": rec.mem_pressure or 0.0,
        }
        return rec

    # --- evaluation, samples, checkpoints
    def evaluate(self) -> tuple[float, int]:
        """Token-weighted loss on the held-out rows; ranks share the batches, then sum."""
        c, batch = self.cluster, max(self.state["split"])
        limit = self.cfg.eval_samples or None
        if self.data.dataset is not None:
            batches = val_batches(self.data.dataset, batch, limit)
        else:
            n = limit or 64
            batches = (
                self.data.stream.batch(SYNTHETIC_VAL_OFFSET + i, n, 0, min(batch, n - i))
                for i in range(0, n, batch)
            )
        loss, tokens = 0.0, 0.0
        for i, b in enumerate(batches):
            if i % c.size == c.rank:
                ls, nt = self.stepper.eval_sums(mx.array(b))
                mx.eval(ls, nt)
                loss, tokens = loss + ls.item(), tokens + nt.item()
        loss, tokens = c.all_sum_floats([loss, tokens])
        return loss / max(tokens, 1.0), int(tokens)

    def note_eval(self, val_loss: float, val_tokens: int) -> str | None:
        """Report an evaluation, keep the best checkpoint (`best`, never pruned) and count
        evaluations without a new best; returns why the run should stop early, or None.
        Every rank calls it with the same loss (summed over ranks): all decide alike."""
        s, cfg = self.state, self.cfg
        s["evals"] = [*s.get("evals", []), [s["step"], val_loss]][-50:]
        best = s.get("best")
        improved = best is None or val_loss < best["val_loss"] - cfg.early_stop_min_delta
        if improved:
            best = s["best"] = {"step": s["step"], "val_loss": val_loss}
            s["evals_since_best"] = 0
            path = self.save() if self.saved_at != s["step"] else self.last_saved
            if path is not None and self.cluster.is_root:
                catalog.point_best(cfg.run_dir, path)
        self.event(
            "eval",
            f"val loss {val_loss:.4f} (best {best['val_loss']:.4f} at update {best['step']})",
            val_loss=val_loss,
            val_tokens=val_tokens,
            best_val_loss=best["val_loss"],
            best_step=best["step"],
        )
        if improved:
            return None
        s["evals_since_best"] = s.get("evals_since_best", 0) + 1
        if not cfg.early_stop_patience or s["evals_since_best"] < cfg.early_stop_patience:
            return None
        recent = s["evals"][-cfg.early_stop_patience :]
        seen = ", ".join(f"{loss:.4f} (update {step})" for step, loss in recent)
        return (
            f"early stop at update {s['step']}: the best validation loss is "
            f"{best['val_loss']:.4f} at update {best['step']}; the last {len(recent)} "
            f"evaluations ({seen}) were none lower by --early-stop-min-delta "
            f"{cfg.early_stop_min_delta:g}; resume with --resume latest to go on"
        )

    def stop_early(self, why: str) -> None:
        """End the run at this boundary with a checkpoint, the reason in the log."""
        path = self.save() if self.saved_at != self.state["step"] else self.last_saved
        self.event("stopped", why, reason="early stop", checkpoint=str(path or ""))
        self.stopping = True

    def sample(self) -> str:
        """Text generated from the prompt (rank 0 only; no collectives)."""
        if self.data.tokenizer is None:
            return "(no tokenizer: synthetic data)"
        tok, prompt = self.data.tokenizer, self.cfg.prompt
        ids = generate(
            self.model,
            [int(t) for t in tok.encode(prompt)],
            self.cfg.sample_tokens,
            seed=self.cfg.seed + self.state["step"],
        )
        return prompt + tok.decode(ids)

    def save(self) -> Path | None:
        """Checkpoint the current update: every rank proves its replica, rank 0 writes.
        A sync point. Raises ReplicaMismatch (after saving, never as latest) if they differ."""
        step, model, opt = self.state["step"], self.model, self.optimizer
        self.watchdog.progress("checkpoint")
        digests = self.cluster.gather_bytes(store.replica_digest(model.parameters(), opt.state))
        agree = len(set(digests)) == 1
        path = None
        if self.cluster.is_root:
            try:
                path = store.save(
                    self.cfg.run_dir,
                    step,
                    params=model.parameters(),
                    optimizer_state=opt.state,
                    state={**self.state, "rng": "reseeded from --seed and the step"},
                    config=self.cfg.to_dict(),
                    identity={**self.identity, "replicas_agree": agree},
                    keep=self.cfg.keep_checkpoints,
                    make_latest=agree,
                )
            except catalog.NoSpace as e:
                self.checkpoint_failed(str(e))
                return None
            self.event("checkpoint", f"saved {path}", path=str(path), verified=agree)
        self.last_saved, self.saved_at = path, step
        if not agree:
            majority = max(set(digests), key=digests.count)
            differ = [r for r, d in enumerate(digests) if d != majority]
            raise ReplicaMismatch(
                f"replicas disagree at update {step}: rank(s) {differ} differ from the others; "
                f"checkpoint {path or ''} kept but not made latest"
            )
        return path

    def checkpoint_failed(self, why: str) -> None:
        """A save that could not be written (rank 0): the previous checkpoint is untouched.
        Training goes on and tries again at the next checkpoint, or with
        --on-checkpoint-error stop, stops at the next boundary (trying once more)."""
        newest = self.last_saved or "none yet"
        plan = (
            "stopping at the next update"
            if self.cfg.on_checkpoint_error == "stop"
            else "training on; the next checkpoint tries again"
        )
        print(
            f"fleet train: {why}; newest checkpoint: {newest}; {plan}", file=sys.stderr, flush=True
        )
        self.event("error", why, newest=str(newest))
        if self.alerts is not None:
            self.alerts.raise_("disk", why, newest=str(newest))
        if self.cfg.on_checkpoint_error == "stop" and not self.stopping:
            self.commands.submit("stop", {"reason": "a checkpoint that could not be written"})

    def rebalance(self, split: list[int]) -> None:
        """Take a new batch split from this boundary on (same global batch: same math)."""
        self.state["split"] = self.identity["split"] = split
        self.reporter.set_hello(local_batch=split[self.cluster.rank])

    # --- signs of life for the peers and the launcher (trainer/heartbeat.py)
    def beat(self, stage: str, since: float) -> None:
        heartbeat.write(self.cfg.run_dir, self.cluster.rank, stage, self.state["step"], since)

    def culprit(self) -> str:
        """The peer that stopped making progress, from the beats in the run folder, or ""."""
        return heartbeat.culprit(heartbeat.read_all(self.cfg.run_dir), exclude=self.cluster.rank)

    def forget_beat(self) -> None:
        heartbeat.clear(self.cfg.run_dir, self.cluster.rank)

    def on_fatal(self, message: str, alert: str = "lost") -> None:
        """Tell the operator before the process ends (any rank: rank 0 may be the one lost)."""
        self.event("error", message)
        if self.alerts is not None:
            self.alerts.raise_(alert, message)
            self.alerts.close(timeout=2.0)
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
        for tmp, dest in catalog.adopt(run_dir):
            say(f"recovered checkpoint {dest.name} from {tmp.name}, left by a save cut short")
        for p in catalog.clear_orphans(run_dir):
            say(f"removed an unfinished checkpoint left by a crash: {p}")
        # The resolved config, as this session runs it (checkpoints keep their own copy).
        resolved = json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n"
        atomic_write(run_dir / "config.json", resolved)

    # --- device, memory limits, data, model and optimizer
    graphs = cuda_graphs.apply(cfg.cuda_graphs)  # before MLX's first kernel
    if cfg.device != "auto":
        mx.set_default_device(mx.cpu if cfg.device == "cpu" else mx.gpu)
    notes = memory.apply_limits(
        cfg.per_rank("cache_limit_gb", world, rank),
        cfg.per_rank("memory_limit_gb", world, rank),
        cfg.per_rank("wired_limit_gb", world, rank),
    )
    if mx.cuda.is_available():
        notes.append(graphs)
    data = open_data(cfg)
    model, optimizer = build_model(cfg, data)

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
    }
    state: dict[str, Any] = {"step": 0, "tokens": 0, "cursor": 0, "split": split, "lr": 0.0}
    if resume is not None:
        catalog.check_compatible(catalog.verify(resume), identity, resume)
        params, opt_state = store.load_arrays(resume)
        model.update(params)
        optimizer.state = opt_state
        mx.eval(model.parameters(), optimizer.state)
        state = {**catalog.read_json(resume, catalog.STATE), "split": split}
        say(
            f"resumed from {resume} at update {state['step']} "
            f"({state['tokens']:,} tokens, data cursor {state['cursor']:,})"
        )
    state["start_step"] = state["step"]
    state["evals_since_best"] = 0  # early-stop patience counts within one session

    # --- the compiled update (it captures the optimizer state: build it once that is final)
    slowdown = cfg.slowdown(world, rank)

    def factor() -> float:  # the simulated slowdown at the update in progress
        return next((f for at, f in reversed(slowdown) if state["step"] >= at), 1.0)

    slowed = any(f > 1 for _, f in slowdown)
    stepper = (SlowedStepper if slowed else Stepper)(
        model,
        optimizer,
        precision=cfg.precision,
        pad_id=data.pad_id,
        grad_clip=cfg.grad_clip,
        loss_chunk=cfg.loss_chunk,
        grad_checkpoint=cfg.grad_checkpoint,
        **({"factor": factor} if slowed else {}),
    )
    commands = CommandQueue()
    run = Run(
        cfg=cfg,
        cluster=cluster,
        model=model,
        optimizer=optimizer,
        stepper=stepper,
        state=state,
        data=data,
        identity=identity,
        banner=banner(cfg, model, data, world, split, notes),
        reporter=open_telemetry(cfg, cluster, commands, split, say, explicit),
        commands=commands,
        saved_at=state["step"] if resume is not None else None,
    )
    run.pilot = Autopilot(
        world,
        enabled=cfg.autopilot,
        min_gain=cfg.autopilot_min_gain,
        window=cfg.autopilot_window,
        cooldown=cfg.autopilot_cooldown,
        pause_on_pressure=cfg.on_memory_pressure == "pause",
    )
    run.alerts = Alerts(cfg.alert_command, cfg.alert_every, run.note)
    run.extra_peak = (cfg.per_rank("simulate_peak_gb", world, rank) or 0.0) * memory.GiB
    run.watchdog = Watchdog(
        cfg.collective_timeout, rank, on_expire=run.on_fatal, beat=run.beat, diagnose=run.culprit
    )
    if cluster.is_root:  # beats of ranks a larger fleet left behind would name ghosts
        for r in range(world, world + 64):
            heartbeat.clear(run_dir, r)
    run.beat("starting", time.time())
    return run


def build_model(cfg: TrainConfig, data: Data) -> tuple[GPT, optim.Optimizer]:
    """A freshly initialized GPT sized for the data, and its optimizer."""
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
    optimizer = make_optimizer(cfg)
    optimizer.init(model.trainable_parameters())
    return model, optimizer


def banner(
    cfg: TrainConfig, model: GPT, data: Data, world: int, split: list[int], notes: list[str]
) -> str:
    """What the run is, in a few lines: printed at the start and sent as the first event."""
    m = model.cfg
    return (
        f"run {cfg.run_dir}: GPT {model.num_params() / 1e6:.2f}M params (depth {m.depth}, "
        f"width {m.width}, heads {m.heads}, vocab {m.vocab}, seq {data.seq_len}), "
        f"{cfg.precision}, {cfg.accum_mode} accumulation\n"
        f"  {world} rank(s), split {split} x {cfg.accum} microsteps = "
        f"{sum(split) * cfg.accum} samples/update; data {data.description}"
        + (f"\n  memory: {', '.join(notes)}" if notes else "")
        + (
            f"\n  SIMULATED slowdown per rank: {cfg.simulate_slowdown} (for tests and demos)"
            if cfg.simulate_slowdown
            else ""
        )
    )


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
    if len(saved) == world:
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
    split: list[int],
    say: Callable[[str], None],
    explicit: frozenset[str] = frozenset(),
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
        local_batch=split[rank],
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
        key=auth.ensure_key(run_dir) if cluster.is_root else None,  # kept across resumes
    )
    hub.start()
    if cluster.is_root:
        served = ports.RecordedPorts(
            base, cluster.size, cfg.telemetry_bind, hello.host, hello.run_id
        )
        where = ports.keep(run_dir, served if port else None)
        if where is not None:
            moved = (
                f" (the default {cfg.telemetry_port_base} is taken)"
                if base != cfg.telemetry_port_base
                else ""
            )
            say(
                f"  telemetry: ranks on {cfg.telemetry_bind}:{base}+rank{moved}, recorded in "
                f"{where}; control key {run_dir / 'control.key'}"
            )
    return hub
