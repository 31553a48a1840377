"""The loss chart's y axis has a floor (issue 18, defect 10): a flat start of 5.76-5.77 drew
its noise as a full-height V."""

from __future__ import annotations

from console import render
from console.widgets.loss_chart import MIN_SPAN_SHARE, LossChart


def rows_used(rows) -> int:
    return sum(1 for r in rows if r.plain.strip())


def test_a_flat_curve_is_drawn_flat():
    noise = [(x, 5.765 + (0.005 if x % 2 else -0.005)) for x in range(1, 60)]
    rows, _, (y0, y1) = render.braille_plot(noise, [], 40, 12, min_span=0.02 * 5.77)
    assert y1 - y0 >= 0.115 and y0 < 5.76 and y1 > 5.77  # centred on the data
    assert rows_used(rows) <= 2  # a band, not a V from top to bottom
    bare, _, (b0, b1) = render.braille_plot(noise, [], 40, 12)
    assert b1 - b0 < 0.011 and rows_used(bare) > 8  # what the floor prevents


def test_a_falling_curve_keeps_its_own_range():
    falling = [(x, 5.8 - 0.05 * x) for x in range(1, 60)]
    _, _, (y0, y1) = render.braille_plot(falling, [], 40, 12, min_span=0.02 * 5.8)
    assert (y0, y1) == (min(y for _, y in falling), 5.75)


def test_the_console_chart_applies_the_floor():
    import asyncio

    from textual.app import App

    class One(App):
        def compose(self):
            yield LossChart()

    async def drawn() -> int:
        app = One()
        async with app.run_test(size=(50, 16)) as pilot:
            chart = app.query_one(LossChart)
            noise = [(x, 5.765 + (0.005 if x % 2 else -0.005)) for x in range(1, 60)]
            chart.set_series(noise, [])
            await pilot.pause(0.1)
            lines = chart.render().plain.splitlines()[:-1]  # the plot, without the x axis
            return sum(1 for line in lines if line[7:].strip())

    assert asyncio.run(drawn()) <= 3  # of 13 rows: a flat band, not a V
    assert MIN_SPAN_SHARE * 5.77 > 0.1
