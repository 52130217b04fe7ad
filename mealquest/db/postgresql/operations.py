"""The SQL of the operator's views and actions on PostgreSQL: queue figures
across households, and the dashboard's retry and delete.

Each read is bounded: counts come from `job_counts` and the changes not yet
folded into it (kept by triggers, see the migration), the rest from indexes
(`jobs_due_by_kind`, `jobs_finished`). Times are the database's (`now()`),
as everywhere on this driver.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from mealquest.db.driver import Reads, Transaction
from mealquest.db.postgresql.transaction import postgres_transaction
from mealquest.model.jobs import Status
from mealquest.model.queue import DueJob, QueueFigures

_NOW = "coalesce(%(now)s::timestamptz, now())"
# A job the operator may queue again: its attempts ended, or it was cancelled.


def queue_figures(conn: Reads, now: datetime | None = None) -> QueueFigures:
    """Rows by (kind, status), the oldest due queued job of each kind, how
    many jobs finished in the hour before `now` (None: the database's clock),
    and the paused kinds."""
    counts = {
        (row["kind"], row["status"]): int(row["count"])
        for row in conn.execute(
            "SELECT kind, status, sum(n) AS count FROM ("
            "SELECT kind, status, count AS n FROM job_counts "
            "UNION ALL SELECT kind, status, change FROM job_count_changes"
            ") AS c GROUP BY kind, status HAVING sum(n) > 0"
        ).fetchall()
    }
    queued = sorted({kind for kind, status in counts if status == Status.QUEUED})
    rows = conn.execute(
        f"SELECT k.kind, due.id, extract(epoch FROM {_NOW} - due.run_at)::float8 AS age "
        "FROM unnest(%(kinds)s::text[]) AS k(kind) CROSS JOIN LATERAL ("
        "SELECT id, run_at FROM jobs WHERE jobs.kind = k.kind AND status = 'queued' "
        f"AND run_at <= {_NOW} ORDER BY run_at LIMIT 1) AS due",
        {"now": now, "kinds": queued},
    ).fetchall()
    oldest = {row["kind"]: DueJob(row["id"], row["kind"], max(0.0, row["age"])) for row in rows}
    finished = conn.execute(
        "SELECT count(*) AS count FROM jobs WHERE finished_at IS NOT NULL "
        f"AND finished_at >= {_NOW} - interval '1 hour'",
        {"now": now},
    ).fetchone()["count"]
    paused = tuple(
        row["kind"]
        for row in conn.execute("SELECT kind FROM paused_kinds ORDER BY kind").fetchall()
    )
    return QueueFigures(
        counts=counts, oldest_due=oldest, finished_last_hour=finished, paused=paused
    )


def fold_counts(tx: Transaction) -> None:
    """Fold the noted changes of jobs' kinds and statuses into `job_counts`
    (skipped if another transaction is folding), so reading them stays cheap."""
    tx.execute("SELECT job_counts_fold()")


def kinds_of(conn: Reads, job_ids: Collection[str]) -> dict[str, str]:
    """The kind of each job that still exists, by id."""
    if not job_ids:
        return {}
    rows = conn.execute(
        "SELECT id, kind FROM jobs WHERE id = ANY(%s::text[])", (list(job_ids),)
    ).fetchall()
    return {row["id"]: row["kind"] for row in rows}


def delete_job(tx: Transaction, job_id: str) -> bool:
    """Delete a job that is not running (a running one is cancelled first);
    whether it was deleted."""
    cursor = tx.execute(
        "DELETE FROM jobs WHERE id = %s AND status <> %s", (job_id, str(Status.RUNNING))
    )
    if cursor.rowcount != 1:
        return False
    # A stream watching it ends.
    postgres_transaction(tx).notify_changed((job_id,))
    return True
