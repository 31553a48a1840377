"""A run's summary from its Arrow logs: per-rank timing, the straggler, loss, evals, rebalances."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from telemetry.arrowlog import log_dir, log_ranks, read_events, read_updates
from telemetry.errors import TelemetryError
from telemetry.parallelism import parse as parse_parallelism
from telemetry.records import Event
from telemetry.units import size_text


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ratio(new: float | None, old: float | None) -> float | None:
    """Relative change new vs old (0.25 = 25% more), None when either is missing or old is 0."""
    if new is None or not old:
        return None
    return new / old - 1.0


def by_step(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step, in order; a step logged twice (a resume replayed it) keeps the last."""
    latest: dict[int, dict[str, Any]] = {}
    for row in rows:
        latest[row["step"]] = row
    return [latest[s] for s in sorted(latest)]


def _rank_figures(rank: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    update_s = sum(r["update_s"] for r in rows)
    # Tensor parallelism: the per-block all-reduces, inside compute (logs before it have none).
    coll = [r.get("collective_s") or 0.0 for r in rows]
    return {
        "rank": rank,
        "updates": len(rows),
        "median_compute_s": _median([r["compute_s"] for r in rows]),
        "median_wait_s": _median([r["wait_s"] for r in rows]),
        "median_transfer_s": _median([r["transfer_s"] for r in rows]),
        "median_collective_s": _median(coll),
        "collective_share": sum(coll) / update_s if update_s else None,
        "median_update_s": _median([r["update_s"] for r in rows]),
        "peak_mem": max((r["peak_mem"] for r in rows), default=0),
        "tokens_per_s": sum(r["local_tokens"] for r in rows) / update_s if update_s else None,
        "wait_share": sum(r["wait_s"] for r in rows) / update_s if update_s else None,
        "simulated": any(r.get("simulated") for r in rows),
        # --shard-optimizer (issue 20): the share stepped and the bytes held, as last logged
        "opt_share": (rows[-1].get("opt_share") or 1.0) if rows else 1.0,
        "resident_mem": (rows[-1].get("resident_mem") or 0) if rows else 0,
    }


def _window(rows: list[dict[str, Any]], after: int, upto: int | None) -> dict[str, Any]:
    """Median update time and global tokens/s over updates with after < step <= upto."""
    sel = [r for r in rows if r["step"] > after and (upto is None or r["step"] <= upto)]
    return {
        "updates": len(sel),
        "median_update_s": _median([r["update_s"] for r in sel]),
        "tokens_per_s": _median([r["update_tokens"] / r["update_s"] for r in sel if r["update_s"]]),
    }


def _unique(events: list[Event], kind: str) -> list[Event]:
    """Events of `kind`, one per step (every rank may report the same one), in step order."""
    seen: dict[int, Event] = {}
    for e in sorted(events, key=lambda e: (e.step, e.rank)):
        if e.kind == kind and e.step not in seen:
            seen[e.step] = e
    return list(seen.values())


def summarize(run_dir: str | Path) -> dict[str, Any]:
    """Everything `fleet report` shows, JSON-ready; TelemetryError for a folder without logs."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TelemetryError(f"no such run folder: {run_dir}")
    ranks = log_ranks(run_dir)
    if not ranks:
        raise TelemetryError(
            f"no telemetry logs in {log_dir(run_dir)} (is {run_dir} a run folder? each rank "
            "writes telemetry/rank-N.arrow there)"
        )
    per_rank = {r: by_step(read_updates(run_dir, r).to_pylist()) for r in ranks}
    events = read_events(run_dir)
    ranks_out = [_rank_figures(r, rows) for r, rows in per_rank.items() if rows]

    straggler = None
    timed = [f for f in ranks_out if f["median_compute_s"] is not None]
    if len(timed) >= 2:
        slow = max(timed, key=lambda f: f["median_compute_s"])
        others = _median([f["median_compute_s"] for f in timed if f is not slow])
        straggler = {
            "rank": slow["rank"],
            "median_compute_s": slow["median_compute_s"],
            "others_median_compute_s": others,
            "excess": _ratio(slow["median_compute_s"], others),
        }

    # Loss, tokens and update times are global figures: every rank logs the same ones, so
    # read them from the lowest rank that logged updates.
    ref = next((rows for rows in per_rank.values() if rows), [])
    loss = None
    if ref:
        low = min(ref, key=lambda r: r["loss"])
        loss = {
            "first": {"step": ref[0]["step"], "loss": ref[0]["loss"]},
            "last": {"step": ref[-1]["step"], "loss": ref[-1]["loss"]},
            "min": {"step": low["step"], "loss": low["loss"]},
        }
    samples = {e.step: e.data.get("text", e.message) for e in _unique(events, "sample")}
    evals = [
        {
            "step": e.step,
            "val_loss": e.data.get("val_loss"),
            "val_tokens": e.data.get("val_tokens"),
            "sample": samples.get(e.step),
        }
        for e in _unique(events, "eval")
    ]
    started = _unique(events, "started")
    model = dict(started[-1].data) if started else {}
    # The mode is in the started event (runs before it was recorded read as data parallel).
    world = model.get("world_size") if isinstance(model.get("world_size"), int) else len(ranks)
    mode = model.get("parallel")
    mode = parse_parallelism(mode if isinstance(mode, str) else None, world)
    rates = [r["update_tokens"] / r["update_s"] for r in ref if r.get("update_s")]
    rebalances = []
    moves = _unique(events, "rebalanced")
    for i, e in enumerate(moves):
        start = moves[i - 1].step if i else -1
        end = moves[i + 1].step if i + 1 < len(moves) else None
        before, after = _window(ref, start, e.step), _window(ref, e.step, end)
        rebalances.append(
            {
                "step": e.step,
                "from": e.data.get("from"),
                "to": e.data.get("to"),
                "before": before,
                "after": after,
                "update_s_change": _ratio(after["median_update_s"], before["median_update_s"]),
                "tokens_per_s_change": _ratio(after["tokens_per_s"], before["tokens_per_s"]),
            }
        )
    return {
        "run_dir": str(run_dir),
        "model": {
            "params": model.get("params"),
            "precision": model.get("precision"),
            **{k: (model.get("architecture") or {}).get(k) for k in ("depth", "width", "vocab")},
        },
        "parallel": {
            "mode": mode.mode,
            "tensor": mode.tensor,
            "replicas": mode.replicas,
            "text": mode.groups(),
        },
        "median_tokens_per_s": _median(rates),
        "samples": [{"step": s, "text": t} for s, t in sorted(samples.items())],
        "world_size": len(ranks),
        "steps": ref[-1]["step"] if ref else 0,
        "tokens": ref[-1]["tokens"] if ref else 0,
        "duration_s": ref[-1]["time"] - ref[0]["time"] if len(ref) > 1 else 0.0,
        "ranks": ranks_out,
        "straggler": straggler,
        "loss": loss,
        "evals": evals,
        "rebalances": rebalances,
        "best": min(
            (e for e in evals if isinstance(e["val_loss"], int | float)),
            key=lambda e: e["val_loss"],
            default=None,
        ),
        "stops": [
            {"step": e.step, "reason": e.data.get("reason", "command"), "message": e.message}
            for e in _unique(events, "stopped")
        ],
        "restarts": [
            {
                "step": e.step,
                "attempt": e.data.get("attempt"),
                "reason": e.data.get("reason"),
                "from": e.data.get("from"),
                "to": e.data.get("to"),
            }
            for e in _unique(events, "restarted")
        ],
        # One count per event, not per rank: a pause of 4 ranks is one pause.
        "events": dict(
            Counter(kind for kind, _, _ in {(e.kind, e.step, e.message) for e in events})
        ),
        "problems": [
            {"rank": e.rank, "step": e.step, "kind": e.kind, "message": e.message}
            for e in events
            if e.kind in ("warning", "error")
        ],
    }


# --- rendering --------------------------------------------------------------------------------


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"


def _size(n: int | None) -> str:
    return "-" if not n else size_text(n)


def _pct(r: float | None, signed: bool = False) -> str:
    return "-" if r is None else f"{r * 100:+.1f}%" if signed else f"{r * 100:.1f}%"


def _rate(r: float | None) -> str:
    return "-" if r is None else f"{r / 1000:.1f}k" if r >= 1000 else f"{r:.0f}"


def wide_console() -> Any:
    """A rich Console; piped (`fleet report RUN | less`), as wide as its tables need instead of
    rich's 80 columns, which cut "update" to "updat…" (COLUMNS still wins)."""
    import os
    import sys

    from rich.console import Console

    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(width=PIPED_WIDTH) if piped else Console()


PIPED_WIDTH = 200


def render(summary: dict[str, Any], console: Any = None) -> None:
    """Print a summary as rich tables."""
    from rich.markup import escape
    from rich.table import Table

    console = console or wide_console()
    console.print(
        f"[bold]{escape(summary['run_dir'])}[/]: {summary['world_size']} rank(s), "
        f"{summary['steps']} updates, {summary['tokens']:,} tokens, "
        f"{summary['duration_s'] / 60:.1f} min"
    )
    if mode := summary.get("parallel"):
        fixed = "; the batch split is fixed (every rank of a group reads the same rows)"
        console.print(f"parallel: {escape(mode['text'])}{fixed if mode['tensor'] > 1 else ''}")
    # The per-block collectives of tensor parallelism, when any rank measured them.
    coll = any((f.get("median_collective_s") or 0) > 0 for f in summary["ranks"])
    table = Table(title="Per rank (medians per update)")
    for col in ("rank", "updates", "compute", "wait", "transfer", "update", "peak mem"):
        table.add_column(col, justify="right")
    if coll:
        table.add_column("collective", justify="right")
        table.add_column("coll share", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("waiting", justify="right")
    slow = (summary.get("straggler") or {}).get("rank")
    for f in summary["ranks"]:
        mark = " (sim)" if f["simulated"] else ""
        colls = [_ms(f["median_collective_s"]), _pct(f["collective_share"])] if coll else []
        table.add_row(
            f"[bold red]{f['rank']}[/]" if f["rank"] == slow else str(f["rank"]),
            str(f["updates"]),
            _ms(f["median_compute_s"]),
            _ms(f["median_wait_s"]),
            _ms(f["median_transfer_s"]),
            _ms(f["median_update_s"]),
            _size(f["peak_mem"]),
            *colls,
            _rate(f["tokens_per_s"]) + mark,
            _pct(f["wait_share"]),
        )
    console.print(table)
    if any(f["opt_share"] < 1 for f in summary["ranks"]):
        console.print(
            "Optimizer sharded (share, master weights + state held): "
            + ", ".join(
                f"rank {f['rank']} {f['opt_share']:.1%} {_size(f['resident_mem'])}"
                for f in summary["ranks"]
            )
        )
    if s := summary.get("straggler"):
        console.print(
            f"Straggler: rank {s['rank']}, median compute {_ms(s['median_compute_s'])}, "
            f"{_pct(s['excess'])} above the others' median ({_ms(s['others_median_compute_s'])})"
        )
    if loss := summary.get("loss"):
        console.print(
            f"Loss: first {loss['first']['loss']:.4f} (step {loss['first']['step']}), "
            f"last {loss['last']['loss']:.4f} (step {loss['last']['step']}), "
            f"min {loss['min']['loss']:.4f} (step {loss['min']['step']})"
        )
    if summary["evals"]:
        evals = Table(title="Evals")
        for col in ("step", "val loss", "val tokens"):
            evals.add_column(col, justify="right")
        with_samples = any(e.get("sample") for e in summary["evals"])
        if with_samples:
            evals.add_column("sample (--prompt)", overflow="fold")
        for e in summary["evals"]:
            vl = e["val_loss"]
            row = [
                str(e["step"]),
                f"{vl:.4f}" if isinstance(vl, int | float) else "-",
                f"{e['val_tokens']:,}" if isinstance(e["val_tokens"], int) else "-",
            ]
            if with_samples:
                row.append(escape(repr(e.get("sample") or "")[1:-1][:160]))
            evals.add_row(*row)
        console.print(evals)
    if best := summary.get("best"):
        console.print(f"Best validation loss: {best['val_loss']:.4f} at update {best['step']}")
    for s in summary.get("stops", []):
        if s["reason"] == "early stop":  # its message says why, without the words again
            console.print(f"Stopped early at update {s['step']}: {escape(s['message'])}")
        else:  # "stopped by Ctrl-C (SIGINT)"
            how = escape(s["message"].removeprefix("stopped "))
            console.print(f"Stopped at update {s['step']} {how}")
    if summary["rebalances"]:
        moves = Table(title="Rebalances (medians before -> after)")
        for col in ("step", "from", "to", "update time", "change", "global tok/s", "change"):
            moves.add_column(col, justify="right")
        for m in summary["rebalances"]:
            b, a = m["before"], m["after"]
            moves.add_row(
                str(m["step"]),
                escape(str(m["from"])),
                escape(str(m["to"])),
                f"{_ms(b['median_update_s'])} -> {_ms(a['median_update_s'])}",
                _pct(m["update_s_change"], signed=True),
                f"{_rate(b['tokens_per_s'])} -> {_rate(a['tokens_per_s'])}",
                _pct(m["tokens_per_s_change"], signed=True),
            )
        console.print(moves)
    if summary.get("restarts"):
        restarts = Table(title="Restarts (fleet launch --restarts)")
        for col in ("at update", "restart", "after", "split"):
            restarts.add_column(col)
        for r in summary["restarts"]:
            fleet = f"{r['from']} -> {r['to']}" if r["from"] != r["to"] else str(r["to"])
            restarts.add_row(str(r["step"]), str(r["attempt"]), escape(str(r["reason"])), fleet)
        console.print(restarts)
    if summary["events"]:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary["events"].items()))
        console.print(f"Events: {counts}")
    for p in summary["problems"][-10:]:
        where = f"rank {p['rank']} step {p['step']}"
        console.print(f"[yellow]{p['kind']}[/] {where}: {escape(p['message'])}")
