"""One rank of `fleet check`'s probe: join the group, time a tiny all-reduce, then each link.

`fleet check` (trainer/launch/check.py) starts these under mlx.launch and reads the line each
prints; the probe is a rank, so it lives on this side of the launcher.
"""

from __future__ import annotations

import json
import os
import time

import mlx.core as mx

from trainer.distributed import Cluster
from trainer.launch.check import PROBE_MARK


def probe_rank(nbytes: int) -> int:
    """One rank of the probe: join the group, time a tiny all-reduce, then each ring link."""
    c = Cluster()
    size = int(mx.distributed.all_sum(mx.ones((1,)), group=c.group).item())
    t0 = time.perf_counter()
    for _ in range(10):
        mx.eval(mx.distributed.all_sum(mx.zeros((1,)), group=c.group))
    latency = (time.perf_counter() - t0) / 10
    bandwidth, note = None, ""
    x = mx.zeros((nbytes // 4,), dtype=mx.float32)
    mx.eval(x)
    try:
        # One link at a time (rank k sends to k+1), so no two transfers share a wire.
        for k in range(c.size if c.size > 1 else 0):
            mx.eval(mx.distributed.all_sum(mx.zeros((1,)), group=c.group))  # line up
            if c.rank == k:
                for _ in range(3):
                    mx.eval(mx.distributed.send(x, (k + 1) % c.size, group=c.group))
            elif c.rank == (k + 1) % c.size:
                best = float("inf")
                for _ in range(3):  # the best of three: a busy moment is not a slow wire
                    t0 = time.perf_counter()
                    mx.eval(mx.distributed.recv_like(x, k, group=c.group))
                    best = min(best, time.perf_counter() - t0)
                bandwidth = nbytes / best
    except (RuntimeError, ValueError) as e:
        note = f"links not timed: {e}"
    row = {
        "rank": c.rank,
        "size": c.size,
        "group_sum": size,
        "backend": c.backend,
        "host": os.uname().nodename,
        "latency_s": latency,
        "in_link_Bps": bandwidth,
        "note": note,
    }
    print(PROBE_MARK + json.dumps(row), flush=True)
    return 0
