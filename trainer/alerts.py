"""Alerts that reach a person: an `alert` event in the log (the console shows it), and with
--alert-command the user's command run with the alert as JSON on its standard input (a
notifier, a chat webhook), at most once per kind every --alert-every seconds. The JSON says
which run: {"kind", "message", "time", "run_id", "run_dir", "host", "rank", ...the alert's
figures, such as "step"}.

Rank 0 raises them: it sees every rank's figures at each boundary. What it watches besides
memory (trainer/autopilot.py): the loss (NaN, or a spike far above its average) and the
run's throughput (a fall below a fraction of its best).
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import time
from collections.abc import Callable
from typing import Any

SPIKE = 2.0  # a loss this many times its running average is a spike
SLOWER = 0.7  # throughput below this fraction of its best running average
WARMUP = 20  # updates before the loss and throughput are judged (compilation, warmup)


class Alerts:
    """Raise alerts; `emit(kind, message, data)` logs the event. `identity` (run_id, run_dir,
    host, rank) goes into every alert the command reads, so one notifier can serve several
    runs and say which one needs a person."""

    def __init__(
        self,
        command: str,
        every: float,
        emit: Callable[[str, str, dict[str, Any]], None],
        clock: Callable[[], float] = time.monotonic,
        identity: dict[str, Any] | None = None,
    ) -> None:
        self.command, self.every, self.emit, self.clock = command, every, emit, clock
        self.identity = dict(identity or {})
        self.last: dict[str, float] = {}
        self.children: list[subprocess.Popen] = []
        self.loss_avg: float | None = None
        self.rate_avg: float | None = None
        self.best_rate = 0.0
        self.seen = 0

    def raise_(self, kind: str, message: str, **data: Any) -> bool:
        """Tell the operator, unless this kind was told less than `every` seconds ago."""
        now = self.clock()
        if now - self.last.get(kind, -math.inf) < self.every:
            return False
        self.last[kind] = now
        self.emit("alert", f"{kind}: {message}", {"alert": kind, **data})
        if self.command:
            alert = {"kind": kind, "message": message, "time": time.time(), **self.identity}
            self._run({**alert, **data})
        return True

    def watch(self, step: int, loss: float, tokens_per_s: float) -> None:
        """Judge one update's loss and the run's throughput."""
        self.seen += 1
        if not math.isfinite(loss):
            self.raise_("loss", f"loss is {loss} at update {step}", step=step)
            return
        if self.loss_avg is not None and self.seen > WARMUP and loss > SPIKE * self.loss_avg:
            self.raise_(
                "loss",
                f"loss spiked to {loss:.4f} at update {step}, {loss / self.loss_avg:.1f}x its "
                f"average {self.loss_avg:.4f}",
                step=step,
            )
        self.loss_avg = loss if self.loss_avg is None else 0.95 * self.loss_avg + 0.05 * loss
        r = tokens_per_s
        self.rate_avg = r if self.rate_avg is None else 0.9 * self.rate_avg + 0.1 * r
        if self.seen > WARMUP:
            self.best_rate = max(self.best_rate, self.rate_avg)
            if self.rate_avg < SLOWER * self.best_rate:
                self.raise_(
                    "throughput",
                    f"{self.rate_avg:,.0f} tokens/s at update {step}, down "
                    f"{1 - self.rate_avg / self.best_rate:.0%} from its best {self.best_rate:,.0f}",
                    step=step,
                )

    def _run(self, alert: dict[str, Any]) -> None:
        self.children = [c for c in self.children if c.poll() is None]
        try:
            child = subprocess.Popen(
                self.command,
                shell=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as e:
            self.emit("error", f"--alert-command could not start: {e}", {})
            return
        with contextlib.suppress(OSError):
            child.stdin.write(json.dumps(alert).encode() + b"\n")
            child.stdin.close()
        self.children.append(child)

    def close(self, timeout: float = 5.0) -> None:
        """Give running alert commands a moment to finish, then end them (nothing outlives
        the run)."""
        deadline = self.clock() + timeout
        for c in self.children:
            try:
                c.wait(timeout=max(0.0, deadline - self.clock()))
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
