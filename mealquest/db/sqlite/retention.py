"""Deleting finished jobs on SQLite, a small batch per transaction.

Each call is one short write transaction: the writer holds SQLite's write
lock only for one batch, so enqueues, claims and outcomes of every process
wait at most that long behind a prune. The batch is found through the
partial index on `finished_at`, never by scanning the table.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from mealquest.clock import to_text
from mealquest.db.driver import Transaction
from mealquest.db.sqlite.periodic import current_time
from mealquest.model.jobs import FINAL_STATUSES


def delete_finished(
    tx: Transaction, *, older_than_seconds: float, limit: int, now: datetime | None = None
) -> int:
    """Delete up to `limit` jobs in a final status that finished more than
    `older_than_seconds` ago, oldest first; the number deleted. Queued and
    running jobs are never touched; their recipes stay (the foreign key sets
    `recipes.job_id` to NULL)."""
    before = current_time(tx, now) - timedelta(seconds=older_than_seconds)
    statuses = [str(status) for status in FINAL_STATUSES]
    cursor = tx.execute(
        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE finished_at < ? "
        f"AND status IN ({', '.join('?' * len(statuses))}) ORDER BY finished_at LIMIT ?)",
        (to_text(before), *statuses, limit),
    )
    return cursor.rowcount
