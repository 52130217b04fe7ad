"""The `periodic_slots` table on PostgreSQL: which scheduled times already made their job.

A slot is claimed by inserting its row in the transaction that enqueues its
job; the primary key (kind, slot_at) refuses a second row, so schedulers on
every host that reach the same slot make one job between them (a second
insert waits for the first transaction, then does nothing if it committed),
and a scheduler that dies before its commit leaves neither row nor job.
Time is the database's clock, as for leases: hosts' clocks differ.
"""

from __future__ import annotations

from datetime import datetime

from mealquest.db.driver import Reads, Transaction


def current_time(tx: Reads, now: datetime | None = None) -> datetime:
    """The database's "now" (`now` overrides it, for tests that stand at a given moment)."""
    if now is not None:
        return now
    moment: datetime = tx.execute("SELECT now() AS now").fetchone()["now"]
    return moment


def first_seen(tx: Transaction, *, kind: str, moment: datetime) -> datetime:
    """When a scheduler first saw `kind`: `moment`, if this is the first time."""
    tx.execute(
        "INSERT INTO periodic_kinds (kind, first_seen_at) VALUES (%s, %s) "
        "ON CONFLICT (kind) DO NOTHING",
        (kind, moment),
    )
    row = tx.execute("SELECT first_seen_at FROM periodic_kinds WHERE kind = %s", (kind,)).fetchone()
    seen: datetime = row["first_seen_at"]
    return seen


def claim_slot(tx: Transaction, *, kind: str, slot_at: datetime) -> bool:
    """Insert the slot's row; False if another scheduler already has it."""
    cursor = tx.execute(
        "INSERT INTO periodic_slots (kind, slot_at) VALUES (%s, %s) "
        "ON CONFLICT (kind, slot_at) DO NOTHING",
        (kind, slot_at),
    )
    return cursor.rowcount == 1


def record_job(tx: Transaction, *, kind: str, slot_at: datetime, job_id: str) -> None:
    """Name the job the slot made (after it is inserted in the same transaction)."""
    tx.execute(
        "UPDATE periodic_slots SET job_id = %s WHERE kind = %s AND slot_at = %s",
        (job_id, kind, slot_at),
    )


def delete_slots(
    tx: Transaction,
    *,
    older_than_seconds: float,
    limit: int,
    now: datetime | None = None,
) -> int:
    """Delete up to `limit` slots older than that; the number deleted."""
    # MATERIALIZED: the batch is chosen once, however the planner joins it.
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT kind, slot_at FROM periodic_slots WHERE slot_at < "
        "coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(seconds)s) "
        "ORDER BY slot_at LIMIT %(limit)s) "
        "DELETE FROM periodic_slots WHERE (kind, slot_at) IN (SELECT kind, slot_at FROM batch)",
        {"now": now, "seconds": float(older_than_seconds), "limit": limit},
    )
    return cursor.rowcount
