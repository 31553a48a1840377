"""`fleet report RUN1 RUN2 ...`: runs side by side, and their validation-loss curves together.

One row per run: depth, width, parameters, precision, tokens seen, the best validation loss
and its update, median tokens/s, wall time and the last sample; then the curves as a terminal
chart, or with `--plot FILE` as a PNG or SVG picture (matplotlib, the optional `plot` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from telemetry.errors import TelemetryError
from telemetry.report import summarize

MARKS = "ox+*#@%&"


def compare(run_dirs: list[str | Path]) -> dict[str, Any]:
    """Each run's row and its curve, JSON-ready."""
    rows, curves = [], {}
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
    return {"runs": rows, "curves": curves}


def chart(curves: dict[str, list[tuple[int, float]]], width: int = 64, height: int = 14) -> str:
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
    lines.append(f"          update {x0}" + f"update {x1}".rjust(width - 7 - len(str(x0))))
    legend = "  ".join(f"{m} {name}" for m, name in zip(MARKS, curves, strict=False))
    return "validation loss\n" + "\n".join(lines) + "\n" + legend


def plot(curves: dict[str, list[tuple[int, float]]], path: str | Path) -> None:
    """The curves as a picture (PNG or SVG by the file's ending), with matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TelemetryError(
            "--plot needs matplotlib: pip install 'mlx-fleet[plot]' (or matplotlib)"
        ) from None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    for name, curve in curves.items():
        if curve:
            ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", label=name)
    ax.set_xlabel("update")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def render(cmp: dict[str, Any], console: Any = None) -> None:
    """Print the table and the chart."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
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
    console.print(chart(cmp["curves"]), highlight=False, markup=False)
