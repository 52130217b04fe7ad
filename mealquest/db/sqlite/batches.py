"""Dependencies and batches on SQLite: their rows, their reads, and the
unblocker's pass (see migration 0019_batches.sql for how a job waits)."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence

from mealquest.clock import to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.model.batches import Batch, BatchMember, BatchOutcome, NewBatch, Unblocked
from mealquest.model.jobs import (
    MESSAGE_DEPENDENCY_FAILED,
    WAITING_RUN_AT,
    NewJob,
    Status,
)

_WAITING = to_text(WAITING_RUN_AT)
_FINAL = "('succeeded', 'failed', 'cancelled')"


def missing_jobs(tx: Reads, household_id: int, job_ids: Collection[str]) -> set[str]:
    """Those of `job_ids` that are no job of the household."""
    rows = tx.execute(
        "SELECT value FROM json_each(?) WHERE value NOT IN "
        "(SELECT id FROM jobs WHERE household_id = ? AND id IN (SELECT value FROM json_each(?)))",
        (json.dumps(list(job_ids)), household_id, json.dumps(list(job_ids))),
    ).fetchall()
    return {row[0] for row in rows}


def insert_dependencies(tx: Transaction, jobs: Sequence[NewJob]) -> None:
    """The rows of what each of `jobs` (inserted, waiting) depends on."""
    rows = [
        (job.job_id, depends_on, int(job.needs_success))
        for job in jobs
        for depends_on in dict.fromkeys(job.depends_on)
    ]
    if rows:
        tx.execute(
            "INSERT INTO job_dependencies (job_id, depends_on, needs_success) "
            "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), "
            "json_extract(value, '$[2]') FROM json_each(?)",
            (json.dumps(rows),),
        )


def insert_batch(tx: Transaction, batch: NewBatch) -> None:
    tx.execute(
        "INSERT INTO batches (id, household_id, total, callback_job_id, created_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (
            batch.batch_id,
            batch.household_id,
            len(batch.job_ids),
            batch.callback_job_id,
            to_text(utc_now()),
        ),
    )
    tx.execute(
        "INSERT INTO batch_jobs (batch_id, position, job_id) "
        "SELECT ?, key, value FROM json_each(?)",
        (batch.batch_id, json.dumps(list(batch.job_ids))),
    )


_MEMBER = "j.id AS job_id, j.status, j.version, j.started_at IS NOT NULL AS started, j.finished_at"


def _member(row: object) -> BatchMember:
    values = dict(row)  # type: ignore[call-overload]
    return BatchMember(
        values["job_id"],
        Status(values["status"]),
        values["version"],
        bool(values["started"]),
        values["finished_at"],
    )


def _batches(conn: Reads, rows: Sequence[object]) -> list[Batch]:
    found = []
    for row in rows:
        values = dict(row)  # type: ignore[call-overload]
        members = conn.execute(
            f"SELECT {_MEMBER} FROM batch_jobs b JOIN jobs j ON j.id = b.job_id "
            "WHERE b.batch_id = ? ORDER BY b.position",
            (values["id"],),
        ).fetchall()
        callback = None
        if values["callback_job_id"] is not None:
            callback_row = conn.execute(
                f"SELECT {_MEMBER} FROM jobs j WHERE j.id = ?", (values["callback_job_id"],)
            ).fetchone()
            callback = _member(callback_row) if callback_row else None
        found.append(
            Batch(
                values["id"],
                values["household_id"],
                values["total"],
                values["created_at"],
                tuple(_member(member) for member in members),
                callback,
                values["callback_job_id"],
            )
        )
    return found


_BATCH = "SELECT id, household_id, total, created_at, callback_job_id FROM batches"


def get_batch(conn: Reads, batch_id: str, household_id: int | None = None) -> Batch | None:
    """The batch (of that household; any household's with None), or None."""
    sql, params = f"{_BATCH} WHERE id = ?", [batch_id]
    if household_id is not None:
        sql += " AND household_id = ?"
        params.append(household_id)  # type: ignore[arg-type]
    found = _batches(conn, conn.execute(sql, params).fetchall())
    return found[0] if found else None


def household_batches(conn: Reads, household_id: int, *, limit: int) -> list[Batch]:
    """The household's newest batches, newest first."""
    rows = conn.execute(
        f"{_BATCH} WHERE household_id = ? ORDER BY created_at DESC, id LIMIT ?",
        (household_id, limit),
    ).fetchall()
    return _batches(conn, rows)


def batch_job_ids(conn: Reads, batch_id: str) -> list[str]:
    """The ids of a batch's members still kept, in their order."""
    rows = conn.execute(
        "SELECT job_id FROM batch_jobs WHERE batch_id = ? ORDER BY position", (batch_id,)
    ).fetchall()
    return [row[0] for row in rows]


def batch_of_member(conn: Reads, job_id: str) -> str | None:
    """The id of the batch that job is a member of, if any."""
    row = conn.execute("SELECT batch_id FROM batch_jobs WHERE job_id = ?", (job_id,)).fetchone()
    return None if row is None else str(row[0])


def batch_outcome(conn: Reads, callback_job_id: str) -> BatchOutcome | None:
    """The outcome of the batch whose callback is that job (None: it is none's)."""
    row = conn.execute("SELECT id FROM batches WHERE callback_job_id = ?", (callback_job_id,))
    found = row.fetchone()
    if found is None:
        return None
    members = conn.execute(
        "SELECT j.id, j.status FROM batch_jobs b JOIN jobs j ON j.id = b.job_id "
        "WHERE b.batch_id = ? ORDER BY b.position",
        (found[0],),
    ).fetchall()
    by_status: dict[str, list[str]] = {}
    for job_id, status in members:
        by_status.setdefault(status, []).append(job_id)
    return BatchOutcome(
        found[0],
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
        "AND NOT EXISTS (SELECT 1 FROM batch_jobs m WHERE m.batch_id = b.id) LIMIT ?)",
        (limit,),
    ).rowcount


def delete_household_batches(tx: Transaction, household_id: int, *, limit: int) -> int:
    return tx.execute(
        "DELETE FROM batches WHERE id IN (SELECT id FROM batches WHERE household_id = ? LIMIT ?)",
        (household_id, limit),
    ).rowcount


def resolve_dependencies(
    tx: Transaction, *, limit: int, depends_on: Sequence[str] | None = None
) -> Unblocked:
    """One pass of the unblocker over up to `limit` dependencies whose job is
    final (or gone): each such row is deleted; a waiting job one of whose
    needed jobs did not succeed (or any of whose jobs is gone) is cancelled
    with `MESSAGE_DEPENDENCY_FAILED` (and its other rows go); a waiting job
    with no row left is made due now.

    A job cancelled here may be another's dependency: the next pass sees it.
    On SQLite one writer at a time runs this, so two passes never race."""
    # Given the jobs that ended, only their dependents' rows, by the index on
    # `depends_on`: a pass per completion then costs what ended, not every
    # dependency still waiting.
    only = "" if depends_on is None else "AND d.depends_on IN (SELECT value FROM json_each(?)) "
    rows = tx.execute(
        "SELECT d.job_id, d.depends_on, d.needs_success, j.status "
        "FROM job_dependencies d LEFT JOIN jobs j ON j.id = d.depends_on "
        f"WHERE (j.id IS NULL OR j.status IN {_FINAL}) {only}LIMIT ?",
        (limit,) if depends_on is None else (json.dumps(list(depends_on)), limit),
    ).fetchall()
    if not rows:
        return Unblocked()
    now = to_text(utc_now())
    # A job gone (an erasure under way) ends even a callback's wait.
    blocked = sorted({r[0] for r in rows if r[3] is None or (r[2] and r[3] != Status.SUCCEEDED)})
    tx.execute(
        "DELETE FROM job_dependencies WHERE (job_id, depends_on) IN "
        "(SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?))",
        (json.dumps([(r[0], r[1]) for r in rows]),),
    )
    cancelled = [
        row[0]
        for row in tx.execute(
            "UPDATE jobs SET status = 'cancelled', error = ?, finished_at = ?, updated_at = ?, "
            "version = version + 1 WHERE id IN (SELECT value FROM json_each(?)) "
            "AND status = 'queued' AND run_at = ? RETURNING id",
            (MESSAGE_DEPENDENCY_FAILED, now, now, json.dumps(blocked), _WAITING),
        ).fetchall()
    ]
    tx.execute(
        "DELETE FROM job_dependencies WHERE job_id IN (SELECT value FROM json_each(?))",
        (json.dumps(blocked),),
    )
    freed = sorted({r[0] for r in rows} - set(blocked))
    due = [
        row[0]
        for row in tx.execute(
            "UPDATE jobs SET run_at = ?, updated_at = ?, version = version + 1 "
            "WHERE id IN (SELECT value FROM json_each(?)) AND status = 'queued' AND run_at = ? "
            "AND NOT EXISTS (SELECT 1 FROM job_dependencies d WHERE d.job_id = jobs.id) "
            "RETURNING id",
            (now, now, json.dumps(freed), _WAITING),
        ).fetchall()
    ]
    return Unblocked(tuple(sorted(due)), tuple(sorted(cancelled)), len(rows))
