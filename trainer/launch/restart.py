"""What `fleet launch --restarts N` does between two attempts: decide whether to go on, which
hosts are left (`--allow-shrink`), the split that keeps the global batch, and the rank's new
command line (resume from the newest verified checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from telemetry import balance
from telemetry.arrowlog import read_updates
from trainer import heartbeat
from trainer.checkpoint import catalog

WINDOW = 20  # recent updates per rank that the balancer fits a shrunk split from


@dataclass(frozen=True)
class Failure:
    """How an attempt ended, compared between attempts: the same failure twice at the same
    update is not bad luck, and restarting again would only repeat it."""

    rank: int
    how: str
    step: int

    def describe(self) -> str:
        when = f"after update {self.step}" if self.step > 0 else "before its first update"
        return f"rank {self.rank} {self.how} {when}"


def failure_of(rank: int, how: str, run_dir: str | Path | None, saved_after: int = 0) -> Failure:
    """The attempt's first failure, after the furthest update any rank's heartbeat reached,
    or the attempt saved (a save with a serial above `saved_after`): a heartbeat is written
    about once a second, so it can lag a fast run by several updates."""
    if run_dir is None:
        return Failure(rank, how, -1)
    beats = heartbeat.read_all(run_dir)
    step = max((b.step for b in beats.values()), default=-1)
    return Failure(rank, how, max(step, catalog.last_saved_step(run_dir, saved_after)))


def backoff(restart: int, base: float) -> float:
    """Seconds to wait before restart number `restart` (1, 2, ...): doubling, at most 5 min."""
    return min(300.0, base * 2 ** (restart - 1))


def reachable(host: str, timeout: float = 10.0) -> bool:
    """Whether ssh reaches `host` now (host keys verified, never a prompt)."""
    try:
        out = subprocess.run(
            ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout:g}", host, "true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout + 5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


def shrunk_split(split: list[int], keep: list[int], run_dir: str | Path | None) -> list[int]:
    """A split of the same global batch over the ranks in `keep` (old rank numbers).

    The balancer proposes it from each kept rank's measured compute and memory, within its
    memory cap; without enough measurements, the lost ranks' samples are spread over the
    others in proportion to what they already took.
    """
    total = sum(split)
    if len(keep) > total:
        raise balance.BalanceError(
            f"{len(keep)} ranks cannot share a global batch of {total} (each needs a sample)"
        )
    if run_dir is not None:
        try:
            samples = []
            for r in keep:
                rows = read_updates(run_dir, r).to_pylist()[-WINDOW:]
                samples.append(
                    [
                        balance.RankSample(
                            u["local_batch"], u["compute_s"], u["peak_mem"], u.get("mem_total")
                        )
                        for u in rows
                    ]
                )
            models = balance.fit(samples)
            if all(m.confident for m in models):
                return balance.propose(models, total).split
        except (balance.BalanceError, OSError, ValueError, KeyError):
            pass
    # Proportional fallback: largest remainders, every rank at least one sample.
    kept = [split[r] for r in keep]
    shares = [total * b / sum(kept) for b in kept]
    out = [max(1, int(s)) for s in shares]
    order = sorted(range(len(out)), key=lambda i: shares[i] - int(shares[i]), reverse=True)
    i = 0
    while sum(out) != total:
        j = order[i % len(out)]
        if sum(out) < total:
            out[j] += 1
        elif out[j] > 1:
            out[j] -= 1
        i += 1
    return out


# Flags of `fleet train` a relaunch replaces (with their value), and their one-token forms.
_REPLACED = ("--resume", "--local-batches", "--local-batch")
# Flags without a value it drops: a relaunch continues its own run folder, never moves it.
_DROPPED = ("--overwrite", "--no-overwrite")


def relaunch_command(command: list[str], run_dir: str | Path, split: list[int]) -> list[str]:
    """The rank's command for the next attempt: resume from the newest verified checkpoint
    (or start over if the run never saved one), with this split."""
    out, skip = [], False
    for arg in command:
        if skip:
            skip = False
            continue
        if arg in _DROPPED:
            continue
        if arg in _REPLACED:
            skip = True
            continue
        if arg.startswith(tuple(f"{f}=" for f in _REPLACED)):
            continue
        out.append(arg)
    try:
        catalog.resolve(run_dir, catalog.LATEST)
        out += ["--resume", catalog.LATEST]
    except catalog.CheckpointError:
        pass  # nothing saved yet: the attempt starts from the beginning
    return [*out, "--local-batches", ",".join(map(str, split))]


def restart_env(attempt: int, reason: str, old: list[int], new: list[int]) -> str:
    """FLEET_RESTART for the ranks of a relaunch: rank 0 logs it as a `restarted` event."""
    return json.dumps({"attempt": attempt, "reason": reason, "from": old, "to": new})


def restart_record() -> dict | None:
    """This rank's restart, when `fleet launch` relaunched it (FLEET_RESTART), else None."""
    raw = os.environ.get("FLEET_RESTART")
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
