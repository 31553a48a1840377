"""Headless: connect, gather one update from every rank, print a table or JSON, exit.

Exit status 0 when every rank answered; 1 naming, on stderr, each rank that could not be
reached and why.
"""

from __future__ import annotations

import json
import threading
import time
from typing import IO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from console import fmt, render
from console.feed import Inbox
from console.fleet import Fleet, RankView
from console.live import LiveFeed
from console.model import LinkPhase
from console.snapshot import header, snapshot

SETTLE_S = 2.0  # after every rank said hello, how long to wait for their first update


def reach(feed: LiveFeed, timeout: float = 15.0, clock=time.time) -> Fleet:
    """Run the feed's links until each rank has sent an update, or `timeout` passes.

    (`console.gather` is another thing: it copies the ranks' log files.)
    """
    fleet = Fleet(feed.targets, clock=clock)
    woke = threading.Event()
    inbox = Inbox(notify=woke.set)
    feed.attach(inbox)
    feed.start_threads()
    deadline = time.monotonic() + timeout
    all_hello_at: float | None = None
    try:
        while True:
            woke.wait(0.1)
            woke.clear()
            fleet.absorb(inbox.drain())
            now = time.monotonic()
            if all(v.last is not None or _refused_for_good(v) for v in fleet.ranks):
                break
            if all(v.hello is not None or _refused_for_good(v) for v in fleet.ranks):
                all_hello_at = all_hello_at or now
                if now - all_hello_at > SETTLE_S:
                    break
            if now > deadline:
                break
    finally:
        feed.close()
    # Links report "lost: console closed" as they stop; drain so that does not count.
    return fleet


def _refused_for_good(view: RankView) -> bool:
    return view.link is not None and view.link.refused_for_good


def unreachable(fleet: Fleet) -> list[str]:
    """One line per rank that never said hello, with the last reason known."""
    out = []
    for v in fleet.ranks:
        if v.hello is None:
            why = v.link.detail if v.link and v.link.detail else "no answer"
            kind = f"{v.link.kind}: " if v.link and v.link.kind and v.link.kind not in why else ""
            out.append(f"{v.target.label}: {kind}{why}")
    return out


def print_json(fleet: Fleet, out: IO[str]) -> None:
    snap = snapshot(fleet)
    snap["unreachable"] = unreachable(fleet)
    json.dump(snap, out, indent=2, default=str)
    out.write("\n")


def table(fleet: Fleet) -> Table:
    """A rich table of the fleet, for terminals and logs."""
    h = header(fleet)
    title = (
        f"{h.run_id or '(no run)'} · {h.status} · step {h.step:,} · {fmt.count(h.tokens)} tokens · "
        f"{fmt.count(h.tokens_per_s)} tok/s · update {fmt.secs(h.update_s)} · "
        f"loss {'—' if h.loss is None else f'{h.loss:.4f}'} · {h.live}/{h.world} reached"
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
    for name, justify in [
        ("rank", "right"),
        ("host", "left"),
        ("b", "right"),
        ("compute░wait", "left"),
        ("update", "right"),
        ("wait", "right"),
        ("peak/total", "right"),
        ("tok/s", "right"),
        ("link", "left"),
    ]:
        t.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    scale = max((v.last.update_s for v in fleet.ranks if v.last), default=None)
    strag = h.straggler
    for v in fleet.ranks:
        u = v.last
        link = render.link_text(v.link, fleet.clock())
        if v.hello is not None and v.phase is LinkPhase.LOST:
            link = Text("● reached", "green")  # the snapshot is taken; the link was closed by us
        t.add_row(
            Text(
                f"{'»' if v.rank == strag else ''}{v.rank}", "bold red" if v.rank == strag else ""
            ),
            v.host,
            str(v.local_batch or "—"),
            render.time_bar(u, 12, scale),
            fmt.secs(u.update_s) if u else "—",
            fmt.secs(u.wait_s) if u else "—",
            f"{fmt.nbytes(u.peak_mem)}/{fmt.nbytes(v.memory_total)}" if u else "—",
            fmt.count(u.tokens_per_s) if u else "—",
            link,
        )
    return t


def print_table(fleet: Fleet, out: IO[str] | None = None) -> None:
    console = Console(file=out, highlight=False)
    console.print(table(fleet))
    if (slow := header(fleet).straggler) is not None:
        console.print(f"» rank {slow} is the straggler")
