"""Copy every rank's telemetry logs of a multi-host run to one local folder, over SFTP.

Each rank writes its Arrow logs into the run folder on its own host, so `fleet report` and
`fleet console --replay` on one machine see only that machine's ranks. `gather` fetches rank r's
logs from rank r's host (and the run's config.json from rank 0's) into DEST/telemetry, where
both commands read them. Logs only grow, so a file whose size is unchanged is not fetched
again; each file arrives whole or not at all. The control key is never copied.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from console.hostfile import RankTarget
from console.ssh import SSHError, SSHPool
from telemetry import rundir
from telemetry.units import MiB

# Any segment of a rank's update or event log, as telemetry.arrowlog names them
# (update_stem, event_stem): rank-3.arrow, rank-3.1.arrow, events-rank-3.arrow, ...
LOG_NAME = re.compile(r"^(?:events-)?rank-(\d+)(?:\.\d+)?\.arrow$")
MARKER = "gathered.json"  # what DEST holds and where it came from


class GatherError(Exception):
    """DEST cannot take the logs (it holds something else)."""


@dataclass(frozen=True)
class Copied:
    rank: int
    host: str
    name: str
    size: int
    fetched: bool  # False: the local copy already had this size


def check_dest(dest: Path) -> None:
    """DEST must be new, empty, or an earlier gather's folder (never a live run's own)."""
    if dest.exists() and not dest.is_dir():
        raise GatherError(f"{dest} exists and is not a folder")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / MARKER).exists():
        raise GatherError(
            f"{dest} already holds files that no gather put there (a run folder?); "
            "give a new or empty folder"
        )


def gather(
    pool: SSHPool,
    targets: Sequence[RankTarget],
    run_dir: str,
    dest: Path,
    say: Callable[[str], None] = lambda _: None,
) -> tuple[list[Copied], list[str]]:
    """Fetch each rank's logs from its host; returns what was copied and the problems met."""
    check_dest(dest)
    here, remote = rundir.at(dest), rundir.at(PurePosixPath(run_dir))
    here.telemetry.mkdir(parents=True, exist_ok=True)
    remote_logs = str(remote.telemetry)
    hosts: dict[str, list[int]] = {}
    for t in targets:
        hosts.setdefault(t.host, []).append(t.rank)
    copied: list[Copied] = []
    problems: list[str] = []
    for host, ranks in hosts.items():
        try:
            listing = pool.list_dir(host, remote_logs)
        except (SSHError, OSError) as e:
            problems.append(f"{host} (ranks {_ranks(ranks)}): {e}")
            continue
        mine = {
            name: size
            for name, size in sorted(listing.items())
            if (m := LOG_NAME.match(name)) and int(m.group(1)) in ranks
        }
        missing = [r for r in ranks if not any(_rank_of(n) == r for n in mine)]
        if missing:
            problems.append(f"{host}:{remote_logs} holds no logs of ranks {_ranks(missing)}")
        for name, size in mine.items():
            local = here.telemetry / name
            rank = _rank_of(name)
            if local.exists() and local.stat().st_size == size:
                copied.append(Copied(rank, host, name, size, fetched=False))
                continue
            try:
                got = pool.download(host, f"{remote_logs}/{name}", local)
            except (SSHError, OSError) as e:
                problems.append(f"{host}: {e}")
                continue
            copied.append(Copied(rank, host, name, got, fetched=True))
            say(f"rank {rank} ({host}): {name} {got / MiB:.1f} MiB")
    if targets:
        root = targets[0]
        try:
            config = pool.read_file(root.host, str(remote.config))
            here.config.write_bytes(config)
        except (SSHError, OSError) as e:
            problems.append(f"the run's config from {root.host}: {e}")
    (dest / MARKER).write_text(
        json.dumps(
            {
                "run_dir": run_dir,
                "ranks": {str(t.rank): t.host for t in targets},
                "time": time.time(),
                "problems": problems,
            },
            indent=2,
        )
    )
    return copied, problems


def _rank_of(name: str) -> int:
    m = LOG_NAME.match(name)
    assert m is not None
    return int(m.group(1))


def _ranks(ranks: Sequence[int]) -> str:
    return ",".join(map(str, ranks))
