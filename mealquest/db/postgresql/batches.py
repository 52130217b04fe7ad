"""Dependencies and batches on PostgreSQL: the same statements as SQLite's
(`mealquest.db.sqlite.batches`), over arrays, and an unblocker's pass that
one process at a time runs (a transaction-scoped advisory lock, which
PgBouncer's transaction mode keeps)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from mealquest.clock import to_text
from mealquest.db.driver import Reads, Transaction
from mealquest.db.postgresql.transaction import postgres_transaction
from mealquest.model.batches import Batch, BatchMember, BatchOutcome, NewBatch, Unblocked
from mealquest.model.jobs import (
    MESSAGE_DEPENDENCY_FAILED,
    WAITING_RUN_AT,
    NewJob,
    Status,
)

# The unblocker's advisory lock: one pass at a time in the deployment, so two
# passes never each see the other's row still there and leave a job waiting.
_UNBLOCKER_LOCK = 0x6D71_756E_626C_6B  # "mqunblk"
_FINAL = "('succeeded', 'failed', 'cancelled')"


def missing_jobs(tx: Reads, household_id: int, job_ids: Collection[str]) -> set[str]:
    """Those of `job_ids` that are no job of the household."""
    rows = tx.execute(
        "SELECT w.id FROM unnest(%(ids)s::text[]) AS w(id) WHERE NOT EXISTS "
        "(SELECT 1 FROM jobs j WHERE j.id = w.id AND j.household_id = %(household_id)s)",
        {"ids": list(job_ids), "household_id": household_id},
    ).fetchall()
    return {row["id"] for row in rows}


def insert_dependencies(tx: Transaction, jobs: Sequence[NewJob]) -> None:
    """The rows of what each of `jobs` (inserted, waiting) depends on."""
    rows = [
        (job.job_id, depends_on, job.needs_success)
        for job in jobs
        for depends_on in dict.fromkeys(job.depends_on)
    ]
    if rows:
        tx.execute(
            "INSERT INTO job_dependencies (job_id, depends_on, needs_success) "
            "SELECT * FROM unnest(%(a)s::text[], %(b)s::text[], %(c)s::boolean[])",
            {"a": [r[0] for r in rows], "b": [r[1] for r in rows], "c": [r[2] for r in rows]},
        )


def insert_batch(tx: Transaction, batch: NewBatch) -> None:
    tx.execute(
        "INSERT INTO batches (id, household_id, total, callback_job_id, created_at) "
        "VALUES (%(id)s, %(household_id)s, %(total)s, %(callback)s, now())",
        {
            "id": batch.batch_id,
            "household_id": batch.household_id,
            "total": len(batch.job_ids),
            "callback": batch.callback_job_id,
        },
    )
    tx.execute(
        "INSERT INTO batch_jobs (batch_id, position, job_id) "
        "SELECT %(id)s, w.position - 1, w.job_id "
        "FROM unnest(%(ids)s::text[]) WITH ORDINALITY AS w(job_id, position)",
        {"id": batch.batch_id, "ids": list(batch.job_ids)},
    )


_MEMBER = "j.id AS job_id, j.status, j.version, j.started_at IS NOT NULL AS started, j.finished_at"


def _member(row: dict[str, Any]) -> BatchMember:
    finished = row["finished_at"]
    return BatchMember(
        row["job_id"],
        Status(row["status"]),
        row["version"],
        row["started"],
        None if finished is None else to_text(finished),
    )


def _batches(conn: Reads, rows: Sequence[dict[str, Any]]) -> list[Batch]:
    found = []
    for row in rows:
        members = conn.execute(
            f"SELECT {_MEMBER} FROM batch_jobs b JOIN jobs j ON j.id = b.job_id "
            "WHERE b.batch_id = %(id)s ORDER BY b.position",
            {"id": row["id"]},
        ).fetchall()
        callback = None
        if row["callback_job_id"] is not None:
            callback_row = conn.execute(
                f"SELECT {_MEMBER} FROM jobs j WHERE j.id = %(id)s", {"id": row["callback_job_id"]}
            ).fetchone()
            callback = _member(callback_row) if callback_row else None
        found.append(
            Batch(
                row["id"],
                row["household_id"],
                row["total"],
                to_text(row["created_at"]),
                tuple(_member(member) for member in members),
                callback,
                row["callback_job_id"],
            )
        )
    return found


_BATCH = "SELECT id, household_id, total, created_at, callback_job_id FROM batches"


def get_batch(conn: Reads, batch_id: str, household_id: int | None = None) -> Batch | None:
    """The batch (of that household; any household's with None), or None."""
    rows = conn.execute(
        f"{_BATCH} WHERE id = %(id)s "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": batch_id, "household_id": household_id},
    ).fetchall()
    found = _batches(conn, rows)
    return found[0] if found else None


def household_batches(conn: Reads, household_id: int, *, limit: int) -> list[Batch]:
    """The household's newest batches, newest first."""
    rows = conn.execute(
        f"{_BATCH} WHERE household_id = %(household_id)s "
        "ORDER BY created_at DESC, id LIMIT %(limit)s",
        {"household_id": household_id, "limit": limit},
    ).fetchall()
    return _batches(conn, rows)


def batch_job_ids(conn: Reads, batch_id: str) -> list[str]:
    """The ids of a batch's members still kept, in their order."""
    rows = conn.execute(
        "SELECT job_id FROM batch_jobs WHERE batch_id = %(id)s ORDER BY position",
        {"id": batch_id},
    ).fetchall()
    return [row["job_id"] for row in rows]


def batch_of_member(conn: Reads, job_id: str) -> str | None:
    """The id of the batch that job is a member of, if any."""
    row = conn.execute(
        "SELECT batch_id FROM batch_jobs WHERE job_id = %(id)s", {"id": job_id}
    ).fetchone()
    return None if row is None else str(row["batch_id"])


def batch_outcome(conn: Reads, callback_job_id: str) -> BatchOutcome | None:
    """The outcome of the batch whose callback is that job (None: it is none's)."""
    found = conn.execute(
        "SELECT id FROM batches WHERE callback_job_id = %(id)s", {"id": callback_job_id}
    ).fetchone()
    if found is None:
        return None
    members = conn.execute(
        "SELECT j.id, j.status FROM batch_jobs b JOIN jobs j ON j.id = b.job_id "
        "WHERE b.batch_id = %(id)s ORDER BY b.position",
        {"id": found["id"]},
    ).fetchall()
    by_status: dict[str, list[str]] = {}
    for member in members:
        by_status.setdefault(member["status"], []).append(member["id"])
    return BatchOutcome(
        found["id"],
        tuple(by_status.get("succeeded", ())),
        tuple(by_status.get("failed", ())),
        tuple(by_status.get("cancelled", ())),
    )


def has_dependencies(conn: Reads) -> bool:
    """Whether any job waits for another (the unblocker's cheap first look)."""
    return conn.execute("SELECT 1 FROM job_dependencies LIMIT 1").fetchone() is not None


def delete_empty_batches(tx: Transaction, *, limit: int) -> int:
    return tx.execute(
        "DELETE FROM batches WHERE id IN (SELECT b.id FROM batches b "
        "WHERE b.callback_job_id IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM batch_jobs m WHERE m.batch_id = b.id) LIMIT %(limit)s)",
        {"limit": limit},
    ).rowcount


def delete_household_batches(tx: Transaction, household_id: int, *, limit: int) -> int:
    return tx.execute(
        "DELETE FROM batches WHERE id IN (SELECT id FROM batches "
        "WHERE household_id = %(household_id)s LIMIT %(limit)s)",
        {"household_id": household_id, "limit": limit},
    ).rowcount


def resolve_dependencies(
    tx: Transaction, *, limit: int, depends_on: Sequence[str] | None = None
) -> Unblocked:
    """One pass of the unblocker, as SQLite's `resolve_dependencies`; a pass
    that finds another process's under way does nothing and says so (`busy`:
    that one may not be looking at the same jobs)."""
    locked = tx.execute(
        "SELECT pg_try_advisory_xact_lock(%(key)s) AS locked", {"key": _UNBLOCKER_LOCK}
    ).fetchone()
    if not locked["locked"]:
        return Unblocked(busy=True)
    only = "" if depends_on is None else "AND d.depends_on = ANY(%(depends_on)s::text[]) "
    rows = tx.execute(
        "SELECT d.job_id, d.depends_on, d.needs_success, j.status "
        "FROM job_dependencies d LEFT JOIN jobs j ON j.id = d.depends_on "
        f"WHERE (j.id IS NULL OR j.status IN {_FINAL}) {only}LIMIT %(limit)s",
        {"limit": limit, "depends_on": None if depends_on is None else list(depends_on)},
    ).fetchall()
    if not rows:
        return Unblocked()
    # A job gone (an erasure under way) ends even a callback's wait.
    blocked = sorted(
        {
            r["job_id"]
            for r in rows
            if r["status"] is None or (r["needs_success"] and r["status"] != Status.SUCCEEDED)
        }
    )
    tx.execute(
        "DELETE FROM job_dependencies WHERE (job_id, depends_on) IN "
        "(SELECT * FROM unnest(%(a)s::text[], %(b)s::text[]))",
        {"a": [r["job_id"] for r in rows], "b": [r["depends_on"] for r in rows]},
    )
    cancelled = [
        row["id"]
        for row in tx.execute(
            "UPDATE jobs SET status = 'cancelled', error = %(error)s, finished_at = now(), "
            "updated_at = now(), version = version + 1 WHERE id = ANY(%(ids)s::text[]) "
            "AND status = 'queued' AND run_at = %(waiting)s RETURNING id",
            {"error": MESSAGE_DEPENDENCY_FAILED, "ids": blocked, "waiting": WAITING_RUN_AT},
        ).fetchall()
    ]
    tx.execute("DELETE FROM job_dependencies WHERE job_id = ANY(%(ids)s::text[])", {"ids": blocked})
    freed = sorted({r["job_id"] for r in rows} - set(blocked))
    due = [
        row["id"]
        for row in tx.execute(
            "UPDATE jobs SET run_at = now(), updated_at = now(), version = version + 1 "
            "WHERE id = ANY(%(ids)s::text[]) AND status = 'queued' AND run_at = %(waiting)s "
            "AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.job_id = jobs.id) "
            "RETURNING id",
            {"ids": freed, "waiting": WAITING_RUN_AT},
        ).fetchall()
    ]
    changed = cancelled + due
    if changed:
        postgres_transaction(tx).notify_changed(changed)
    if due:
        postgres_transaction(tx).notify_enqueued()
    return Unblocked(tuple(sorted(due)), tuple(sorted(cancelled)), len(rows))
