"""Every SQL statement of the job runner, as plain functions over a connection.

Writes take a `Transaction` (they run inside `SqliteStore.write`, in the
writer thread); reads take what `Reads` names (they run inside
`SqliteStore.read`, on the reader connection).
Every write after the claim is fenced on the lease: the job must still be
`running`, owned by this worker's boot id, at this attempt. A write that
matches no row returns False and the caller treats the lease as lost. Every
state change a worker makes goes through `transition` (or `transition_many`,
its batch); interruptions (a stop that cut a job short, or an expired lease)
through `interrupt` and `rescue_unrenewed`, which apply the row's
`on_interrupt` policy in SQL.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from mealquest.clock import to_text
from mealquest.db import listing, outcomes, standing
from mealquest.db.driver import Reads, Transaction
from mealquest.db.sqlite import standing as standing_reads
from mealquest.db.sqlite.claim import claim as claim
from mealquest.db.sqlite.claim import has_due_job as has_due_job
from mealquest.db.sqlite.job_rows import COLUMNS, NEXT_VERSION, moment_of, moment_text
from mealquest.db.sqlite.signals import mark_waiting as mark_waiting
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

# The columns an insert sets, in the order of `_insert_row`'s values.
_INSERTED = (
    "id",
    "household_id",
    "kind",
    "payload",
    "max_attempts",
    "on_interrupt",
    "priority",
    "unique_key",
    "unique_digest",
    "partition_key",
    "run_at",
    "created_at",
    "updated_at",
)
_INSERT = (
    f"INSERT INTO jobs (status, {', '.join(_INSERTED)}) "
    f"VALUES ('queued', {', '.join('?' * len(_INSERTED))}) "
    "ON CONFLICT (household_id, unique_key) WHERE unique_key IS NOT NULL DO NOTHING"
)
# The same rows, each an array of `_insert_row`'s values, from one JSON array
# (`key` is an item's index there).
_INSERT_FROM_JSON = (
    f"INSERT INTO jobs (status, {', '.join(_INSERTED)}) SELECT 'queued', "
    + ", ".join(f"json_extract(value, '$[{index}]')" for index in range(len(_INSERTED)))
    + " FROM json_each(?) ORDER BY key"
)


def _insert_row(moment: datetime, now: str, job: NewJob) -> tuple[object, ...]:
    """The INSERT's parameters; `now` is `moment` as stored (made once per statement)."""
    if job.due_now:
        due = now
    else:
        due = to_text(job.run_at or moment + timedelta(seconds=job.delay_seconds or 0.0))
    return (
        job.job_id,
        job.household_id,
        job.kind,
        job.payload,
        job.max_attempts,
        str(job.on_interrupt),
        job.priority,
        job.unique_key,
        job.unique_digest,
        job.partition_key,
        due,
        now,
        now,
    )


def insert_job(tx: Transaction, job: NewJob) -> bool:
    """Queue a job, due at its `run_at`, `delay_seconds` from now, or now.

    With a `unique_key`, nothing is inserted (False) when the household already
    has a job holding that key: the unique index decides, so two concurrent
    enqueues cannot both insert. True when the job was inserted.
    """
    moment = moment_of(None)
    return tx.execute(_INSERT, _insert_row(moment, to_text(moment), job)).rowcount == 1


def insert_jobs(tx: Transaction, jobs: Sequence[NewJob]) -> None:
    """Queue jobs that hold no idempotency key, each as `insert_job` would, in
    their order, by one statement that reads the rows from a JSON array. One
    statement a row paid a statement call and a clock read a job; one
    `executemany` still paid a run of the statement a row: 1,000 rows took
    about 50 ms, against 30 for one statement over them all."""
    if any(job.unique_key is not None for job in jobs):
        raise ValueError("a job with an idempotency key needs insert_job's answer")
    if not jobs:
        return
    moment = moment_of(None)
    now = to_text(moment)
    rows = [_insert_row(moment, now, job) for job in jobs]
    tx.execute(_INSERT_FROM_JSON, (json.dumps(rows),))


def release_unique_key(
    tx: Transaction, *, household_id: int, unique_key: str, older_than_seconds: float
) -> int:
    """Clear `unique_key` from the household's job that holds it, if that job was
    created more than `older_than_seconds` ago (its window is over)."""
    cutoff = moment_text(moment_of(None) - timedelta(seconds=older_than_seconds))
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
    now = moment_text(None)
    scope = "" if household_id is None else " AND household_id = :household_id"
    tx.execute(
        "UPDATE jobs SET "
        "status = CASE status WHEN 'queued' THEN 'cancelled' ELSE status END, "
        "finished_at = CASE status WHEN 'queued' THEN :now ELSE finished_at END, "
        "cancel_requested_at = CASE status WHEN 'running' "
        "THEN COALESCE(cancel_requested_at, :now) ELSE cancel_requested_at END, "
        f"updated_at = :now, {NEXT_VERSION} "
        "WHERE id = :job_id AND (status = 'queued' "
        f"OR (status = 'running' AND cancel_requested_at IS NULL)){scope}",
        {"now": now, "job_id": job_id, "household_id": household_id},
    )
    return get_job(tx, job_id, household_id)


def retry_job(tx: Transaction, job_id: str, household_id: int | None = None) -> Job | None:
    """Queue a failed or cancelled job again, due now, with a fresh attempt
    budget; other jobs are left as they are. Returns the job as it now is."""
    now = moment_text(None)
    scope = "" if household_id is None else " AND household_id = :household_id"
    tx.execute(
        "UPDATE jobs SET status = 'queued', attempt = 0, interruptions = 0, snoozes = 0, "
        "result = NULL, "
        "error = NULL, started_at = NULL, finished_at = NULL, cancel_requested_at = NULL, "
        f"run_at = :now, updated_at = :now, {NEXT_VERSION} "
        f"WHERE id = :job_id AND status IN ('failed', 'cancelled'){scope}",
        {"now": now, "job_id": job_id, "household_id": household_id},
    )
    return get_job(tx, job_id, household_id)


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


def _placeholders(values: Collection[object]) -> str:
    return ", ".join("?" * len(values))


_FENCE = "id = :job_id AND status = 'running' AND lease_owner = :owner AND attempt = :attempt"


def _fence(lease: Lease) -> dict[str, object]:
    return {"job_id": lease.job_id, "owner": lease.owner, "attempt": lease.attempt}


def publish(tx: Transaction, lease: Lease, *, result: str) -> bool:
    cursor = tx.execute(
        f"UPDATE jobs SET result = :result, updated_at = :now, {NEXT_VERSION} WHERE {_FENCE}",
        {"result": result, "now": moment_text(None), **_fence(lease)},
    )
    return cursor.rowcount == 1


def owns(tx: Transaction, lease: Lease) -> bool:
    row = tx.execute(f"SELECT 1 FROM jobs WHERE {_FENCE}", _fence(lease)).fetchone()
    return row is not None


def add_log_lines(tx: Transaction, job_id: str, lines: Sequence[LogLine]) -> None:
    if not lines:
        return
    # One statement: at most an attempt's 100 lines, 600 parameters.
    tx.execute(
        "INSERT INTO job_logs (job_id, attempt, line, level, message, logged_at) VALUES "
        + ", ".join(["(?, ?, ?, ?, ?, ?)"] * len(lines)),
        [
            value
            for x in lines
            for value in (job_id, x.attempt, x.line, x.level, x.message, x.logged_at)
        ],
    )


def add_traceparents(tx: Transaction, traces: Sequence[tuple[str, str]]) -> None:
    if traces:
        # One statement and one parameter however many jobs a bulk enqueue made.
        tx.execute(
            "INSERT INTO job_traces (job_id, traceparent) "
            "SELECT value ->> 0, value ->> 1 FROM json_each(?)",
            (json.dumps(traces),),
        )


def traceparents(conn: Reads, job_ids: Sequence[str]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT job_id, traceparent FROM job_traces "
        "WHERE job_id IN (SELECT value FROM json_each(?))",
        (json.dumps(list(job_ids)),),
    ).fetchall()
    return {row["job_id"]: row["traceparent"] for row in rows}


def log_lines(conn: Reads, job_id: str) -> list[LogLine]:
    rows = conn.execute(
        "SELECT attempt, line, level, message, logged_at FROM job_logs "
        "WHERE job_id = ? ORDER BY attempt, line",
        (job_id,),
    ).fetchall()
    return [LogLine(**dict(row)) for row in rows]


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
_CLEAR_LEASE = f"lease_owner = NULL, lease_expires_at = NULL, updated_at = :now, {NEXT_VERSION}"
# A snooze counts on the job (unless a cancel wins), and ends its interruptions in a row.
_SNOOZED = f"snoozes = snoozes + CASE WHEN {_CANCELLING} THEN 0 ELSE 1 END, interruptions = 0"


def transition(tx: Transaction, change: Transition) -> bool:
    """Move the leased running job to `change.to`; False if the lease is no longer held.

    `to=QUEUED` with `Attempt.SPEND` is a retry, due `delay_seconds` from
    now; with `Attempt.REFUND` the job goes back as if the attempt never
    started (`delay_seconds` None keeps its place in the queue); a snooze
    is such a refund, counted in the job's `snoozes`. Each ends the job
    cancelled instead if a cancel was requested meanwhile.
    """
    check_transition(change.to, change.attempt, change.snoozed)
    moment = moment_of(None)
    delay = change.delay_seconds
    run_at = None if delay is None else moment_text(moment + timedelta(seconds=delay))
    snoozed = f"{_SNOOZED}, " if change.snoozed else ""
    cursor = tx.execute(
        f"UPDATE jobs SET {_TO[change.to]}, {_ATTEMPT[change.attempt]}, {snoozed}{_CLEAR_LEASE} "
        f"WHERE {_FENCE}",
        {
            "to": str(change.to),
            "now": moment_text(moment),
            "result": change.result,
            "error": change.error,
            "run_at": run_at,
            **_fence(change.lease),
        },
    )
    return cursor.rowcount == 1


# `transition` for a batch, in one statement: each row of `change` carries its
# lease, target status, whether the attempt is refunded (and whether as a
# snooze), and its result, error and new run time; the columns are those
# `_TO`, `_ATTEMPT` and `_SNOOZED` set, chosen per row. Bound by position,
# `?1` the moment and the rows' values after it (by name, each of a row's
# parameters was looked up: 50 us against 35 for four rows, and growing with
# the square of the rows).
_CHANGE_COLUMNS = (
    "id",
    "owner",
    "attempt",
    "status",
    "refunded",
    "result",
    "error",
    "run_at",
    "snoozed",
)
_CHANGE_CANCELLING = "change.status = 'queued' AND jobs.cancel_requested_at IS NOT NULL"
_TRANSITION_MANY_HEAD = (
    "UPDATE jobs SET "
    f"status = CASE WHEN {_CHANGE_CANCELLING} THEN 'cancelled' ELSE change.status END, "
    "result = CASE change.status WHEN 'succeeded' THEN change.result "
    f"WHEN 'queued' THEN CASE WHEN {_CHANGE_CANCELLING} THEN jobs.result END "
    "ELSE jobs.result END, "
    "error = CASE WHEN change.status = 'failed' THEN change.error ELSE jobs.error END, "
    "finished_at = CASE WHEN change.status <> 'queued' OR jobs.cancel_requested_at IS NOT NULL "
    "THEN ?1 END, "
    f"run_at = CASE WHEN change.status <> 'queued' OR {_CHANGE_CANCELLING} THEN jobs.run_at "
    "ELSE COALESCE(change.run_at, jobs.run_at) END, "
    "interruptions = CASE WHEN change.refunded AND NOT change.snoozed "
    "THEN jobs.interruptions ELSE 0 END, "
    "attempt = CASE WHEN change.refunded THEN jobs.attempt - 1 ELSE jobs.attempt END, "
    f"snoozes = CASE WHEN change.snoozed AND NOT ({_CHANGE_CANCELLING}) "
    "THEN jobs.snoozes + 1 ELSE jobs.snoozes END, "
    f"{_CLEAR_LEASE.replace(':now', '?1')} FROM (SELECT "
    + ", ".join(f"column{index} AS {name}" for index, name in enumerate(_CHANGE_COLUMNS, 1))
    + " FROM (VALUES "
)
_TRANSITION_MANY_TAIL = (
    ")) AS change "
    "WHERE jobs.id = change.id AND jobs.status = 'running' AND jobs.lease_owner = change.owner "
    "AND jobs.attempt = change.attempt RETURNING jobs.id"
)
# Rows a statement takes at most: 9,001 values, well within the 32,766 SQLite
# binds by default, and a statement text of about 45 kB.
_TRANSITION_MANY_ROWS = 1_000


@functools.lru_cache(maxsize=32)
def _transition_many_statement(rows: int) -> str:
    """The statement for `rows` changes (its text built once per batch size)."""
    row = "(" + ", ".join("?" * len(_CHANGE_COLUMNS)) + ")"
    return _TRANSITION_MANY_HEAD + ", ".join([row] * rows) + _TRANSITION_MANY_TAIL


def _transition_together(tx: Transaction, transitions: list[Transition]) -> set[str]:
    """The ids of the jobs the transitions (each naming another job) moved."""
    moment = moment_of(None)
    moved: set[str] = set()
    for start in range(0, len(transitions), _TRANSITION_MANY_ROWS):
        chunk = transitions[start : start + _TRANSITION_MANY_ROWS]
        params: list[object] = [moment_text(moment)]
        for change in chunk:
            params += (
                change.lease.job_id,
                change.lease.owner,
                change.lease.attempt,
                str(change.to),
                change.attempt is Attempt.REFUND,
                change.result,
                change.error,
                None
                if change.delay_seconds is None
                else moment_text(moment + timedelta(seconds=change.delay_seconds)),
                change.snoozed,
            )
        statement = _transition_many_statement(len(chunk))
        moved.update(found["id"] for found in tx.execute(statement, params).fetchall())
    return moved


def transition_many(tx: Transaction, transitions: Sequence[Transition]) -> list[bool]:
    """`transition` for each; whether each lease was still held.

    The jobs named once go in one statement (`mealquest.db.outcomes`;
    measured: four outcomes and their BEGIN took about a quarter less time
    than as four statements, which each paid a call, a clock read and
    their parameters). Its values are bound as `transition` binds them, so any
    text is stored as it is. The rows named once are written before those
    named twice, whatever their order in the batch, and the row triggers
    read the rows written so far: the outcomes of one batch came at once.
    """
    return outcomes.transition_many(tx, transitions, _transition_together, transition)


def renew_leases(
    tx: Transaction, leases: Iterable[Lease], *, lease_seconds: float
) -> set[tuple[str, int]]:
    """Extend the given leases where still held; returns the (id, attempt) renewed.

    Only leases the process names: a job the heartbeat leaves out (its handler
    past its timeout, or its outcome given up on) expires and is rescued.
    """
    lease_expires_at = moment_text(moment_of(None) + timedelta(seconds=lease_seconds))
    renewed = set()
    for lease in leases:
        cursor = tx.execute(
            f"UPDATE jobs SET lease_expires_at = :lease_expires_at WHERE {_FENCE}",
            {"lease_expires_at": lease_expires_at, **_fence(lease)},
        )
        if cursor.rowcount == 1:
            renewed.add((lease.job_id, lease.attempt))
    return renewed


def leases_of(tx: Transaction, owner: str) -> list[Lease]:
    """The leases of the running jobs one claim (by its fencing `owner`) holds."""
    rows = tx.execute(
        "SELECT id, lease_owner, attempt FROM jobs WHERE status = 'running' AND lease_owner = ?",
        (owner,),
    ).fetchall()
    return [Lease(row["id"], row["lease_owner"], row["attempt"]) for row in rows]


def queued_of_other_kinds(conn: Reads, kinds: Collection[str]) -> dict[str, int]:
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
    now = moment_text(None)
    for lease in leases:
        recovered += _interrupt(tx, _FENCE, {"now": now, **_fence(lease)})
    return recovered


def running_leases(conn: Reads) -> list[HeldLease]:
    """The lease of every running job, as stored now (index `jobs_running`)."""
    rows = conn.execute(
        "SELECT id, lease_owner, attempt, lease_expires_at FROM jobs WHERE status = 'running'"
    ).fetchall()
    return [
        HeldLease(Lease(row["id"], row["lease_owner"], row["attempt"]), row["lease_expires_at"])
        for row in rows
    ]


def rescue_unrenewed(
    tx: Transaction, held: Sequence[HeldLease], *, now: datetime | None = None
) -> Recovered:
    """Interrupt each of `held` whose lease is still as it was read (nobody
    renewed it since) and expired before `now` (None: the wall clock)."""
    recovered = Recovered()
    moment = moment_text(now)
    for entry in held:
        recovered += _interrupt(
            tx,
            f"{_FENCE} AND lease_expires_at = :expires_at AND lease_expires_at < :now",
            {"now": moment, "expires_at": entry.expires_at, **_fence(entry.lease)},
        )
    return recovered


def get_job(conn: Reads, job_id: str, household_id: int | None = None) -> Job | None:
    sql = f"SELECT {COLUMNS} FROM jobs WHERE id = ?"
    params: tuple[object, ...] = (job_id,)
    if household_id is not None:
        sql += " AND household_id = ?"
        params += (household_id,)
    row = conn.execute(sql, params).fetchone()
    return Job.from_row(row) if row else None


_JOB_COLUMNS_OF_J = ", ".join(f"j.{column.strip()}" for column in COLUMNS.split(","))


def get_job_with_token(
    conn: Reads, job_id: str, token_sha256: str
) -> tuple[Household, Job | None] | None:
    """The household of a live token (by digest) and its job `job_id` (None if
    it has none of that id), in one statement; None if the token is not live."""
    row = conn.execute(
        "SELECT h.id AS token_household_id, h.name AS token_household_name, "
        "h.suspended_at IS NOT NULL AS token_household_suspended, "
        f"{_JOB_COLUMNS_OF_J} FROM api_tokens t JOIN households h ON h.id = t.household_id "
        "LEFT JOIN jobs j ON j.id = ? AND j.household_id = t.household_id "
        "WHERE t.token_sha256 = ? AND t.revoked_at IS NULL AND h.erased_at IS NULL",
        (job_id, token_sha256),
    ).fetchone()
    if row is None:
        return None
    values = dict(row)
    household = Household(
        values.pop("token_household_id"),
        values.pop("token_household_name"),
        bool(values.pop("token_household_suspended")),
    )
    return household, Job.from_row(values) if values["id"] is not None else None


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
    A household's list goes by an index of its own rows (`listing`), named
    here, as statistics could make SQLite prefer another."""
    conditions: list[str] = []
    params: list[object] = []
    for column, value in (("household_id", household_id), ("status", status), ("kind", kind)):
        if value is not None:
            conditions.append(f"{column} = ?")
            params.append(str(value) if column == "status" else value)
    if before_seq is not None:
        conditions.append("seq < ?")
        params.append(before_seq)
    indexed = ""
    if household_id is not None:
        index, implied = listing.household_index(status, kind)
        indexed = f" INDEXED BY {index}"
        if implied is not None:
            conditions.append(implied)
    where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM jobs{indexed} {where} ORDER BY seq DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return [Job.from_row(row) for row in rows]


def count_pending(tx: Transaction, household_id: int, at_most: int) -> int:
    """The household's queued and running jobs (its quota's use), inside the
    write transaction that may add one: SQLite writes one transaction at a
    time, so the count stays true until it commits. Queued ones are counted
    on the household's queue row (kept by the queue triggers in the same
    transaction: one probe, however many wait); running ones through their
    partial index, up to `at_most` (the quota)."""
    row = tx.execute(
        "SELECT coalesce((SELECT queued FROM household_queues WHERE household_id = :household), 0)"
        " + (SELECT count(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_running "
        "WHERE household_id = :household AND status = 'running' LIMIT :most)) AS pending",
        {"household": household_id, "most": at_most},
    ).fetchone()
    return int(row["pending"])


# How many of a household's latest finished jobs its typical run time is read from.
_RECENT_RUNS = 20


def household_load(conn: Reads, household_id: int) -> tuple[int, float | None]:
    """The household's running jobs, and the mean run time in seconds of its
    latest finished ones (None without any): what a quota's wait is judged by."""
    running = conn.execute(
        "SELECT count(*) AS running FROM jobs INDEXED BY jobs_running "
        "WHERE household_id = ? AND status = 'running'",
        (household_id,),
    ).fetchone()["running"]
    mean = conn.execute(
        "SELECT avg((julianday(finished_at) - julianday(started_at)) * 86400.0) AS seconds "
        "FROM (SELECT started_at, finished_at FROM jobs WHERE household_id = ? "
        "AND status IN ('succeeded', 'failed') AND started_at IS NOT NULL "
        "ORDER BY seq DESC LIMIT ?)",
        (household_id, _RECENT_RUNS),
    ).fetchone()["seconds"]
    return int(running), None if mean is None else float(mean)


# Watched jobs one statement probes at most (its JSON text about 20 kB).
_WATCHED_PER_STATEMENT = 500
_CHANGED = (
    f"SELECT json_extract(w.value, '$[0]') AS watched, {_JOB_COLUMNS_OF_J} "
    "FROM json_each(?) AS w LEFT JOIN jobs AS j ON j.id = json_extract(w.value, '$[0]') "
    "WHERE j.id IS NULL OR j.version <> json_extract(w.value, '$[1]')"
)


def changed_jobs(conn: Reads, versions: Mapping[str, int]) -> dict[str, Job | None]:
    """Each job of `versions` whose version is no longer the one given (None:
    it no longer exists): a probe of the jobs' id index per job, from one JSON
    array per batch, and only changed rows come back."""
    changed: dict[str, Job | None] = {}
    watched = list(versions.items())
    for start in range(0, len(watched), _WATCHED_PER_STATEMENT):
        batch = json.dumps(watched[start : start + _WATCHED_PER_STATEMENT])
        for row in conn.execute(_CHANGED, (batch,)).fetchall():
            values = dict(row)
            job_id = values.pop("watched")
            changed[job_id] = Job.from_row(values) if values["id"] is not None else None
    return changed


def queue_standings(conn: Reads, jobs: Sequence[Job], *, at_most: int) -> dict[str, Standing]:
    """Each queued job's place in line (see `mealquest.db.standing`), judged at
    the wall clock's now."""
    return standing.standings(standing_reads, conn, jobs, at_most=at_most, now=moment_text(None))


# How many of a kind's latest jobs its typical run time is looked for in (its
# newest jobs may be a long queue of waiting ones), and read from.
_KIND_JOBS_LOOKED_AT = 1_000


def kind_run_seconds(conn: Reads, kind: str) -> float | None:
    """The mean run time in seconds of the kind's latest finished jobs among its
    newest `_KIND_JOBS_LOOKED_AT` (None without any), through the kind's index."""
    row = conn.execute(
        "SELECT avg((julianday(finished_at) - julianday(started_at)) * 86400.0) AS seconds "
        "FROM (SELECT started_at, finished_at FROM (SELECT seq, status, started_at, finished_at "
        "FROM jobs INDEXED BY jobs_kind_seq WHERE kind = ? ORDER BY seq DESC LIMIT ?) "
        "WHERE status IN ('succeeded', 'failed') AND started_at IS NOT NULL "
        "ORDER BY seq DESC LIMIT ?)",
        (kind, _KIND_JOBS_LOOKED_AT, _RECENT_RUNS),
    ).fetchone()
    return None if row["seconds"] is None else float(row["seconds"])


def running_job_ids(conn: Reads, household_id: int) -> list[str]:
    """The ids of the household's running jobs (through their partial index)."""
    rows = conn.execute(
        "SELECT id FROM jobs INDEXED BY jobs_running WHERE household_id = ? AND status = 'running'",
        (household_id,),
    ).fetchall()
    return [row["id"] for row in rows]


def delete_household_jobs(tx: Transaction, household_id: int, *, limit: int) -> int:
    """Delete up to `limit` of the household's jobs that are not running."""
    cursor = tx.execute(
        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs INDEXED BY jobs_household "
        "WHERE household_id = ? AND status <> 'running' LIMIT ?)",
        (household_id, limit),
    )
    return cursor.rowcount
