"""Training loss as a braille line, eval losses as dots, with the axes labelled."""

from __future__ import annotations

import math

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from console import render

Y_LABEL = 7  # width of the y-axis labels
# The y axis spans at least this fraction of the loss (or MIN_SPAN): 5.76-5.77 drew noise as
# a full-height V; 2% of 5.77 is 0.12, about what a first minute of learning moves.
MIN_SPAN, MIN_SPAN_SHARE = 0.05, 0.02


class LossChart(Widget):
    """The loss curve of the whole run; older points are merged so it always fits."""

    DEFAULT_CSS = """
    LossChart {
        border: round $panel-lighten-2;
        border-title-color: $text-muted;
        background: $surface;
        min-width: 20;
    }
    """

    version: reactive[int] = reactive(0, layout=False)
    """Bumped by the app when the series change; the points themselves live in `points`."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.points: list[tuple[float, float]] = []
        self.evals: list[tuple[float, float]] = []
        self.border_title = "loss ⣀ train ● eval"

    def set_series(
        self, points: list[tuple[float, float]], evals: list[tuple[float, float]]
    ) -> None:
        self.points, self.evals = points, evals
        self.version += 1

    def render(self) -> Text:
        width, height = self.content_size.width, self.content_size.height
        if not self.points and not self.evals:
            return Text("waiting for the first update…", style="bright_black")
        plot_w = max(1, width - Y_LABEL)
        plot_h = max(1, height - 1)
        ys = [abs(y) for _, y in [*self.points, *self.evals] if math.isfinite(y)]
        level = max(ys, default=0.0)
        floor = max(MIN_SPAN, MIN_SPAN_SHARE * level)
        rows, (x0, x1), (y0, y1) = render.braille_plot(
            self.points, self.evals, plot_w, plot_h, min_span=floor
        )
        out = []
        for i, row in enumerate(rows):
            label = f"{y1:.3g}" if i == 0 else f"{y0:.3g}" if i == plot_h - 1 else ""
            line = Text(f"{label:>{Y_LABEL - 1}} ", style="bright_black")
            line.append_text(row)
            out.append(line)
        if height > 1:
            left, right = f"{x0:,.0f}", f"{x1:,.0f}"
            gap = max(1, plot_w - len(left) - len(right))
            out.append(Text(" " * Y_LABEL + left + " " * gap + right, style="bright_black"))
        return Text("\n").join(out)
