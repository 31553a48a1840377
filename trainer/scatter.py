"""Robust scatter of timing figures: the MAD's spread, its floor, and a median's standard error."""

from __future__ import annotations

import statistics

SIGMA_FLOOR = 0.03  # no machine is steadier than this (log units: timer, scheduler)
MAD_SIGMA = 1.4826  # a MAD times this is the standard deviation, were the figures normal
MEDIAN_SE = 1.2533  # a median's standard error over a mean's: sqrt(pi/2)


def spread(q: list[float]) -> float:
    """The scatter of figures `q`: MAD_SIGMA times their median absolute deviation."""
    mid = statistics.median(q)
    return MAD_SIGMA * statistics.median(abs(x - mid) for x in q)
