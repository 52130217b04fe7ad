"""The SQL of the operator's views and actions on SQLite: queue figures across
households, and the dashboard's retry and delete.

Each read is bounded: counts come from `job_counts` (kept by triggers), the
rest from indexes (`jobs_due_by_kind`, `jobs_finished`). Reads run on the
process's event loop, so none may walk the table's rows.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.jobs import Status
from mealquest.model.queue import DueJob, QueueFigures

# A job the operator may queue again: its attempts ended, or it was cancelled.


def queue_figures(conn: Reads, now: datetime | None = None) -> QueueFigures:
    """Rows by (kind, status) from `job_counts` (kept by triggers), the oldest
    due queued job of each kind (`jobs_due_by_kind`), how many jobs
    finished in the hour before `now` (None: the wall clock), and the paused
    kinds."""
    moment = now or utc_now()
    now_text = to_text(moment)
    counts = {
        (row["kind"], row["status"]): row["count"]
        for row in conn.execute(
            "SELECT kind, status, count FROM job_counts WHERE count > 0"
        ).fetchall()
    }
    oldest: dict[str, DueJob] = {}
    for kind in sorted({kind for kind, status in counts if status == Status.QUEUED}):
        row = conn.execute(
            "SELECT id, run_at FROM jobs WHERE kind = ? AND status = 'queued' AND run_at <= ? "
            "ORDER BY run_at LIMIT 1",
            (kind, now_text),
        ).fetchone()
        if row is not None:
            due = datetime.fromisoformat(row["run_at"].replace("Z", "+00:00"))
            oldest[kind] = DueJob(row["id"], kind, max(0.0, (moment - due).total_seconds()))
    finished = conn.execute(
        "SELECT count(*) FROM jobs WHERE finished_at IS NOT NULL AND finished_at >= ?",
        (to_text(moment - timedelta(hours=1)),),
    ).fetchone()[0]
    paused = tuple(
        row["kind"]
        for row in conn.execute("SELECT kind FROM paused_kinds ORDER BY kind").fetchall()
    )
    return QueueFigures(
        counts=counts, oldest_due=oldest, finished_last_hour=finished, paused=paused
    )


def fold_counts(tx: Transaction) -> None:
    """Nothing to fold on SQLite: its triggers update `job_counts` in place
    (one writer at a time, so no transaction waits on another for it)."""


def kinds_of(conn: Reads, job_ids: Collection[str]) -> dict[str, str]:
    """The kind of each job that still exists, by id."""
    ids = list(job_ids)
    if not ids:
        return {}
    marks = ", ".join("?" for _ in ids)
    rows = conn.execute(f"SELECT id, kind FROM jobs WHERE id IN ({marks})", ids).fetchall()
    return {row["id"]: row["kind"] for row in rows}


def delete_job(tx: Transaction, job_id: str) -> bool:
    """Delete a job that is not running (a running one is cancelled first);
    whether it was deleted."""
    cursor = tx.execute(
        "DELETE FROM jobs WHERE id = ? AND status <> ?", (job_id, str(Status.RUNNING))
    )
    return cursor.rowcount == 1
