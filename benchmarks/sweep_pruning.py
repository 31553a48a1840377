"""A real sweep on this machine, with and without pruning: wall time, what was pruned and when,
the champion and its spread over seeds, and whether pruning changed it.

    python benchmarks/sweep_pruning.py --out /tmp/fleet-sweeps            # 12 trials, lr x wd
    python benchmarks/sweep_pruning.py --out /tmp/fleet-sweeps --trials 4 --updates 50

Both sweeps draw the same trials (Optuna's random sampler, the same seed), so the only
difference is the pruner: `median` after the default warm-up (half the budget) against
`none`. Each re-runs its top 3 on 2 new seeds. Tiny models on the CPU, one rank per trial, the
standard library corpus (`fleet prepare --stdlib`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = """
name = "{name}"
sampler = "random"
sampler_seed = 7
trials = {trials}

[train]
data = "{data}"
depth = {depth}
width = {width}
local_batch = {batch}
eval_samples = 0
device = "cpu"

[search]
lr = {{ low = 3e-4, high = 3e-2, log = true }}
weight_decay = {{ low = 0.0, high = 0.3 }}

[budget]
tokens = {tokens}
evals = {evals}

[prune]
rule = "{rule}"

[champion]
top_k = 3
seeds = [1, 2]
"""


def fleet(*args: str, timeout: float = 7200) -> tuple[str, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "fleet.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        sys.exit(f"sweep_pruning: fleet {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout, time.perf_counter() - start


def sweep(a: argparse.Namespace, rule: str) -> dict:
    name = f"lr-wd-{rule}"
    spec = a.out / f"{name}.toml"
    tokens = a.updates * a.batch * a.seq_len
    spec.write_text(
        SPEC.format(
            name=name, trials=a.trials, data=a.out / "data", depth=a.depth, width=a.width,
            batch=a.batch, tokens=tokens, evals=a.evals, rule=rule,
        )
    )  # fmt: skip
    folder = a.out / name
    out, wall = fleet("sweep", str(spec), "--out", str(folder))
    from trainer.sweep import report

    s = report.open_sweep(folder)
    data = report.summary(s)
    search = [r for r in data["trials"] if r["role"] == "search"]
    from trainer.sweep import metric

    # Updates trained, read from each trial's log: the time saved, free of this box's load.
    trained = [metric.progress(folder / "trials" / f"{r['trial']:04d}").step for r in search]
    champ = next(c for c in data["candidates"] if c["trial"] == data["champion"])
    return {
        "rule": rule,
        "wall_s": round(wall, 1),
        "trial_s": [round(r["run_s"] or 0, 1) for r in data["trials"]],
        "search_updates": trained,
        "search_updates_total": sum(trained),
        "pruned": [
            {"trial": r["trial"], "at": r["last_at"], "why": r["ended"]}
            for r in search
            if r["state"] == "PRUNED"
        ],
        "finished": sum(r["state"] == "COMPLETE" for r in search),
        "champion": {
            "trial": champ["trial"],
            "params": champ["params"],
            "seeds": champ["seeds"],
            "values": champ["values"],
            "mean": champ["mean"],
            "min": champ["min"],
            "max": champ["max"],
            "sd": champ["sd"],
        },
        "candidates": data["candidates"],
        "report": report.render(data),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--max-files", type=int, default=200)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--updates", type=int, default=200, help="the budget, in updates")
    p.add_argument("--evals", type=int, default=8)
    p.add_argument("--rules", default="median,none")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not (a.out / "data" / "dataset.json").is_file():
        fleet(
            "prepare", "--stdlib", "--max-files", str(a.max_files), "--seq-len", str(a.seq_len),
            "--out", str(a.out / "data"), "--quiet",
        )  # fmt: skip
    results = []
    for rule in a.rules.split(","):
        results.append(sweep(a, rule))
        r = results[-1]
        print(
            f"sweep_pruning: {rule}: {r['wall_s']:.0f} s, {len(r['pruned'])} pruned, champion "
            f"trial {r['champion']['trial']} {r['champion']['mean']:.4f}",
            flush=True,
        )
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}
    out = {"config": config, "command": " ".join(sys.argv), "results": results}
    (a.out / "sweep_pruning.json").write_text(json.dumps(out, indent=2) + "\n")
    for r in results:
        print(f"\n## prune rule {r['rule']}: {r['wall_s']:.0f} s\n{r['report']}")
    print(f"(JSON: {a.out / 'sweep_pruning.json'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
