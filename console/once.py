"""Headless: connect, take every rank's newest update, print a table or JSON, exit.

Exit status 0 when every rank answered; 1 naming, on stderr, each rank that could not be
reached and why.
"""

from __future__ import annotations

import json
import threading
import time
from typing import IO, Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from console import events, fmt, render
from console.feed import Inbox
from console.fleet import Fleet, RankView
from console.link_phase import LinkPhase
from console.live import LiveFeed
from console.snapshot import header, snapshot
from telemetry.records import Hello, Update

SETTLE_S = 2.0  # after every rank sent its history, how long to wait for a first update


class Backlog:
    """How much of each rank's history has arrived: its hello says how many updates follow.

    The history comes oldest first, so a rank's first update is usually old news; its newest
    is the last of the history (or a live one after it).
    """

    def __init__(self, world: int) -> None:
        self.expected: list[int | None] = [None] * world  # updates the hello announced
        self.received = [0] * world

    def count(self, items: list[tuple[int, Any]]) -> None:
        for rank, item in items:
            if not 0 <= rank < len(self.received):
                continue
            if isinstance(item, Hello):
                self.expected[rank], self.received[rank] = item.backlog, 0  # a new connection
            elif isinstance(item, Update):
                self.received[rank] += 1

    def caught_up(self, rank: int) -> bool:
        """Every update of the rank's history is in (its newest is known, if it has any)."""
        expected = self.expected[rank]
        return expected is not None and self.received[rank] >= expected


def reach(
    feed: LiveFeed, timeout: float = 15.0, clock=time.time, settle: float = SETTLE_S
) -> Fleet:
    """Run the feed's links until each rank's newest update is in, or `timeout` passes.

    A rank counts as reached once its whole history has arrived and holds an update (or
    `settle` s after every history arrived: a run that has not finished an update yet).
    When every rank is refused with nothing listening, there is no run to wait for: it
    returns at once. (`console.gather` is another thing: it copies the ranks' log files.)
    """
    fleet = Fleet(feed.targets, clock=clock)
    backlog = Backlog(len(feed.targets))
    woke = threading.Event()
    inbox = Inbox(notify=woke.set)
    feed.attach(inbox)
    feed.start_threads()
    deadline = time.monotonic() + timeout
    all_in_at: float | None = None
    try:
        while True:
            woke.wait(0.1)
            woke.clear()
            items = inbox.drain()
            backlog.count(items)
            fleet.absorb(items)
            now = time.monotonic()
            if fleet.nobody():
                break
            gone = [_refused_for_good(v) for v in fleet.ranks]
            if all(backlog.caught_up(v.rank) or g for v, g in zip(fleet.ranks, gone, strict=True)):
                if all(v.last is not None or g for v, g in zip(fleet.ranks, gone, strict=True)):
                    break
                all_in_at = all_in_at or now  # a rank with no update yet: wait a little
                if now - all_in_at > settle:
                    break
            if now > deadline:
                break
    finally:
        feed.close()
    # Links report "lost: console closed" as they stop; drain so that does not count.
    return fleet


def _refused_for_good(view: RankView) -> bool:
    return view.link is not None and view.link.refused_for_good


def unreachable(fleet: Fleet, advice: str = "") -> list[str]:
    """One line per rank that never said hello, with the last reason known.

    When no rank answers because nothing listens on any of their ports, that is one line
    (with `advice`, e.g. a finished run to replay), not the same refusal once per rank.
    """
    if fleet.nobody():
        return [events.nobody_line([(v.target.host, v.target.port) for v in fleet.ranks], advice)]
    out = []
    for v in fleet.ranks:
        if v.hello is None:
            why = v.link.detail if v.link and v.link.detail else "no answer"
            kind = f"{v.link.kind}: " if v.link and v.link.kind and v.link.kind not in why else ""
            out.append(f"{v.target.label}: {kind}{why}")
    return out


def print_json(fleet: Fleet, out: IO[str], advice: str = "", now: float | None = None) -> None:
    snap = snapshot(fleet, now)
    snap["unreachable"] = unreachable(fleet, advice)
    json.dump(snap, out, indent=2, default=str)
    out.write("\n")


def table(fleet: Fleet, now: float | None = None) -> Table:
    """A rich table of the fleet, for terminals and logs (`age`: of each rank's newest update,
    measured from `now`, default the fleet's clock)."""
    h = header(fleet)
    title = (
        f"{h.run_id or '(no run)'} · {h.status} · step {h.step:,} · {fmt.count(h.tokens)} tokens · "
        f"{fmt.count(h.tokens_per_s)} tok/s · update {fmt.secs(h.update_s)} · "
        f"loss {'—' if h.loss is None else f'{h.loss:.4f}'} · "
        + (h.ended if h.ended else f"{h.live}/{h.world} reached")
        + (f" · {h.parallel}" if h.parallel else "")
    )
    t = Table(
        title=title,
        title_justify="left",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    # Tensor parallelism: the per-block collectives, only where some rank reports them.
    coll = any(v.last is not None and v.last.collective_s > 0 for v in fleet.ranks)
    for name, justify in [
        ("rank", "right"),
        ("host", "left"),
        ("b", "right"),
        ("compute░wait", "left"),
        ("update", "right"),
        ("wait", "right"),
        *([("coll", "right")] if coll else []),
        ("peak/total", "right"),
        ("tok/s", "right"),
        ("age", "right"),
        ("link", "left"),
    ]:
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    scale = max((v.last.update_s for v in fleet.ranks if v.last), default=None)
    strag = h.straggler
    clock = fleet.clock() if now is None else now
    for v in fleet.ranks:
        u = v.last
        link = render.link_text(v.link, clock)
        if v.hello is not None and v.phase is LinkPhase.LOST:
            link = Text("● reached", "green")  # the snapshot is taken; the link was closed by us
        colls = [fmt.secs(u.collective_s) if u and u.collective_s > 0 else "—"] if coll else []
        t.add_row(
            Text(
                f"{'»' if v.rank == strag else ''}{v.rank}", "bold red" if v.rank == strag else ""
            ),
            v.host,
            str(v.local_batch or "—"),
            render.time_bar(u, 12, scale),
            fmt.secs(u.update_s) if u else "—",
            fmt.secs(u.wait_s) if u else "—",
            *colls,
            f"{fmt.nbytes(u.peak_mem)}/{fmt.nbytes(v.memory_total)}" if u else "—",
            fmt.count(u.tokens_per_s) if u else "—",
            fmt.duration(max(0.0, clock - u.time)) if u else "—",  # how old the newest one is
            link,
        )
    return t


def print_table(fleet: Fleet, out: IO[str] | None = None, now: float | None = None) -> None:
    console = Console(file=out, highlight=False)
    console.print(table(fleet, now))
    if (slow := header(fleet).straggler) is not None:
        console.print(f"» rank {slow} is the straggler")
