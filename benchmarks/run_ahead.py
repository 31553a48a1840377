"""How far MLX's CUDA stream runs ahead, against the memory limit: peak, live set and speed.

    python benchmarks/run_ahead.py --out OUT                  # issue 12's configuration, GPU
    python benchmarks/run_ahead.py --out OUT --tiny --device cpu   # the logic, tiny, CPU

Why (MLX 0.32, mlx/backend/cuda/device.cpp, mlx/transforms.cpp): without CUDA graphs (the
product's default) the stream commits its kernels every MLX_MAX_OPS_PER_BUFFER of them (100
on an H100/H200), and every input of a committed batch stays alive until the whole batch has
run; up to ten batches run ahead. So the dead memory a peak holds scales with the ops a batch
takes. A memory limit bounds it another way: past the limit, `eval` commits what it holds
and waits for batches to finish, until active memory is below the limit again (all of them,
when what is live alone passes it), and the GPU idles meanwhile.

One child process per value of --ops (MLX reads the variable once): the trainer's update
(bench.update.synthetic_stepper, the defaults: mixed, the flat step, fused-qkv attention on
CUDA), compiled, its live set measured (one update under a tight limit), then --rounds rounds
of --updates updates under each limit arm (none, and the live set + each --headroom), each
with --overlap off and/or on (the next update's first microstep built while this one's step
runs), the arms' order turned each round. A value given twice (the first and the last) bounds
drift.
Writes OUT/run-ahead.json (each child's figures) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpu_speed import FULL, TINY  # issue 12's configuration, and the tiny one

HERE = Path(__file__).resolve().parent
GiB = 2**30


def child(a: argparse.Namespace) -> dict:
    sys.path.insert(0, str(HERE.parent))
    from trainer import cuda_graphs

    graphs = cuda_graphs.apply("auto")  # as the trainer: before MLX's first kernel
    import mlx.core as mx

    from bench.update import synthetic_stepper
    from trainer.data.dataset import SyntheticStream

    mx.set_default_device(mx.cpu if a.device == "cpu" else mx.gpu)
    cfg = TINY if a.tiny else FULL
    sizes = {k: v for k, v in cfg.items() if k != "local_batch"}
    _, _, stepper = synthetic_stepper(**sizes, precision=a.precision)
    B, T = cfg["local_batch"], cfg["seq_len"]
    stream = SyntheticStream(cfg["vocab"], T, 0)
    counter = [0]

    def batch(i: int) -> mx.array:
        return mx.array(stream.batch(i * B, B, 0, B))

    def updates(n: int) -> dict:
        ups, peak = [], 0
        for _ in range(n):
            i = counter[0]
            counter[0] += 1
            # keyed and ahead as train()'s loop: with overlap on, update i + 1's microstep
            # starts behind update i's step (an arm's first update builds its own)
            ahead = lambda i=i: (i + 1, batch(i + 1))  # noqa: E731
            ups.append(stepper.update([batch(i)], 1e-4, key=i, ahead=ahead))
            peak = max(peak, mx.get_peak_memory())  # the update resets the peak at its start
        med = statistics.median(u.update_s for u in ups)
        return {
            "tokens_per_s": B * T / med,
            "update_ms": 1e3 * med,
            "compute_ms": 1e3 * statistics.median(u.compute_s for u in ups),
            "optimizer_ms": 1e3 * statistics.median(u.optimizer_s for u in ups),
            "peak_bytes": peak,
        }

    default_limit = mx.get_memory_limit()
    t0 = time.monotonic()
    updates(a.warmup)  # compiles
    compile_s = time.monotonic() - t0
    mx.set_memory_limit(1)  # tight: eval waits after every batch, so the peak is the live set
    live = updates(1)["peak_bytes"]
    limits = {"none": default_limit}
    limits.update({f"live+{h:g}%": int(live * (1 + h / 100)) for h in a.headroom})
    arms = {  # each limit with the overlap off and on
        f"{name}{'' if o == 'off' else ' overlap'}": (value, o == "on")
        for name, value in limits.items()
        for o in a.overlap
    }
    rounds: dict[str, list] = {name: [] for name in arms}
    names = list(arms)
    for r in range(a.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            limit, stepper.overlap = arms[name]
            mx.set_memory_limit(limit)
            rounds[name].append(updates(a.updates))
    mx.set_memory_limit(default_limit)
    return {
        "ops_per_buffer": os.environ.get("MLX_MAX_OPS_PER_BUFFER", "MLX's"),
        "cuda_graphs": graphs,
        "device": str(mx.default_device()),
        "mlx": mx.__version__,
        "config": {**cfg, "precision": a.precision},
        "compile_s": compile_s,
        "live_bytes": live,
        "limits": limits,
        "rounds": rounds,
    }


def summarize(children: list[dict]) -> dict:
    """Each (ops, arm): median tokens/s, its ratio to the first child's no-limit arm in the
    same round, and the peak over the live set."""
    first = children[0]["rounds"]
    base = first[next(iter(first))]  # the first child's first arm: no limit (overlap off)
    rows = []
    for c in children:
        for arm, rounds in c["rounds"].items():
            pairs = zip(rounds, base, strict=False)
            ratios = [x["tokens_per_s"] / b["tokens_per_s"] for x, b in pairs]
            rows.append(
                {
                    "ops_per_buffer": c["ops_per_buffer"],
                    "arm": arm,
                    "tokens_per_s": statistics.median(x["tokens_per_s"] for x in rounds),
                    "over_first_unlimited": ratios,
                    "peak_over_live": max(x["peak_bytes"] for x in rounds) / c["live_bytes"],
                    "peak_gib": max(x["peak_bytes"] for x in rounds) / GiB,
                    "live_gib": c["live_bytes"] / GiB,
                    "optimizer_ms": statistics.median(x["optimizer_ms"] for x in rounds),
                    "compute_ms": statistics.median(x["compute_ms"] for x in rounds),
                }
            )
    return {"rows": rows}


def table(summary: dict) -> str:
    out = [
        "ops  arm                tok/s     x first arm (rounds)      peak/live  peak GiB"
        "  live GiB  compute ms  optimizer ms"
    ]
    for r in summary["rows"]:
        ratios = " ".join(f"{x:.3f}" for x in r["over_first_unlimited"])
        out.append(
            f"{r['ops_per_buffer']:>4} {r['arm']:<17}{r['tokens_per_s']:>10,.0f}   {ratios:<26}"
            f"{r['peak_over_live']:>8.3f}{r['peak_gib']:>10.2f}{r['live_gib']:>10.2f}"
            f"{r['compute_ms']:>12.2f}{r['optimizer_ms']:>14.2f}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="/tmp/fleet-run-ahead")
    p.add_argument("--ops", default="100,30,10,100", help="MLX_MAX_OPS_PER_BUFFER, one child each")
    p.add_argument("--headroom", default="5,10,25", help="limit arms: the live set + these %%")
    p.add_argument("--overlap", default="off", help="off, on or off,on: the arms' --overlap")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--updates", type=int, default=12, help="timed updates per arm and round")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precision", default="mixed", choices=("fp32", "bf16", "mixed"))
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--timeout-s", type=float, default=180.0, help="per child")
    a = p.parse_args(argv)
    a.headroom = [float(h) for h in str(a.headroom).split(",") if h]
    a.overlap = [o for o in str(a.overlap).split(",") if o]
    if not a.overlap or set(a.overlap) - {"off", "on"}:
        p.error(f"--overlap: off, on or off,on, got {','.join(a.overlap)!r}")
    if a.child:
        print(json.dumps(child(a)))
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    passed = [f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("rounds", "updates", "warmup")]
    passed += [f"--precision={a.precision}", f"--device={a.device}"]
    passed += [f"--headroom={','.join(f'{h:g}' for h in a.headroom)}"] + (["--tiny"] * a.tiny)
    passed += [f"--overlap={','.join(a.overlap)}"]
    children, errors = [], []
    for ops in a.ops.split(","):
        env = {**os.environ, "MLX_MAX_OPS_PER_BUFFER": ops}
        print(f"== {time.strftime('%H:%M:%S')} ops per buffer {ops}", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--child", *passed]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout_s)
            children.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as e:
            tail = getattr(e, "stderr", None) or (proc.stderr if "proc" in locals() else "")
            errors.append(f"ops {ops}: {type(e).__name__}: {str(tail)[-1500:]}")
            print(errors[-1], file=sys.stderr)
        result = {"children": children, "errors": errors, "command": " ".join(sys.argv)}
        if children:
            result["summary"] = summarize(children)
        (out / "run-ahead.json").write_text(json.dumps(result, indent=1) + "\n")
    if children:
        text = table(result["summary"])
        (out / "run-ahead.log").write_text(text + "\n")
        print(text)
    return 0 if children and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
