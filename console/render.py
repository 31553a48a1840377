"""Rich text pieces shared by the widgets and the `--once` table: bars, sparklines, a braille plot.

Every bar carries its meaning in its characters as well as its colour, so a terminal without
colour (or a reader who cannot tell red from green) still reads it:

    time bar   █ compute   ▓ per-block collectives (tensor parallelism: inside compute)
               ░ wait for the slowest rank   ▒ all-reduce + optimizer
    memory     █ active    ▓ peak above active            ░ allocator cache
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

from console import fmt
from console.link_phase import LinkPhase, LinkStatus
from telemetry.records import Update

COMPUTE, COLLECTIVE, WAIT, OTHER = "█", "▓", "░", "▒"
ACTIVE, PEAK, CACHE, FREE = "█", "▓", "░", "·"
SPARKS = "▁▂▃▄▅▆▇█"

STYLE_COMPUTE = "green"
STYLE_COLLECTIVE = "magenta"
STYLE_WAIT = "yellow"
STYLE_OTHER = "blue"
STYLE_DIM = "bright_black"


def _cells(parts: Sequence[float], width: int) -> list[int]:
    """Split `width` cells in proportion to `parts` (largest remainder, so they sum exactly)."""
    total = sum(parts)
    if total <= 0 or width <= 0:
        return [0] * len(parts)
    exact = [p / total * width for p in parts]
    cells = [math.floor(x) for x in exact]
    order = sorted(range(len(parts)), key=lambda i: exact[i] - cells[i], reverse=True)
    for i in order[: width - sum(cells)]:
        cells[i] += 1
    return cells


def time_bar(u: Update | None, width: int, scale_s: float | None = None) -> Text:
    """Compute (and the collectives inside it) vs wait vs the rest of one update, `width`
    cells wide.

    With `scale_s` (the slowest rank's update time) every rank's bar shares one scale, so a
    short bar is a rank that finished early; without it the bar fills the width.
    """
    if u is None or width <= 0:
        return Text("·" * max(width, 0), style=STYLE_DIM)
    other = max(0.0, u.transfer_s + u.optimizer_s)
    compute = max(0.0, u.compute_s)
    coll = min(compute, max(0.0, u.collective_s))  # measured inside compute_s: split it out
    parts = [compute - coll, coll, max(0.0, u.wait_s), other]
    total = max(sum(parts), u.update_s)
    used = width
    if scale_s and scale_s > 0:
        used = min(width, max(1, round(width * total / scale_s)))
    c, k, w, o = _cells(parts, used)
    text = Text()
    text.append(COMPUTE * c, STYLE_COMPUTE)
    text.append(COLLECTIVE * k, STYLE_COLLECTIVE)
    text.append(WAIT * w, STYLE_WAIT)
    text.append(OTHER * o, STYLE_OTHER)
    text.append(" " * (width - c - k - w - o))
    return text


def collective_share(u: Update) -> tuple[float | None, float | None]:
    """The collectives' share of compute and of the whole update (None where undefined)."""
    coll = max(0.0, u.collective_s)
    of_compute = coll / u.compute_s if u.compute_s > 0 else None
    of_update = coll / u.update_s if u.update_s > 0 else None
    return of_compute, of_update


def mem_style(fraction: float) -> str:
    return "red" if fraction >= 0.9 else "yellow" if fraction >= 0.75 else "green"


def mem_bar(u: Update | None, total: int | None, width: int) -> Text:
    """Active, peak and cache memory against the machine's physical memory."""
    if u is None or not total or width <= 0:
        return Text("·" * max(width, 0), style=STYLE_DIM)
    peak = max(u.peak_mem, u.active_mem)
    parts = [u.active_mem, peak - u.active_mem, u.cache_mem]
    used = sum(parts)
    free = max(0, total - used)
    a, p, c, f = _cells([*parts, free], width)
    style = mem_style((peak + u.cache_mem) / total)
    text = Text()
    text.append(ACTIVE * a, style)
    text.append(PEAK * p, style)
    text.append(CACHE * c, STYLE_DIM if style == "green" else style)
    text.append(FREE * f, STYLE_DIM)
    return text


def spark(
    values: Sequence[float], width: int, lo: float | None = None, hi: float | None = None
) -> str:
    """The last `width` values as ▁..█ (a flat series sits on the floor)."""
    if width <= 0:
        return ""
    vals = list(values)[-width:]
    if not vals:
        return " " * width
    lo = min(vals) if lo is None else lo
    hi = max(vals) if hi is None else hi
    span = hi - lo
    out = []
    for v in vals:
        i = 0 if span <= 0 else int((min(max(v, lo), hi) - lo) / span * (len(SPARKS) - 1) + 0.5)
        out.append(SPARKS[i])
    return " " * (width - len(vals)) + "".join(out)


# Refusal reasons, cut to fit the link column (the full reason is in the log and the detail).
SHORT_KIND = {
    "host key changed": "KEY CHANGED",
    "host key unknown": "key unknown",
    "nothing listening": "no listener",
    "auth failed": "auth failed",
}

LINK_STYLE = {
    LinkPhase.LIVE: ("●", "green"),
    LinkPhase.STALE: ("◐", "yellow"),
    LinkPhase.CONNECTING: ("◌", STYLE_DIM),
    LinkPhase.LOST: ("○", "red"),
    LinkPhase.REFUSED: ("✗", "bold red"),
    LinkPhase.ENDED: ("■", STYLE_DIM),  # a replay's log is over: the run ended, no fault
}


def link_text(status: LinkStatus | None, now: float, paused: bool = False) -> Text:
    """`● live`, `◐ stale`, `○ lost 3s` (next retry), `✗ auth failed`."""
    phase = status.phase if status else LinkPhase.CONNECTING
    mark, style = LINK_STYLE[phase]
    label = phase.value
    if phase is LinkPhase.STALE and paused:
        mark, style, label = "●", "green", "idle"  # a paused run sends nothing: not a fault
    elif phase is LinkPhase.REFUSED and status is not None:
        label = SHORT_KIND.get(status.kind, status.kind)[:11] if status.kind else "refused"
    elif phase is LinkPhase.LOST and status is not None and status.retry_at is not None:
        label = f"lost {fmt.duration(max(0.0, status.retry_at - now))}"
    elif phase is LinkPhase.CONNECTING:
        label = "connecting"
    return Text(f"{mark} {label}", style=style)


def _dot(grid: list[list[int]], c: int, r_lo: int, r_hi: int) -> None:
    for rr in range(r_lo, r_hi + 1):
        grid[rr // 4][c // 2] |= _DOTS[rr % 4][c % 2]


# --- the loss chart -----------------------------------------------------------------------------

_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))  # [row][col] of a 2x4 cell


def braille_plot(
    points: Sequence[tuple[float, float]],
    marks: Sequence[tuple[float, float]],
    width: int,
    height: int,
    *,
    line_style: str = "cyan",
    mark_style: str = "magenta",
    min_span: float = 0.0,
) -> tuple[list[Text], tuple[float, float], tuple[float, float]]:
    """A line of `points` (x, y) and `marks` as ● in a width x height braille grid.

    The y range spans at least `min_span` (centred on the data), so that noise in a flat
    curve is not stretched into a full-height V. Returns the rows (top first) and the x and
    y ranges drawn, for the axis labels.
    """
    width, height = max(1, width), max(1, height)
    allp = list(points) + list(marks)
    if not allp:
        return [Text(" " * width) for _ in range(height)], (0.0, 0.0), (0.0, 0.0)
    xs = [p[0] for p in allp]
    ys = [p[1] for p in allp if math.isfinite(p[1])]
    x0, x1 = min(xs), max(xs)
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if y1 - y0 < 1e-9:
        y0, y1 = y0 - 0.5, y1 + 0.5
    if y1 - y0 < min_span:
        mid = (y0 + y1) / 2
        y0, y1 = mid - min_span / 2, mid + min_span / 2
    pw, ph = width * 2, height * 4
    grid = [[0] * width for _ in range(height)]

    def px(x: float) -> int:
        return 0 if x1 == x0 else min(pw - 1, int((x - x0) / (x1 - x0) * (pw - 1) + 0.5))

    def py(y: float) -> int:
        return min(ph - 1, max(0, int((y1 - y) / (y1 - y0) * (ph - 1) + 0.5)))

    # One value per pixel column (the mean of the points falling there), then join neighbours.
    cols: dict[int, list[float]] = {}
    for x, y in points:
        if math.isfinite(y):
            cols.setdefault(px(x), []).append(y)
    prev: tuple[int, int] | None = None
    for c in sorted(cols):
        r = py(sum(cols[c]) / len(cols[c]))
        if prev is None:
            _dot(grid, c, r, r)
        else:
            # Join to the previous point column by column, filling each column's vertical run.
            c0, r0 = prev
            last = r0
            for cc in range(c0 + 1, c + 1):
                rr = round(r0 + (r - r0) * (cc - c0) / (c - c0))
                _dot(grid, cc, min(last, rr), max(last, rr))
                last = rr
        prev = (c, r)
    mark_cells = {(py(y) // 4, px(x) // 2) for x, y in marks if math.isfinite(y)}
    rows = []
    for ri, row in enumerate(grid):
        text = Text()
        for ci, bits in enumerate(row):
            if (ri, ci) in mark_cells:
                text.append("●", mark_style)
            elif bits:
                text.append(chr(0x2800 + bits), line_style)
            else:
                text.append(" ")
        rows.append(text)
    return rows, (x0, x1), (y0, y1)
