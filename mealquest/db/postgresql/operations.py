"""The SQL of the operator's views and actions on PostgreSQL: queue figures
across households, the dashboard's retry and delete, and its bulk actions.

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
from mealquest.model.operations import ActedJob, BulkAction, BulkBatch, JobFilter
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


def newest_seq(conn: Reads) -> int:
    return int(conn.execute("SELECT coalesce(max(seq), 0) AS seq FROM jobs").fetchone()["seq"])


# Statuses read in `seq` order (their indexes are: the household's, the
# kind's, the failed and cancelled ones' partial indexes, the primary key), so
# a batch goes on where the last ended instead of walking again the rows it
# passed over; queued and running jobs are found through their partial
# indexes, which hold only them.
_IN_SEQ_ORDER = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


def _matching(
    status: Status, job_filter: JobFilter, *, after_seq: int, upto_seq: int
) -> tuple[str, dict[str, object]]:
    conditions = ["status = %(status)s", "seq <= %(upto)s"]
    params: dict[str, object] = {"status": str(status), "upto": upto_seq}
    if status in _IN_SEQ_ORDER:
        conditions.append("seq > %(after)s")
        params["after"] = after_seq
    if status is Status.RUNNING:
        # Those already told to stop are being cancelled.
        conditions.append("cancel_requested_at IS NULL")
    if job_filter.kind is not None:
        conditions.append("kind = %(kind)s")
        params["kind"] = job_filter.kind
    if job_filter.household_id is not None:
        conditions.append("household_id = %(household)s")
        params["household"] = job_filter.household_id
    return f"FROM jobs WHERE {' AND '.join(conditions)}", params


def count_matching(
    conn: Reads, status: Status, job_filter: JobFilter, *, upto_seq: int, at_most: int
) -> int:
    where, params = _matching(status, job_filter, after_seq=0, upto_seq=upto_seq)
    row = conn.execute(
        f"SELECT count(*) AS n FROM (SELECT 1 {where} LIMIT %(most)s) AS m",
        {**params, "most": at_most},
    ).fetchone()
    return int(row["n"])


# What each action sets, as the one-job statements do (`retry_job`,
# `cancel_job` in the jobs statements, `delete_job` here).
_RETRY = (
    "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, snoozes = 0, "
    "result = NULL, "
    "error = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL, "
    "run_at = now(), updated_at = now(), version = version + 1 "
    "WHERE status IN ('failed', 'cancelled')"
)
_CANCEL = (
    "UPDATE jobs SET "
    "status = CASE status WHEN 'queued' THEN 'cancelled' ELSE status END, "
    "finished_at = CASE status WHEN 'queued' THEN now() ELSE finished_at END, "
    "cancel_requested_at = CASE status WHEN 'running' "
    "THEN coalesce(cancel_requested_at, now()) ELSE cancel_requested_at END, "
    "updated_at = now(), version = version + 1 WHERE status IN ('queued', 'running')"
)
_DELETE = "DELETE FROM jobs WHERE status <> 'running'"
_ACTIONS = {BulkAction.RETRY: _RETRY, BulkAction.CANCEL: _CANCEL, BulkAction.DELETE: _DELETE}


def act_on_batch(
    tx: Transaction,
    action: BulkAction,
    status: Status,
    job_filter: JobFilter,
    *,
    after_seq: int,
    upto_seq: int,
    limit: int,
) -> BulkBatch:
    """`action` on up to `limit` matching jobs of `status`: chosen and locked
    first (`SKIP LOCKED`: a job another transaction holds now, a claim's or an
    outcome's, is left to it and not waited for), then acted on by `seq`,
    each still in a state the action applies to."""
    if status not in action.statuses:
        raise ValueError(f"{action} does not apply to {status} jobs")
    where, params = _matching(status, job_filter, after_seq=after_seq, upto_seq=upto_seq)
    order = "ORDER BY seq" if status in _IN_SEQ_ORDER else ""
    picked = [
        row["seq"]
        for row in tx.execute(
            f"SELECT seq {where} {order} LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
            {**params, "limit": limit},
        ).fetchall()
    ]
    if not picked:
        return BulkBatch([], 0, after_seq)
    rows = tx.execute(
        f"{_ACTIONS[action]} AND seq = ANY(%s::bigint[]) RETURNING seq, id, status", (picked,)
    ).fetchall()
    if action is BulkAction.RETRY and rows:
        postgres_transaction(tx).notify_enqueued()
    # Streams watching these jobs see them change, as a single action's do.
    postgres_transaction(tx).notify_changed(row["id"] for row in rows)
    acted = [ActedJob(row["seq"], row["id"], Status(row["status"])) for row in rows]
    resume = max(picked) if status in _IN_SEQ_ORDER else after_seq
    return BulkBatch(acted, len(picked), resume)
