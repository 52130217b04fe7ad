"""The overview's charts as inline SVG: each kind's outcomes (stacked bars)
and its wait and run times (p50 and p95 lines, on a log scale). No script
draws them: the page's refresh swaps in new ones with the rest of the
figures.

Every bar and point carries its series, period and value as `data-`
attributes (and a `<title>` a browser shows on hover), so what a chart says
can be read back exactly. The markup is written here as text: a day's charts
are a few thousand elements, which a template's loops made a page's
slowest part. Only the kind's name comes from outside; it is escaped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

from mealquest.job_history import OUTCOMES, Charts, KindHistory

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
_DASHED = {"p95"}
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
_TITLES = {"outcomes": "jobs ended", "wait": "wait (due to start)", "run": "run time"}


@dataclass(frozen=True)
class KindCharts:
    kind: str
    totals: dict[str, int]
    charts: list[Markup]


def period_text(start: datetime) -> str:
    """A period as the charts' attributes name it: RFC 3339, to the minute."""
    return start.strftime("%Y-%m-%dT%H:%MZ")


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


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... at or above `value`."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def _frame(index: int, chart: str, kind: str, legend: tuple[str, ...]) -> list[str]:
    """The chart's opening: its element, title, plot area and legend."""
    title = f"{kind}: {_TITLES[chart]}"
    parts = [
        f'<svg class="chart" id="chart-{index}-{chart}" data-kind="{kind}" data-chart="{chart}" '
        f'width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{title}" xmlns="http://www.w3.org/2000/svg"><title>{title}</title>',
        f'<rect x="{_LEFT}" y="{_TOP}" width="{_PLOT_W}" height="{_PLOT_H}" fill="#fff" '
        'stroke="#dde1e7"/>',
        f'<text x="{_LEFT}" y="12" font-size="11" font-weight="600" fill="#1d2430">'
        f"{_TITLES[chart]}</text>",
    ]
    for place, series in enumerate(legend):
        dash = ' stroke-dasharray="4 2"' if series in _DASHED else ""
        parts.append(
            f'<g transform="translate({_LEFT + place * 78}, 22)"><line x1="0" y1="0" x2="14" '
            f'y2="0" stroke="{COLORS[series]}" stroke-width="3"{dash}/><text x="18" y="4" '
            f'font-size="10" fill="#5b5f66">{series}</text></g>'
        )
    return parts


def _y_tick(y: float, label: str) -> str:
    return (
        f'<line x1="{_LEFT}" y1="{y}" x2="{_LEFT + _PLOT_W}" y2="{y}" stroke="#eef0f4"/>'
        f'<text x="{_LEFT - 4}" y="{y + 3:.2f}" font-size="9" text-anchor="end" '
        f'fill="#5b5f66">{label}</text>'
    )


def _x_ticks(labels: list[tuple[str, str]]) -> str:
    """The first period's time, the middle one's and the latest's (now's)."""
    slot = _PLOT_W / len(labels)
    middle = len(labels) // 2
    ticks = (
        (_LEFT, labels[0][1], "start"),
        (_LEFT + slot * (middle + 0.5), labels[middle][1], "middle"),
        (_LEFT + _PLOT_W, labels[-1][1], "end"),
    )
    return "".join(
        f'<text x="{x:.2f}" y="{HEIGHT - 5}" font-size="9" text-anchor="{anchor}" '
        f'fill="#5b5f66">{clock}</text>'
        for x, clock, anchor in ticks
    )


# Each period's name in the attributes, and its time of day, as `lay_out` makes them once.
Labels = list[tuple[str, str]]


def outcomes_chart(index: int, history: KindHistory, labels: Labels) -> Markup:
    kind = str(escape(history.kind))
    parts = _frame(index, "outcomes", kind, tuple(OUTCOMES))
    top = _nice_ceiling(
        max((p.succeeded + p.failed + p.cancelled for p in history.periods), default=1) or 1
    )
    slot = _PLOT_W / len(labels)
    width = max(1.0, slot - 1.0)
    for place, period in enumerate(history.periods):
        base = 0
        for series in OUTCOMES:
            value = period.outcome(series)
            if not value:
                continue
            y_low = _TOP + _PLOT_H * (1 - base / top)
            y_high = _TOP + _PLOT_H * (1 - (base + value) / top)
            name, clock = labels[place]
            parts.append(
                f'<rect class="bar" data-series="{series}" data-period="{name}" '
                f'data-value="{value}" x="{_LEFT + slot * place + 0.5:.2f}" y="{y_high:.2f}" '
                f'width="{width:.2f}" height="{max(y_low - y_high, 0.5):.2f}" '
                f'fill="{COLORS[series]}"><title>{clock} {series} {value}</title></rect>'
            )
            base += value
    parts += [_y_tick(_TOP + _PLOT_H, "0"), _y_tick(_TOP, str(top)), _x_ticks(labels), "</svg>"]
    return Markup("".join(parts))  # noqa: S704 - the kind is escaped; the rest is ours


def duration_chart(index: int, history: KindHistory, labels: Labels, measure: str) -> Markup:
    """`measure` is `wait` (due time to start) or `run` (start to end)."""
    kind = str(escape(history.kind))
    parts = _frame(index, measure, kind, ("p50", "p95"))
    series_values = {
        "p50": [getattr(p, f"{measure}_p50") for p in history.periods],
        "p95": [getattr(p, f"{measure}_p95") for p in history.periods],
    }
    high = max([1.0, *(v for values in series_values.values() for v in values if v is not None)])
    ceiling = next((at for at, _ in _DURATION_TICKS if at >= high), _DURATION_TICKS[-1][0])
    low, high = math.log10(_FLOOR_SECONDS), math.log10(max(ceiling, high))
    scale = _PLOT_H / (high - low)

    def y_of(seconds: float) -> float:
        return _TOP + _PLOT_H - (math.log10(max(seconds, _FLOOR_SECONDS)) - low) * scale

    for at, label in _DURATION_TICKS:
        if low <= math.log10(at) <= high:
            parts.append(_y_tick(round(y_of(at), 2), label))
    slot = _PLOT_W / len(labels)
    for series, values in series_values.items():
        color = COLORS[series]
        dash = ' stroke-dasharray="4 2"' if series in _DASHED else ""
        run: list[str] = []
        points: list[str] = []
        for place, value in enumerate([*values, None]):
            if value is None:
                if len(run) > 1:
                    parts.append(
                        f'<polyline class="line" data-series="{series}" points="{" ".join(run)}" '
                        f'fill="none" stroke="{color}" stroke-width="1.5"{dash}/>'
                    )
                run = []
                continue
            x, y = _LEFT + slot * (place + 0.5), y_of(value)
            run.append(f"{x:.2f},{y:.2f}")
            name, clock = labels[place]
            points.append(
                f'<circle class="point" data-series="{series}" data-period="{name}" '
                f'data-value="{value:.6g}" cx="{x:.2f}" cy="{y:.2f}" r="2" fill="{color}">'
                f"<title>{clock} {series} {duration_text(value)}</title></circle>"
            )
        parts += points
    parts += [_x_ticks(labels), "</svg>"]
    return Markup("".join(parts))  # noqa: S704 - the kind is escaped; the rest is ours


def lay_out(charts: Charts) -> list[KindCharts]:
    """Each kind's three charts."""
    labels = [(period_text(start), start.strftime("%H:%M")) for start in charts.starts]
    return [
        KindCharts(
            history.kind,
            {str(series): history.total(series) for series in OUTCOMES},
            [
                outcomes_chart(index, history, labels),
                duration_chart(index, history, labels, "wait"),
                duration_chart(index, history, labels, "run"),
            ],
        )
        for index, history in enumerate(charts.kinds)
    ]
