"""The job history behind the dashboard's charts, on PostgreSQL.

A statement trigger appends the starts and ends of attempts that each
statement made to `job_history_changes`, counted per minute, kind, series
and bucket (appended, never updated: concurrent claims and outcomes never
wait on each other for it); `job_history_fold()` moves them
into `job_history`, per minute and per ten minutes, one transaction at a
time. A chart folds first (`fold_history`), then reads the folded rows and
the changes not yet folded in one statement, so it never misses an event a
concurrent fold holds, and gets one row per kind and period. Times are the
database's.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mealquest.db.driver import Reads, Transaction
from mealquest.db.history_summary import SUMMARY
from mealquest.model.history import History, HistoryPeriod

WIDTHS = (1, 10)
# The origin periods are counted from (any whole hour keeps ten-minute periods on the clock's).
_ORIGIN = "timestamptz '2000-01-01 00:00+00'"
_NOW = "coalesce(%(now)s::timestamptz, now())"


def fold_history(tx: Transaction) -> None:
    """Move the noted events into the history (skipped if another transaction
    is folding: its events are still read, from the changes)."""
    tx.execute("SELECT job_history_fold()")


def history(
    conn: Reads,
    *,
    width: int,
    periods: int,
    since: datetime | None = None,
    now: datetime | None = None,
) -> History:
    """Each kind's periods among the last `periods` of `width` minutes (from
    `since`, if later): the folded rows by the primary key's range plus the
    changes not yet folded, summed and their percentiles found in one
    statement (`mealquest.db.history_summary`)."""
    if width not in WIDTHS or periods < 1:
        raise ValueError("width must be 1 or 10 and periods at least 1")
    clock = conn.execute(
        f"SELECT {_NOW} AS now, date_bin(make_interval(mins => %(width)s), {_NOW}, {_ORIGIN}) "
        "AS last",
        {"width": width, "now": now},
    ).fetchone()
    last: datetime = clock["last"]
    first = last - timedelta(minutes=width * (periods - 1))
    if since is not None:
        first = max(first, since)
    rows = conn.execute(
        "WITH h AS (SELECT period, kind, series, bucket, count FROM job_history "
        "WHERE width = %(width)s AND period >= %(first)s AND period <= %(last)s "
        "UNION ALL SELECT * FROM (SELECT date_bin(make_interval(mins => %(width)s), moment, "
        f"{_ORIGIN}) AS period, kind, series, bucket, count FROM job_history_changes) AS c "
        f"WHERE period >= %(first)s AND period <= %(last)s), {SUMMARY}",
        {"width": width, "first": first, "last": last},
    ).fetchall()
    summed = [
        HistoryPeriod(
            row["period"],
            row["kind"],
            int(row["succeeded"]),
            int(row["failed"]),
            int(row["cancelled"]),
            int(row["started"]),
            row["wait_p50"],
            row["wait_p95"],
            row["run_p50"],
            row["run_p95"],
        )
        for row in rows
    ]
    return History(width, periods, last, summed, clock["now"])


def duration_bounds(conn: Reads) -> list[float]:
    rows = conn.execute("SELECT lower_seconds FROM job_duration_buckets ORDER BY bucket").fetchall()
    return [float(row["lower_seconds"]) for row in rows]


def delete_history(
    tx: Transaction,
    *,
    width: int,
    older_than_seconds: float,
    limit: int,
    now: datetime | None = None,
) -> int:
    """Delete up to `limit` rows of `width` whose period began more than that
    long ago, oldest first (the batch chosen once, its rows locked without
    waiting for a fold that holds them)."""
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT width, period, kind, series, bucket "
        "FROM job_history WHERE width = %(width)s AND period < "
        f"{_NOW} - make_interval(secs => %(seconds)s) ORDER BY period LIMIT %(limit)s "
        "FOR UPDATE SKIP LOCKED) "
        "DELETE FROM job_history WHERE (width, period, kind, series, bucket) IN "
        "(SELECT width, period, kind, series, bucket FROM batch)",
        {"width": width, "seconds": float(older_than_seconds), "limit": limit, "now": now},
    )
    return cursor.rowcount
