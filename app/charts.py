"""The overview's throughput charts, drawn on the server as SVG (no JavaScript, no chart library).

The plot is an SVG stretched to its box (preserveAspectRatio="none", strokes that do not scale), so it
fills a phone as well as a laptop; axis labels and the legend are HTML text next to it, positioned in
percent of the plot, so they stay readable at any width instead of shrinking with the drawing.
Colours come from the stylesheet's variables, so the chart follows the light or dark scheme.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

WIDTH, HEIGHT = 1000.0, 200.0  # the SVG's own coordinates; the browser stretches them to the box
HEADROOM = 0.95  # the tallest value reaches 95% of the height, so its line is never clipped
SERIES = (("succeeded", "succeeded"), ("failed", "failed attempts"), ("dead", "dead"))


@dataclass(frozen=True)
class Mark:
    """One drawn shape of a series: a bar (x, y, width, height) or, for lines, a polyline's points."""

    x: float
    y: float
    width: float
    height: float


@dataclass(frozen=True)
class Series:
    name: str  # the stats field, also the CSS class that colours it
    label: str
    total: int
    points: str  # polyline points ("x,y x,y ..."), for line charts
    bars: list[Mark]  # for bar charts


@dataclass(frozen=True)
class Bucket:
    x: float  # left edge, SVG units
    width: float
    tooltip: str


@dataclass(frozen=True)
class Tick:
    text: str
    percent: float  # from the top (y axis) or from the left (x axis)


@dataclass(frozen=True)
class Chart:
    name: str
    title: str
    style: Literal["lines", "bars"]
    series: list[Series]
    buckets: list[Bucket]
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    description: str  # the accessible summary of the whole chart
    width: float = WIDTH
    height: float = HEIGHT


def nice_ceiling(value: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least `value` (at least 1)."""
    if value <= 1:
        return 1
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return int(step * magnitude)
    return int(10 * magnitude)


def throughput_chart(
    name: str,
    title: str,
    rows: Sequence[dict[str, Any]],
    key: str,
    label: Callable[[Any], str],
    tick_every: int,
    style: Literal["lines", "bars"],
) -> Chart:
    """A chart of succeeded, failed attempts and dead over `rows` (oldest first, one per bucket at `key`),
    with an x label every `tick_every` buckets (counted back from the newest, so it is always labelled)."""
    count = max(len(rows), 1)
    step = WIDTH / count
    top = nice_ceiling(max([0] + [row[field] for row in rows for field, _ in SERIES]))

    def y(value: float) -> float:
        return round(HEIGHT - HEIGHT * HEADROOM * value / top, 2)

    series = []
    for index, (field, text) in enumerate(SERIES):
        points = " ".join(f"{round((i + 0.5) * step, 2)},{y(row[field])}" for i, row in enumerate(rows))
        bar_width = step * 0.8 / len(SERIES)
        bars = [
            Mark(
                round(i * step + step * 0.1 + index * bar_width, 2),
                y(row[field]),
                round(bar_width, 2),
                round(HEIGHT - y(row[field]), 2),
            )
            for i, row in enumerate(rows)
            if row[field]
        ]
        series.append(Series(field, text, sum(row[field] for row in rows), points, bars))
    buckets = [
        Bucket(
            round(i * step, 2),
            round(step, 2),
            f"{label(row[key])}: " + ", ".join(f"{row[field]} {text}" for field, text in SERIES),
        )
        for i, row in enumerate(rows)
    ]
    values = [top] + ([top // 2] if top >= 2 else []) + [0]
    y_ticks = [Tick(f"{value:,}", round(100 - 100 * HEADROOM * value / top, 2)) for value in values]
    x_ticks = [
        Tick(label(rows[i][key]), round(100 * (i + 0.5) / count, 2)) for i in range(len(rows) - 1, -1, -tick_every)
    ][::-1]
    totals = ", ".join(f"{s.total} {s.label}" for s in series)
    return Chart(name, title, style, series, buckets, y_ticks, x_ticks, f"{title}: {totals}")
