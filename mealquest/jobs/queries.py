"""Every SQL statement of the job runner, as plain functions over a connection.

Writes take a `Transaction` (they run inside `Store.write`, in the writer
thread); reads take a `sqlite3.Connection` (they run inside `Store.read`).
Every write after the claim is fenced on the lease: the job must still be
`running`, owned by this worker's boot id, at this attempt. A write that
matches no row returns False and the caller treats the lease as lost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass

from mealquest.jobs.model import MESSAGE_INTERRUPTED, Job, Status
from mealquest.store import Transaction

_COLUMNS = (
    "id, seq, household_id, kind, payload, status, result, error, attempt, max_attempts, "
    "run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at"
)


@dataclass(frozen=True)
class Lease:
    """What fences a running job's writes."""

    job_id: str
    owner: str
    attempt: int


def insert_job(
    tx: Transaction,
    *,
    job_id: str,
    household_id: int,
    kind: str,
    payload: str,
    max_attempts: int,
    now: str,
) -> None:
    tx.execute(
        "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, run_at, "
        "created_at, updated_at) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
        (job_id, household_id, kind, payload, max_attempts, now, now, now),
    )


def claim(tx: Transaction, *, owner: str, now: str, lease_expires_at: str, limit: int) -> list[Job]:
    """Claim up to `limit` due queued jobs, oldest first, in one statement."""
    rows = tx.execute(
        "UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = ?, "
        "lease_expires_at = ?, started_at = ?, updated_at = ? "
        "WHERE seq IN (SELECT seq FROM jobs WHERE status = 'queued' AND run_at <= ? "
        "ORDER BY run_at, seq LIMIT ?) "
        f"RETURNING {_COLUMNS}",
        (owner, lease_expires_at, now, now, now, limit),
    ).fetchall()
    # RETURNING gives no order; hand jobs out oldest first.
    return sorted((Job.from_row(row) for row in rows), key=lambda job: (job.run_at, job.seq))


_FENCE = "WHERE id = ? AND status = 'running' AND lease_owner = ? AND attempt = ?"


def publish(tx: Transaction, lease: Lease, *, result: str, now: str) -> bool:
    cursor = tx.execute(
        f"UPDATE jobs SET result = ?, updated_at = ? {_FENCE}",
        (result, now, lease.job_id, lease.owner, lease.attempt),
    )
    return cursor.rowcount == 1


def owns(tx: Transaction, lease: Lease) -> bool:
    row = tx.execute(
        f"SELECT 1 FROM jobs {_FENCE}", (lease.job_id, lease.owner, lease.attempt)
    ).fetchone()
    return row is not None


def succeed(tx: Transaction, lease: Lease, *, result: str, now: str) -> bool:
    cursor = tx.execute(
        "UPDATE jobs SET status = 'succeeded', result = ?, lease_owner = NULL, "
        f"lease_expires_at = NULL, updated_at = ?, finished_at = ? {_FENCE}",
        (result, now, now, lease.job_id, lease.owner, lease.attempt),
    )
    return cursor.rowcount == 1


def fail(tx: Transaction, lease: Lease, *, error: str, now: str) -> bool:
    cursor = tx.execute(
        "UPDATE jobs SET status = 'failed', error = ?, lease_owner = NULL, "
        f"lease_expires_at = NULL, updated_at = ?, finished_at = ? {_FENCE}",
        (error, now, now, lease.job_id, lease.owner, lease.attempt),
    )
    return cursor.rowcount == 1


def retry(tx: Transaction, lease: Lease, *, run_at: str, now: str) -> bool:
    """Put a running job back in the queue for its next attempt, its result cleared."""
    cursor = tx.execute(
        "UPDATE jobs SET status = 'queued', result = NULL, lease_owner = NULL, "
        f"lease_expires_at = NULL, run_at = ?, updated_at = ? {_FENCE}",
        (run_at, now, lease.job_id, lease.owner, lease.attempt),
    )
    return cursor.rowcount == 1


def unclaim(tx: Transaction, leases: Iterable[Lease], *, now: str) -> int:
    """Put claimed jobs that never started back in the queue, their attempt not spent."""
    unclaimed = 0
    for lease in leases:
        cursor = tx.execute(
            "UPDATE jobs SET status = 'queued', attempt = attempt - 1, lease_owner = NULL, "
            f"lease_expires_at = NULL, updated_at = ? {_FENCE}",
            (now, lease.job_id, lease.owner, lease.attempt),
        )
        unclaimed += cursor.rowcount
    return unclaimed


def renew_leases(
    tx: Transaction, leases: Iterable[Lease], *, lease_expires_at: str
) -> set[tuple[str, int]]:
    """Extend the given leases where still held; returns the (id, attempt) renewed.

    Only leases the process names: a job whose outcome could not be recorded
    drops out of the heartbeat, so its lease expires and the rescuer takes it.
    """
    renewed = set()
    for lease in leases:
        cursor = tx.execute(
            f"UPDATE jobs SET lease_expires_at = ? {_FENCE}",
            (lease_expires_at, lease.job_id, lease.owner, lease.attempt),
        )
        if cursor.rowcount == 1:
            renewed.add((lease.job_id, lease.attempt))
    return renewed


def has_due_job(conn: sqlite3.Connection, now: str) -> bool:
    row = conn.execute(
        "SELECT 1 FROM jobs WHERE status = 'queued' AND run_at <= ? LIMIT 1", (now,)
    ).fetchone()
    return row is not None


@dataclass(frozen=True)
class Recovered:
    """Jobs taken back from a worker that no longer runs them."""

    requeued: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


def _recover(tx: Transaction, condition: str, params: tuple, now: str) -> Recovered:
    # Attempts left: back to the queue at once, keeping its run_at so it keeps
    # its place among the oldest (the worker died, not the job); none left:
    # failed as interrupted.
    requeued = tx.execute(
        "UPDATE jobs SET status = 'queued', result = NULL, lease_owner = NULL, "
        "lease_expires_at = NULL, updated_at = ? "
        f"WHERE status = 'running' AND attempt < max_attempts AND {condition} RETURNING id",
        (now, *params),
    ).fetchall()
    failed = tx.execute(
        "UPDATE jobs SET status = 'failed', error = ?, lease_owner = NULL, "
        "lease_expires_at = NULL, updated_at = ?, finished_at = ? "
        f"WHERE status = 'running' AND {condition} RETURNING id",
        (MESSAGE_INTERRUPTED, now, now, *params),
    ).fetchall()
    return Recovered(tuple(r["id"] for r in requeued), tuple(r["id"] for r in failed))


def rescue_expired(tx: Transaction, *, now: str) -> Recovered:
    """Recover every running job whose lease expired before `now`, whoever held it."""
    return _recover(tx, "lease_expires_at < ?", (now,), now)


def release(tx: Transaction, leases: Iterable[Lease], *, now: str) -> Recovered:
    """Recover jobs a stopping worker had to stop (fenced on their leases)."""
    requeued: list[str] = []
    failed: list[str] = []
    for lease in leases:
        recovered = _recover(
            tx,
            "id = ? AND lease_owner = ? AND attempt = ?",
            (lease.job_id, lease.owner, lease.attempt),
            now,
        )
        requeued += recovered.requeued
        failed += recovered.failed
    return Recovered(tuple(requeued), tuple(failed))


def get_job(conn: sqlite3.Connection, job_id: str, household_id: int | None = None) -> Job | None:
    sql = f"SELECT {_COLUMNS} FROM jobs WHERE id = ?"
    params: tuple = (job_id,)
    if household_id is not None:
        sql += " AND household_id = ?"
        params += (household_id,)
    row = conn.execute(sql, params).fetchone()
    return Job.from_row(row) if row else None


def list_jobs(
    conn: sqlite3.Connection,
    *,
    household_id: int | None = None,
    status: Status | None = None,
    kind: str | None = None,
    before_seq: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs newest first, filtered; `before_seq` continues a previous page."""
    conditions: list[str] = []
    params: list[object] = []
    for column, value in (("household_id", household_id), ("status", status), ("kind", kind)):
        if value is not None:
            conditions.append(f"{column} = ?")
            params.append(str(value) if column == "status" else value)
    if before_seq is not None:
        conditions.append("seq < ?")
        params.append(before_seq)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT ?", (*params, limit)
    ).fetchall()
    return [Job.from_row(row) for row in rows]
