"""`fleet report RUN1 RUN2 ...`: runs side by side, and their loss curves together.

One row per run: depth, width, parameters, precision, tokens seen, the best validation loss
and its update, median tokens/s, wall time and the last sample; then the curves as a terminal
chart, or with `--plot FILE` as a PNG or SVG picture (matplotlib, the optional `plot` extra):
each run's validation loss and its train loss (smoothed), against updates or, with
`--x tokens`, tokens seen (runs with different batches compare per token, not per update).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from telemetry.arrowlog import log_ranks, read_updates
from telemetry.errors import TelemetryError
from telemetry.report import by_step, summarize, wide_console

MARKS = "ox+*#@%&"
SMOOTHING = 0.9  # the train loss's exponential moving average (debiased), as TensorBoard's
AXES = {"updates": ("update", 0), "tokens": ("tokens", 1)}  # --x: label, index in a point


def compare(run_dirs: list[str | Path]) -> dict[str, Any]:
    """Each run's row, its val-loss curve [(update, loss)], and both of its loss curves as
    [update, tokens, loss] points (`series`: "val" and "train", the train loss smoothed)."""
    rows, curves, series = [], {}, {}
    for d in run_dirs:
        s = summarize(d)
        m, best = s["model"], s.get("best") or {}
        name = Path(d).name or str(d)
        rows.append(
            {
                "run": name,
                "run_dir": s["run_dir"],
                "depth": m.get("depth"),
                "width": m.get("width"),
                "params": m.get("params"),
                "precision": m.get("precision"),
                "tokens": s["tokens"],
                "best_val_loss": best.get("val_loss"),
                "best_step": best.get("step"),
                "median_tokens_per_s": s["median_tokens_per_s"],
                "wall_s": s["duration_s"],
                "last_sample": s["samples"][-1]["text"] if s["samples"] else None,
            }
        )
        curves[name] = [
            (e["step"], e["val_loss"]) for e in s["evals"] if isinstance(e["val_loss"], float)
        ]
        updates = _updates(d)
        tokens = {u["step"]: u["tokens"] for u in updates}
        series[name] = {
            "val": [[step, tokens.get(step, 0), v] for step, v in curves[name]],
            "train": [
                [u["step"], u["tokens"], v]
                for u, v in zip(updates, smoothed([u["loss"] for u in updates]), strict=True)
            ],
        }
    return {"runs": rows, "curves": curves, "series": series}


def _updates(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's updates, one per step, from its lowest rank that logged any (every rank logs
    the same loss and tokens)."""
    for rank in log_ranks(run_dir):
        rows = by_step(read_updates(run_dir, rank).select(["step", "tokens", "loss"]).to_pylist())
        if rows:
            return rows
    return []


def smoothed(values: list[float], beta: float = SMOOTHING) -> list[float]:
    """An exponential moving average, debiased (the first points are not pulled to 0)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, start=1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**i))
    return out


def what_to_draw(series: dict[str, dict[str, list]]) -> str:
    """Which curves a picture of `series` can show: "val" (with the train loss), "train"
    (the runs have no evaluations), or "" (no run logged an update: nothing to draw)."""
    if any(c["val"] for c in series.values()):
        return "val"
    return "train" if any(c["train"] for c in series.values()) else ""


def title(runs: list[dict[str, Any]]) -> str:
    """The runs and their model sizes, for a picture's title."""
    parts = []
    for r in runs:
        size = f"{r['params'] / 1e6:.2f}M params" if r.get("params") else "size unknown"
        shape = f", depth {r['depth']}, width {r['width']}" if r.get("depth") else ""
        parts.append(f"{r['run']} ({size}{shape})")
    return " vs ".join(parts)


def chart(
    curves: dict[str, list[tuple[float, float]]],
    width: int = 64,
    height: int = 14,
    label: str = "validation loss",
    x: str = "update",
) -> str:
    """The curves on one grid of characters, a mark per run, with their axes."""
    points = [(s, v) for c in curves.values() for s, v in c]
    if not points:
        return "(no evaluations to draw: runs need --eval-every)"
    x0, x1 = min(s for s, _ in points), max(s for s, _ in points)
    y0, y1 = min(v for _, v in points), max(v for _, v in points)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1e-9)
    grid = [[" "] * width for _ in range(height)]
    for mark, curve in zip(MARKS, curves.values(), strict=False):
        for s, v in curve:
            col = round((s - x0) / (x1 - x0) * (width - 1))
            row = round((y1 - v) / (y1 - y0) * (height - 1))
            grid[row][col] = mark
    lines = [f"{y1:8.4f} |" + "".join(grid[0])]
    lines += ["         |" + "".join(r) for r in grid[1:-1]]
    lines += [f"{y0:8.4f} |" + "".join(grid[-1]), "         +" + "-" * width]
    left, right = f"{x} {_num(x0)}", f"{x} {_num(x1)}"
    lines.append("          " + left + right.rjust(width - len(left)))
    legend = "  ".join(f"{m} {name}" for m, name in zip(MARKS, curves, strict=False))
    return label + "\n" + "\n".join(lines) + "\n" + legend


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 1000 else f"{v:g}"


def terminal_chart(cmp: dict[str, Any], x: str = "updates") -> str:
    """The validation-loss chart, or the smoothed train loss when no run evaluated."""
    name, i = AXES[x]
    kind = what_to_draw(cmp["series"])
    if not kind:
        return "(nothing to draw: no run logged an update)"
    label = (
        "validation loss"
        if kind == "val"
        else ("train loss, smoothed (no evaluations: the runs need --eval-every)")
    )
    curves = {n: [(p[i], p[2]) for p in c[kind]] for n, c in cmp["series"].items()}
    return chart(curves, label=label, x=name)


def plot(cmp: dict[str, Any], path: str | Path, x: str = "updates") -> str:
    """Draw each run's validation loss and smoothed train loss into a picture (PNG or SVG by
    the file's ending), against updates or tokens; returns what was drawn. Refuses, writing
    nothing, when there is nothing to draw."""
    kind = what_to_draw(cmp["series"])
    if not kind:
        raise TelemetryError(
            "nothing to draw: no run logged an update (is each folder a run's --run-dir?)"
        )
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TelemetryError(
            "--plot needs matplotlib: pip install 'mlx-fleet[plot]' (or matplotlib)"
        ) from None
    name, i = AXES[x]
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    for n, (run, c) in enumerate(cmp["series"].items()):
        color = f"C{n % 10}"
        if c["train"]:
            ax.plot(
                [p[i] for p in c["train"]],
                [p[2] for p in c["train"]],
                color=color,
                alpha=0.45,
                linewidth=1,
                label=f"{run} train (smoothed)",
            )
        if c["val"]:
            ax.plot(
                [p[i] for p in c["val"]],
                [p[2] for p in c["val"]],
                color=color,
                marker="o",
                label=f"{run} validation",
            )
    ax.set_xlabel("update" if x == "updates" else "tokens seen")
    ax.set_ylabel("loss")
    ax.set_title(textwrap.fill(title(cmp["runs"]), 80), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    runs = f"{len(cmp['series'])} run{'s' if len(cmp['series']) > 1 else ''}"
    if kind == "val":
        return f"validation and train loss (smoothed) of {runs}"
    return f"train loss (smoothed) of {runs}; no run has evaluations (they need --eval-every)"


def render(cmp: dict[str, Any], console: Any = None, x: str = "updates") -> None:
    """Print the table and the chart."""
    from rich.markup import escape
    from rich.table import Table

    console = console or wide_console()
    table = Table(title="Runs side by side")
    cols = ("run", "depth", "width", "params", "precision", "tokens", "best val", "at update")
    for col in (*cols, "tok/s", "wall", "last sample"):
        table.add_column(col, justify="left" if col in ("run", "last sample") else "right")
    for r in cmp["runs"]:
        fmt = lambda v, f="{}": "-" if v is None else f.format(v)  # noqa: E731
        table.add_row(
            escape(r["run"]),
            fmt(r["depth"]),
            fmt(r["width"]),
            fmt(r["params"] and r["params"] / 1e6, "{:.2f}M"),
            fmt(r["precision"]),
            f"{r['tokens']:,}",
            fmt(r["best_val_loss"], "{:.4f}"),
            fmt(r["best_step"]),
            fmt(r["median_tokens_per_s"], "{:,.0f}"),
            f"{r['wall_s'] / 60:.1f} min",
            escape(repr(r["last_sample"] or "")[1:-1][:60]),
        )
    console.print(table)
    console.print(terminal_chart(cmp, x), highlight=False, markup=False)
