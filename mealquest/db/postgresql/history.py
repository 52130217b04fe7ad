"""The job history behind the dashboard's charts, on PostgreSQL.

A trigger appends each start and end of an attempt to
`job_history_changes` (appended, never updated: concurrent claims and
outcomes never wait on each other for it); `job_history_fold()` moves them
into `job_history`, per minute and per ten minutes, one transaction at a
time. A chart folds first (`fold_history`), then reads the folded rows and
the changes not yet folded in one statement, so it never misses an event a
concurrent fold holds. Times are the database's.
"""

from __future__ import annotations

from datetime import datetime

from mealquest.db.driver import Reads, Transaction
from mealquest.model.history import History, HistoryCount

WIDTHS = (1, 10)
# The origin periods are counted from (any whole hour keeps ten-minute periods on the clock's).
_ORIGIN = "timestamptz '2000-01-01 00:00+00'"
_NOW = "coalesce(%(now)s::timestamptz, now())"


def fold_history(tx: Transaction) -> None:
    """Move the noted events into the history (skipped if another transaction
    is folding: its events are still read, from the changes)."""
    tx.execute("SELECT job_history_fold()")


def history(conn: Reads, *, width: int, periods: int, now: datetime | None = None) -> History:
    """The counts of the last `periods` periods of `width` minutes: the folded
    rows by the primary key's range, plus the changes not yet folded."""
    if width not in WIDTHS or periods < 1:
        raise ValueError("width must be 1 or 10 and periods at least 1")
    bin_now = f"date_bin(make_interval(mins => %(width)s), {_NOW}, {_ORIGIN})"
    rows = conn.execute(
        f"WITH bounds AS MATERIALIZED (SELECT {bin_now} AS last, "
        f"{bin_now} - make_interval(mins => %(width)s * (%(periods)s - 1)) AS first) "
        "SELECT period, kind, series, bucket, sum(count)::bigint AS count, "
        "(SELECT last FROM bounds) AS last FROM ("
        "SELECT h.period, h.kind, h.series, h.bucket, h.count FROM job_history AS h, bounds AS b "
        "WHERE h.width = %(width)s AND h.period >= b.first AND h.period <= b.last "
        "UNION ALL SELECT date_bin(make_interval(mins => %(width)s), c.moment, "
        f"{_ORIGIN}), c.kind, c.series, c.bucket, 1 FROM job_history_changes AS c) AS all_rows "
        "WHERE period >= (SELECT first FROM bounds) AND period <= (SELECT last FROM bounds) "
        "GROUP BY period, kind, series, bucket",
        {"width": width, "periods": periods, "now": now},
    ).fetchall()
    if rows:
        last = rows[0]["last"]
    else:
        last = conn.execute(f"SELECT {bin_now} AS last", {"width": width, "now": now}).fetchone()[
            "last"
        ]
    counts = [
        HistoryCount(row["period"], row["kind"], row["series"], row["bucket"], int(row["count"]))
        for row in rows
    ]
    return History(width, periods, last, counts)


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
