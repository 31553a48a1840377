"""A sweep killed with SIGKILL at random moments, then resumed each time: trials lost or
repeated (goal: none lost, at most the one in flight redone per kill).

    python benchmarks/sweep_kills.py --out /tmp/fleet-sweep-kills              # 10 kills
    python benchmarks/sweep_kills.py --out /tmp/fleet-sweep-kills --kills 3 --trials 4

Each kill is a SIGKILL at a random moment (uniform over --min-s..--max-s after the start):
odd kills end only the controller (its trial goes on, an orphan the next controller must end),
even kills end the controller and every trial process too (a crash of the machine). Then
`fleet sweep SPEC --resume`. After the last kill the sweep is resumed to its end, and the
study is checked against what the spec asks for:

- lost: a search trial or a re-run that is missing, or failed (a kill must never fail one);
- repeated: a trial started again from nothing (its folder renamed `.restart-...`), counted
  against the kills; a trial resumed from a checkpoint redoes at most one evaluation's work;
- extra: trials beyond the spec's (a trial asked twice for one slot).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SPEC = """
name = "kills"
sampler = "tpe"
sampler_seed = 3
startup_trials = 3
trials = {trials}

[train]
data = "{data}"
depth = 1
width = 32
local_batch = 8
eval_samples = 64
device = "cpu"

[search]
lr = {{ low = 3e-4, high = 3e-2, log = true }}

[budget]
tokens = {tokens}
evals = 5

[champion]
top_k = 1
seeds = [1]
"""


def start(argv: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fleet.cli", *argv],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill(proc: subprocess.Popen, everything: bool) -> int:
    """SIGKILL the controller (and, with `everything`, every trial process it started)."""
    victims = [proc.pid]
    if everything:
        with contextlib.suppress(psutil.NoSuchProcess):
            victims += [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    return len(victims)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--updates", type=int, default=100, help="the budget, in updates")
    p.add_argument("--min-s", type=float, default=4.0)
    p.add_argument("--max-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    a.out.mkdir(parents=True, exist_ok=True)
    data, folder = a.out / "data", a.out / "sweep"
    if not (data / "dataset.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "fleet.cli", "prepare", "--stdlib", "--max-files", "60",
             "--seq-len", "64", "--out", str(data), "--quiet"],
            cwd=ROOT, check=True,
        )  # fmt: skip
    spec = a.out / "kills.toml"
    spec.write_text(SPEC.format(trials=a.trials, data=data, tokens=a.updates * 8 * 64))
    log_path = a.out / "controller.log"
    kills, started = [], time.perf_counter()
    with open(log_path, "w") as log:
        for k in range(a.kills):
            argv = ["sweep", str(spec), "--out", str(folder)] + (["--resume"] if k else [])
            proc = start(argv, log)
            wait = rng.uniform(a.min_s, a.max_s)
            time.sleep(wait)
            if proc.poll() is not None:
                kills.append({"kill": k + 1, "after_s": round(wait, 1), "note": "ended first"})
                break
            everything = k % 2 == 1
            n = kill(proc, everything)
            kills.append(
                {"kill": k + 1, "after_s": round(wait, 1), "what": "all" if everything else
                 "controller", "processes": n}
            )  # fmt: skip
            print(f"sweep_kills: kill {k + 1} after {wait:.1f} s ({n} process(es))", flush=True)
        proc = start(["sweep", str(spec), "--out", str(folder), "--resume"], log)
        code = proc.wait(timeout=7200)
    wall = time.perf_counter() - started

    from trainer.sweep import report

    s = report.open_sweep(folder)
    text = log_path.read_text()
    search = [t for t in s.trials if t.user_attrs.get("role", "search") == "search"]
    reruns = [t for t in s.trials if t.user_attrs.get("role") == "confirm"]
    failed = [t.number for t in s.trials if t.state.name == "FAIL"]
    unfinished = [t.number for t in s.trials if t.state.name in ("RUNNING", "WAITING")]
    restarts = sorted(p.name for p in (folder / "trials").glob("*.restart-*"))
    resumed = re.findall(r"trial (\d+) \([^)]*\): resumed from (step-\d+)", text)
    result = {
        "command": " ".join(sys.argv),
        "kills": kills,
        "final_exit": code,
        "wall_s": round(wall, 1),
        "search_trials": len(search),
        "asked_for": a.trials,
        "reruns": len(reruns),
        "states": {t.number: t.state.name for t in s.trials},
        "failed": failed,
        "unfinished": unfinished,
        "lost": len(failed) + len(unfinished) + max(0, a.trials - len(search)),
        "extra": max(0, len(search) - a.trials),
        "restarted_from_nothing": restarts,
        "resumed_from_checkpoint": resumed,
        "orphans_ended": len(re.findall(r"ended the process the last controller left", text)),
    }
    (a.out / "sweep_kills.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "states"}, indent=2))
    return 0 if result["lost"] == 0 and code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
