"""Households' open event streams on PostgreSQL, counted against their limit.

Two hosts may open a household's streams at once: each open takes a
transaction advisory lock on the household first, so that the counts and
inserts of one household's opens take turns (other households' do not wait),
as the quota's enqueues do."""

from __future__ import annotations

from mealquest.db.driver import Transaction

# Transaction advisory locks (class, household) serialising a household's stream opens.
_STREAM_LOCK_CLASS = int.from_bytes(b"mqst", "big") - (1 << 31)


def open_stream(
    tx: Transaction,
    *,
    stream_id: str,
    household_id: int,
    owner: str,
    at_most: int,
    stale_after_seconds: float,
) -> float | None:
    tx.execute(
        "SELECT pg_advisory_xact_lock(%s, (%s::bigint %% 2147483647)::integer)",
        (_STREAM_LOCK_CLASS, household_id),
    ).fetchall()
    row = tx.execute(
        "SELECT count(*) AS open, extract(epoch FROM now() - min(opened_at)) AS oldest "
        "FROM job_streams WHERE household_id = %s "
        "AND seen_at >= now() - make_interval(secs => %s)",
        (household_id, float(stale_after_seconds)),
    ).fetchone()
    if row["open"] >= at_most:
        return max(0.0, float(row["oldest"]))
    tx.execute(
        "INSERT INTO job_streams (id, household_id, owner, opened_at, seen_at) "
        "VALUES (%s, %s, %s, now(), now())",
        (stream_id, household_id, owner),
    )
    return None


def close_stream(tx: Transaction, stream_id: str) -> None:
    tx.execute("DELETE FROM job_streams WHERE id = %s", (stream_id,))


def renew_streams(tx: Transaction, owner: str, *, stale_after_seconds: float) -> int:
    tx.execute(
        "DELETE FROM job_streams WHERE seen_at < now() - make_interval(secs => %s)",
        (2 * float(stale_after_seconds),),
    )
    cursor = tx.execute("UPDATE job_streams SET seen_at = now() WHERE owner = %s", (owner,))
    return cursor.rowcount
