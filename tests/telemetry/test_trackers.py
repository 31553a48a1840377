"""--report-to: the trackers get mlx-lm's keys (and ours) from one reporter that never blocks
the loop; TensorBoard's event files and trackio's local database are read back (no network)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from telemetry import trackers
from telemetry.errors import TrackerError
from telemetry.records import Event, Update
from telemetry.reporter import NullReporter
from tests.support.fleet import fleet_env


def update(step: int, loss: float = 3.0) -> Update:
    return Update(
        rank=0, step=step, tokens=step * 256, update_tokens=256, local_tokens=128, loss=loss,
        lr=1e-3, grad_norm=0.5, local_batch=4, microsteps=1, compute_s=0.2, wait_s=0.05,
        transfer_s=0.01, optimizer_s=0.01, update_s=0.25, active_mem=1, peak_mem=3_000_000_000,
        cache_mem=0,
    )  # fmt: skip


MLX_LM_KEYS = {
    "train_loss",
    "learning_rate",
    "iterations_per_second",
    "tokens_per_second",
    "trained_tokens",
    "peak_memory",
}


def test_rows_carry_mlx_lms_keys_and_ours():
    row = trackers.update_row(update(7))
    assert set(row) >= MLX_LM_KEYS and {"compute_s", "wait_s", "grad_norm"} <= set(row)
    assert row["tokens_per_second"] == 256 / 0.25 and row["peak_memory"] == 3.0  # GB, as mlx-lm
    assert trackers.event_row(Event("eval", 0, 10, "", {"val_loss": 2.5})) == {"val_loss": 2.5}
    assert trackers.event_row(Event("started", 0, 0, "", {"split": [3, 1]})) == {
        "split/rank0": 3.0,
        "split/rank1": 1.0,
    }
    assert trackers.event_row(Event("rebalanced", 0, 9, "", {"from": [3, 1], "to": [2, 2]})) == {
        "split/rank0": 2.0,
        "split/rank1": 2.0,
    }
    assert trackers.event_row(Event("checkpoint", 0, 9, "saved")) is None


def test_an_unknown_tracker_or_a_missing_extra_is_one_line(monkeypatch):
    with pytest.raises(TrackerError, match=r"--report-to mlflow: no such tracker \(choose from"):
        trackers.check("tensorboard,mlflow")
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(
        trackers.importlib.util, "find_spec", lambda n: None if n == "wandb" else real(n)
    )
    with pytest.raises(TrackerError) as e:
        trackers.check("trackio, WandB")
    assert str(e.value) == (
        "--report-to wandb needs the `wandb` extra: pip install 'mlx-fleet[wandb]'"
    )
    assert trackers.check("") == []


class Blocked(trackers.Tracker):
    """A tracker whose client hangs until released (a slow network)."""

    def __init__(self):
        self.release, self.rows = threading.Event(), []

    def open(self, project, name, run_dir, config):
        self.release.wait()

    def log(self, row, step):
        self.rows.append(step)


def test_a_slow_tracker_never_blocks_the_loop_and_gets_every_row(tmp_path):
    t = Blocked()
    r = trackers.TrackerReporter(
        NullReporter(), [t], project="p", name="n", run_dir=tmp_path, config={}, queue_size=50
    )
    for step in range(1, 201):  # the tracker is stuck: these must return all the same
        r.on_update(update(step))
    assert r.dropped == 150  # the oldest went; the newest 50 wait
    t.release.set()
    r.close()
    assert t.rows == list(range(151, 201))


def test_tensorboard_event_files_hold_each_update_and_eval(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    r = trackers.TrackerReporter.open(NullReporter(), "tensorboard", "", tmp_path, {"lr": 1e-3})
    r.on_event(Event("started", 0, 0, "", {"split": [4]}))
    for step in (1, 2, 3):
        r.on_update(update(step, loss=4.0 - step))
    r.on_event(Event("eval", 0, 3, "", {"val_loss": 1.25}))
    r.close()
    acc = EventAccumulator(str(tmp_path / "trackers" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    assert MLX_LM_KEYS | {"val_loss", "split/rank0", "wait_s"} <= tags
    losses = [(e.step, e.tensor_proto.float_val[0]) for e in acc.Tensors("train_loss")]
    assert losses == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert [(e.step, e.tensor_proto.float_val[0]) for e in acc.Tensors("val_loss")] == [(3, 1.25)]


def test_trackio_logs_to_its_local_database(tmp_path):
    # trackio reads TRACKIO_DIR when it is imported: a fresh interpreter for a private one.
    code = (
        "import sys\n"
        "from telemetry import trackers\n"
        "from telemetry.records import Event\n"
        "from telemetry.reporter import NullReporter\n"
        "from tests.telemetry.test_trackers import update\n"
        "r = trackers.TrackerReporter.open(NullReporter(), 'trackio', 'fleet-test', "
        "sys.argv[1], {'lr': 0.001})\n"
        "for s in (1, 2): r.on_update(update(s, loss=5.0 - s))\n"
        "r.on_event(Event('eval', 0, 2, '', {'val_loss': 2.5}))\n"
        "r.close()\n"
        "assert not r.failures, r.failures\n"
        "from trackio.sqlite_storage import SQLiteStorage\n"
        "import json\n"
        "print(json.dumps(SQLiteStorage.get_logs('fleet-test', 'run-a')))\n"
    )
    run = tmp_path / "run-a"
    out = subprocess.run(
        [sys.executable, "-c", code, str(run)],
        env=fleet_env(TRACKIO_DIR=str(tmp_path / "trackio")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    logs = json.loads(out.stdout.strip().splitlines()[-1])
    by_step = {}
    for row in logs:
        by_step.setdefault(row["step"], {}).update(row)
    assert by_step[1]["train_loss"] == 4.0 and by_step[2]["train_loss"] == 3.0
    assert by_step[2]["val_loss"] == 2.5 and set(by_step[1]) >= MLX_LM_KEYS
