"""Every SQL statement of the job runner on PostgreSQL, as plain functions.

The same semantics as the SQLite driver's, statement for statement: writes
take a `Transaction` (inside `PostgresStore.write`), reads a
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

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from mealquest.clock import to_text
from mealquest.db import listing, outcomes, standing
from mealquest.db.driver import Reads, Transaction
from mealquest.db.postgresql import standing as standing_reads
from mealquest.db.postgresql.claim import claim as claim
from mealquest.db.postgresql.claim import has_due_job as has_due_job
from mealquest.db.postgresql.job_rows import COLUMNS, NEXT_VERSION, NOW, qualified, to_job
from mealquest.db.postgresql.signals import mark_waiting as mark_waiting
from mealquest.db.postgresql.transaction import postgres_transaction
from mealquest.model.households import Household
from mealquest.model.jobs import (
    MAX_INTERRUPTIONS,
    MESSAGE_INTERRUPTED,
    Attempt,
    HeldLease,
    Job,
    Lease,
    LogLine,
    NewJob,
    Recovered,
    Status,
    Transition,
    check_transition,
)
from mealquest.model.queue import Standing


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
_CLEAR_LEASE = f"lease_owner = NULL, lease_expires_at = NULL, updated_at = now(), {NEXT_VERSION}"


def _fence(lease: Lease) -> dict[str, Any]:
    return {"job_id": lease.job_id, "owner": lease.owner, "attempt": lease.attempt}


_INSERT = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "priority, unique_key, unique_digest, partition_key, run_at, created_at, updated_at) "
    "VALUES (%(id)s, %(household_id)s, %(kind)s, %(payload)s, 'queued', %(max_attempts)s, "
    "%(on_interrupt)s, %(priority)s, %(unique_key)s, %(unique_digest)s, %(partition_key)s, "
    "coalesce(%(run_at)s::timestamptz, "
    "now() + make_interval(secs => coalesce(%(delay)s::double precision, 0))), now(), now()) "
    "ON CONFLICT (household_id, unique_key) WHERE unique_key IS NOT NULL DO NOTHING"
)


def _insert_params(job: NewJob) -> dict[str, Any]:
    return {
        "id": job.job_id,
        "household_id": job.household_id,
        "kind": job.kind,
        "payload": job.payload,
        "max_attempts": job.max_attempts,
        "on_interrupt": str(job.on_interrupt),
        "priority": job.priority,
        "unique_key": job.unique_key,
        "unique_digest": job.unique_digest,
        "partition_key": job.partition_key,
        "run_at": job.run_at,
        "delay": None if job.delay_seconds is None else float(job.delay_seconds),
    }


def insert_job(tx: Transaction, job: NewJob) -> bool:
    """Queue a job, due at its `run_at`, `delay_seconds` from the database's
    now, or now; listening processes hear of it when the transaction commits.

    With `unique_key`, nothing is inserted (False) when the household already
    has a job holding that key: the unique index decides (a concurrent insert
    of the same key waits for the other transaction, then inserts nothing).
    True when the job was inserted.
    """
    if tx.execute(_INSERT, _insert_params(job)).rowcount != 1:
        return False
    postgres_transaction(tx).notify_enqueued()
    return True


# `_INSERT` for many rows: each column's values as one array (`_insert_params`'
# names and the arrays' types), the rows inserted in the arrays' order.
_ARRAYS = (
    ("id", "text"),
    ("household_id", "bigint"),
    ("kind", "text"),
    ("payload", "text"),
    ("max_attempts", "integer"),
    ("on_interrupt", "text"),
    ("priority", "smallint"),
    ("partition_key", "text"),
    ("run_at", "timestamptz"),
    ("delay", "double precision"),
)
_INSERT_ARRAYS = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "priority, partition_key, run_at, created_at, updated_at) "
    "SELECT r.id, r.household_id, r.kind, r.payload, 'queued', r.max_attempts, r.on_interrupt, "
    "r.priority, r.partition_key, "
    "coalesce(r.run_at, now() + make_interval(secs => coalesce(r.delay, 0))), "
    "now(), now() "
    f"FROM unnest({', '.join(f'%({name})s::{kind}[]' for name, kind in _ARRAYS)}) "
    f"WITH ORDINALITY AS r({', '.join(name for name, _ in _ARRAYS)}, position) "
    "ORDER BY r.position"
)


def insert_jobs(tx: Transaction, jobs: Sequence[NewJob]) -> None:
    """Queue jobs that hold no idempotency key, each as `insert_job` would,
    in their order, by one statement
    over arrays of their values. An `executemany`, pipelined, still ran the
    statement once a row: 1,000 rows took about 258 ms, against 149."""
    if any(job.unique_key is not None for job in jobs):
        raise ValueError("a job with an idempotency key needs insert_job's answer")
    if not jobs:
        return
    rows = [_insert_params(job) for job in jobs]
    tx.execute(_INSERT_ARRAYS, {name: [row[name] for row in rows] for name, _ in _ARRAYS})
    postgres_transaction(tx).notify_enqueued()


def release_unique_key(
    tx: Transaction, *, household_id: int, unique_key: str, older_than_seconds: float
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


def holder_of_key(tx: Transaction, *, household_id: int, unique_key: str) -> tuple[str, str] | None:
    """The (id, digest) of the household's job holding `unique_key`, if any
    (a statement of its own: it sees a concurrent insert that just committed)."""
    row = tx.execute(
        "SELECT id, unique_digest FROM jobs WHERE household_id = %s AND unique_key = %s",
        (household_id, unique_key),
    ).fetchone()
    return (row["id"], row["unique_digest"]) if row else None


def cancel_job(tx: Transaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Cancel a job: a queued one is cancelled at once; a running one gets
    `cancel_requested_at` (its process stops it and records it cancelled).
    Final jobs are left as they are. Returns the job as it now is (None: no
    such job for that household). The update waits for a fenced write in
    flight on the row and then judges the row as that write left it."""
    cursor = tx.execute(
        "UPDATE jobs SET "
        "status = CASE status WHEN 'queued' THEN 'cancelled' ELSE status END, "
        "finished_at = CASE status WHEN 'queued' THEN now() ELSE finished_at END, "
        "cancel_requested_at = CASE status WHEN 'running' "
        "THEN coalesce(cancel_requested_at, now()) ELSE cancel_requested_at END, "
        f"updated_at = now(), {NEXT_VERSION} "
        "WHERE id = %(id)s AND (status = 'queued' "
        "OR (status = 'running' AND cancel_requested_at IS NULL)) "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    )
    if cursor.rowcount:
        postgres_transaction(tx).notify_changed((job_id,))
    return get_job(tx, job_id, household_id)


def retry_job(tx: Transaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Queue a failed or cancelled job again, due now, with a fresh attempt
    budget; other jobs are left as they are. Returns the job as it now is."""
    cursor = tx.execute(
        "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, snoozes = 0, "
        "result = NULL, "
        "error = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL, "
        f"run_at = now(), updated_at = now(), {NEXT_VERSION} "
        "WHERE id = %(id)s AND status IN ('failed', 'cancelled') "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    )
    postgres_transaction(tx).notify_enqueued()
    if cursor.rowcount:
        postgres_transaction(tx).notify_changed((job_id,))
    return get_job(tx, job_id, household_id)


def cancel_requested(tx: Transaction, leases: Iterable[Lease]) -> set[str]:
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


def publish(tx: Transaction, lease: Lease, *, result: str) -> bool:
    cursor = tx.execute(
        f"UPDATE jobs SET result = %(result)s, updated_at = now(), {NEXT_VERSION} WHERE {_FENCE}",
        {"result": result, **_fence(lease)},
    )
    if cursor.rowcount != 1:
        return False
    postgres_transaction(tx).notify_changed((lease.job_id,))
    return True


def owns(tx: Transaction, lease: Lease) -> bool:
    """Whether the lease still holds, keeping it held until `tx` ends: the row
    lock makes a rescuer's update wait for the handler's fenced write, as
    SQLite's one writer does, instead of slipping in between."""
    row = tx.execute(
        f"SELECT 1 FROM jobs WHERE {_FENCE} FOR NO KEY UPDATE", _fence(lease)
    ).fetchone()
    return row is not None


def add_log_lines(tx: Transaction, job_id: str, lines: Sequence[LogLine]) -> None:
    tx.execute(
        "INSERT INTO job_logs (job_id, attempt, line, level, message, logged_at) "
        "SELECT %s, * FROM unnest(%s::int[], %s::int[], %s::text[], %s::text[], "
        "%s::timestamptz[])",
        (
            job_id,
            [x.attempt for x in lines],
            [x.line for x in lines],
            [x.level for x in lines],
            [x.message for x in lines],
            [x.logged_at for x in lines],
        ),
    )


def add_traceparents(tx: Transaction, traces: Sequence[tuple[str, str]]) -> None:
    if traces:
        tx.execute(
            "INSERT INTO job_traces (job_id, traceparent) "
            "SELECT * FROM unnest(%s::text[], %s::text[])",
            ([job_id for job_id, _ in traces], [value for _, value in traces]),
        )


def traceparents(conn: Reads, job_ids: Sequence[str]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT job_id, traceparent FROM job_traces WHERE job_id = ANY(%s::text[])",
        (list(job_ids),),
    ).fetchall()
    return {row["job_id"]: row["traceparent"] for row in rows}


def log_lines(conn: Reads, job_id: str) -> list[LogLine]:
    rows = conn.execute(
        "SELECT attempt, line, level, message, logged_at FROM job_logs "
        "WHERE job_id = %s ORDER BY attempt, line",
        (job_id,),
    ).fetchall()
    return [LogLine(**{**row, "logged_at": to_text(row["logged_at"])}) for row in rows]


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
# A snooze counts on the job (unless a cancel wins), and ends its interruptions in a row.
_SNOOZED = f"snoozes = jobs.snoozes + CASE WHEN {_CANCELLING} THEN 0 ELSE 1 END, interruptions = 0"


def transition(tx: Transaction, change: Transition) -> bool:
    """Move the leased running job to `change.to`; False if the lease is no longer held.

    `to=QUEUED` with `Attempt.SPEND` is a retry, due `delay_seconds` from
    now; with `Attempt.REFUND` the job goes back as if the attempt never
    started; a snooze is such a refund, counted in the job's `snoozes`.
    `delay_seconds` None keeps its `run_at`, and so its place in the queue.
    Each ends the job cancelled instead if a cancel was requested meanwhile.
    """
    check_transition(change.to, change.attempt, change.snoozed)
    delay = change.delay_seconds
    snoozed = f"{_SNOOZED}, " if change.snoozed else ""
    cursor = tx.execute(
        f"UPDATE jobs SET {_TO[change.to]}, {_ATTEMPT[change.attempt]}, {snoozed}{_CLEAR_LEASE} "
        f"WHERE {_FENCE}",
        {
            "to": str(change.to),
            "result": change.result,
            "error": change.error,
            "delay": None if delay is None else float(delay),
            **_fence(change.lease),
        },
    )
    if cursor.rowcount != 1:
        return False
    postgres_transaction(tx).notify_changed((change.lease.job_id,))
    return True


# `transition` for a batch, in one statement: each row of `change` carries its
# target status, whether the attempt is refunded (and whether as a snooze),
# and its result, error and delay; the same columns as `_TO`, `_ATTEMPT` and
# `_SNOOZED` set, chosen per row.
_CHANGE_CANCELLING = "change.status = 'queued' AND jobs.cancel_requested_at IS NOT NULL"
_TRANSITION_MANY = (
    "UPDATE jobs SET "
    f"status = CASE WHEN {_CHANGE_CANCELLING} THEN 'cancelled' ELSE change.status END, "
    "result = CASE change.status WHEN 'succeeded' THEN change.result "
    f"WHEN 'queued' THEN CASE WHEN {_CHANGE_CANCELLING} THEN jobs.result END "
    "ELSE jobs.result END, "
    "error = CASE WHEN change.status = 'failed' THEN change.error ELSE jobs.error END, "
    "finished_at = CASE WHEN change.status <> 'queued' OR jobs.cancel_requested_at IS NOT NULL "
    "THEN now() END, "
    f"run_at = CASE WHEN change.status <> 'queued' OR {_CHANGE_CANCELLING} "
    "OR change.delay IS NULL THEN jobs.run_at "
    "ELSE now() + make_interval(secs => change.delay) END, "
    "interruptions = CASE WHEN change.refund AND NOT change.snoozed "
    "THEN jobs.interruptions ELSE 0 END, "
    "attempt = CASE WHEN change.refund THEN jobs.attempt - 1 ELSE jobs.attempt END, "
    f"snoozes = CASE WHEN change.snoozed AND NOT ({_CHANGE_CANCELLING}) "
    "THEN jobs.snoozes + 1 ELSE jobs.snoozes END, "
    f"{_CLEAR_LEASE} "
    "FROM jsonb_to_recordset(%(changes)s::jsonb) AS change(id text, owner text, "
    "attempt integer, status text, refund boolean, result text, error text, "
    "delay double precision, snoozed boolean) "
    "WHERE jobs.id = change.id AND jobs.status = 'running' AND jobs.lease_owner = change.owner "
    "AND jobs.attempt = change.attempt RETURNING jobs.id"
)


def _transition_together(tx: Transaction, transitions: list[Transition]) -> set[str]:
    """The ids of the jobs the transitions (each naming another job) moved."""
    # The batch as one JSON document, not nine arrays: psycopg dumps a list
    # element by element in Python, and the arrays cost the completer about
    # twice the client time of the document (the server's is the same).
    changes = [
        {
            "id": change.lease.job_id,
            "owner": change.lease.owner,
            "attempt": change.lease.attempt,
            "status": str(change.to),
            "refund": change.attempt is Attempt.REFUND,
            "result": change.result,
            "error": change.error,
            "delay": None if change.delay_seconds is None else float(change.delay_seconds),
            "snoozed": change.snoozed,
        }
        for change in transitions
    ]
    rows = tx.execute(_TRANSITION_MANY, {"changes": json.dumps(changes)}).fetchall()
    moved = {row["id"] for row in rows}
    postgres_transaction(tx).notify_changed(moved)
    return moved


def transition_many(tx: Transaction, transitions: Sequence[Transition]) -> list[bool]:
    """`transition` for each; whether each lease was still held.

    The completer writes a batch of outcomes at once: the jobs named once
    by one statement (`mealquest.db.outcomes`), one round trip for the
    batch rather than one per job (the fence is each row's own).
    """
    return outcomes.transition_many(tx, transitions, _transition_together, transition)


def renew_leases(
    tx: Transaction, leases: Iterable[Lease], *, lease_seconds: float
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


def leases_of(tx: Transaction, owner: str) -> list[Lease]:
    """The leases of the running jobs one claim (by its fencing `owner`) holds."""
    rows = tx.execute(
        "SELECT id, lease_owner, attempt FROM jobs WHERE status = 'running' AND lease_owner = %s",
        (owner,),
    ).fetchall()
    return [Lease(row["id"], row["lease_owner"], row["attempt"]) for row in rows]


def queued_of_other_kinds(conn: Reads, kinds: Collection[str]) -> dict[str, int]:
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


def _recovered(tx: Transaction, rows: list[dict[str, Any]]) -> Recovered:
    postgres_transaction(tx).notify_changed(row["id"] for row in rows)
    return Recovered(
        tuple(row["id"] for row in rows if row["status"] == Status.QUEUED),
        tuple(row["id"] for row in rows if row["status"] == Status.FAILED),
        tuple(row["id"] for row in rows if row["status"] == Status.CANCELLED),
    )


def interrupt(tx: Transaction, leases: Iterable[Lease]) -> Recovered:
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
    return _recovered(tx, rows)


def running_leases(conn: Reads) -> list[HeldLease]:
    """The lease of every running job, as stored now."""
    rows = conn.execute(
        "SELECT id, lease_owner, attempt, lease_expires_at FROM jobs WHERE status = 'running'"
    ).fetchall()
    return [
        HeldLease(
            Lease(row["id"], row["lease_owner"], row["attempt"]), to_text(row["lease_expires_at"])
        )
        for row in rows
    ]


def rescue_unrenewed(
    tx: Transaction, held: Sequence[HeldLease], *, now: datetime | None = None
) -> Recovered:
    """Interrupt each of `held` whose lease is still as it was read (nobody
    renewed it since) and expired by the database's clock (or `now`)."""
    if not held:
        return Recovered()
    rows = tx.execute(
        f"UPDATE jobs SET {_INTERRUPT} FROM unnest(%(ids)s::text[], %(owners)s::text[], "
        "%(attempts)s::integer[], %(expiries)s::timestamptz[]) "
        f"AS lease(id, owner, attempt, expires_at) WHERE {_FENCE_ON_LEASES} "
        f"AND jobs.lease_expires_at = lease.expires_at AND jobs.lease_expires_at < {NOW} "
        "RETURNING jobs.id, jobs.status",
        {
            "interrupted": MESSAGE_INTERRUPTED,
            "now": now,
            "expiries": [entry.expires_at for entry in held],
            **_lease_arrays(entry.lease for entry in held),
        },
    ).fetchall()
    return _recovered(tx, rows)


def get_job(conn: Reads, job_id: str, household_id: int | None = None) -> Job | None:
    row = conn.execute(
        f"SELECT {COLUMNS} FROM jobs WHERE id = %(id)s "
        "AND (%(household_id)s::bigint IS NULL OR household_id = %(household_id)s)",
        {"id": job_id, "household_id": household_id},
    ).fetchone()
    return to_job(row) if row else None


def get_job_with_token(
    conn: Reads, job_id: str, token_sha256: str
) -> tuple[Household, Job | None] | None:
    """The household of a live token (by digest) and its job `job_id` (None if
    it has none of that id), in one statement; None if the token is not live."""
    row = conn.execute(
        "SELECT h.id AS token_household_id, h.name AS token_household_name, "
        "h.suspended_at IS NOT NULL AS token_household_suspended, "
        f"{qualified('j')} FROM api_tokens t JOIN households h ON h.id = t.household_id "
        "LEFT JOIN jobs j ON j.id = %(id)s AND j.household_id = t.household_id "
        "WHERE t.token_sha256 = %(digest)s AND t.revoked_at IS NULL AND h.erased_at IS NULL",
        {"id": job_id, "digest": token_sha256},
    ).fetchone()
    if row is None:
        return None
    values = dict(row)
    household = Household(
        values.pop("token_household_id"),
        values.pop("token_household_name"),
        values.pop("token_household_suspended"),
    )
    return household, to_job(values) if values["id"] is not None else None


def list_jobs(
    conn: Reads,
    *,
    household_id: int | None = None,
    status: Status | None = None,
    kind: str | None = None,
    before_seq: int | None = None,
    limit: int = 50,
) -> list[Job]:
    """Jobs newest first, filtered; `before_seq` continues a previous page.
    A household's list goes by an index of its own rows (`listing`)."""
    conditions: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    for column, value in (("household_id", household_id), ("status", status), ("kind", kind)):
        if value is not None:
            conditions.append(f"{column} = %({column})s")
            params[column] = str(value) if column == "status" else value
    if before_seq is not None:
        conditions.append("seq < %(before_seq)s")
        params["before_seq"] = before_seq
    if household_id is not None:
        _index, implied = listing.household_index(status, kind)
        if implied is not None:
            conditions.append(implied)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT %(limit)s", params
    ).fetchall()
    return [to_job(row) for row in rows]


# Transaction advisory locks (class, household) serialising a household's enqueues.
_QUOTA_LOCK_CLASS = int.from_bytes(b"mqqt", "big") - (1 << 31)


def count_pending(tx: Transaction, household_id: int, at_most: int) -> int:
    """The household's queued and running jobs (its quota's use), under a
    transaction advisory lock on the household: concurrent enqueues of one
    household wait for each other's commit, so the count stays true until
    this transaction commits. Read in a statement after the lock, so it sees
    every enqueue that committed before. Queued ones are counted on the
    household's queue row (kept by the queue triggers in the same
    transactions: one probe, however many wait); running ones through their
    partial index, up to `at_most` (the quota)."""
    tx.execute(
        "SELECT pg_advisory_xact_lock(%s, (%s::bigint %% 2147483647)::integer)",
        (_QUOTA_LOCK_CLASS, household_id),
    ).fetchall()
    row = tx.execute(
        "SELECT coalesce((SELECT queued FROM household_queues WHERE household_id = %(h)s), 0) "
        "+ (SELECT count(*) FROM (SELECT 1 FROM jobs WHERE household_id = %(h)s "
        "AND status = 'running' LIMIT %(most)s) AS running) AS pending",
        {"h": household_id, "most": at_most},
    ).fetchone()
    return int(row["pending"])


# How many of a household's latest finished jobs its typical run time is read from.
_RECENT_RUNS = 20


def household_load(conn: Reads, household_id: int) -> tuple[int, float | None]:
    """The household's running jobs, and the mean run time in seconds of its
    latest finished ones (None without any): what a quota's wait is judged by."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE household_id = %(h)s AND status = 'running') "
        "AS running, (SELECT avg(extract(epoch FROM finished_at - started_at)) "
        "FROM (SELECT started_at, finished_at FROM jobs WHERE household_id = %(h)s "
        "AND status IN ('succeeded', 'failed') AND started_at IS NOT NULL "
        "ORDER BY seq DESC LIMIT %(recent)s) AS recent) AS seconds",
        {"h": household_id, "recent": _RECENT_RUNS},
    ).fetchone()
    mean = row["seconds"]
    return int(row["running"]), None if mean is None else float(mean)


def changed_jobs(conn: Reads, versions: Mapping[str, int]) -> dict[str, Job | None]:
    """Each job of `versions` whose version is no longer the one given (None:
    it no longer exists): one statement over arrays, a primary-key probe per
    job, and only changed rows come back."""
    if not versions:
        return {}
    rows = conn.execute(
        f"SELECT w.id AS watched, {qualified('j')} "
        "FROM unnest(%(ids)s::text[], %(versions)s::integer[]) AS w(id, version) "
        "LEFT JOIN jobs AS j ON j.id = w.id WHERE j.id IS NULL OR j.version <> w.version",
        {"ids": list(versions), "versions": list(versions.values())},
    ).fetchall()
    changed: dict[str, Job | None] = {}
    for row in rows:
        values = dict(row)
        job_id = values.pop("watched")
        changed[job_id] = to_job(values) if values["id"] is not None else None
    return changed


def queue_standings(conn: Reads, jobs: Sequence[Job], *, at_most: int) -> dict[str, Standing]:
    """Each queued job's place in line (see `mealquest.db.standing`), judged at
    the database's now."""
    if not any(job.status == Status.QUEUED for job in jobs):
        return {}
    now = to_text(conn.execute("SELECT now() AS now").fetchone()["now"])
    return standing.standings(standing_reads, conn, jobs, at_most=at_most, now=now)


# How many of a kind's latest jobs its typical run time is looked for in (its
# newest jobs may be a long queue of waiting ones).
_KIND_JOBS_LOOKED_AT = 1_000


def kind_run_seconds(conn: Reads, kind: str) -> float | None:
    """The mean run time in seconds of the kind's latest finished jobs among its
    newest `_KIND_JOBS_LOOKED_AT` (None without any), through the kind's index."""
    row = conn.execute(
        "SELECT avg(extract(epoch FROM finished_at - started_at)) AS seconds FROM ("
        "SELECT started_at, finished_at FROM (SELECT seq, status, started_at, finished_at "
        "FROM jobs WHERE kind = %(kind)s ORDER BY kind, seq DESC LIMIT %(looked)s) AS newest "
        "WHERE status IN ('succeeded', 'failed') AND started_at IS NOT NULL "
        "ORDER BY seq DESC LIMIT %(recent)s) AS recent",
        {"kind": kind, "looked": _KIND_JOBS_LOOKED_AT, "recent": _RECENT_RUNS},
    ).fetchone()
    return None if row["seconds"] is None else float(row["seconds"])


def running_job_ids(conn: Reads, household_id: int) -> list[str]:
    """The ids of the household's running jobs (through their partial index)."""
    rows = conn.execute(
        "SELECT id FROM jobs WHERE household_id = %s AND status = 'running'", (household_id,)
    ).fetchall()
    return [row["id"] for row in rows]


def delete_household_jobs(tx: Transaction, household_id: int, *, limit: int) -> int:
    """Delete up to `limit` of the household's jobs that are not running (the
    batch chosen once, its rows locked without waiting)."""
    cursor = tx.execute(
        "WITH batch AS MATERIALIZED (SELECT seq FROM jobs WHERE household_id = %s "
        "AND status <> 'running' LIMIT %s FOR UPDATE SKIP LOCKED) "
        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM batch) AND status <> 'running'",
        (household_id, limit),
    )
    return cursor.rowcount
