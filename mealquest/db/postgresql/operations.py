"""The SQL of the operator's views and actions on PostgreSQL: queue figures
across households, and the dashboard's retry and delete.

Each read is bounded by an index (`jobs_status_kind_seq` with an index-only
scan, the claim's partial index, `jobs_finished_at`). Times are the
database's (`now()`), as everywhere on this driver.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from mealquest.db.postgresql.notify import notify_enqueued
from mealquest.db.postgresql.store import Executes, PostgresTransaction
from mealquest.jobs.model import Status
from mealquest.queue_stats import DueJob, QueueFigures

_NOW = "coalesce(%(now)s::timestamptz, now())"
# A job the operator may queue again: its attempts ended, or it was cancelled.
_RETRYABLE = ["failed", "cancelled"]


def queue_figures(conn: Executes, now: datetime | None = None) -> QueueFigures:
    """Rows by (kind, status), the oldest due queued job of each kind, and how
    many jobs finished in the hour before `now` (None: the database's clock)."""
    counts = {
        (row["kind"], row["status"]): row["count"]
        for row in conn.execute(
            "SELECT kind, status, count(*) AS count FROM jobs GROUP BY status, kind"
        ).fetchall()
    }
    rows = conn.execute(
        "SELECT DISTINCT ON (kind) kind, id, "
        f"extract(epoch FROM {_NOW} - run_at)::float8 AS age FROM jobs "
        f"WHERE status = 'queued' AND run_at <= {_NOW} ORDER BY kind, run_at, seq",
        {"now": now},
    ).fetchall()
    oldest = {row["kind"]: DueJob(row["id"], row["kind"], max(0.0, row["age"])) for row in rows}
    finished = conn.execute(
        "SELECT count(*) AS count FROM jobs WHERE finished_at IS NOT NULL "
        f"AND finished_at >= {_NOW} - interval '1 hour'",
        {"now": now},
    ).fetchone()["count"]
    return QueueFigures(counts=counts, oldest_due=oldest, finished_last_hour=finished)


def kinds_of(conn: Executes, job_ids: Collection[str]) -> dict[str, str]:
    """The kind of each job that still exists, by id."""
    if not job_ids:
        return {}
    rows = conn.execute(
        "SELECT id, kind FROM jobs WHERE id = ANY(%s::text[])", (list(job_ids),)
    ).fetchall()
    return {row["id"]: row["kind"] for row in rows}


def retry_job(tx: PostgresTransaction, job_id: str) -> bool:
    """Queue a failed or cancelled job again with a fresh attempt budget, due
    now; whether it was in such a state (a job that moved on is left alone)."""
    cursor = tx.execute(
        "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, result = NULL, "
        "error = NULL, started_at = NULL, finished_at = NULL, run_at = now(), "
        "updated_at = now() WHERE id = %s AND status = ANY(%s::text[])",
        (job_id, _RETRYABLE),
    )
    if cursor.rowcount != 1:
        return False
    notify_enqueued(tx)  # other hosts' idle pools, as an enqueue does
    return True


def delete_job(tx: PostgresTransaction, job_id: str) -> bool:
    """Delete a job that is not running (a running one is cancelled first);
    whether it was deleted."""
    cursor = tx.execute(
        "DELETE FROM jobs WHERE id = %s AND status <> %s", (job_id, str(Status.RUNNING))
    )
    return cursor.rowcount == 1
