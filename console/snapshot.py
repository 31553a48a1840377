"""Figures derived from the fleet: the header's, the straggler, the balancer's, a JSON picture.

Every figure shown is derived here (or in `console.fleet`), so the widgets only lay text out.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from console import fmt
from console.fleet import Fleet, RankView
from console.link_phase import UP
from telemetry import balance
from telemetry.parallelism import FIXED_SPLIT

SMOOTH = 10  # updates averaged for rates, the update time and the straggler
STRAGGLER_SPREAD = 0.10  # a rank is called the straggler when compute times differ by > 10%
BALANCE_WINDOW = 200  # updates per rank handed to the balancer
EVENTS_SHOWN = 20  # log lines in a JSON snapshot


@dataclass(slots=True)
class HeaderInfo:
    """The figures in the header."""

    run_id: str = ""
    step: int = 0
    total_updates: int | None = None
    tokens: int = 0
    tokens_per_s: float | None = None
    update_s: float | None = None
    loss: float | None = None
    val_loss: float | None = None
    eta_s: float | None = None
    status: str = "connecting"  # running, paused, stopped, connecting, no link, no run, or
    # once a replay is over: finished, stopped, failed, ended (see `ending`)
    live: int = 0
    world: int = 0
    straggler: int | None = None
    global_batch: int | None = None
    warning: str = ""
    ended: str = ""  # a replay that is over: "finished at update 30/30, 14:03:07"
    best: tuple[int, float] | None = None  # (update, val loss) of the run's best checkpoint
    autopilot: bool | None = None
    alert: str = ""
    parallel: str = ""  # "tensor parallel x2", "2 replicas x tensor 2"; "" in data parallelism


@dataclass(slots=True)
class RunEnd:
    """How a run's records end: the last update, and what the log says about why."""

    how: str  # finished (reached its planned updates), stopped, failed, ended (no reason logged)
    step: int
    total: int | None
    time: float | None  # the last record's own wall time

    def describe(self) -> str:
        """`finished at update 30/30, 2026-12-01 14:03:07`."""
        of = f"/{self.total:,}" if self.total else ""
        when = f", {fmt.stamp(self.time)}" if self.time else ""
        return f"{self.how} at update {self.step:,}{of}{when}"


def ending(fleet: Fleet) -> RunEnd:
    """How the fleet's records end (read once they are all in: a replay that is over)."""
    step = fleet.step()
    if fleet.failed:
        how = "failed"
    elif fleet.stopped:
        how = "stopped"
    elif fleet.total_updates and step >= fleet.total_updates:
        how = "finished"
    else:
        how = "ended"  # neither its planned end nor a stop: killed, or crashed without a word
    return RunEnd(how, step, fleet.total_updates, fleet.last_time)


def reference(fleet: Fleet) -> RankView | None:
    """The rank with the newest update: the header's figures come from it."""
    best = None
    for v in fleet.ranks:
        if v.last is not None and (best is None or v.last.step > best.last.step):  # type: ignore[union-attr]
            best = v
    return best


def straggler(fleet: Fleet) -> int | None:
    """The rank the others wait for, when compute times differ enough to matter."""
    means = {}
    for v in fleet.ranks:
        recent = v.recent(SMOOTH)
        if recent and v.phase in UP:
            means[v.rank] = statistics.fmean(u.compute_s for u in recent)
    if len(means) < 2:
        return None
    slowest = max(means, key=means.__getitem__)
    top, bottom = means[slowest], min(means.values())
    return slowest if top > 0 and (top - bottom) / top > STRAGGLER_SPREAD else None


def header(fleet: Fleet) -> HeaderInfo:
    """The header's figures now."""
    info = HeaderInfo(
        run_id=fleet.run_id,
        step=fleet.step(),
        total_updates=fleet.total_updates,
        live=fleet.live_count(),
        world=len(fleet.ranks),
        straggler=straggler(fleet),
        warning=fleet.warning,
        best=fleet.best,
        autopilot=fleet.autopilot,
        alert=fleet.alert,
    )
    mode = fleet.parallelism()
    info.parallel = mode.describe() if mode.fixed_split else ""
    split = fleet.split()
    # A tensor-parallel group reads one batch together: count it once per group, not per rank.
    info.global_batch = sum(split[:: mode.tensor]) if split is not None else None
    ref = reference(fleet)
    if ref is not None and ref.last is not None:
        recent = ref.recent(SMOOTH)
        wall = sum(u.update_s for u in recent)
        info.tokens = ref.last.tokens
        info.loss = ref.last.loss
        info.update_s = wall / len(recent)
        info.tokens_per_s = sum(u.update_tokens for u in recent) / wall if wall > 0 else None
        if fleet.total_updates and info.update_s:
            info.eta_s = max(0, fleet.total_updates - info.step) * info.update_s
    if fleet.evals:
        info.val_loss = fleet.evals.last_y
    if fleet.ended():
        end = ending(fleet)
        info.status, info.ended = end.how, end.describe()
    elif fleet.stopped:
        info.status = "stopped"
    elif fleet.paused:
        info.status = "paused"
    elif info.live == 0 and fleet.nobody():
        info.status = "no run"  # every port refused: nothing is coming, say so
    elif info.live == 0:
        info.status = "connecting" if not fleet.run_id else "no link"
    else:
        info.status = "running"
    return info


# --- the balancer's view -----------------------------------------------------------------------


def balance_samples(fleet: Fleet) -> list[list[balance.RankSample]]:
    """Each rank's recent updates as the balancer's input. A rank's memory is its budget
    (--memory-limit-gb, or auto's share of its machine: the figure the trainer's caps and
    memory guard use), or its machine's memory where an older rank reports none."""
    out = []
    for v in fleet.ranks:
        total = v.memory_total
        out.append(
            [
                balance.RankSample(u.local_batch, u.compute_s, u.peak_mem, u.mem_budget or total)
                for u in list(v.updates)[-BALANCE_WINDOW:]
            ]
        )
    return out


def proposal(
    fleet: Fleet, headroom: float = 0.15
) -> tuple[balance.Proposal | None, list[balance.RankModel], str]:
    """The balancer's proposal for this run, the fitted models, and why not if none."""
    if fleet.parallelism().fixed_split:
        return None, [], FIXED_SPLIT  # nothing to propose: the trainer would refuse any split
    split = fleet.split()
    if split is None:
        return None, [], "not every rank has reported its local batch yet"
    samples = balance_samples(fleet)
    missing = [v.rank for v, s in zip(fleet.ranks, samples, strict=True) if not s]
    if missing:
        return None, [], f"no updates yet from rank(s) {', '.join(map(str, missing))}"
    try:
        models = balance.fit(samples)
        prop = balance.propose(models, sum(split), headroom=headroom, current=split)
    except balance.BalanceError as e:
        return None, [], str(e)
    return prop, models, ""


# --- the JSON picture (--once --json, replay --once) ---------------------------------------------


def snapshot(fleet: Fleet, now: float | None = None) -> dict[str, Any]:
    """A JSON-ready picture of the run now: each rank's newest update and how old it is.

    `now`: the time ages are measured from (default the fleet's clock; a replay passes the
    end of its log).
    """
    h = header(fleet)
    now = fleet.clock() if now is None else now
    ranks = []
    for v in fleet.ranks:
        u = v.last
        ranks.append(
            {
                "rank": v.rank,
                "host": v.host,
                "port": v.target.port,
                "link": v.phase.value,
                "link_detail": v.link.detail if v.link else "",
                "local_batch": v.local_batch,
                "memory_total": v.memory_total,
                "chip": v.hello.chip if v.hello else None,
                "straggler": v.rank == h.straggler,
                "dropped": v.dropped,
                "update": u.to_msg() if u else None,
                "update_age_s": None if u is None else round(max(0.0, now - u.time), 3),
            }
        )
    return {
        "run_id": h.run_id,
        "status": h.status,
        "step": h.step,
        "total_updates": h.total_updates,
        "tokens": h.tokens,
        "tokens_per_s": h.tokens_per_s,
        "update_s": h.update_s,
        "loss": h.loss,
        "val_loss": h.val_loss,
        "best": {"step": h.best[0], "val_loss": h.best[1]} if h.best else None,
        "autopilot": h.autopilot,
        "alert": h.alert,
        "eta_s": h.eta_s,
        "live": h.live,
        "world": h.world,
        "straggler": h.straggler,
        "global_batch": h.global_batch,
        "parallel": fleet.parallel,
        "ended": h.ended,
        "ranks": ranks,
        "events": [
            {
                "time": ln.time,
                "level": ln.level,
                "rank": ln.rank,
                "ranks": list(ln.ranks),
                "step": ln.step,
                "kind": ln.kind,
                "text": ln.text,
            }
            for ln in list(fleet.log_lines)[-EVENTS_SHOWN:]
        ],
    }
