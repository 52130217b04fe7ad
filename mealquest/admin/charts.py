"""The overview's charts as drawings: each kind's outcomes (stacked bars) and
its wait and run times (p50 and p95 lines, on a log scale), laid out here and
drawn as inline SVG by `templates/admin/_charts.html`. No script draws them:
the page's refresh swaps in new ones with the rest of the figures.

Every bar and point carries its series, period and value as `data-`
attributes (and a `<title>` a browser shows on hover), so what a chart says
can be read back exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from mealquest.job_history import OUTCOMES, Charts, KindHistory, Period

WIDTH = 380
HEIGHT = 142
# Room for the y labels, the title and legend rows, and the x labels.
_LEFT, _RIGHT, _TOP, _BOTTOM = 46, 10, 30, 18
_PLOT_W = WIDTH - _LEFT - _RIGHT
_PLOT_H = HEIGHT - _TOP - _BOTTOM

COLORS = {
    "succeeded": "#19733a",
    "failed": "#b3261e",
    "cancelled": "#8a8f98",
    "p50": "#0b5cad",
    "p95": "#c26a00",
}
# Ticks of the duration charts' log scale, in seconds.
_DURATION_TICKS = (
    (0.01, "10 ms"),
    (0.1, "100 ms"),
    (1.0, "1 s"),
    (10.0, "10 s"),
    (60.0, "1 min"),
    (600.0, "10 min"),
    (3600.0, "1 h"),
    (36000.0, "10 h"),
    (86400.0, "1 d"),
)
_FLOOR_SECONDS = 0.005


@dataclass(frozen=True)
class Tick:
    at: float
    label: str
    anchor: str = "end"


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    series: str
    period: str
    value: int
    label: str


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    series: str
    period: str
    value: float
    label: str


@dataclass(frozen=True)
class Line:
    series: str
    points: str
    dashed: bool


@dataclass
class Chart:
    """One drawing: `chart` is `outcomes`, `wait` or `run`."""

    kind: str
    chart: str
    title: str
    legend: list[tuple[str, str, bool]]
    bars: list[Bar] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    width: int = WIDTH
    height: int = HEIGHT
    left: int = _LEFT
    top: int = _TOP
    plot_width: int = _PLOT_W
    plot_height: int = _PLOT_H


@dataclass(frozen=True)
class KindCharts:
    kind: str
    totals: dict[str, int]
    charts: list[Chart]


def period_text(start: datetime) -> str:
    """A period as the charts' attributes name it: RFC 3339, to the minute."""
    return start.strftime("%Y-%m-%dT%H:%MZ")


def _clock(start: datetime) -> str:
    return start.strftime("%H:%M")


def duration_text(seconds: float) -> str:
    if seconds < 0.01:
        return "under 10 ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _x_ticks(starts: list[datetime]) -> list[Tick]:
    """The first period's time, the middle one's and the latest's (now's)."""
    slot = _PLOT_W / len(starts)
    return [
        Tick(_LEFT, _clock(starts[0]), "start"),
        Tick(_LEFT + slot * (len(starts) // 2 + 0.5), _clock(starts[len(starts) // 2]), "middle"),
        Tick(_LEFT + _PLOT_W, _clock(starts[-1]), "end"),
    ]


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at or above `value`."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def outcomes_chart(history: KindHistory, starts: list[datetime]) -> Chart:
    chart = Chart(
        history.kind,
        "outcomes",
        "jobs ended",
        [(str(series), COLORS[series], False) for series in OUTCOMES],
    )
    top = _nice_ceiling(max((sum(p.outcomes.values()) for p in history.periods), default=1) or 1)
    slot = _PLOT_W / len(starts)
    width = max(1.0, slot - 1.0)
    for index, period in enumerate(history.periods):
        base = 0
        for series in OUTCOMES:
            value = period.outcomes.get(series, 0)
            if not value:
                continue
            y_low = _TOP + _PLOT_H * (1 - base / top)
            y_high = _TOP + _PLOT_H * (1 - (base + value) / top)
            chart.bars.append(
                Bar(
                    x=round(_LEFT + slot * index + 0.5, 2),
                    y=round(y_high, 2),
                    width=round(width, 2),
                    height=round(max(y_low - y_high, 0.5), 2),
                    series=str(series),
                    period=period_text(period.start),
                    value=value,
                    label=f"{_clock(period.start)} {series} {value}",
                )
            )
            base += value
    chart.y_ticks = [Tick(_TOP + _PLOT_H, "0"), Tick(_TOP, str(top))]
    chart.x_ticks = _x_ticks(starts)
    return chart


def _duration_scale(periods: list[Period], measure: str) -> tuple[float, float]:
    values = [
        value
        for period in periods
        for value in (getattr(period, f"{measure}_p50"), getattr(period, f"{measure}_p95"))
        if value is not None
    ]
    high = max([1.0, *values])
    ceiling = next((at for at, _ in _DURATION_TICKS if at >= high), _DURATION_TICKS[-1][0])
    return math.log10(_FLOOR_SECONDS), math.log10(max(ceiling, high))


def duration_chart(history: KindHistory, starts: list[datetime], measure: str) -> Chart:
    """`measure` is `wait` (due time to start) or `run` (start to end)."""
    chart = Chart(
        history.kind,
        measure,
        "wait (due to start)" if measure == "wait" else "run time",
        [("p50", COLORS["p50"], False), ("p95", COLORS["p95"], True)],
    )
    low, high = _duration_scale(history.periods, measure)
    slot = _PLOT_W / len(starts)

    def y_of(seconds: float) -> float:
        share = (math.log10(max(seconds, _FLOOR_SECONDS)) - low) / (high - low)
        return round(_TOP + _PLOT_H * (1 - share), 2)

    for series, dashed in (("p50", False), ("p95", True)):
        run: list[str] = []
        for index, period in enumerate(history.periods):
            value = getattr(period, f"{measure}_{series}")
            if value is None:
                if len(run) > 1:
                    chart.lines.append(Line(series, " ".join(run), dashed))
                run = []
                continue
            x = round(_LEFT + slot * (index + 0.5), 2)
            y = y_of(value)
            run.append(f"{x},{y}")
            chart.points.append(
                Point(
                    x,
                    y,
                    series,
                    period_text(period.start),
                    value,
                    f"{_clock(period.start)} {series} {duration_text(value)}",
                )
            )
        if len(run) > 1:
            chart.lines.append(Line(series, " ".join(run), dashed))
    chart.y_ticks = [
        Tick(y_of(at), label) for at, label in _DURATION_TICKS if low <= math.log10(at) <= high
    ]
    chart.x_ticks = _x_ticks(starts)
    return chart


def lay_out(charts: Charts) -> list[KindCharts]:
    """Each kind's three charts."""
    return [
        KindCharts(
            history.kind,
            {str(series): history.total(series) for series in OUTCOMES},
            [
                outcomes_chart(history, charts.starts),
                duration_chart(history, charts.starts, "wait"),
                duration_chart(history, charts.starts, "run"),
            ],
        )
        for history in charts.kinds
    ]
