"""The console's figures, bars, sparklines and plots as text."""

from __future__ import annotations

from console import fmt, render
from console.link_phase import LinkPhase, LinkStatus
from tests.support.console_fakes import GiB, update

# --- formatting and bars -----------------------------------------------------------------------


def test_fmt_figures_are_short():
    assert fmt.nbytes(16 * GiB) == "16G"
    assert fmt.nbytes(1.5 * GiB) == "1.5G"
    assert fmt.secs(0.532) == "532ms"
    assert fmt.secs(12.34) == "12.3s"
    assert fmt.duration(3725) == "1h02m"
    assert fmt.duration(65) == "1m05s"
    assert fmt.count(12345) == "12.3k"
    assert fmt.count(None) == "—"


def test_time_bar_shares_cells_by_time_and_scale():
    u = update(0, 1, batch=2, per_sample=0.1, slowest=0.4)  # compute 0.2, wait 0.2, other 0.02
    bar = render.time_bar(u, 20).plain
    assert len(bar) == 20
    assert abs(bar.count(render.COMPUTE) - bar.count(render.WAIT)) <= 1  # equal times
    assert bar.count(render.OTHER) >= 1
    # On a shared scale twice this update's length, the bar uses about half the width.
    half = render.time_bar(u, 20, scale_s=2 * u.update_s).plain
    assert len(half) == 20 and len(half.rstrip()) == 10


def test_mem_bar_marks_active_peak_cache_against_total():
    u = update(0, 1, batch=2)  # active 1.5G, peak 2G, cache 0.5G of 16G
    bar = render.mem_bar(u, 16 * GiB, 32).plain
    assert bar.count(render.ACTIVE) == 3 and bar.count(render.PEAK) == 1
    assert bar.count(render.CACHE) == 1 and len(bar) == 32
    assert render.mem_bar(None, 16 * GiB, 5).plain == "·····"


def test_spark_scales_into_eight_levels():
    assert render.spark([0, 1, 2, 3, 4, 5, 6, 7], 8) == render.SPARKS
    assert render.spark([1, 1], 4) == "  ▁▁"


def test_braille_plot_draws_a_connected_line_and_marks():
    rows, xr, yr = render.braille_plot([(0, 4.0), (10, 2.0)], [(10, 2.0)], 10, 3)
    assert xr == (0, 10) and yr == (2.0, 4.0)
    text = [r.plain for r in rows]
    assert all(len(t) == 10 for t in text)
    assert "●" in text[-1]  # the eval mark at the bottom right
    # Connected: every column up to the mark has a dot somewhere.
    for c in range(9):
        assert any(t[c] != " " for t in text), c


def test_link_text_states():
    assert "idle" in render.link_text(LinkStatus(0, LinkPhase.STALE), 0, paused=True).plain
    assert "stale" in render.link_text(LinkStatus(0, LinkPhase.STALE), 0).plain
    lost = LinkStatus(0, LinkPhase.LOST, "eof", retry_at=103.0)
    assert render.link_text(lost, 100.0).plain == "○ lost 3s"
    refused = LinkStatus(0, LinkPhase.REFUSED, "…", kind="host key changed")
    assert render.link_text(refused, 0).plain == "✗ KEY CHANGED"
