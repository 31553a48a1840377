"""Kill checkpoint saves anywhere: how often does `--resume latest` then fail or lose one?

    python benchmarks/checkpoint_kills.py [--trials 200] [--kills 100] [--seed 0] [--json]

Each trial plays a random plan of saves and cuts it short once. The plan mixes new steps, the
same step saved again unchanged (a `stop` right after a periodic save), again with another
state (a rebalance while paused), an older step saved again with other bytes (a run resumed
from an older checkpoint) and, last, a save whose replicas disagreed; --keep-checkpoints is
0, 1 or 2. The cut is either

- inject (`--trials`): in this process, at a random file operation of the plan (rename,
  replace, symlink, unlink, rmdir, mkdir, fsync, safetensors write), by an exception that
  no `except OSError` catches, so nothing after that operation runs; or
- sigkill (`--kills`): a real SIGKILL of a child process playing the plan, at a random
  delay within the time the plan takes.

Then it recovers as `fleet train --resume latest` does (resolve, then clear_orphans) and
counts, per trial:

- failed resume: resolve raised, or clean-up then removed or broke what it chose;
- wrong resume: it took another checkpoint than the last save that returned or the one in
  flight (an update silently redone, or another run's timeline), or one whose replicas
  disagreed;
- checkpoints lost: steps that had a verified step folder at the instant of the kill, or
  were the last save that returned, and have no verified step folder after recovery;
- verified copies removed: other steps with a complete, verified copy under a temporary
  name at the kill (a save cut short after its files were whole) that recovery deleted.

Standalone: imports trainer.checkpoint.store (of this checkout) and mlx only. With PYTHONPATH set,
`trainer` comes from there instead: PYTHONPATH=<another checkout> measures another version
(the child processes inherit it). The first line printed names the catalog.py measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

if not os.environ.get("PYTHONPATH"):  # this checkout, not an installed copy; else as given
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402

from trainer.checkpoint import catalog, store  # noqa: E402

IDENT = {"architecture": {"d": 1}, "tokenizer": {}, "dataset": "x", "global_batch": {}}
OPS = ("rename", "replace", "symlink", "unlink", "rmdir", "mkdir", "fsync")
Save = tuple[int, str, bool]  # step, version (its state), replicas agree


# --- plans --------------------------------------------------------------------------------
def plan(rng: random.Random) -> tuple[list[Save], int]:
    """A random sequence of saves and the --keep-checkpoints it runs under."""
    saves: list[Save] = [(1, "a", True)]
    step, version = 1, "a"
    for n in range(rng.randint(3, 8)):
        kind = rng.choices(["new", "same", "changed", "older"], [5, 2, 2, 1])[0]
        if kind == "new":
            step, version = step + 1, "a"
        elif kind == "changed":
            version = f"b{n}"
        elif kind == "older" and step > 2:
            step, version = step - 2, f"r{n}"
        saves.append((step, version, True))
    if rng.random() < 0.3:  # the trainer stops after a disagreement: it can only come last
        saves.append((step + 1, "a", False))
    return saves, rng.choice([0, 1, 2])


def save(run: Path, entry: Save, keep: int, size: int) -> None:
    step, version, agree = entry
    store.save(
        run,
        step,
        params={"w": mx.full((size,), float(step))},
        optimizer_state={"m": mx.full((2 * size,), float(step)), "step": mx.array(step)},
        state={"step": step, "version": version},
        config={"keep": keep},
        identity={**IDENT, "replicas_agree": agree},
        keep=keep,
        make_latest=agree,
    )


# --- cutting short ------------------------------------------------------------------------
class Killed(BaseException):
    """A kill at a file operation: no `except OSError` (or Exception) swallows it."""


class Faults:
    """Counts file operations; raises Killed instead of performing the `at`-th (0: never)."""

    def __init__(self, at: int = 0) -> None:
        self.at, self.count, self.killed_at = at, 0, ""
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> Faults:
        targets = [(os, name) for name in OPS] + [(mx, "save_safetensors")]
        for mod, name in targets:
            real = getattr(mod, name)
            self._saved.append((mod, name, real))
            setattr(mod, name, self._wrap(name, real))
        return self

    def __exit__(self, *exc: object) -> None:
        for mod, name, real in self._saved:
            setattr(mod, name, real)

    def _wrap(self, name: str, real):
        def op(*args, **kwargs):
            self.count += 1
            if self.count == self.at:
                self.killed_at = name
                raise Killed(name)
            return real(*args, **kwargs)

        return op


def play(run: Path, saves: list[Save], keep: int, size: int, at: int = 0) -> tuple[int, Faults]:
    """Saves that returned before the kill at operation `at`, and the counter."""
    done = 0
    with Faults(at) as faults, contextlib.suppress(Killed):
        for entry in saves:
            save(run, entry, keep, size)
            done += 1
    return done, faults


def child(run: Path, seed: int, size: int) -> None:
    """The plan of `seed` in this process, one line per save that returned (for sigkill)."""
    saves, keep = plan(random.Random(seed))
    print("ready", flush=True)
    for entry in saves:
        save(run, entry, keep, size)
        print("done", flush=True)


# --- judging ------------------------------------------------------------------------------
def verified_steps(run: Path, *, named_only: bool = False) -> set[int]:
    """Steps with a folder that verifies: any folder, or only `step-NNNNNN` ones."""
    ckpts = catalog.root(run)
    found = set()
    for p in ckpts.iterdir() if ckpts.is_dir() else []:
        try:
            step = int(catalog.verify(p)["step"])
        except Exception:  # an older catalog.py may raise anything on a damaged manifest
            continue
        if not named_only or p.name == catalog.step_dir(run, step).name:
            found.add(step)
    return found


def judge(run: Path, saves: list[Save], done: int) -> dict[str, int]:
    """Recover as `fleet train --resume latest` does; what went wrong, counted."""
    returned = [s for s in saves[:done] if s[2]]
    flying = saves[done] if done < len(saves) and saves[done][2] else None
    allowed = {s[:2] for s in (returned[-1:] + [flying]) if s}
    before = verified_steps(run)
    # committed: a verified step folder in place, or the last save that returned
    committed = verified_steps(run, named_only=True) | {s[0] for s in returned[-1:]}
    if flying and flying[0] in before and returned and returned[-1][0] not in before:
        committed.discard(returned[-1][0])  # pruned while the newer one was being saved
    out = {"failed": 0, "wrong": 0, "lost": 0, "removed": 0}
    path = None
    try:
        path, manifest, _ = catalog.resolve(run, "latest")
        taken = (manifest["step"], catalog.read_json(path, catalog.STATE)["version"])
        if taken not in allowed or manifest.get("replicas_agree") is not True:
            out["wrong"] = 1
    except Exception:
        out["failed"] = int(bool(returned))
    with contextlib.suppress(Exception):
        catalog.clear_orphans(run)
    if path is not None:
        try:
            catalog.verify(path)
        except Exception:
            out["failed"] = 1
    after = verified_steps(run, named_only=True)
    out["lost"] = len(committed - after)
    out["removed"] = len(before - committed - after)
    return out


# --- trials -------------------------------------------------------------------------------
def inject_trial(rng: random.Random, scratch: Path, size: int) -> tuple[dict, str]:
    saves, keep = plan(rng)
    _, counter = play(scratch / "count", saves, keep, size)
    at = rng.randint(1, counter.count)
    run = scratch / "run"
    done, faults = play(run, saves, keep, size, at)
    return judge(run, saves, done), faults.killed_at


def sigkill_trial(seed: int, scratch: Path, size: int) -> tuple[dict, str]:
    saves, keep = plan(random.Random(seed))
    started = time.perf_counter()
    play(scratch / "time", saves, keep, size)
    span = time.perf_counter() - started
    run = scratch / "run"
    cmd = [sys.executable, __file__, "--child", str(run), str(seed), "--size", str(size)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(random.Random(seed).uniform(0, span))
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate()
    done = rest.count("done\n")
    return judge(run, saves, done), "finished first" if proc.returncode == 0 else "SIGKILL"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200, help="injected kills (0 = none)")
    ap.add_argument("--kills", type=int, default=100, help="SIGKILLed children (0 = none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", type=int, default=1 << 16, help="weights per checkpoint (fp32)")
    ap.add_argument("--json", action="store_true", help="one JSON object, no table")
    ap.add_argument("--child", nargs=2, metavar=("RUN", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(Path(args.child[0]), int(args.child[1]), args.size)
        return 0
    rng = random.Random(args.seed)
    rows = {}
    for mode, count in (("inject", args.trials), ("sigkill", args.kills)):
        if count <= 0:
            continue
        totals, where = Counter(failed=0, wrong=0, lost=0, removed=0), Counter()
        for n in range(count):
            scratch = Path(tempfile.mkdtemp(prefix="ckpt-kills-"))
            try:
                if mode == "inject":
                    result, at = inject_trial(rng, scratch, args.size)
                else:
                    result, at = sigkill_trial(args.seed * 100_003 + n, scratch, args.size)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            totals.update(result)
            where[at] += 1
        rows[mode] = {
            "trials": count,
            "failed_resumes": totals["failed"],
            "wrong_resumes": totals["wrong"],
            "checkpoints_lost": totals["lost"],
            "verified_copies_removed": totals["removed"],
            "cut_at": dict(sorted(where.items())),
        }
    report = {"checkpoint_py": store.__file__, "seed": args.seed, "modes": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"store.py: {store.__file__}  seed {args.seed}")
    print(f"{'mode':8} {'trials':>6} {'failed':>7} {'wrong':>6} {'lost':>5} {'removed':>8}  cut at")
    for mode, r in rows.items():
        cuts = ", ".join(f"{k} {v}" for k, v in r["cut_at"].items())
        print(
            f"{mode:8} {r['trials']:>6} {r['failed_resumes']:>7} {r['wrong_resumes']:>6} "
            f"{r['checkpoints_lost']:>5} {r['verified_copies_removed']:>8}  {cuts}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
