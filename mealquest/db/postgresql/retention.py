"""Deleting finished jobs on PostgreSQL, a small batch per transaction.

Each call is one short transaction that locks only the rows it deletes:
claims skip nothing of it (finished jobs are never claimed), and outcomes
of running jobs never wait on it. The batch is found through the partial
index on `finished_at`; `SKIP LOCKED` leaves alone any row another
transaction holds (an operator's delete, another prune) instead of waiting.
"""

from __future__ import annotations

from datetime import datetime

from mealquest.db.driver import Transaction
from mealquest.model.jobs import FINAL_STATUSES


def delete_finished(
    tx: Transaction,
    *,
    older_than_seconds: float,
    limit: int,
    now: datetime | None = None,
) -> int:
    """Delete up to `limit` jobs in a final status that finished more than
    `older_than_seconds` ago, oldest first; the number deleted. Queued and
    running jobs are never touched; their recipes stay (the foreign key sets
    `recipes.job_id` to NULL)."""
    # MATERIALIZED: the batch is chosen once. As a plain subquery the planner
    # could run it again for each row of `jobs` it scanned, and each run
    # locked the next rows (those this statement had deleted were skipped):
    # one statement deleted every old job, far more than `limit`.
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT seq FROM jobs WHERE finished_at < "
        "coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(seconds)s) "
        "AND status = ANY(%(statuses)s::text[]) ORDER BY finished_at LIMIT %(limit)s "
        "FOR UPDATE SKIP LOCKED) "
        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM batch)",
        {
            "now": now,
            "seconds": float(older_than_seconds),
            "statuses": [str(status) for status in FINAL_STATUSES],
            "limit": limit,
        },
    )
    return cursor.rowcount
