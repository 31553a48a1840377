"""`fleet console --once`: each rank's newest update and its age."""

from __future__ import annotations

import threading
import time

from console.fleet import Fleet
from console.hostfile import (
    local_targets,
)
from console.link_phase import LinkPhase, LinkStatus
from console.snapshot import snapshot
from tests.support.console_fakes import T0, hello, update

# --- issue 14: --once takes each rank's newest update ------------------------------------------


class HistoryFeed:
    """Ranks whose history (oldest first) arrives in slow chunks, as over a busy link."""

    def __init__(self, world: int, newest: int, backlog: int) -> None:
        self.targets = local_targets(world)
        self.newest, self.backlog = newest, backlog
        self.sink = None
        self._threads: list[threading.Thread] = []

    def attach(self, sink) -> None:
        self.sink = sink

    def _rank(self, r: int) -> None:
        self.sink.link_status(LinkStatus(r, LinkPhase.LIVE, "fake"))
        h = hello(r, world=len(self.targets))
        h.backlog = self.backlog
        self.sink.link_message(r, h)
        for step in range(self.newest - self.backlog + 1, self.newest + 1):
            self.sink.link_message(r, update(r, step))
            if step % 10 == 0:
                time.sleep(0.15)  # the rest of the history is still on its way

    def start_threads(self) -> None:
        for r in range(len(self.targets)):
            t = threading.Thread(target=self._rank, args=(r,), daemon=True)
            t.start()
            self._threads.append(t)

    def close(self) -> None:
        for t in self._threads:
            t.join(5)


def test_once_waits_for_each_ranks_whole_history_and_says_how_old_its_newest_is():
    from console import once

    fleet = once.reach(HistoryFeed(4, newest=210, backlog=60), timeout=20, clock=lambda: T0 + 9e9)
    assert [v.last.step for v in fleet.ranks] == [210] * 4
    snap = snapshot(fleet, now=update(0, 210).time + 2.5)
    assert snap["step"] == 210 and [r["update_age_s"] for r in snap["ranks"]] == [2.5] * 4


def test_once_with_nothing_listening_is_one_line_with_advice():
    from console import once

    fleet = Fleet(local_targets(3, port_base=5000))
    for r in range(3):
        why = f"nothing listening on 127.0.0.1:{5000 + r}"
        fleet.set_link(LinkStatus(r, LinkPhase.REFUSED, why, "nothing listening", T0 + 1))
    lines = once.unreachable(fleet, "replay it with: fleet console --replay R")
    assert lines == [
        "nothing listening on 127.0.0.1:5000-5002: no run serves there; "
        "replay it with: fleet console --replay R"
    ]


def test_a_run_folder_that_is_not_there_is_named(tmp_path, capsys):
    """Issue 18, defect 11: `--local --run-dir nope --once` said "--local needs -n N"."""
    from fleet.cli import main as fleet

    argv = ["console", "--local", "--run-dir", str(tmp_path / "nope"), "--once"]
    assert fleet(argv) == 2
    assert f"--run-dir {tmp_path / 'nope'}: no such run folder" in capsys.readouterr().err
    (tmp_path / "new").mkdir()
    assert fleet(["console", "--local", "--run-dir", str(tmp_path / "new"), "--once"]) == 2
    err = capsys.readouterr().err
    assert "has recorded no telemetry ports yet" in err and "-n N" in err
