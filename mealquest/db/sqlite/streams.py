"""Households' open event streams on SQLite, counted against their limit.

SQLite writes one transaction at a time, so the count and the insert of
`open_stream` hold together: two streams opened at once cannot both take
the household's last place."""

from __future__ import annotations

from datetime import timedelta

from mealquest.clock import from_text, to_text, utc_now
from mealquest.db.driver import Transaction


def open_stream(
    tx: Transaction,
    *,
    stream_id: str,
    household_id: int,
    owner: str,
    at_most: int,
    stale_after_seconds: float,
) -> float | None:
    moment = utc_now()
    cutoff = to_text(moment - timedelta(seconds=stale_after_seconds))
    row = tx.execute(
        "SELECT count(*) AS open, min(opened_at) AS oldest FROM job_streams "
        "WHERE household_id = ? AND seen_at >= ?",
        (household_id, cutoff),
    ).fetchone()
    if row["open"] >= at_most:
        return max(0.0, (moment - from_text(row["oldest"])).total_seconds())
    now = to_text(moment)
    tx.execute(
        "INSERT INTO job_streams (id, household_id, owner, opened_at, seen_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (stream_id, household_id, owner, now, now),
    )
    return None


def close_stream(tx: Transaction, stream_id: str) -> None:
    tx.execute("DELETE FROM job_streams WHERE id = ?", (stream_id,))


def renew_streams(tx: Transaction, owner: str, *, stale_after_seconds: float) -> int:
    moment = utc_now()
    tx.execute(
        "DELETE FROM job_streams WHERE seen_at < ?",
        (to_text(moment - timedelta(seconds=2 * stale_after_seconds)),),
    )
    cursor = tx.execute(
        "UPDATE job_streams SET seen_at = ? WHERE owner = ?", (to_text(moment), owner)
    )
    return cursor.rowcount
