"""Benchmark (not a test): the console fed 64 ranks x 10 updates/s, headless.

    fleet bench console [--ranks 64] [--rate 10] [--seconds 10] [--size 160x50]
    python -m bench.console ...              # the same, without the fleet entry point

Reports, as JSON:
- frame time p50/p95/max: from the start of a redraw (state -> widgets) until the screen
  has been composed after it: what an operator waits between data and pixels;
- loop lag p95: how late a 50 ms timer fires, i.e. how long a key press may wait;
- CPU: process CPU time (all threads, including the synthetic feeder) / wall time, as % of
  one core.
Targets: frame p95 <= 50 ms, CPU <= 30 % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from console.hostfile import RankTarget
from console.link_phase import LinkPhase, LinkStatus
from telemetry.records import Event, Hello, Update
from telemetry.units import GiB

if TYPE_CHECKING:
    from console.app import FleetApp


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=64, help="synthetic ranks fed to it")
    parser.add_argument("--rate", type=float, default=10.0, help="updates per second per rank")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--size", default="160x50", help="terminal size, COLSxROWS")


class SyntheticFeed:
    """`ranks` ranks, each sending one update every 1/rate s from a feeder thread."""

    playback = None
    control_problem = "benchmark: no commands"

    def __init__(self, ranks: int, rate: float, seed: int = 0) -> None:
        self.targets = [RankTarget(r, f"mac-{r:02d}", 47800 + r) for r in range(ranks)]
        self.rate = rate
        self.sink: Any = None
        self.sent = 0
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._thread = threading.Thread(target=self._run, name="bench-feed", daemon=True)

    def attach(self, sink: Any) -> None:
        self.sink = sink

    def loops(self) -> dict:
        return {}  # one feeder thread, started by start()

    def start(self) -> None:
        for t in self.targets:
            self.sink.link_status(LinkStatus(t.rank, LinkPhase.LIVE, "synthetic"))
            self.sink.link_message(
                t.rank,
                Hello(
                    1, "bench", t.rank, len(self.targets), t.host, "macOS", "M2", 32 * GiB, 4, "x"
                ),
            )
        self.sink.link_message(0, Event("started", 0, 0, data={"updates": 10**6}))
        self._thread.start()

    def _run(self) -> None:
        step = 0
        period = 1.0 / self.rate
        next_t = time.monotonic()
        while not self._stop.is_set():
            step += 1
            slow = [1.0 + 0.5 * (r % 7 == 3) for r in range(len(self.targets))]
            slowest = max(0.02 * 4 * s for s in slow)
            for t in self.targets:
                compute = 0.02 * 4 * slow[t.rank] * self._rng.uniform(0.95, 1.05)
                wait = max(0.0, slowest - compute)
                self.sink.link_message(
                    t.rank,
                    Update(
                        rank=t.rank,
                        step=step,
                        tokens=step * 4096 * len(self.targets),
                        update_tokens=4096 * len(self.targets),
                        local_tokens=4096,
                        loss=4.0 / (1 + 0.001 * step) + 1,
                        lr=1e-3,
                        grad_norm=1.0,
                        local_batch=4,
                        microsteps=1,
                        compute_s=compute,
                        wait_s=wait,
                        transfer_s=0.004,
                        optimizer_s=0.002,
                        update_s=compute + wait + 0.006,
                        active_mem=4 * GiB,
                        peak_mem=6 * GiB,
                        cache_mem=GiB,
                        tokens_per_s=4096 / (compute + wait + 0.006),
                    ),
                )
                self.sent += 1
            next_t += period
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def send(self, cmd: str, args: dict | None = None) -> int:
        raise RuntimeError(self.control_problem)

    def reconnect(self) -> None:
        pass

    def close(self) -> None:
        self._stop.set()


def timed_app(feed: SyntheticFeed) -> FleetApp:
    """The console, with its redraws timed (into `frame_ms`) until the screen after them is
    composed. Textual is imported here, so that no other `fleet bench` loads it."""
    import inspect

    from console.app import FleetApp

    class BenchApp(FleetApp):
        # Textual finds a relative CSS_PATH beside the subclass's module: point at the app's.
        CSS_PATH = Path(inspect.getfile(FleetApp)).parent / FleetApp.CSS_PATH

        def __init__(self, feed: SyntheticFeed) -> None:
            super().__init__(feed)
            self.frame_ms: list[float] = []

        def _frame(self, force: bool = False) -> None:
            before = self.frames
            start = time.perf_counter()
            super()._frame(force)
            if self.frames != before:
                self.call_after_refresh(
                    lambda: self.frame_ms.append((time.perf_counter() - start) * 1e3)
                )

    return BenchApp(feed)


async def measure(ranks: int, rate: float, seconds: float, size: tuple[int, int]) -> dict:
    """Frame times, loop lag and CPU of the console under `ranks` x `rate` updates per second."""
    feed = SyntheticFeed(ranks, rate)
    app = timed_app(feed)
    lags: list[float] = []
    async with app.run_test(size=size, headless=True) as pilot:
        await pilot.pause(1.0)  # warm up: first layout, caches
        app.frame_ms.clear()
        cpu0, wall0, sent0 = time.process_time(), time.perf_counter(), feed.sent
        end = wall0 + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            await asyncio.sleep(0.05)
            lags.append((time.perf_counter() - t - 0.05) * 1e3)
        cpu = time.process_time() - cpu0
        wall = time.perf_counter() - wall0
        received = feed.sent - sent0
        # Move the cursor around too: keys must stay snappy under load.
        await pilot.press("down", "down", "up")
    frames = sorted(app.frame_ms)
    return {
        "ranks": ranks,
        "updates_per_s_per_rank": rate,
        "terminal": f"{size[0]}x{size[1]}",
        "records_per_s": round(received / wall, 1),
        "frames": len(frames),
        "frame_ms_p50": round(statistics.median(frames), 2) if frames else None,
        "frame_ms_p95": round(frames[int(0.95 * (len(frames) - 1))], 2) if frames else None,
        "frame_ms_max": round(frames[-1], 2) if frames else None,
        "loop_lag_ms_p95": round(sorted(lags)[int(0.95 * (len(lags) - 1))], 2) if lags else None,
        "cpu_percent_of_one_core": round(100 * cpu / wall, 1),
        "targets": {"frame_ms_p95": 50, "cpu_percent_of_one_core": 30},
    }


def verdict(result: dict) -> tuple[bool, str]:
    """Whether both targets held, and the line that says so with the figures."""
    frame, cpu = result["frame_ms_p95"], result["cpu_percent_of_one_core"]
    goal = result["targets"]
    frame_ok = frame is not None and frame <= goal["frame_ms_p95"]
    cpu_ok = cpu <= goal["cpu_percent_of_one_core"]
    said = lambda ok: "met" if ok else "MISSED"  # noqa: E731
    shown = "-" if frame is None else f"{frame:.1f} ms"
    return frame_ok and cpu_ok, (
        f"fleet bench console: {result['ranks']} ranks x {result['updates_per_s_per_rank']:g} "
        f"updates/s at {result['terminal']}: frame p95 {shown} (target <= "
        f"{goal['frame_ms_p95']} ms: {said(frame_ok)}), CPU {cpu:.1f}% of one core (target <= "
        f"{goal['cpu_percent_of_one_core']}%: {said(cpu_ok)})"
    )


def run(args: argparse.Namespace) -> int:
    """Measure, print the figures as JSON and the verdict in words; 0 when both targets held."""
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    result = asyncio.run(measure(args.ranks, args.rate, args.seconds, (cols, rows)))
    ok, line = verdict(result)
    result["verdict"] = "met" if ok else "missed"
    print(json.dumps(result, indent=2))
    print(line, file=sys.stderr, flush=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
