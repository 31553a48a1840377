"""A stand-in for a trial's `fleet train`, for fast tests of the sweep controller: it takes
the same flags, writes the same telemetry (updates and `eval` events, through the real
ArrowLog), stops on SIGTERM, and trains nothing (no mlx).

Its validation loss falls with the updates and is lowest at --lr 3e-3; --lr above 0.05 gives
a NaN loss at update 3 (and exit 5, as the trainer does); each --seed shifts it a little.
FAKE_TRIAL_DELAY in the environment is the seconds per update; a trial whose run folder's
name is FAKE_TRIAL_FAIL exits 1 at once, as a trial that cannot start would; one named
FAKE_TRIAL_SLOW takes 0.3 s per update.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time

from telemetry.arrowlog import ArrowLog
from telemetry.records import Event, Update


def val_loss(lr: float, wd: float, step: int, updates: int, seed: int) -> float:
    return (
        3.0
        + (math.log10(lr) + 2.5) ** 2
        + 2.0 * (1 - step / updates)
        + 0.5 * wd
        + 0.003 * ((seed * 7919) % 5)
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--run-dir", required=True)
    p.add_argument("--updates", type=int, required=True)
    p.add_argument("--eval-every", type=int, required=True)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--local-batch", type=int, default=8)
    a, _ = p.parse_known_args()
    delay = float(os.environ.get("FAKE_TRIAL_DELAY", "0.02"))
    if os.path.basename(a.run_dir) == os.environ.get("FAKE_TRIAL_SLOW"):
        delay = 0.3
    if os.path.basename(a.run_dir) == os.environ.get("FAKE_TRIAL_FAIL"):
        print("fake trial: boom", flush=True)
        return 1
    stop = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    log = ArrowLog(a.run_dir, 0, interval=0.05).start()
    planned = a.updates  # the budget: the trainer evaluates the final model at the end
    try:
        log.put(Event("started", 0, 0, "fake trial"))
        for step in range(a.updates):
            if stop:
                log.put(Event("stopped", 0, step, "stop", {"reason": "SIGTERM"}))
                return 0
            if step and step % a.eval_every == 0:
                v = val_loss(a.lr, a.weight_decay, step, planned, a.seed)
                log.put(Event("eval", 0, step, "", {"val_loss": v, "val_tokens": 100}))
            loss = math.nan if a.lr > 0.05 and step >= 2 else 5.0 - step / a.updates
            log.put(
                Update(
                    rank=0, step=step + 1, tokens=(step + 1) * 512, update_tokens=512,
                    local_tokens=512, loss=loss, lr=a.lr, grad_norm=1.0,
                    local_batch=a.local_batch, microsteps=1, compute_s=delay, wait_s=0.0,
                    transfer_s=0.0, optimizer_s=0.0, update_s=delay, active_mem=1 << 20,
                    peak_mem=2 << 20, cache_mem=0,
                )
            )  # fmt: skip
            if not math.isfinite(loss):
                log.put(Event("error", 0, step + 1, f"loss is nan at update {step + 1}; stopping"))
                return 5
            time.sleep(delay)
        v = val_loss(a.lr, a.weight_decay, a.updates, planned, a.seed)  # the final evaluation
        log.put(Event("eval", 0, a.updates, "", {"val_loss": v, "val_tokens": 100}))
        return 0
    finally:
        log.close()


if __name__ == "__main__":
    sys.exit(main())
