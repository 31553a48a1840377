"""A chart's (x, y) points, bounded: when full, neighbours are averaged pairwise.

So a long run keeps its whole shape at a coarser grain instead of losing its start.
"""

from __future__ import annotations


class Series:
    """(x, y) points for a chart, at most about `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(4, capacity)
        self.clear()

    def clear(self) -> None:
        """Forget every point (a new run)."""
        self.points: list[tuple[float, float]] = []
        self.stride = 1  # raw points per stored point
        self._pending: list[tuple[float, float]] = []
        self.last_x = float("-inf")
        self.last_y: float | None = None
        self.version = 0

    def add(self, x: float, y: float) -> None:
        self.last_x, self.last_y = x, y
        self.version += 1
        self._pending.append((x, y))
        if len(self._pending) < self.stride:
            return
        self.points.append(_mean(self._pending))
        self._pending = []
        if len(self.points) >= self.capacity:
            pts = self.points
            self.points = [_mean(pts[i : i + 2]) for i in range(0, len(pts), 2)]
            self.stride *= 2

    def all(self) -> list[tuple[float, float]]:
        """Stored points plus the partial bucket, so the newest value is always drawn."""
        return self.points + ([_mean(self._pending)] if self._pending else [])

    def __len__(self) -> int:
        return len(self.points) + (1 if self._pending else 0)

    def __bool__(self) -> bool:
        return len(self) > 0


def _mean(pts: list[tuple[float, float]]) -> tuple[float, float]:
    return (sum(p[0] for p in pts) / len(pts), sum(p[1] for p in pts) / len(pts))
