"""The SQL of the operator's views and actions on SQLite: queue figures across
households, the dashboard's retry and delete, and its bulk actions.

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
from mealquest.model.operations import ActedJob, BulkAction, BulkBatch, JobFilter
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


def newest_seq(conn: Reads) -> int:
    return int(conn.execute("SELECT coalesce(max(seq), 0) FROM jobs").fetchone()[0])


# Statuses whose index is in `seq` order, so a batch goes on where the last
# ended instead of walking again the rows it passed over; queued and running
# jobs are found through their partial indexes, which hold only them.
_IN_SEQ_ORDER = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


def _index(status: Status, job_filter: JobFilter) -> str:
    """The index a bulk batch reads, named, so that the planner cannot choose a
    walk of the table: a batch runs holding the write lock."""
    if job_filter.household_id is not None:
        if status is Status.QUEUED:
            return "INDEXED BY jobs_household_queued"
        if status is Status.RUNNING:
            return "INDEXED BY jobs_running"
        return "INDEXED BY jobs_household"
    if status is Status.QUEUED:
        return "INDEXED BY jobs_due_by_kind" if job_filter.kind else "INDEXED BY jobs_claim"
    if status is Status.RUNNING:
        return "INDEXED BY jobs_running"
    if status is Status.FAILED:
        return "INDEXED BY jobs_failed_seq"
    if status is Status.CANCELLED:
        return "INDEXED BY jobs_cancelled_seq"
    # Succeeded: most of the table, walked in `seq` order (by the kind's index,
    # or the table itself, by its rowid).
    return "INDEXED BY jobs_kind_seq" if job_filter.kind else "NOT INDEXED"


def _matching(
    status: Status, job_filter: JobFilter, *, after_seq: int, upto_seq: int
) -> tuple[str, dict[str, object]]:
    # The status as a literal (one of ours): SQLite uses a partial index only
    # where it can see that the statement's terms imply the index's own.
    conditions = [f"status = '{Status(status)}'", "seq <= :upto"]
    params: dict[str, object] = {"upto": upto_seq}
    if status in _IN_SEQ_ORDER:
        conditions.append("seq > :after")
        params["after"] = after_seq
    if status is Status.RUNNING:
        # Those already told to stop are being cancelled.
        conditions.append("cancel_requested_at IS NULL")
    if job_filter.kind is not None:
        conditions.append("kind = :kind")
        params["kind"] = job_filter.kind
    if job_filter.household_id is not None:
        conditions.append("household_id = :household")
        params["household"] = job_filter.household_id
    where = f"FROM jobs {_index(status, job_filter)} WHERE {' AND '.join(conditions)}"
    return where, params


def count_matching(
    conn: Reads, status: Status, job_filter: JobFilter, *, upto_seq: int, at_most: int
) -> int:
    where, params = _matching(status, job_filter, after_seq=0, upto_seq=upto_seq)
    row = conn.execute(
        f"SELECT count(*) FROM (SELECT 1 {where} LIMIT :most)", {**params, "most": at_most}
    ).fetchone()
    return int(row[0])


# What each action sets, as the one-job statements do (`retry_job`,
# `cancel_job` in the jobs statements, `delete_job` here).
_RETRY = (
    "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, snoozes = 0, "
    "result = NULL, "
    "error = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL, "
    "run_at = :now, updated_at = :now WHERE status IN ('failed', 'cancelled')"
)
_CANCEL = (
    "UPDATE jobs SET "
    "status = CASE status WHEN 'queued' THEN 'cancelled' ELSE status END, "
    "finished_at = CASE status WHEN 'queued' THEN :now ELSE finished_at END, "
    "cancel_requested_at = CASE status WHEN 'running' "
    "THEN COALESCE(cancel_requested_at, :now) ELSE cancel_requested_at END, "
    "updated_at = :now WHERE status IN ('queued', 'running')"
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
    """`action` on up to `limit` matching jobs of `status`: found through an
    index (`_index`), then acted on by `seq`, each still in a state the action
    applies to. Measured by `python -m bench.bulk`: a batch of 100 holds the
    write lock for a few milliseconds on a table of a million jobs."""
    if status not in action.statuses:
        raise ValueError(f"{action} does not apply to {status} jobs")
    where, params = _matching(status, job_filter, after_seq=after_seq, upto_seq=upto_seq)
    order = "ORDER BY seq" if status in _IN_SEQ_ORDER else ""
    picked = [
        row[0]
        for row in tx.execute(
            f"SELECT seq {where} {order} LIMIT :limit", {**params, "limit": limit}
        ).fetchall()
    ]
    if not picked:
        return BulkBatch([], 0, after_seq)
    seqs = {f"s{index}": seq for index, seq in enumerate(picked)}
    rows = tx.execute(
        f"{_ACTIONS[action]} AND seq IN ({', '.join(f':{name}' for name in seqs)}) "
        "RETURNING seq, id, status",
        {"now": to_text(utc_now()), **seqs},
    ).fetchall()
    acted = [ActedJob(row["seq"], row["id"], Status(row["status"])) for row in rows]
    resume = max(picked) if status in _IN_SEQ_ORDER else after_seq
    return BulkBatch(acted, len(picked), resume)
