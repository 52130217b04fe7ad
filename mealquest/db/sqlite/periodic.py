"""The `periodic_slots` table on SQLite: which scheduled times already made their job.

A slot is claimed by inserting its row in the transaction that enqueues its
job; the primary key (kind, slot_at) refuses a second row, so two schedulers
that reach the same slot make one job between them, and a scheduler that
dies before its commit leaves neither row nor job behind.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mealquest.clock import from_text, to_text, utc_now
from mealquest.db.driver import Reads, Transaction


def current_time(tx: Reads, now: datetime | None = None) -> datetime:
    """The database's "now": on SQLite, the one machine's wall clock (`now`
    overrides it, for tests that stand at a given moment)."""
    return now if now is not None else utc_now()


def first_seen(tx: Transaction, *, kind: str, moment: datetime) -> datetime:
    """When a scheduler first saw `kind`: `moment`, if this is the first time."""
    tx.execute(
        "INSERT INTO periodic_kinds (kind, first_seen_at) VALUES (?, ?) "
        "ON CONFLICT (kind) DO NOTHING",
        (kind, to_text(moment)),
    )
    row = tx.execute("SELECT first_seen_at FROM periodic_kinds WHERE kind = ?", (kind,)).fetchone()
    return from_text(row["first_seen_at"])


def claim_slot(tx: Transaction, *, kind: str, slot_at: datetime) -> bool:
    """Insert the slot's row; False if another scheduler already has it."""
    cursor = tx.execute(
        "INSERT INTO periodic_slots (kind, slot_at, created_at) VALUES (?, ?, ?) "
        "ON CONFLICT (kind, slot_at) DO NOTHING",
        (kind, to_text(slot_at), to_text(utc_now())),
    )
    return cursor.rowcount == 1


def record_job(tx: Transaction, *, kind: str, slot_at: datetime, job_id: str) -> None:
    """Name the job the slot made (after it is inserted in the same transaction)."""
    tx.execute(
        "UPDATE periodic_slots SET job_id = ? WHERE kind = ? AND slot_at = ?",
        (job_id, kind, to_text(slot_at)),
    )


def delete_slots(
    tx: Transaction, *, older_than_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to `limit` slots older than that; the number deleted."""
    before = to_text(current_time(tx, now) - timedelta(seconds=older_than_seconds))
    cursor = tx.execute(
        "DELETE FROM periodic_slots WHERE (kind, slot_at) IN "
        "(SELECT kind, slot_at FROM periodic_slots WHERE slot_at < ? ORDER BY slot_at LIMIT ?)",
        (before, limit),
    )
    return cursor.rowcount
