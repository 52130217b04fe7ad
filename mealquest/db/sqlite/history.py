"""The job history behind the dashboard's charts, on SQLite.

The triggers of the migration count each start and each end of an attempt
into `job_history` in the transaction that moves the job, per minute and
per ten minutes, so reading a chart reads a few rows per kind and period,
never the jobs, and answers one row per kind and period. Periods are stored
as 'YYYY-MM-DDTHH:MM' (UTC), the first minute of the period.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from mealquest.db.driver import Reads, Transaction
from mealquest.db.history_summary import SUMMARY
from mealquest.db.sqlite.periodic import current_time
from mealquest.model.history import History, HistoryPeriod

WIDTHS = (1, 10)


def fold_history(tx: Transaction) -> None:
    """Nothing to fold on SQLite: its triggers count in place (one writer at a
    time, so no transaction waits on another for it)."""


def _period_start(moment: datetime, width: int) -> datetime:
    moment = moment.astimezone(UTC).replace(second=0, microsecond=0)
    return moment - timedelta(minutes=moment.minute % width)


def _period_text(start: datetime) -> str:
    return start.strftime("%Y-%m-%dT%H:%M")


def history(
    conn: Reads,
    *,
    width: int,
    periods: int,
    since: datetime | None = None,
    now: datetime | None = None,
) -> History:
    """Each kind's periods among the last `periods` of `width` minutes (from
    `since`, if later), summed and their percentiles found in one statement
    (`mealquest.db.history_summary`) over the rows the primary key's range
    holds."""
    if width not in WIDTHS or periods < 1:
        raise ValueError("width must be 1 or 10 and periods at least 1")
    moment = current_time(conn, now)
    last = _period_start(moment, width)
    first = last - timedelta(minutes=width * (periods - 1))
    if since is not None:
        first = max(first, since)
    rows = conn.execute(
        "WITH h AS (SELECT period, kind, series, bucket, count FROM job_history "
        f"WHERE width = ? AND period >= ? AND period <= ?), {SUMMARY}",
        (width, _period_text(first), _period_text(last)),
    ).fetchall()
    starts: dict[str, datetime] = {}
    summed = []
    for period, *rest in rows:
        start = starts.get(period)
        if start is None:
            start = starts[period] = datetime.fromisoformat(period).replace(tzinfo=UTC)
        summed.append(HistoryPeriod(start, *rest))
    return History(width, periods, last, summed, moment)


def duration_bounds(conn: Reads) -> list[float]:
    rows = conn.execute("SELECT lower_seconds FROM job_duration_buckets ORDER BY bucket").fetchall()
    return [float(row[0]) for row in rows]


def delete_history(
    tx: Transaction,
    *,
    width: int,
    older_than_seconds: float,
    limit: int,
    now: datetime | None = None,
) -> int:
    """Delete up to `limit` rows of `width` whose period began more than that
    long ago, oldest first (the primary key's order)."""
    before = current_time(tx, now) - timedelta(seconds=older_than_seconds)
    cursor = tx.execute(
        "DELETE FROM job_history WHERE (width, period, kind, series, bucket) IN ("
        "SELECT width, period, kind, series, bucket FROM job_history "
        "WHERE width = ? AND period < ? ORDER BY period LIMIT ?)",
        (width, _period_text(before.astimezone(UTC)), limit),
    )
    return cursor.rowcount
