"""Every SQL statement of the job runner on PostgreSQL, as plain functions.

The same semantics as the SQLite driver's, statement for statement: writes
take a `PostgresTransaction` (inside `PostgresStore.write`), reads a
connection (inside `PostgresStore.read`). Every write after the claim is
fenced on the lease (the job still `running`, owned by this worker's boot
id, at this attempt); a write that matches no row returns False.

Every time comes from the database's clock (`now()`, the transaction's
start), never from a host: hosts' clocks differ, and a lease written by one
host is judged by another. `now` arguments exist only so tests can stand at
another moment (a rescue past a lease, a claim in the future), as River's
driver allows.

Lists of leases and kinds travel as arrays, so each function is one
statement whatever their number, and one prepared plan.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any

from mealquest.clock import to_text
from mealquest.db.postgresql.notify import notify_enqueued
from mealquest.db.postgresql.store import Executes, PostgresTransaction
from mealquest.jobs.model import (
    MAX_INTERRUPTIONS,
    MESSAGE_INTERRUPTED,
    Attempt,
    Job,
    Lease,
    OnInterrupt,
    Recovered,
    Status,
)

_COLUMNS = (
    "id, seq, household_id, kind, payload, status, result, error, attempt, max_attempts, "
    "run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, "
    "on_interrupt, interruptions, priority, unique_key, cancel_requested_at"
)
# The claim's order: priority (lower first), then due time, then insertion order.
CLAIM_ORDER = "priority, run_at, seq"
_TIMES = (
    "run_at",
    "lease_expires_at",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "cancel_requested_at",
)
# The moment a statement acts at: the transaction's start, or a test's.
_NOW = "coalesce(%(now)s::timestamptz, now())"


def _job(row: dict[str, Any]) -> Job:
    """A row as `Job` has it on every driver: times as fixed-width UTC text."""
    values = dict(row)
    for column in _TIMES:
        if values[column] is not None:
            values[column] = to_text(values[column])
    return Job.from_row(values)


def _lease_arrays(leases: Iterable[Lease]) -> dict[str, list[Any]]:
    leases = list(leases)
    return {
        "ids": [lease.job_id for lease in leases],
        "owners": [lease.owner for lease in leases],
        "attempts": [lease.attempt for lease in leases],
    }


_LEASES = (
    "unnest(%(ids)s::text[], %(owners)s::text[], %(attempts)s::integer[]) "
    "AS lease(id, owner, attempt)"
)
_FENCE = (
    "id = %(job_id)s AND status = 'running' AND lease_owner = %(owner)s AND attempt = %(attempt)s"
)
_FENCE_ON_LEASES = (
    "jobs.id = lease.id AND jobs.status = 'running' AND jobs.lease_owner = lease.owner "
    "AND jobs.attempt = lease.attempt"
)
_CLEAR_LEASE = "lease_owner = NULL, lease_expires_at = NULL, updated_at = now()"


def _fence(lease: Lease) -> dict[str, Any]:
    return {"job_id": lease.job_id, "owner": lease.owner, "attempt": lease.attempt}


def insert_job(
    tx: PostgresTransaction,
    *,
    job_id: str,
    household_id: int,
    kind: str,
    payload: str,
    max_attempts: int,
    on_interrupt: OnInterrupt,
    priority: int = 0,
    run_at: datetime | None = None,
    delay_seconds: float | None = None,
    unique_key: str | None = None,
    unique_digest: str | None = None,
) -> bool:
    """Queue a job, due at `run_at`, `delay_seconds` from the database's now, or
    now; listening processes hear of it when the transaction commits.

    With `unique_key`, nothing is inserted (False) when the household already
    has a job holding that key: the unique index decides (a concurrent insert
    of the same key waits for the other transaction, then inserts nothing).
    True when the job was inserted.
    """
    cursor = tx.execute(
        "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
        "priority, unique_key, unique_digest, run_at, created_at, updated_at) "
        "VALUES (%(id)s, %(household_id)s, %(kind)s, %(payload)s, 'queued', %(max_attempts)s, "
        "%(on_interrupt)s, %(priority)s, %(unique_key)s, %(unique_digest)s, "
        "coalesce(%(run_at)s::timestamptz, "
        "now() + make_interval(secs => coalesce(%(delay)s::double precision, 0))), now(), now()) "
        "ON CONFLICT (household_id, unique_key) WHERE unique_key IS NOT NULL DO NOTHING",
        {
            "id": job_id,
            "household_id": household_id,
            "kind": kind,
            "payload": payload,
            "max_attempts": max_attempts,
            "on_interrupt": str(on_interrupt),
            "priority": priority,
            "unique_key": unique_key,
            "unique_digest": unique_digest,
            "run_at": run_at,
            "delay": None if delay_seconds is None else float(delay_seconds),
        },
    )
    if cursor.rowcount != 1:
        return False
    notify_enqueued(tx)
    return True


def release_unique_key(
    tx: PostgresTransaction, *, household_id: int, unique_key: str, older_than_seconds: float
) -> int:
    """Clear `unique_key` from the household's job that holds it, if that job was
    created more than `older_than_seconds` ago (its window is over)."""
    cursor = tx.execute(
        "UPDATE jobs SET unique_key = NULL, unique_digest = NULL "
        "WHERE household_id = %s AND unique_key = %s "
        "AND created_at < now() - make_interval(secs => %s)",
        (household_id, unique_key, float(older_than_seconds)),
    )
    return cursor.rowcount


def holder_of_key(
    tx: PostgresTransaction, *, household_id: int, unique_key: str
) -> tuple[str, str] | None:
    """The (id, digest) of the household's job holding `unique_key`, if any
    (a statement of its own: it sees a concurrent insert that just committed)."""
    row = tx.execute(
        "SELECT id, unique_digest FROM jobs WHERE household_id = %s AND unique_key = %s",
        (household_id, unique_key),
    ).fetchone()
    return (row["id"], row["unique_digest"]) if row else None


def cancel_job(tx: PostgresTransaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Cancel a job: a queued one is cancelled at once; a running one gets
    `cancel_requested_at` (its process stops it and records it cancelled).
    Final jobs are left as they are. Returns the job as it now is (None: no
    such job for that household). The update waits for a fenced write in
    flight on the row and then judges the row as that write left it."""
    tx.execute(
        "UPDATE jobs SET "
        "status = CASE status WHEN 'queued' THEN 'cancelled' ELSE status END, "
        "finished_at = CASE status WHEN 'queued' THEN now() ELSE finished_at END, "
        "cancel_requested_at = CASE status WHEN 'running' "
        "THEN coalesce(cancel_requested_at, now()) ELSE cancel_requested_at END, "
        "updated_at = now() "
        "WHERE id = %(id)s AND status IN ('queued', 'running') "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    )
    return get_job(tx, job_id, household_id)


def retry_job(tx: PostgresTransaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Queue a failed or cancelled job again, due now, with a fresh attempt
    budget; other jobs are left as they are. Returns the job as it now is."""
    tx.execute(
        "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, result = NULL, "
        "error = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL, "
        "run_at = now(), updated_at = now() "
        "WHERE id = %(id)s AND status IN ('failed', 'cancelled') "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    )
    notify_enqueued(tx)
    return get_job(tx, job_id, household_id)


def cancel_requested(tx: PostgresTransaction, leases: Iterable[Lease]) -> set[str]:
    """The ids of the given leased jobs whose cancel was requested."""
    arrays = _lease_arrays(leases)
    if not arrays["ids"]:
        return set()
    rows = tx.execute(
        f"SELECT jobs.id FROM jobs, {_LEASES} WHERE {_FENCE_ON_LEASES} "
        "AND jobs.cancel_requested_at IS NOT NULL",
        arrays,
    ).fetchall()
    return {row["id"] for row in rows}


def claim(
    tx: PostgresTransaction,
    *,
    owner: str,
    lease_seconds: float,
    limit: int,
    kinds: Collection[str],
    now: datetime | None = None,
) -> list[Job]:
    """Claim up to `limit` due queued jobs of `kinds` in one statement: by
    priority (lower first), then oldest due first, then insertion order.

    `SKIP LOCKED`: concurrent claims take disjoint jobs instead of waiting on
    each other's rows. Only the kinds this process can run: during a rolling
    deploy that adds a kind, older processes leave its jobs queued.
    """
    if not kinds or limit <= 0:
        return []
    rows = tx.execute(
        "WITH next AS ("
        "SELECT seq FROM jobs WHERE status = 'queued' "
        f"AND run_at <= {_NOW} AND kind = ANY(%(kinds)s::text[]) "
        f"ORDER BY {CLAIM_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
        "UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = %(owner)s, "
        f"lease_expires_at = {_NOW} + make_interval(secs => %(lease_seconds)s), "
        f"started_at = {_NOW}, updated_at = {_NOW} "
        f"FROM next WHERE jobs.seq = next.seq RETURNING {_qualified('jobs')}",
        {
            "now": now,
            "kinds": list(kinds),
            "limit": limit,
            "owner": owner,
            "lease_seconds": float(lease_seconds),
        },
    ).fetchall()
    # RETURNING gives no order; hand jobs out in the claim's.
    return sorted((_job(row) for row in rows), key=lambda job: (job.priority, job.run_at, job.seq))


def _qualified(table: str) -> str:
    return ", ".join(f"{table}.{column.strip()}" for column in _COLUMNS.split(","))


def publish(tx: PostgresTransaction, lease: Lease, *, result: str) -> bool:
    cursor = tx.execute(
        f"UPDATE jobs SET result = %(result)s, updated_at = now() WHERE {_FENCE}",
        {"result": result, **_fence(lease)},
    )
    return cursor.rowcount == 1


def owns(tx: PostgresTransaction, lease: Lease) -> bool:
    """Whether the lease still holds, keeping it held until `tx` ends: the row
    lock makes a rescuer's update wait for the handler's fenced write, as
    SQLite's one writer does, instead of slipping in between."""
    row = tx.execute(
        f"SELECT 1 FROM jobs WHERE {_FENCE} FOR NO KEY UPDATE", _fence(lease)
    ).fetchone()
    return row is not None


# Every way a running job leaves `running` through its own worker: the target
# status's columns, plus what the ending attempt does to the counters. Each
# write clears the lease and is fenced on it. A job whose cancel was requested
# goes to cancelled instead of back to the queue, its last partial result kept.
_CANCELLING = "jobs.cancel_requested_at IS NOT NULL"
_TO: dict[Status, str] = {
    Status.SUCCEEDED: "status = %(to)s, result = %(result)s, finished_at = now()",
    Status.FAILED: "status = %(to)s, error = %(error)s, finished_at = now()",
    Status.CANCELLED: "status = %(to)s, finished_at = now()",
    # The partial result of the attempt that ended is not the next one's.
    Status.QUEUED: (
        f"status = CASE WHEN {_CANCELLING} THEN 'cancelled' ELSE 'queued' END, "
        f"finished_at = CASE WHEN {_CANCELLING} THEN now() END, "
        f"result = CASE WHEN {_CANCELLING} THEN jobs.result END, "
        f"run_at = CASE WHEN {_CANCELLING} OR %(delay)s::double precision IS NULL "
        "THEN jobs.run_at ELSE now() + make_interval(secs => %(delay)s::double precision) END"
    ),
}
_ATTEMPT: dict[Attempt, str] = {
    Attempt.SPEND: "interruptions = 0",
    Attempt.REFUND: "attempt = attempt - 1",
}


def transition(
    tx: PostgresTransaction,
    lease: Lease,
    *,
    to: Status,
    attempt: Attempt = Attempt.SPEND,
    result: str | None = None,
    error: str | None = None,
    delay_seconds: float | None = None,
) -> bool:
    """Move the leased running job to `to`; False if the lease is no longer held.

    `to=QUEUED` with `Attempt.SPEND` is a retry, due `delay_seconds` from
    now; with `Attempt.REFUND` the job goes back as if the attempt never
    started. `delay_seconds` None keeps its `run_at`, and so its place in the
    queue. Either ends the job cancelled instead if a cancel was requested
    meanwhile.
    """
    if to not in _TO or (attempt is Attempt.REFUND and to is not Status.QUEUED):
        raise ValueError(f"no transition from running to {to} with {attempt}")
    cursor = tx.execute(
        f"UPDATE jobs SET {_TO[to]}, {_ATTEMPT[attempt]}, {_CLEAR_LEASE} WHERE {_FENCE}",
        {
            "to": str(to),
            "result": result,
            "error": error,
            "delay": None if delay_seconds is None else float(delay_seconds),
            **_fence(lease),
        },
    )
    return cursor.rowcount == 1


def renew_leases(
    tx: PostgresTransaction, leases: Iterable[Lease], *, lease_seconds: float
) -> set[tuple[str, int]]:
    """Extend the given leases where still held; returns the (id, attempt) renewed.

    Only leases the process names: a job the heartbeat leaves out (its handler
    past its timeout, or its outcome given up on) expires and is rescued.
    """
    arrays = _lease_arrays(leases)
    if not arrays["ids"]:
        return set()
    rows = tx.execute(
        "UPDATE jobs SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s) "
        f"FROM {_LEASES} WHERE {_FENCE_ON_LEASES} RETURNING jobs.id, jobs.attempt",
        {"lease_seconds": float(lease_seconds), **arrays},
    ).fetchall()
    return {(row["id"], row["attempt"]) for row in rows}


def has_due_job(conn: Executes, kinds: Collection[str]) -> bool:
    if not kinds:
        return False
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued' AND run_at <= now() "
        "AND kind = ANY(%s::text[])) AS due",
        (list(kinds),),
    ).fetchone()
    return bool(row["due"])


def queued_of_other_kinds(conn: Executes, kinds: Collection[str]) -> dict[str, int]:
    """Queued jobs by kind, for the kinds not in `kinds` (no handler here)."""
    rows = conn.execute(
        "SELECT kind, count(*) AS waiting FROM jobs WHERE status = 'queued' "
        "AND kind <> ALL(%s::text[]) GROUP BY kind ORDER BY kind",
        (list(kinds),),
    ).fetchall()
    return {row["kind"]: row["waiting"] for row in rows}


# The interruption policy, in SQL so that one statement applies it to any
# number of rows, whatever their kinds (UPDATE's expressions all read the row
# as it was before the statement). A job whose cancel was requested ends
# cancelled, its last partial result kept.
_REQUEUES = (
    f"(jobs.on_interrupt = 'requeue' AND jobs.interruptions + 1 < {MAX_INTERRUPTIONS} "
    f"AND NOT {_CANCELLING})"
)
_INTERRUPT = (
    f"status = CASE WHEN {_CANCELLING} THEN 'cancelled' "
    f"WHEN {_REQUEUES} THEN 'queued' ELSE 'failed' END, "
    f"attempt = CASE WHEN {_REQUEUES} THEN jobs.attempt - 1 ELSE jobs.attempt END, "
    f"result = CASE WHEN {_REQUEUES} THEN NULL ELSE jobs.result END, "
    f"error = CASE WHEN {_REQUEUES} OR {_CANCELLING} THEN NULL ELSE %(interrupted)s END, "
    f"finished_at = CASE WHEN {_REQUEUES} THEN NULL ELSE now() END, "
    f"interruptions = jobs.interruptions + 1, {_CLEAR_LEASE}"
)


def _recovered(rows: list[dict[str, Any]]) -> Recovered:
    return Recovered(
        tuple(row["id"] for row in rows if row["status"] == Status.QUEUED),
        tuple(row["id"] for row in rows if row["status"] == Status.FAILED),
        tuple(row["id"] for row in rows if row["status"] == Status.CANCELLED),
    )


def interrupt(tx: PostgresTransaction, leases: Iterable[Lease]) -> Recovered:
    """Record jobs a stopping worker cut short (fenced on their leases).

    A re-queued job keeps its run_at, and so its place among the oldest: its
    process stopped, not the job.
    """
    arrays = _lease_arrays(leases)
    if not arrays["ids"]:
        return Recovered()
    rows = tx.execute(
        f"UPDATE jobs SET {_INTERRUPT} FROM {_LEASES} WHERE {_FENCE_ON_LEASES} "
        "RETURNING jobs.id, jobs.status",
        {"interrupted": MESSAGE_INTERRUPTED, **arrays},
    ).fetchall()
    return _recovered(rows)


def rescue_expired(
    tx: PostgresTransaction, *, keep: Collection[Lease] = (), now: datetime | None = None
) -> Recovered:
    """Interrupt every running job whose lease expired, whoever held it, except
    `keep`: the caller's own jobs whose handlers are still alive (their process
    deals with them; re-queueing them would start a second attempt beside the
    live one)."""
    rows = tx.execute(
        f"UPDATE jobs SET {_INTERRUPT} WHERE status = 'running' "
        f"AND lease_expires_at < {_NOW} "
        f"AND NOT EXISTS (SELECT 1 FROM {_LEASES} WHERE {_FENCE_ON_LEASES}) "
        "RETURNING jobs.id, jobs.status",
        {"interrupted": MESSAGE_INTERRUPTED, "now": now, **_lease_arrays(keep)},
    ).fetchall()
    return _recovered(rows)


def get_job(conn: Executes, job_id: str, household_id: int | None = None) -> Job | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM jobs WHERE id = %(id)s "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    ).fetchone()
    return _job(row) if row else None


def list_jobs(
    conn: Executes,
    *,
    household_id: int | None = None,
    status: Status | None = None,
    kind: str | None = None,
    before_seq: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs newest first, filtered; `before_seq` continues a previous page."""
    conditions: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    for column, value in (("household_id", household_id), ("status", status), ("kind", kind)):
        if value is not None:
            conditions.append(f"{column} = %({column})s")
            params[column] = str(value) if column == "status" else value
    if before_seq is not None:
        conditions.append("seq < %(before_seq)s")
        params["before_seq"] = before_seq
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT %(limit)s", params
    ).fetchall()
    return [_job(row) for row in rows]
