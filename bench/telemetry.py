"""Telemetry benchmarks: overhead on a simulated training loop, flat memory, 10k-input fuzz.

fleet bench telemetry                     # all three (about a minute)
fleet bench telemetry --only overhead --updates 400 --work-ms 30
fleet bench telemetry --only overhead --trainer --json    # on the trainer's real update
python -m bench.telemetry ...             # the same without --trainer, and without mlx
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench import synthetic
from bench.fuzz import fuzz
from telemetry import sysmem
from telemetry.client import TelemetryClient
from telemetry.errors import TelemetryError
from telemetry.hub import ANY_PORT, Hub
from telemetry.records import Event
from telemetry.units import MiB

PARTS = ("overhead", "memory", "fuzz")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only",
        choices=PARTS,
        action="append",
        help="run only this part (repeatable; default: all)",
    )
    parser.add_argument("--updates", type=int, default=200, help="overhead: updates per arm")
    parser.add_argument("--work-ms", type=float, default=30.0, help="overhead: cost of an update")
    parser.add_argument(
        "--memory-updates", type=int, default=100_000, help="memory: updates pushed"
    )
    parser.add_argument("--fuzz", type=int, default=10_000, help="fuzz: malformed inputs sent")
    parser.add_argument("--seed", type=int, default=0, help="fuzz: seed of the malformed inputs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")


def run(args: argparse.Namespace, work: Callable[[], Any] | None = None) -> int:
    """Run the selected parts; 0 when every check held (overhead <= 1%, flat memory, no fault).

    `work`: one real training update (`fleet bench telemetry --trainer` passes the trainer's,
    so that this module never loads mlx). Without it the overhead runs on two stand-ins.
    """
    parts = args.only or list(PARTS)
    results: dict[str, Any] = {}
    ok = True
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        if "overhead" in parts and work is not None:
            results["overhead"] = {
                "trainer": overhead(Path(tmp) / "o-trainer", args.updates, 0.0, "trainer", work)
            }
            ok &= results["overhead"]["trainer"]["ok"]
        elif "overhead" in parts:
            results["overhead"] = {
                mode: overhead(Path(tmp) / f"o-{mode}", args.updates, args.work_ms, mode)
                for mode in ("gil-free", "gil-holding")
            }
            # MLX releases the GIL in mx.eval, so the GIL-free run is the one that models a
            # training loop; the GIL-holding run is a worst case, reported but not judged.
            ok &= results["overhead"]["gil-free"]["ok"]
        if "memory" in parts:
            results["memory"] = memory(Path(tmp) / "m", args.memory_updates)
            ok &= results["memory"]["ok"]
        if "fuzz" in parts:
            results["fuzz"] = fuzz(Path(tmp) / "f", args.fuzz, args.seed)
            ok &= results["fuzz"]["ok"]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print(results)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.telemetry", description=__doc__.split("\n")[0]
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


# --- shared -----------------------------------------------------------------------------------


def _subscribe(host: str, port: int, readers: int, stalled: int) -> None:
    """Child process: `readers` clients draining on threads, `stalled` clients never reading.

    Subscribers live in their own process, as consoles do, so their decoding does not
    compete with the measured loop for this process's GIL.
    """
    conns: list[Any] = []

    def drain(client: TelemetryClient) -> None:
        with contextlib.suppress(TelemetryError):
            for _ in client:
                pass

    for _ in range(readers):
        client = TelemetryClient.connect(host, port)
        conns.append(client)
        threading.Thread(target=drain, args=(client,), daemon=True).start()
    for _ in range(stalled):
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.connect((host, port))
        conns.append(raw)  # hello and all: never read
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes our stdin


class Subscribers:
    """A child process holding subscribers of `hub` until closed."""

    def __init__(self, hub: Hub, readers: int, stalled: int) -> None:
        assert hub.address is not None
        host, port = hub.address
        code = (
            "import sys; from bench.telemetry import _subscribe; "
            "_subscribe(sys.argv[1], *map(int, sys.argv[2:5]))"
        )
        root = str(Path(__file__).resolve().parents[1])  # so the child imports this bench
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, host, str(port), str(readers), str(stalled)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.close()
            raise TelemetryError("the subscriber process did not start")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _rss() -> int:
    return psutil.Process().memory_info().rss


# --- overhead ---------------------------------------------------------------------------------


def _work(mode: str, ms: float) -> Callable[[], None]:
    """A fixed-cost stand-in for an update: hashing (releases the GIL, like MLX kernels do)
    or a pure-Python loop (holds it: the worst case for telemetry's threads)."""
    if mode == "gil-free":
        buf = bytes(1 << 20)
        t = time.perf_counter()
        for _ in range(20):
            hashlib.sha256(buf).digest()
        per_mib = (time.perf_counter() - t) / 20
        reps = max(1, round(ms / 1000 / per_mib))

        def hashing() -> None:
            for _ in range(reps):
                hashlib.sha256(buf).digest()

        return hashing

    def spin(n: int) -> None:
        x = 0
        for i in range(n):
            x += i * i

    t = time.perf_counter()
    spin(200_000)
    n = max(1, round(200_000 * ms / 1000 / (time.perf_counter() - t)))
    return lambda: spin(n)


def overhead(
    run_dir: Path,
    updates: int,
    work_ms: float,
    mode: str,
    work: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Median update time with telemetry on (4 subscribers, one never reading) vs off.

    Arms alternate in blocks of 10 (on, off, off, on, ...) so drift hits both alike; the first
    update of each block is discarded, because the previous block's background work spills
    into it. `work` is the update itself; by default a stand-in of `work_ms` (see `_work`).
    """
    work = work or _work(mode, work_ms)
    hub = Hub(run_dir=run_dir, hello=synthetic.hello(), port=ANY_PORT).start()
    subs = Subscribers(hub, readers=3, stalled=1)
    step = 0
    try:
        for _ in range(20_000):  # saturate the stalled subscriber: it drops from here on
            step += 1
            hub.on_update(synthetic.update(step))
        time.sleep(1.0)
        cpu_before = _thread_cpu(hub)
        times: dict[str, list[float]] = {"on": [], "off": []}
        block, order = 10, ["on", "off", "off", "on"]
        i = 0
        while min(len(v) for v in times.values()) < updates:
            arm = order[i % 4]
            i += 1
            for j in range(block):
                step += 1
                t0 = time.perf_counter()
                work()
                if arm == "on":
                    record = synthetic.update(step)
                    for k, v in sysmem.sample().update_fields().items():
                        setattr(record, k, v)
                    hub.on_update(record)
                else:
                    record = synthetic.update(step)
                dt = time.perf_counter() - t0
                if j:
                    times[arm].append(dt)
        time.sleep(0.5)  # let the last records drain, so their cost is counted
        telemetry_cpu = _thread_cpu(hub) - cpu_before
        on_updates = (i + 1) // 2 * block
        stats = hub.stats()
    finally:
        subs.close()
        hub.close()
    on, off = statistics.median(times["on"]), statistics.median(times["off"])
    diff = on / off - 1.0
    return {
        "mode": mode,
        "updates_per_arm": min(len(v) for v in times.values()),
        "median_off_ms": off * 1000,
        "median_on_ms": on * 1000,
        "median_diff_pct": diff * 100,
        "p90_off_ms": _pct(times["off"], 0.9) * 1000,
        "p90_on_ms": _pct(times["on"], 0.9) * 1000,
        "on_update_us": _call_cost(run_dir.with_name(run_dir.name + "-call")),
        # CPU the server and log threads spent per update: what telemetry takes from a
        # machine whose cores are all busy (a box smaller than the work, like a CI runner).
        # Both threads count their own CPU (they publish it about once a loop).
        "thread_cpu_per_update_us": telemetry_cpu / on_updates * 1e6,
        "thread_cpu_pct": telemetry_cpu / on_updates / off * 100,
        "sysmem_us": _timeit(sysmem.sample, 2000),
        "stalled_dropped": stats.get("dropped_for_subscribers", 0),
        "ok": diff <= 0.01,
    }


def _thread_cpu(hub: Hub) -> float:
    """CPU seconds used so far by the hub's server and log threads (each counts its own)."""
    stats = hub.stats()
    return stats.get("server_cpu_s", 0.0) + stats.get("log_cpu_s", 0.0)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _timeit(fn: Callable[[], Any], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def _call_cost(run_dir: Path) -> float:
    """Microseconds the training thread spends in on_update itself (median of 5 x 2,000)."""
    hub = Hub(run_dir=run_dir, hello=synthetic.hello(), port=ANY_PORT).start()
    records = [synthetic.update(i) for i in range(2000)]
    costs = []
    try:
        for _ in range(5):
            t = time.perf_counter()
            for r in records:
                hub.on_update(r)
            costs.append((time.perf_counter() - t) / len(records) * 1e6)
            time.sleep(0.2)
    finally:
        hub.close()
    return statistics.median(costs)


# --- memory -----------------------------------------------------------------------------------


def memory(run_dir: Path, n: int) -> dict[str, Any]:
    """RSS while `n` updates go to a hub with one stalled and one reading subscriber."""
    hub = Hub(run_dir=run_dir, hello=synthetic.hello(), port=ANY_PORT).start()
    subs = Subscribers(hub, readers=1, stalled=1)
    samples = []
    try:
        warm = max(1, n // 10)
        for step in range(1, n + 1):
            hub.on_update(synthetic.update(step))
            if step % 500 == 0:
                hub.on_event(synthetic_event(step))
                time.sleep(0.002)  # about the pace the server keeps; the rest is dropped
            if step % warm == 0:
                gc.collect()
                samples.append(_rss())
        stats = hub.stats()
    finally:
        subs.close()
        hub.close()
    # Samples start after the first tenth; buffers and allocator pools fill during the first
    # half, so "flat" means the second half adds under 2% of the first sample.
    first, mid, last = samples[0], samples[len(samples) // 2], samples[-1]
    return {
        "updates": n,
        "rss_first_mib": first / MiB,
        "rss_mid_mib": mid / MiB,
        "rss_last_mib": last / MiB,
        "rss_max_mib": max(samples) / MiB,
        "growth_pct": (last - first) / first * 100,
        "second_half_growth_pct": (last - mid) / first * 100,
        "stalled_dropped": stats.get("dropped_for_subscribers", 0),
        "queue_dropped": stats.get("dropped_in_queue", 0),
        "log_dropped": stats.get("log_dropped", 0),
        "samples_mib": [round(x / MiB, 1) for x in samples],
        "ok": last - mid <= 0.02 * first,
    }


def synthetic_event(step: int) -> Event:
    return Event("sample", 0, step, data={"prompt": "once", "text": "upon a time " * 20})


# --- output -----------------------------------------------------------------------------------


def _print(results: dict[str, Any]) -> None:
    for mode, r in results.get("overhead", {}).items():
        print(
            f"overhead ({mode} work): median update {r['median_off_ms']:.2f} ms off, "
            f"{r['median_on_ms']:.2f} ms on ({r['median_diff_pct']:+.2f}%, "
            f"{r['updates_per_arm']} updates per arm); telemetry threads "
            f"{r['thread_cpu_per_update_us']:.0f} us CPU per update "
            f"({r['thread_cpu_pct']:.2f}%); on_update {r['on_update_us']:.1f} us, "
            f"sysmem.sample {r['sysmem_us']:.1f} us; stalled subscriber dropped "
            f"{r['stalled_dropped']} -> "
            + ("ok" if r["ok"] else "over 1% (worst case)" if mode == "gil-holding" else "OVER 1%")
        )
    if m := results.get("memory"):
        print(
            f"memory: {m['updates']} updates, RSS {m['rss_first_mib']:.1f} -> "
            f"{m['rss_mid_mib']:.1f} -> {m['rss_last_mib']:.1f} MiB (max {m['rss_max_mib']:.1f}, "
            f"{m['growth_pct']:+.1f}%, second half {m['second_half_growth_pct']:+.1f}%); "
            f"stalled subscriber dropped {m['stalled_dropped']} -> "
            f"{'flat' if m['ok'] else 'GROWING'}"
        )
    if f := results.get("fuzz"):
        print(
            f"fuzz: {f['inputs']} malformed inputs ({f['bytes_sent'] / MiB:.1f} MiB) in "
            f"{f['seconds']:.1f} s; {f['closed_on_error']} connections closed on error; "
            f"{f['serving_checks_passed']} serving checks passed; max on_update "
            f"{f['max_on_update_us']:.0f} us; commands reaching the run: "
            f"{f['commands_reached_run']}; server errors: {f['server_errors_logged']} -> "
            f"{'ok' if f['ok'] else 'FAILED'}"
        )


if __name__ == "__main__":
    sys.exit(main())
