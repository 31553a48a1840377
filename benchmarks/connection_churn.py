"""What strangers' connections cost a live rank 0 (issue 19 item 5's figure).

    python benchmarks/connection_churn.py --connections 35000 --out /tmp/churn.json

Starts one real `fleet train` rank serving telemetry on loopback, lets its history fill,
then opens and closes `--connections` unauthenticated connections, `--concurrency` at a
time, in four kinds taken in turn: one that closes at once, one that reads its hello and
history and closes, one that sends garbage, one that starts a message it never finishes.
The rank's RSS is sampled before, every `--every` connections and after a quiet spell.
Not a test: the figure for benchmarks/RESULTS.md (memory is not disturbed by load).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.churn import KINDS, churn  # noqa: E402
from tests.support.fleet import fleet_env, free_port  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=35000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--every", type=int, default=5000)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--code",
        default="",
        help="a checkout whose fleet the rank runs (default: this one), e.g. an older commit "
        "exported with git archive, for the figure before a change",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-churn-"))
    port = free_port(2)
    rank = subprocess.Popen(
        [
            *(sys.executable, "-m", "fleet.cli", "train", "--synthetic", "--seq-len", "32"),
            *("--vocab", "256", "--depth", "2", "--width", "64", "--heads", "2"),
            *("--local-batch", "2", "--updates", "100000000", "--log-every", "100000"),
            *("--run-dir", str(tmp / "run"), "--telemetry-port-base", str(port)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**fleet_env(), "PYTHONPATH": args.code} if args.code else fleet_env(),
        cwd=args.code or None,
    )
    proc = psutil.Process(rank.pid)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert rank.poll() is None and time.monotonic() < deadline, rank.stderr.read()
                time.sleep(0.2)
        time.sleep(15)  # the history fills (256 updates), the allocator settles

        def rss() -> float:
            return round(proc.memory_info().rss / 2**20, 1)

        samples = [(0, rss())]
        t0 = time.monotonic()
        done = 0
        while done < args.connections:
            step = min(args.every, args.connections - done)
            churn(port, step, args.concurrency, done)
            done += step
            samples.append((done, rss()))
            print(f"{done} connections: rank RSS {samples[-1][1]} MiB", flush=True)
        churn_s = time.monotonic() - t0
        time.sleep(35)  # past the partial-message timeout: every stranger is gone
        settled = rss()
    finally:
        rank.terminate()
        try:
            rank.wait(30)
        except subprocess.TimeoutExpired:
            rank.kill()
    out = {
        "code": args.code or str(ROOT),
        "connections": args.connections,
        "concurrency": args.concurrency,
        "kinds": KINDS,
        "rss_mib": samples,
        "rss_settled_mib": settled,
        "growth_mib": round(settled - samples[0][1], 1),
        "peak_mib": max(s for _, s in samples),
        "churn_s": round(churn_s, 1),
    }
    print(json.dumps(out, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
