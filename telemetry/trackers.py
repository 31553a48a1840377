"""The trackers people already use: `--report-to wandb,trackio,swanlab,tensorboard`.

Rank 0 logs the run once (never once per rank), through the Reporter the loop already calls:
`TrackerReporter` hands every record to the hub as before, then queues a row for a thread
that feeds the trackers, because their clients can be slow (a network, a database) and the
loop must never wait for them. A full queue drops the oldest rows and counts them.

The keys are mlx-lm's (mlx_lm/tuner/trainer.py, callbacks.py): `train_loss`, `learning_rate`,
`iterations_per_second`, `tokens_per_second`, `trained_tokens`, `peak_memory` (GB, 1e9 bytes)
at each update and `val_loss` at each evaluation, all at step `iteration`; plus ours:
`grad_norm`, `compute_s`, `wait_s`, `transfer_s`, `optimizer_s` (rank 0's: its wait is the
time the slowest rank made it wait) and `split/rankN`, each rank's local batch.

Each tracker is an optional extra (`pip install 'mlx-fleet[trackio]'`); a missing one is a
one-line error naming it, before the run starts.
"""

from __future__ import annotations

import importlib.util
import queue
import sys
import threading
from pathlib import Path
from typing import Any

from telemetry import rundir
from telemetry.errors import TrackerError
from telemetry.records import Event, Update
from telemetry.reporter import Reporter

DEFAULT_PROJECT = "mlx-fleet"
GB = 1e9  # mlx-lm logs peak memory in GB (mx.get_peak_memory() / 1e9)


# --- the trackers ---------------------------------------------------------------------------
class Tracker:
    """One tracker's client: opened, fed rows, finished (all on the reporter's thread)."""

    module = ""  # what must be importable: also the name of its extra

    def open(self, project: str, name: str, run_dir: Path, config: dict[str, Any]) -> None:
        raise NotImplementedError

    def log(self, row: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass


class WandB(Tracker):
    module = "wandb"

    def open(self, project, name, run_dir, config):
        import wandb

        self.run = wandb.init(project=project, name=name, dir=str(run_dir), config=config)

    def log(self, row, step):
        self.run.log(row, step=step)

    def finish(self):
        self.run.finish()


class SwanLab(Tracker):
    module = "swanlab"

    def open(self, project, name, run_dir, config):
        import swanlab

        self.swanlab = swanlab
        swanlab.init(
            project=project, experiment_name=name, logdir=str(run_dir / "swanlog"), config=config
        )

    def log(self, row, step):
        self.swanlab.log(row, step=step)

    def finish(self):
        self.swanlab.finish()


class Trackio(Tracker):
    module = "trackio"

    def open(self, project, name, run_dir, config):
        import trackio

        self.trackio = trackio
        # trackio keeps its current run in a context variable: this thread's, as it should be.
        trackio.init(project=project, name=name, config=config)

    def log(self, row, step):
        self.trackio.log(row, step=step)

    def finish(self):
        self.trackio.finish()


class TensorBoard(Tracker):
    module = "tensorboard"

    def open(self, project, name, run_dir, config):
        from tensorboard.summary import Writer  # the framework-free writer (numpy only)

        self.writer = Writer(str(run_dir / "tensorboard"))

    def log(self, row, step):
        for key, value in row.items():
            self.writer.add_scalar(key, value, step=step)
        self.writer.flush()

    def finish(self):
        self.writer.close()


TRACKERS: dict[str, type[Tracker]] = {
    "wandb": WandB,
    "trackio": Trackio,
    "swanlab": SwanLab,
    "tensorboard": TensorBoard,
}


def names(report_to: str) -> list[str]:
    return [n.strip().lower() for n in report_to.split(",") if n.strip()]


def check(report_to: str) -> list[str]:
    """The trackers named, each known and installed; TrackerError names the first that is not."""
    out = names(report_to)
    for name in out:
        if name not in TRACKERS:
            raise TrackerError(
                f"--report-to {name}: no such tracker (choose from {', '.join(TRACKERS)})"
            )
        if importlib.util.find_spec(TRACKERS[name].module) is None:
            raise TrackerError(
                f"--report-to {name} needs the `{name}` extra: pip install 'mlx-fleet[{name}]'"
            )
    return out


# --- rows -----------------------------------------------------------------------------------
def update_row(u: Update) -> dict[str, float]:
    """An update as mlx-lm's keys, plus ours."""
    per_s = 1.0 / u.update_s if u.update_s > 0 else 0.0
    return {
        "train_loss": u.loss,
        "learning_rate": u.lr,
        "iterations_per_second": per_s,
        "tokens_per_second": u.update_tokens * per_s,
        "trained_tokens": float(u.tokens),
        "peak_memory": u.peak_mem / GB,
        "grad_norm": u.grad_norm,
        "compute_s": u.compute_s,
        "wait_s": u.wait_s,
        "transfer_s": u.transfer_s,
        "optimizer_s": u.optimizer_s,
    }


def event_row(e: Event) -> dict[str, float] | None:
    """What an event adds: the validation loss, or the split (at the start, on a rebalance)."""
    if e.kind == "eval" and "val_loss" in e.data:
        return {"val_loss": float(e.data["val_loss"])}
    split = e.data.get("split") if e.kind == "started" else e.data.get("to")
    if e.kind in ("started", "rebalanced") and isinstance(split, list):
        return {f"split/rank{r}": float(b) for r, b in enumerate(split)}
    return None


# --- the reporter ---------------------------------------------------------------------------
class TrackerReporter:
    """A Reporter that hands everything to `inner` (the hub) and, on a thread, to trackers."""

    def __init__(
        self,
        inner: Reporter,
        trackers: list[Tracker],
        *,
        project: str,
        name: str,
        run_dir: Path,
        config: dict[str, Any],
        queue_size: int = 10_000,
    ) -> None:
        self.inner, self.trackers = inner, trackers
        self.dropped = 0
        self.failures: list[str] = []
        self._rows: queue.Queue[tuple[dict[str, float], int] | None] = queue.Queue(queue_size)
        self._opened = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(project, name, run_dir, config), daemon=True,
            name="trackers",
        )  # fmt: skip
        self._thread.start()

    @classmethod
    def open(
        cls, inner: Reporter, report_to: str, project: str, run_dir: str | Path, config: dict
    ) -> TrackerReporter:
        """Rank 0's reporter for `--report-to`; raises TrackerError before anything starts."""
        trackers = [TRACKERS[n]() for n in check(report_to)]
        folder = Path(rundir.at(run_dir).trackers)
        folder.mkdir(parents=True, exist_ok=True)
        return cls(
            inner,
            trackers,
            project=project or DEFAULT_PROJECT,
            name=Path(run_dir).resolve().name,
            run_dir=folder,
            config=config,
        )

    # --- the loop's side: never blocks
    def on_update(self, record: Update) -> None:
        self.inner.on_update(record)
        self._put(update_row(record), record.step)

    def on_event(self, event: Event) -> None:
        self.inner.on_event(event)
        row = event_row(event)
        if row is not None:
            self._put(row, event.step)

    def set_hello(self, **changes: Any) -> None:
        self.inner.set_hello(**changes)

    def _put(self, row: dict[str, float], step: int) -> None:
        while True:
            try:
                self._rows.put_nowait((row, step))
                return
            except queue.Full:
                try:  # the oldest goes: the newest say most about the run now
                    self._rows.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def close(self, timeout: float = 30.0) -> None:
        """Close the hub, then give the trackers `timeout` seconds to take the rest."""
        self.inner.close()
        while True:
            try:
                self._rows.put(None, timeout=timeout)
                break
            except queue.Full:
                self._rows.get_nowait()
                self.dropped += 1
        self._thread.join(timeout)

    # --- the thread's side
    def _run(self, project: str, name: str, run_dir: Path, config: dict[str, Any]) -> None:
        live = []
        for t in self.trackers:
            try:
                t.open(project, name, run_dir, config)
                live.append(t)
            except Exception as e:  # a tracker that cannot start must not stop the run
                self._warn(f"{type(t).__name__} cannot start: {e}; the run goes on without it")
        self._opened.set()
        while (item := self._rows.get()) is not None:
            row, step = item
            for t in list(live):
                try:
                    t.log(row, step)
                except Exception as e:
                    self._warn(f"{type(t).__name__} stopped logging: {e}")
                    live.remove(t)
        for t in live:
            try:
                t.finish()
            except Exception as e:
                self._warn(f"{type(t).__name__} did not finish cleanly: {e}")

    def _warn(self, text: str) -> None:
        self.failures.append(text)
        print(f"fleet train: trackers: {text}", file=sys.stderr, flush=True)
