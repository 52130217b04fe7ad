"""Every SQL statement of the job runner, as plain functions over a connection.

Writes take a `Transaction` (they run inside `Store.write`, in the writer
thread); reads take a `sqlite3.Connection` (they run inside `Store.read`).
Every write after the claim is fenced on the lease: the job must still be
`running`, owned by this worker's boot id, at this attempt. A write that
matches no row returns False and the caller treats the lease as lost. Every
state change a worker makes goes through `transition`; interruptions (a stop
that cut a job short, or an expired lease) through `interrupt` and
`rescue_expired`, which apply the row's `on_interrupt` policy in SQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from mealquest.clock import to_text, utc_now
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
from mealquest.store import Transaction

_COLUMNS = (
    "id, seq, household_id, kind, payload, status, result, error, attempt, max_attempts, "
    "run_at, lease_owner, lease_expires_at, created_at, updated_at, started_at, finished_at, "
    "on_interrupt, interruptions, priority, unique_key, cancel_requested_at"
)
# The claim's order: priority (lower first), then due time, then insertion order.
CLAIM_ORDER = "priority, run_at, seq"


def insert_job(
    tx: Transaction,
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
    """Queue a job, due at `run_at`, `delay_seconds` from now, or now.

    With `unique_key`, nothing is inserted (False) when the household already
    has a job holding that key: the unique index decides, so two concurrent
    enqueues cannot both insert. True when the job was inserted.
    """
    moment = _moment(None)
    if run_at is None:
        run_at = moment + timedelta(seconds=delay_seconds or 0.0)
    now = to_text(moment)
    cursor = tx.execute(
        "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
        "priority, unique_key, unique_digest, run_at, created_at, updated_at) "
        "VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (household_id, unique_key) WHERE unique_key IS NOT NULL DO NOTHING",
        (
            job_id,
            household_id,
            kind,
            payload,
            max_attempts,
            str(on_interrupt),
            priority,
            unique_key,
            unique_digest,
            to_text(run_at),
            now,
            now,
        ),
    )
    return cursor.rowcount == 1


def release_unique_key(
    tx: Transaction, *, household_id: int, unique_key: str, older_than_seconds: float
) -> int:
    """Clear `unique_key` from the household's job that holds it, if that job was
    created more than `older_than_seconds` ago (its window is over)."""
    cutoff = _text(_moment(None) - timedelta(seconds=older_than_seconds))
    cursor = tx.execute(
        "UPDATE jobs SET unique_key = NULL, unique_digest = NULL "
        "WHERE household_id = ? AND unique_key = ? AND created_at < ?",
        (household_id, unique_key, cutoff),
    )
    return cursor.rowcount


def holder_of_key(tx: Transaction, *, household_id: int, unique_key: str) -> tuple[str, str] | None:
    """The (id, digest) of the household's job holding `unique_key`, if any."""
    row = tx.execute(
        "SELECT id, unique_digest FROM jobs WHERE household_id = ? AND unique_key = ?",
        (household_id, unique_key),
    ).fetchone()
    return (row["id"], row["unique_digest"]) if row else None


def cancel_job(tx: Transaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Cancel a job: a queued one is cancelled at once; a running one gets
    `cancel_requested_at` (its process stops it and records it cancelled).
    Final jobs are left as they are. Returns the job as it now is (None: no
    such job for that household)."""
    now = _text(None)
    scope = "" if household_id is None else " AND household_id = :household_id"
    tx.execute(
        "UPDATE jobs SET "
        "status = CASE status WHEN 'queued' THEN 'cancelled' ELSE status END, "
        "finished_at = CASE status WHEN 'queued' THEN :now ELSE finished_at END, "
        "cancel_requested_at = CASE status WHEN 'running' "
        "THEN COALESCE(cancel_requested_at, :now) ELSE cancel_requested_at END, "
        "updated_at = :now "
        f"WHERE id = :job_id AND status IN ('queued', 'running'){scope}",
        {"now": now, "job_id": job_id, "household_id": household_id},
    )
    return get_job(tx.conn, job_id, household_id)


def retry_job(tx: Transaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Queue a failed or cancelled job again, due now, with a fresh attempt
    budget; other jobs are left as they are. Returns the job as it now is."""
    now = _text(None)
    scope = "" if household_id is None else " AND household_id = :household_id"
    tx.execute(
        "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, result = NULL, "
        "error = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL, "
        "run_at = :now, updated_at = :now "
        f"WHERE id = :job_id AND status IN ('failed', 'cancelled'){scope}",
        {"now": now, "job_id": job_id, "household_id": household_id},
    )
    return get_job(tx.conn, job_id, household_id)


def cancel_requested(tx: Transaction, leases: Iterable[Lease]) -> set[str]:
    """The ids of the given leased jobs whose cancel was requested."""
    found = set()
    for lease in leases:
        row = tx.execute(
            f"SELECT 1 FROM jobs WHERE {_FENCE} AND cancel_requested_at IS NOT NULL",
            _fence(lease),
        ).fetchone()
        if row is not None:
            found.add(lease.job_id)
    return found


def _moment(now: datetime | None) -> datetime:
    """The database's "now": on SQLite, one machine's wall clock (`now` overrides
    it for tests that move time past a lease)."""
    return now if now is not None else utc_now()


def _text(now: datetime | None) -> str:
    return to_text(_moment(now))


def _placeholders(values: Collection[object]) -> str:
    return ", ".join("?" * len(values))


def claim(
    tx: Transaction,
    *,
    owner: str,
    lease_seconds: float,
    limit: int,
    kinds: Collection[str],
    now: datetime | None = None,
) -> list[Job]:
    """Claim up to `limit` due queued jobs of `kinds` in one statement: by
    priority (lower first), then oldest due first, then insertion order.

    Only the kinds this process can run: during a rolling deploy that adds a
    kind, older processes leave its jobs queued for the newer ones.
    """
    if not kinds or limit <= 0:
        return []
    moment = _moment(now)
    rows = tx.execute(
        "UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = ?, "
        "lease_expires_at = ?, started_at = ?, updated_at = ? "
        "WHERE seq IN (SELECT seq FROM jobs WHERE status = 'queued' AND run_at <= ? "
        f"AND kind IN ({_placeholders(kinds)}) ORDER BY {CLAIM_ORDER} LIMIT ?) "
        f"RETURNING {_COLUMNS}",
        (
            owner,
            _text(moment + timedelta(seconds=lease_seconds)),
            _text(moment),
            _text(moment),
            _text(moment),
            *kinds,
            limit,
        ),
    ).fetchall()
    # RETURNING gives no order; hand jobs out in the claim's.
    return sorted(
        (Job.from_row(row) for row in rows), key=lambda job: (job.priority, job.run_at, job.seq)
    )


_FENCE = "id = :job_id AND status = 'running' AND lease_owner = :owner AND attempt = :attempt"


def _fence(lease: Lease) -> dict[str, object]:
    return {"job_id": lease.job_id, "owner": lease.owner, "attempt": lease.attempt}


def publish(tx: Transaction, lease: Lease, *, result: str) -> bool:
    cursor = tx.execute(
        f"UPDATE jobs SET result = :result, updated_at = :now WHERE {_FENCE}",
        {"result": result, "now": _text(None), **_fence(lease)},
    )
    return cursor.rowcount == 1


def owns(tx: Transaction, lease: Lease) -> bool:
    row = tx.execute(f"SELECT 1 FROM jobs WHERE {_FENCE}", _fence(lease)).fetchone()
    return row is not None


# Every way a running job leaves `running` through its own worker: the target
# status's columns, plus what the ending attempt does to the counters. Each
# write clears the lease and is fenced on it. A job whose cancel was requested
# goes to cancelled instead of back to the queue, its last partial result kept.
_CANCELLING = "cancel_requested_at IS NOT NULL"
_TO: dict[Status, str] = {
    Status.SUCCEEDED: "status = :to, result = :result, finished_at = :now",
    Status.FAILED: "status = :to, error = :error, finished_at = :now",
    Status.CANCELLED: "status = :to, finished_at = :now",
    # The partial result of the attempt that ended is not the next one's.
    Status.QUEUED: (
        f"status = CASE WHEN {_CANCELLING} THEN 'cancelled' ELSE 'queued' END, "
        f"finished_at = CASE WHEN {_CANCELLING} THEN :now END, "
        f"result = CASE WHEN {_CANCELLING} THEN result END, "
        f"run_at = CASE WHEN {_CANCELLING} THEN run_at ELSE COALESCE(:run_at, run_at) END"
    ),
}
_ATTEMPT: dict[Attempt, str] = {
    Attempt.SPEND: "interruptions = 0",
    Attempt.REFUND: "attempt = attempt - 1",
}
_CLEAR_LEASE = "lease_owner = NULL, lease_expires_at = NULL, updated_at = :now"


def transition(
    tx: Transaction,
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
    started (`delay_seconds` None keeps its place in the queue). Either ends
    the job cancelled instead if a cancel was requested meanwhile.
    """
    if to not in _TO or (attempt is Attempt.REFUND and to is not Status.QUEUED):
        raise ValueError(f"no transition from running to {to} with {attempt}")
    moment = _moment(None)
    run_at = None if delay_seconds is None else _text(moment + timedelta(seconds=delay_seconds))
    cursor = tx.execute(
        f"UPDATE jobs SET {_TO[to]}, {_ATTEMPT[attempt]}, {_CLEAR_LEASE} WHERE {_FENCE}",
        {
            "to": str(to),
            "now": _text(moment),
            "result": result,
            "error": error,
            "run_at": run_at,
            **_fence(lease),
        },
    )
    return cursor.rowcount == 1


def renew_leases(
    tx: Transaction, leases: Iterable[Lease], *, lease_seconds: float
) -> set[tuple[str, int]]:
    """Extend the given leases where still held; returns the (id, attempt) renewed.

    Only leases the process names: a job the heartbeat leaves out (its handler
    past its timeout, or its outcome given up on) expires and is rescued.
    """
    lease_expires_at = _text(_moment(None) + timedelta(seconds=lease_seconds))
    renewed = set()
    for lease in leases:
        cursor = tx.execute(
            f"UPDATE jobs SET lease_expires_at = :lease_expires_at WHERE {_FENCE}",
            {"lease_expires_at": lease_expires_at, **_fence(lease)},
        )
        if cursor.rowcount == 1:
            renewed.add((lease.job_id, lease.attempt))
    return renewed


def has_due_job(conn: sqlite3.Connection, kinds: Collection[str]) -> bool:
    if not kinds:
        return False
    row = conn.execute(
        "SELECT 1 FROM jobs WHERE status = 'queued' AND run_at <= ? "
        f"AND kind IN ({_placeholders(kinds)}) LIMIT 1",
        (_text(None), *kinds),
    ).fetchone()
    return row is not None


def queued_of_other_kinds(conn: sqlite3.Connection, kinds: Collection[str]) -> dict[str, int]:
    """Queued jobs by kind, for the kinds not in `kinds` (no handler here)."""
    rows = conn.execute(
        "SELECT kind, count(*) AS waiting FROM jobs WHERE status = 'queued' "
        f"AND kind NOT IN ({_placeholders(kinds)}) GROUP BY kind ORDER BY kind",
        tuple(kinds),
    ).fetchall()
    return {row["kind"]: row["waiting"] for row in rows}


# The interruption policy, in SQL so that one statement applies it to any
# number of rows, whatever their kinds (UPDATE's expressions all read the row
# as it was before the statement). A job whose cancel was requested ends
# cancelled, its last partial result kept.
_REQUEUES = (
    f"(on_interrupt = 'requeue' AND interruptions + 1 < {MAX_INTERRUPTIONS} AND NOT {_CANCELLING})"
)
_INTERRUPT = (
    f"status = CASE WHEN {_CANCELLING} THEN 'cancelled' "
    f"WHEN {_REQUEUES} THEN 'queued' ELSE 'failed' END, "
    f"attempt = CASE WHEN {_REQUEUES} THEN attempt - 1 ELSE attempt END, "
    f"result = CASE WHEN {_REQUEUES} THEN NULL ELSE result END, "
    f"error = CASE WHEN {_REQUEUES} OR {_CANCELLING} THEN NULL ELSE :interrupted END, "
    f"finished_at = CASE WHEN {_REQUEUES} THEN NULL ELSE :now END, "
    f"interruptions = interruptions + 1, {_CLEAR_LEASE}"
)


def _interrupt(tx: Transaction, condition: str, params: dict[str, object]) -> Recovered:
    # A re-queued job keeps its run_at, and so its place among the oldest:
    # its process stopped, not the job.
    rows = tx.execute(
        f"UPDATE jobs SET {_INTERRUPT} WHERE status = 'running' AND {condition} "
        "RETURNING id, status",
        {"interrupted": MESSAGE_INTERRUPTED, **params},
    ).fetchall()
    return Recovered(
        tuple(row["id"] for row in rows if row["status"] == Status.QUEUED),
        tuple(row["id"] for row in rows if row["status"] == Status.FAILED),
        tuple(row["id"] for row in rows if row["status"] == Status.CANCELLED),
    )


def interrupt(tx: Transaction, leases: Iterable[Lease]) -> Recovered:
    """Record jobs a stopping worker cut short (fenced on their leases)."""
    recovered = Recovered()
    now = _text(None)
    for lease in leases:
        recovered += _interrupt(tx, _FENCE, {"now": now, **_fence(lease)})
    return recovered


def rescue_expired(
    tx: Transaction, *, keep: Collection[Lease] = (), now: datetime | None = None
) -> Recovered:
    """Interrupt every running job whose lease expired before `now`, whoever held it,
    except `keep`: the caller's own jobs whose handlers are still alive (their
    process deals with them; re-queueing them would start a second attempt
    beside the live one)."""
    condition = "lease_expires_at < :now"
    params: dict[str, object] = {"now": _text(now)}
    for index, lease in enumerate(keep):
        condition += (
            f" AND NOT (id = :keep_id{index} AND lease_owner = :keep_owner{index} "
            f"AND attempt = :keep_attempt{index})"
        )
        params.update(
            {
                f"keep_id{index}": lease.job_id,
                f"keep_owner{index}": lease.owner,
                f"keep_attempt{index}": lease.attempt,
            }
        )
    return _interrupt(tx, condition, params)


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
