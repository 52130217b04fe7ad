"""What the dashboard's charts show, per kind: jobs succeeded, failed and
cancelled, and wait and run time percentiles, per minute over the last hour
or per ten minutes over the last day.

Read from the history the database keeps (`job_history`: counts per kind,
period and duration bucket, written by triggers on `jobs`), never from the
jobs: a chart costs about one row per kind, period and bucket used, however
many jobs the table holds.

A percentile comes from the buckets: the smallest bucket in which at least
that share of the period's events fall holds the true value (the
nearest-rank percentile), and the figure given is the bucket's middle on a
log scale (its lower bound times 2 ** 0.25). Buckets are √2 wide, so the
figure is within a factor of 2 ** 0.25 (19 %) of the true value, either
way. Below 10 ms (the first bucket) the figure is 5 ms and says only "under
10 ms"; from the last bucket's lower bound (about 23.3 hours) it is that
bound, "at least".
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mealquest.db.driver import Reads, Store
from mealquest.model.history import NEVER_RAN, History, Series


class Range(enum.StrEnum):
    """A chart's span, and the periods it is drawn in."""

    HOUR = "hour"
    DAY = "day"

    @property
    def width(self) -> int:
        """Minutes per period."""
        return 1 if self is Range.HOUR else 10

    @property
    def periods(self) -> int:
        return 60 if self is Range.HOUR else 144


# Where a percentile falls inside its bucket: its middle on a log scale.
_MIDDLE = 2**0.25
OUTCOMES = (Series.SUCCEEDED, Series.FAILED, Series.CANCELLED)
_RAN = frozenset((*OUTCOMES, Series.RETRIED))


@dataclass
class Period:
    """One period of one kind: how many attempts ended each way, and the
    wait and run time percentiles in seconds (None: nothing started, or
    nothing ran to an end, in it)."""

    start: datetime
    outcomes: dict[str, int] = field(default_factory=dict)
    wait: dict[int, int] = field(default_factory=dict)
    run: dict[int, int] = field(default_factory=dict)
    wait_p50: float | None = None
    wait_p95: float | None = None
    run_p50: float | None = None
    run_p95: float | None = None

    @property
    def started(self) -> int:
        return sum(self.wait.values())


@dataclass(frozen=True)
class KindHistory:
    kind: str
    periods: list[Period]
    """Every period of the range, oldest first (empty ones too)."""

    def total(self, series: str) -> int:
        return sum(period.outcomes.get(series, 0) for period in self.periods)


@dataclass(frozen=True)
class Charts:
    range: Range
    starts: list[datetime]
    """The start of each period, oldest first; the last is the one now is in."""
    kinds: list[KindHistory]


def percentile(histogram: dict[int, int], share: float, bounds: list[float]) -> float | None:
    """The `share` (0 to 1) percentile of the durations counted in `histogram`
    (bucket -> count), as the module's docstring says; None if it is empty."""
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = max(1, math.ceil(share * total))
    seen = 0
    for bucket in sorted(histogram):
        seen += histogram[bucket]
        if seen >= rank:
            return bucket_figure(bucket, bounds)
    raise AssertionError("unreachable: the ranks add up to the total")


def bucket_figure(bucket: int, bounds: list[float]) -> float:
    """The figure a percentile in `bucket` is given (see the module's docstring)."""
    if bucket <= 0:
        return bounds[1] / 2
    if bucket >= len(bounds) - 1:
        return bounds[-1]
    return bounds[bucket] * _MIDDLE


def _charts(history: History, bounds: list[float], chart_range: Range) -> Charts:
    width = timedelta(minutes=history.width)
    starts = [
        history.last_period - width * (history.periods - 1 - index)
        for index in range(history.periods)
    ]
    by_kind: dict[str, dict[datetime, Period]] = {}
    for row in history.counts:
        of_kind = by_kind.setdefault(row.kind, {})
        period = of_kind.get(row.period)
        if period is None:
            period = of_kind[row.period] = Period(row.period)
        if row.series == Series.WAIT:
            period.wait[row.bucket] = period.wait.get(row.bucket, 0) + row.count
            continue
        if row.series in OUTCOMES:
            period.outcomes[row.series] = period.outcomes.get(row.series, 0) + row.count
        if row.series in _RAN and row.bucket != NEVER_RAN:
            period.run[row.bucket] = period.run.get(row.bucket, 0) + row.count
    kinds = []
    for kind in sorted(by_kind):
        found = by_kind[kind]
        periods = [found.get(start) or Period(start) for start in starts]
        for period in periods:
            period.wait_p50 = percentile(period.wait, 0.5, bounds)
            period.wait_p95 = percentile(period.wait, 0.95, bounds)
            period.run_p50 = percentile(period.run, 0.5, bounds)
            period.run_p95 = percentile(period.run, 0.95, bounds)
        kinds.append(KindHistory(kind, periods))
    return Charts(chart_range, starts, kinds)


def read_charts(store: Store, chart_range: Range, now: datetime | None = None) -> Charts:
    """Every kind's chart data for the range (kinds with no event in it are left out)."""
    store.write(store.history.fold_history)

    def read(conn: Reads) -> tuple[History, list[float]]:
        history = store.history.history(
            conn, width=chart_range.width, periods=chart_range.periods, now=now
        )
        return history, store.history.duration_bounds(conn)

    history, bounds = store.read(read)
    return _charts(history, bounds, chart_range)
