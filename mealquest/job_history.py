"""What the dashboard's charts show, per kind: jobs succeeded, failed and
cancelled, and wait and run time percentiles, per minute over the last hour
or per ten minutes over the last day.

Read from the history the database keeps (`job_history`: counts per kind,
period and duration bucket, written by triggers on `jobs`), never from the
jobs: a chart costs one row per kind and period, however many jobs the
table holds (the database sums the buckets and finds the percentiles'
buckets itself: `mealquest.db.history_summary`).

A percentile comes from the buckets: the smallest bucket in which at least
that share of the period's durations fall holds the true value (the
nearest-rank percentile), and the figure given is the bucket's middle on a
log scale (its lower bound times 2 ** 0.25). Buckets are √2 wide, so the
figure is within a factor of 2 ** 0.25 (19 %) of the true value, either
way. Below 10 ms (the first bucket) the figure is 5 ms and says only "under
10 ms"; from the last bucket's lower bound (about 23.3 hours) it is that
bound, "at least".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from mealquest.db.driver import Reads, Store
from mealquest.model.history import History, HistoryPeriod, Series


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


@dataclass(frozen=True, slots=True)
class Period:
    """One period of one kind: attempts that ended each way, jobs that
    started, and the wait and run time percentiles in seconds (None: none
    started, or none ran to an end, in it)."""

    start: datetime
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    started: int = 0
    wait_p50: float | None = None
    wait_p95: float | None = None
    run_p50: float | None = None
    run_p95: float | None = None

    def outcome(self, series: str) -> int:
        value: int = getattr(self, series)
        return value


@dataclass(frozen=True)
class KindHistory:
    kind: str
    periods: list[Period]
    """Every period of the range, oldest first (empty ones too)."""

    def total(self, series: str) -> int:
        return sum(period.outcome(series) for period in self.periods)


@dataclass(frozen=True)
class Charts:
    range: Range
    starts: list[datetime]
    """The start of each period, oldest first; the last is the one now is in."""
    kinds: list[KindHistory]


def bucket_figure(bucket: int | None, bounds: list[float]) -> float | None:
    """The figure a percentile in `bucket` is given (see the module's docstring)."""
    if bucket is None:
        return None
    if bucket <= 0:
        return bounds[1] / 2
    if bucket >= len(bounds) - 1:
        return bounds[-1]
    return bounds[bucket] * _MIDDLE


def _period(row: HistoryPeriod, bounds: list[float]) -> Period:
    return Period(
        row.period,
        row.succeeded,
        row.failed,
        row.cancelled,
        row.started,
        bucket_figure(row.wait_p50, bounds),
        bucket_figure(row.wait_p95, bounds),
        bucket_figure(row.run_p50, bounds),
        bucket_figure(row.run_p95, bounds),
    )


def charts_of(history: History, bounds: list[float], chart_range: Range) -> Charts:
    width = timedelta(minutes=history.width)
    starts = [
        history.last_period - width * (history.periods - 1 - index)
        for index in range(history.periods)
    ]
    by_kind: dict[str, dict[datetime, Period]] = {}
    for row in history.rows:
        by_kind.setdefault(row.kind, {})[row.period] = _period(row, bounds)
    kinds = [
        KindHistory(kind, [found.get(start) or Period(start) for start in starts])
        for kind, found in sorted(by_kind.items())
    ]
    return Charts(chart_range, starts, kinds)


# A period is final, and kept, once it ended this long ago by the database's
# clock: every transaction that wrote into it has committed by then (a write
# lasts milliseconds; on PostgreSQL events carry their transaction's start).
FINAL_AFTER = timedelta(minutes=1)


@dataclass
class _Kept:
    """A range's final periods: every period up to `through` (its start) is
    final, and those with events are in `rows`."""

    through: datetime | None = None
    rows: dict[datetime, list[HistoryPeriod]] = field(default_factory=dict)


def _period_start(moment: datetime, width: int) -> datetime:
    moment = moment.replace(second=0, microsecond=0)
    return moment - timedelta(minutes=moment.minute % width)


class ChartsReader:
    """A process's charts. Periods that can no longer change are kept, so a
    page reads only the periods since the newest final one (the one or two
    latest), and its cost does not grow with the periods a range shows; the
    first page of a process after its start reads the whole range once."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._kept: dict[Range, _Kept] = {}
        self._bounds: list[float] | None = None

    def read(self, chart_range: Range, now: datetime | None = None) -> Charts:
        """Every kind's chart data for the range (kinds with no event in it are left out)."""
        store = self.store
        kept = self._kept.setdefault(chart_range, _Kept())
        width = timedelta(minutes=chart_range.width)
        since = None if kept.through is None else kept.through + width
        store.write(store.history.fold_history)

        def read(conn: Reads) -> tuple[History, list[float]]:
            history = store.history.history(
                conn, width=chart_range.width, periods=chart_range.periods, since=since, now=now
            )
            return history, self._bounds or store.history.duration_bounds(conn)

        history, bounds = store.read(read)
        self._bounds = bounds
        if kept.through is not None and history.last_period < kept.through:
            # The clock went back (SQLite's is the host's): start again.
            self._kept[chart_range] = _Kept()
            return self.read(chart_range, now)
        fresh: dict[datetime, list[HistoryPeriod]] = {}
        for row in history.rows:
            fresh.setdefault(row.period, []).append(row)
        final = _period_start(history.now - FINAL_AFTER, chart_range.width) - width
        kept.rows.update((start, rows) for start, rows in fresh.items() if start <= final)
        kept.through = final if kept.through is None else max(kept.through, final)
        first = history.last_period - width * (chart_range.periods - 1)
        for start in [start for start in kept.rows if start < first]:
            del kept.rows[start]
        periods = {**kept.rows, **fresh}
        rows = [row for start in sorted(periods) for row in periods[start]]
        whole = History(history.width, history.periods, history.last_period, rows, history.now)
        return charts_of(whole, bounds, chart_range)


def read_charts(store: Store, chart_range: Range, now: datetime | None = None) -> Charts:
    """The charts read whole, keeping nothing (see `ChartsReader`)."""
    return ChartsReader(store).read(chart_range, now)
