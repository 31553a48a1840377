"""Tensor parallelism against one rank and against data parallelism (issue 21's figures).

    python benchmarks/tensor_parallel.py --out benchmarks/results/tensor-parallel.json

On this machine's CPU over the ring backend (real ranks under `fleet launch`):
- equality: loss and weights after --updates updates, TP 2 and TP 4 against one rank;
- memory: each rank's resident weights + optimizer state (the `started` event's figure), TP 2
  and 4 against one rank, and each rank's peak over depths (the deepest model under a limit);
- cost: update time and the per-block collectives' time (probed) on 2 ranks, TP against data
  parallelism of the same global batch, in interleaved pairs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from telemetry.arrowlog import read_events, read_updates  # noqa: E402
from tests.support.fleet import launch_args, run_fleet  # noqa: E402
from trainer.checkpoint import catalog  # noqa: E402

MODEL = ["--width", "128", "--heads", "4", "--seed", "4", "--telemetry-port-base", "0"]


def train(data: Path, run: Path, n: int, *args: str) -> None:
    if n == 1:
        run_fleet("train", "--data", str(data), "--run-dir", str(run), *args, timeout=1800)
    else:
        run_fleet(*launch_args(n, data, run, *args), timeout=1800)


def weights(run: Path, step: int) -> dict[str, np.ndarray]:
    return {
        k: np.array(v)
        for k, v in mx.load(str(catalog.step_dir(run, step) / catalog.WEIGHTS)).items()
    }


def equality(data: Path, tmp: Path, updates: int) -> dict:
    common = [
        *MODEL,
        "--depth",
        "2",
        "--local-batch",
        "4",
        "--accum",
        "2",
        "--updates",
        str(updates),
    ]
    common += ["--checkpoint-every", str(updates)]
    train(data, tmp / "one", 1, *common)
    base_w, base_loss = weights(tmp / "one", updates), read_updates(tmp / "one")
    base_loss = np.array(base_loss.filter(pc.equal(base_loss["rank"], 0))["loss"].to_pylist())
    out = {}
    for n in (2, 4):
        run = tmp / f"tp{n}"
        train(data, run, n, *common, "--parallel", "tensor")
        w = weights(run, updates)
        t = read_updates(run)
        loss = np.array(t.filter(pc.equal(t["rank"], 0))["loss"].to_pylist())
        out[f"tp{n}"] = {
            "loss_max_rel": float(np.max(np.abs(loss - base_loss) / np.abs(base_loss))),
            "weights_max_norm_rel": max(
                float(np.linalg.norm(w[k] - base_w[k]) / np.linalg.norm(base_w[k])) for k in w
            ),
            "weights_max_elementwise_rel": max(
                float(np.max(np.abs(w[k] - base_w[k])) / np.max(np.abs(base_w[k]))) for k in w
            ),
        }
    return out


def started(run: Path) -> dict[int, dict]:
    return {e.rank: e.data for e in read_events(run) if e.kind == "started"}


def peaks(run: Path, field: str = "peak_mem") -> dict[int, int]:
    """Each rank's largest `field` over the run's updates (peak_mem, or live_mem: the live
    set, measured under a tight limit at the first update)."""
    t = read_updates(run)
    return {
        r: max(t.filter(pc.equal(t["rank"], r))[field].to_pylist())
        for r in set(t["rank"].to_pylist())
    }


def memory(data: Path, tmp: Path, depths: list[int], limit_mib: float) -> dict:
    resident, deepest = {}, {}
    for n in (1, 2, 4):
        fits = 0
        for depth in depths:
            run = tmp / f"mem{n}-{depth}"
            args = [*MODEL, "--depth", str(depth), "--local-batch", "2", "--updates", "2"]
            train(data, run, n, *args, *(["--parallel", "tensor"] if n > 1 else []))
            bytes_ = [started(run)[r]["resident_bytes"] for r in range(n)]
            peak, live = max(peaks(run).values()), max(peaks(run, "live_mem").values())
            resident.setdefault(n, {})[depth] = {
                "resident_bytes": bytes_,
                "peak_bytes": peak,
                "live_set_bytes": live,
            }
            if live <= limit_mib * 2**20:  # what must fit: a limit below it only serializes
                fits = depth
        deepest[n] = fits
    ratio = {
        n: max(v["resident_bytes"]) / resident[1][d]["resident_bytes"][0]
        for n in (2, 4)
        for d, v in resident[n].items()
        if d == depths[-1]
    }
    return {"resident": resident, "ratio_at_deepest": ratio, "deepest_under_limit": deepest,
            "limit_mib": limit_mib}  # fmt: skip


def cost(data: Path, tmp: Path, pairs: int, updates: int) -> dict:
    common = [*MODEL, "--depth", "4", "--accum", "2", "--updates", str(updates)]
    rows = {"data": [], "tensor": [], "collective_s": []}
    for i in range(pairs):  # interleaved: a pair shares the machine's mood
        for mode in ("data", "tensor"):
            run = tmp / f"cost-{mode}-{i}"
            split = ["--local-batch", "2"] if mode == "data" else ["--local-batch", "4"]
            train(data, run, 2, *common, *split, "--parallel", mode)
            t = read_updates(run)
            t = t.filter(pc.equal(t["rank"], 0))
            times = t["update_s"].to_pylist()[2:]  # the first updates compile
            rows[mode].append(statistics.median(times))
            if mode == "tensor":
                rows["collective_s"].append(statistics.median(t["collective_s"].to_pylist()))
    return {
        "update_s_data": rows["data"],
        "update_s_tensor": rows["tensor"],
        "collective_s_tensor": rows["collective_s"],
        "tensor_over_data": [t / d for t, d in zip(rows["tensor"], rows["data"], strict=True)],
    }


# Links between two Macs, for the model below. Bandwidth of RDMA over Thunderbolt 5: the
# ~7.6 GB/s per rank that PyTorch's TCCL pull request (#189856) measured for fp32 all-reduce;
# its small-message latency is ~56x below TCP's, which we take as 10 us against ~0.5 ms.
# TCP over Thunderbolt IP or 10 GbE (the ring backend): assumptions, not measurements.
LINKS = {
    "thunderbolt5-rdma (jaccl)": {"latency_s": 10e-6, "bytes_per_s": 7.6e9},
    "thunderbolt-ip (ring)": {"latency_s": 500e-6, "bytes_per_s": 2.5e9},
    "10 GbE (ring)": {"latency_s": 500e-6, "bytes_per_s": 1.1e9},
}


def link_model(depth: int, width: int, rows: int, seq: int, n: int, dtype_bytes: int) -> dict:
    """The per-block collectives of one microstep over each of LINKS: in the forward pass an
    all_sum of the activations after attention and after the MLP of every block, and one after
    the embedding; in the backward pass one for the input gradient of q, k, v together and one
    for the MLP's, per block, and one for the head's input; three of one float per token for
    the vocabulary-parallel loss. A ring all-reduce moves 2 (n-1)/n of a message per rank."""
    big = (4 * depth + 2, rows * seq * width * dtype_bytes)
    small = (3, rows * seq * 4)
    out = {"collectives": big[0] + small[0], "bytes_each": big[1]}
    for name, link in LINKS.items():
        t = sum(
            count * (link["latency_s"] + size * 2 * (n - 1) / n / link["bytes_per_s"])
            for count, size in (big, small)
        )
        out[name] = t
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=10, help="updates for the equality check")
    parser.add_argument("--depths", default="2,4,8,12", help="depths for the memory sweep")
    parser.add_argument("--limit-mib", type=float, default=64.0, help="the memory limit (MiB)")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs for the cost")
    parser.add_argument("--only", choices=("equality", "memory", "cost"), help="one part")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = tmp / "data"
        run_fleet("prepare", "--stdlib", "--max-files", "40", "--seq-len", "64", "--out", str(data))
        out = {}
        if args.only in (None, "equality"):
            out["equality"] = equality(data, tmp, args.updates)
        if args.only in (None, "memory"):
            out["memory"] = memory(
                data, tmp, [int(d) for d in args.depths.split(",")], args.limit_mib
            )
        if args.only in (None, "cost"):
            out["cost"] = cost(data, tmp, args.pairs, 12)
        # The same microstep between two Macs, at the cost run's size and at issue 12's
        # (depth 12, width 768, 4 rows of 1024 tokens, bf16): seconds of collectives.
        out["link_model"] = {
            "cost_run": link_model(4, 128, 4, 64, 2, 4),
            "depth12_width768_4x1024_bf16": link_model(12, 768, 4, 1024, 2, 2),
        }
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
