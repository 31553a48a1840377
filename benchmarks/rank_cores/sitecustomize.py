"""Pins a local rank to its own core as its interpreter starts (benchmarks/autopilot.py's runs).

A fleet's ranks each have a Mac of their own; local ranks share this machine's cores, and a rank
that waits in MLX's ring all-reduce spins its socket threads on the cores where its peers
compute (mlx/distributed/ring/ring.cpp polls a non-blocking socket). Pinned here, before any
thread exists (threads inherit it), rank r keeps to the r-th set of FLEET_BENCH_RANK_CORES
("0;1": rank 0 on core 0, rank 1 on core 1; "0,1;2,3": two cores each), its rank read from
MLX_RANK, which mlx.launch sets. A process without both (the launchers) is left alone.

Python imports the first `sitecustomize` on its path: this one shadows any other (Debian's),
which only the benchmark's ranks and launchers then go without.
"""

import os
import sys

_sets, _rank = os.environ.get("FLEET_BENCH_RANK_CORES"), os.environ.get("MLX_RANK")
if _sets and _rank is not None and hasattr(os, "sched_setaffinity"):
    try:
        _chosen = _sets.split(";")[int(_rank) % len(_sets.split(";"))]
        os.sched_setaffinity(0, {int(c) for c in _chosen.split(",")})
    except (OSError, ValueError) as e:  # a core it may not use, a rank unread: run unpinned
        print(f"rank_cores: rank {_rank} not pinned ({_sets}): {e}", file=sys.stderr)
