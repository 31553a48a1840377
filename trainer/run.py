"""What a training run holds besides its loop, and what it does between updates: the batches
of each update, events and records for telemetry, the checkpoint, the beats.

Building one is builder.py's; evaluating it is evaluation.py's."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim

from telemetry import parallelism, sysmem
from telemetry.control import CommandQueue
from telemetry.records import Event, Update
from telemetry.reporter import NullReporter, Reporter
from trainer import heap, heartbeat, memory
from trainer.alerts import Alerts
from trainer.autopilot import Autopilot
from trainer.checkpoint import catalog, store
from trainer.config import TrainConfig
from trainer.controller import Controller
from trainer.data.dataset import Dataset
from trainer.distributed import Cluster, Watchdog
from trainer.keeper import Keeper
from trainer.launch import lifeline
from trainer.launch.plan import LAUNCH_ENV
from trainer.launch.restart import restart_record
from trainer.model import tensor
from trainer.model.gpt import GPT
from trainer.parallel import Layout
from trainer.state import LoopState
from trainer.step import SlowedStepper, Stepper, UpdateFigures


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
    layout: Layout  # replicas and tensor-parallel groups (trainer/parallel.py)
    model: GPT
    optimizer: optim.Optimizer
    stepper: Stepper
    state: LoopState  # step, tokens, cursor, split, ...: saved as state.json
    data: Data
    identity: dict[str, Any]  # what a checkpoint must share with this run to resume it
    banner: str
    reporter: Reporter = field(default_factory=NullReporter)
    commands: CommandQueue = field(default_factory=CommandQueue)
    watchdog: Watchdog = field(default_factory=lambda: Watchdog(0, 0))  # 0: never fires
    pilot: Autopilot = field(default_factory=lambda: Autopilot(1))  # rank 0 steers with it
    alerts: Alerts | None = None  # rank 0 raises them
    extra_peak: float = 0.0  # --simulate-peak-gb of this rank, in bytes
    collective_s: float = 0.0  # tensor parallelism: an update's per-block all-reduces (probed)
    measured: dict[str, float] = field(default_factory=dict)  # the last update, for rank 0
    stopping: bool = False  # a stop was applied at this boundary
    stop_reason: str = ""  # what stopped it: "early stop", "Ctrl-C (SIGINT)", ...
    last_saved: Path | None = None
    saved_at: int | None = None  # the step of the newest checkpoint of this run
    keeper: Keeper | None = None  # rank 0's memory of the run folder's small files

    # --- samples of the global order: this rank's slice of each microbatch of the update
    def batches(self):
        """The update's `accum` microbatches for this rank, read as they are consumed."""
        for m in range(self.cfg.accum):
            yield self._microbatch(self.state.cursor + m * sum(self.state.split))

    def _microbatch(self, cursor: int) -> mx.array:
        split, rank = self.state.split, self.layout.replica  # a tensor group reads alike
        global_batch, offset = sum(split), sum(split[:rank])
        return mx.array(self.data.stream.batch(cursor, global_batch, offset, split[rank]))

    def batch_key(self, cursor: int | None = None) -> tuple:
        """What names this rank's first microbatch of the update at `cursor` (this one's by
        default): the samples are a function of it alone."""
        s = self.state
        return (s.cursor if cursor is None else cursor, tuple(s.split), self.layout.replica)

    def seed(self, step: int) -> None:
        """The global RNG of update `step`: reseeded from (seed, step) every update, so
        anything random in an update (none today; dropout tomorrow) resumes exactly without
        its state."""
        mx.random.seed(self.cfg.seed * 1_000_003 + step)

    def ahead(self) -> tuple[tuple, mx.array]:
        """The next update's first microbatch and its key, with that update's RNG, for a
        microstep started early (`Stepper.update(ahead=...)`)."""
        cursor = self.state.cursor + self.cfg.accum * sum(self.state.split)
        self.seed(self.state.step + 1)
        return self.batch_key(cursor), self._microbatch(cursor)

    def advance(self, figures: UpdateFigures, lr: float) -> None:
        """Move the loop state past one update."""
        s = self.state
        s.step, s.tokens, s.lr = s.step + 1, s.tokens + figures.tokens, lr
        s.cursor += self.cfg.accum * sum(s.split)

    # --- what every rank tells telemetry
    def event(self, kind: str, message: str, **data: Any) -> None:
        """One event of this rank at the current update."""
        self.reporter.on_event(Event(kind, self.cluster.rank, self.state.step, message, data))

    def announce(self) -> None:
        """The `started` event, with what the report and the console show of the run; and
        `restarted`, when `fleet launch --restarts` relaunched it (rank 0)."""
        cfg = self.cfg
        self.event(
            "started",
            self.banner,
            world_size=self.cluster.size,
            split=self.state.split,
            updates=cfg.updates,
            config_digest=cfg.digest(),
            architecture=self.identity["architecture"],
            params=self.model.cfg.num_params(),
            parallel=self.layout.mode,
            resident_bytes=self.stepper.resident_bytes(),
            precision=cfg.precision,
            autopilot=cfg.autopilot,
        )
        if (restart := restart_record()) and self.cluster.is_root:
            self.event(
                "restarted", f"restart {restart.get('attempt')}: {restart.get('reason')}", **restart
            )

    def resume_command(self) -> str:
        """The exact command that continues this run from its newest checkpoint: printed by
        every stop (Ctrl-C, `s`, --stop-at, early stop)."""
        rank = f"train --resume latest --run-dir {shlex.quote(str(self.cfg.run_dir))}"
        launch = os.environ.get(LAUNCH_ENV, "")  # `fleet launch -n 3`, from the launcher
        if not launch and self.cluster.size > 1:
            launch = f"fleet launch -n {self.cluster.size}"
        return f"{launch} -- {rank}" if launch else f"fleet {rank}"

    def controller(self) -> Controller:
        """The boundary's exchange for this run: memory caps from every rank's limit and
        peak, and (rank 0) the autopilot."""
        return Controller(
            self.cluster,
            self.commands,
            caps_model=memory.memory_caps,
            pilot=self.pilot if self.cluster.is_root and self.layout.tensor == 1 else None,
            on_event=self.tell,
            fixed_split=parallelism.FIXED_SPLIT if self.layout.tensor > 1 else "",
            watch=lifeline.Watch.from_env(),  # started by fleet launch: it may stop us
        )

    def fail(self, message: str, code: int, alert: str = "lost") -> int:
        """End this rank on an error: say it, tell telemetry (and a person), return `code`."""
        text = f"fleet train: rank {self.cluster.rank}: {message}"
        print(text, file=sys.stderr, flush=True)
        self.on_fatal(text, alert)
        return code

    def tell(self, kind: str, message: str, data: dict[str, Any]) -> None:
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
            step=s.step,
            tokens=s.tokens,
            update_tokens=f.tokens,
            local_tokens=f.local_tokens,
            loss=f.loss,
            lr=s.lr,
            grad_norm=f.grad_norm,
            local_batch=s.split[self.layout.replica],
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
            collective_s=self.collective_s,
            **self.stepper.memory_fields(),
            **sysmem.sample().update_fields(),
        )
        self.reporter.on_update(rec)
        self.measured = {
            "budget": rec.mem_budget,
            "peak": rec.peak_mem,
            "compute_s": f.compute_s,
            "swap": rec.swap_used,
            "pressure": rec.mem_pressure or 0.0,
        }
        return rec

    def save(self) -> Path | None:
        """Checkpoint the current update: every rank proves its replica, rank 0 writes.
        A sync point. Raises ReplicaMismatch (after saving, never as latest) if they differ."""
        step, layout = self.state.step, self.layout
        self.watchdog.progress("checkpoint")
        digests = self.cluster.gather_bytes(self.stepper.replica_digest())
        # Replicas of the same slice must hold the same bytes (in data parallelism: every rank).
        slices = [digests[t :: layout.tensor] for t in range(layout.tensor)]
        agree = all(len(set(d)) == 1 for d in slices)
        if layout.tensor_group is None:
            trees = self.stepper.checkpoint_trees(self.cluster)  # sharded: gathered into rank 0
        elif layout.replica == 0:
            # One logical checkpoint: replica 0's group gathers the whole model for rank 0
            # (a collective, tensor by tensor; the other ranks drop each one as it comes).
            keep, group = self.cluster.is_root, layout.tensor_group
            local = self.stepper.checkpoint_trees(None)  # this rank's slices, per tensor
            trees = tuple(tensor.gather_tree(t, group, keep=keep) for t in local)
        else:
            trees = None  # another replica's slices: replica 0's group holds the same
        path = None
        if self.cluster.is_root:
            params, opt_state = trees
            try:
                path = store.save(
                    self.cfg.run_dir,
                    step,
                    params=params,
                    optimizer_state=opt_state,
                    state={**self.state.to_json(), "rng": "reseeded from --seed and the step"},
                    config=self.cfg.to_dict(),
                    identity={**self.identity, "replicas_agree": agree},
                    keep=self.cfg.keep_checkpoints,
                    make_latest=agree,
                )
            except catalog.NoSpace as e:
                self.checkpoint_failed(str(e))
                return None
            except catalog.LatestNotMoved as e:  # saved and verified: only the hint is old
                path = e.path
                print(f"fleet train: warning: {e}; --resume latest still finds it", file=sys.stderr)
            self.event("checkpoint", f"saved {path}", path=str(path), verified=agree)
        self.last_saved, self.saved_at = path, step
        if not agree:
            differ = []
            for t, d in enumerate(slices):
                majority = max(set(d), key=d.count)
                differ += [t + i * layout.tensor for i, x in enumerate(d) if x != majority]
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
        me = self.layout.replica
        heap.resized(self.state.split[me], split[me])
        self.state.split = self.identity["split"] = split
        self.reporter.set_hello(local_batch=split[me])

    # --- signs of life for the peers and the launcher (trainer/heartbeat.py)
    def beat(self, stage: str, since: float) -> None:
        """About once a second, from the watchdog thread: the beat, and (rank 0) what the run
        folder should hold put back if it went missing. Neither may end the run."""
        with contextlib.suppress(OSError):  # a full disk: advisory, tried again next second
            heartbeat.write(self.cfg.run_dir, self.cluster.rank, stage, self.state.step, since)
        if self.keeper is not None:
            self.keeper.check()

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
