"""The SQL of the operator's views and actions on SQLite: queue figures across
households, and the dashboard's retry and delete.

Each read is bounded by an index (`jobs_status_kind_seq`, the claim's partial
index, `jobs_finished_at`): reads run on the process's event loop, so none
may walk the table's rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection
from datetime import datetime, timedelta

from mealquest.clock import to_text, utc_now
from mealquest.jobs.model import Status
from mealquest.queue_stats import DueJob, QueueFigures
from mealquest.store import Transaction

# A job the operator may queue again: its attempts ended, or it was cancelled.
_RETRYABLE = ("failed", "cancelled")


def queue_figures(conn: sqlite3.Connection, now: datetime | None = None) -> QueueFigures:
    """Rows by (kind, status), the oldest due queued job of each kind, and how
    many jobs finished in the hour before `now` (None: the wall clock)."""
    moment = now or utc_now()
    now_text = to_text(moment)
    counts = {
        (row[0], row[1]): row[2]
        for row in conn.execute(
            "SELECT kind, status, count(*) FROM jobs INDEXED BY jobs_status_kind_seq "
            "GROUP BY status, kind"
        )
    }
    oldest: dict[str, DueJob] = {}
    for row in conn.execute(
        "SELECT kind, id, min(run_at) AS run_at FROM jobs "
        "WHERE status = 'queued' AND run_at <= ? GROUP BY kind",
        (now_text,),
    ):
        due = datetime.fromisoformat(row["run_at"].replace("Z", "+00:00"))
        age = max(0.0, (moment - due).total_seconds())
        oldest[row["kind"]] = DueJob(row["id"], row["kind"], age)
    finished = conn.execute(
        "SELECT count(*) FROM jobs WHERE finished_at IS NOT NULL AND finished_at >= ?",
        (to_text(moment - timedelta(hours=1)),),
    ).fetchone()[0]
    return QueueFigures(counts=counts, oldest_due=oldest, finished_last_hour=finished)


def kinds_of(conn: sqlite3.Connection, job_ids: Collection[str]) -> dict[str, str]:
    """The kind of each job that still exists, by id."""
    ids = list(job_ids)
    if not ids:
        return {}
    marks = ", ".join("?" for _ in ids)
    rows = conn.execute(f"SELECT id, kind FROM jobs WHERE id IN ({marks})", ids)
    return {row["id"]: row["kind"] for row in rows}


def retry_job(tx: Transaction, job_id: str) -> bool:
    """Queue a failed or cancelled job again with a fresh attempt budget, due
    now; whether it was in such a state (a job that moved on is left alone)."""
    now = to_text(utc_now())
    marks = ", ".join("?" for _ in _RETRYABLE)
    cursor = tx.execute(
        "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, result = NULL, "
        "error = NULL, started_at = NULL, finished_at = NULL, run_at = ?, updated_at = ? "
        f"WHERE id = ? AND status IN ({marks})",
        (now, now, job_id, *_RETRYABLE),
    )
    return cursor.rowcount == 1


def delete_job(tx: Transaction, job_id: str) -> bool:
    """Delete a job that is not running (a running one is cancelled first);
    whether it was deleted."""
    cursor = tx.execute(
        "DELETE FROM jobs WHERE id = ? AND status <> ?", (job_id, str(Status.RUNNING))
    )
    return cursor.rowcount == 1
