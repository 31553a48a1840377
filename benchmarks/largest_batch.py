"""The largest local batch whose update peaks under a memory limit, by a short search.

    python benchmarks/largest_batch.py --memory-limit-gb 16 --start 16 -- \
        --depth 12 --width 768 --heads 12 --vocab 32768 --seq-len 1024 --precision mixed

Arguments after `--` go to every `fleet bench throughput` run (each in a fresh process, peak
active memory as MLX counts it). An update's peak is close to linear in the batch (weights and
optimizer state, plus activations per sample), so two measured batches predict the boundary;
the search then measures around the prediction until it has a batch that fits beside one that
does not (or reaches --max). Prints one JSON object: every batch measured, its peak, and the
largest that fits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from telemetry.units import GiB


def peak_of(batch: int, limit_gb: float, flags: list[str], cache: dict[int, int]) -> int:
    """The update's peak bytes at `batch` (measured once per batch)."""
    if batch not in cache:
        cmd = [sys.executable, "-m", "fleet.cli", "bench", "throughput", *flags]
        cmd += ["--local-batch", str(batch), "--memory-limit-gb", str(limit_gb)]
        cmd += ["--updates", "2", "--warmup", "1", "--no-breakdown", "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:  # an out-of-memory failure counts as not fitting
            print(f"batch {batch}: failed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
            cache[batch] = 1 << 62
        else:
            cache[batch] = json.loads(proc.stdout)["peak_bytes"]
        print(f"batch {batch}: peak {cache[batch] / GiB:.2f} GiB", file=sys.stderr, flush=True)
    return cache[batch]


def search(limit_gb: float, start: int, top: int, flags: list[str]) -> dict:
    """Predict the boundary from two batches, then gallop and bisect to it."""
    limit, cache = limit_gb * GiB, {}
    low = max(1, start // 2)
    a, b = peak_of(low, limit_gb, flags, cache), peak_of(start, limit_gb, flags, cache)
    per_sample = max(1.0, (b - a) / max(1, start - low))
    n = max(1, min(top, int(low + (limit - a) / per_sample)))
    lo, hi = 0, top + 1  # the largest batch known to fit, the smallest known not to
    for batch, peak in cache.items():
        lo, hi = (max(lo, batch), hi) if peak <= limit else (lo, min(hi, batch))
    step, direction = 1, 0  # gallop away from the guess until the boundary is crossed
    while hi - lo > 1:
        n = min(max(n, lo + 1), hi - 1)
        fits = peak_of(n, limit_gb, flags, cache) <= limit
        lo, hi = (n, hi) if fits else (lo, n)
        toward = 1 if fits else -1
        if direction is None or (direction and toward != direction):
            direction, n = None, (lo + hi) // 2  # crossed: bisect what is left
        else:
            direction, n, step = toward, n + toward * step, 2 * step
    return {
        "memory_limit_gb": limit_gb,
        "flags": flags,
        "per_sample_bytes": per_sample,
        "peaks": {str(k): v for k, v in sorted(cache.items())},
        "largest": lo,
        "peak_at_largest": cache.get(lo),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--memory-limit-gb", type=float, default=16.0)
    p.add_argument("--start", type=int, default=16, help="a batch known to run")
    p.add_argument("--max", type=int, default=512, help="search no higher")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="-- then fleet bench throughput flags")
    a = p.parse_args()
    flags = a.flags[1:] if a.flags[:1] == ["--"] else a.flags
    print(json.dumps(search(a.memory_limit_gb, a.start, a.max, flags)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
