"""A job's durable steps, its waits for its household and the household's
answers, on PostgreSQL (see `SignalStatements`), by the database's clock.

A signal locks its job's row before it looks at the job, and a wait's
transition locks it too (its fenced update), so the two never miss each
other: a signal that comes while the job's last attempt is being recorded
waits for that record, then finds the job waiting and makes it due; a wait
recorded after a signal was stored finds the signal (`mark_waiting` reads
in a statement of its own, after the transition's row lock) and is due at
once."""

from __future__ import annotations

from mealquest.db.driver import Reads, Transaction
from mealquest.db.postgresql.job_rows import COLUMNS, NEXT_VERSION, to_job
from mealquest.db.postgresql.transaction import postgres_transaction
from mealquest.model.jobs import Job, Lease
from mealquest.model.signals import (
    WAIT_STEP_PREFIX,
    Signaled,
    SignalResult,
    WaitState,
    refused,
    resumes,
)

_FENCE = (
    "EXISTS (SELECT 1 FROM jobs WHERE id = %(job_id)s AND status = 'running' "
    "AND lease_owner = %(owner)s AND attempt = %(attempt)s)"
)


def _fence(lease: Lease) -> dict[str, object]:
    return {"job_id": lease.job_id, "owner": lease.owner, "attempt": lease.attempt}


def kept_step(conn: Reads, job_id: str, name: str) -> str | None:
    row = conn.execute(
        "SELECT result FROM job_steps WHERE job_id = %s AND name = %s", (job_id, name)
    ).fetchone()
    return None if row is None else str(row["result"])


def keep_step(tx: Transaction, lease: Lease, name: str, result: str) -> bool:
    row = tx.execute(
        "WITH kept AS (INSERT INTO job_steps (job_id, name, result, kept_at) "
        f"SELECT %(job_id)s, %(name)s, %(result)s, now() WHERE {_FENCE} "
        "ON CONFLICT (job_id, name) DO NOTHING RETURNING 1) "
        f"SELECT {_FENCE} AS held",
        {**_fence(lease), "name": name, "result": result},
    ).fetchone()
    return bool(row["held"])


def wait_state(conn: Reads, job_id: str, name: str) -> WaitState:
    # A wait's deadline is kept as seconds since the epoch.
    row = conn.execute(
        "SELECT (SELECT payload FROM job_signals WHERE job_id = %(job)s AND name = %(name)s) "
        "AS answer, (SELECT result::double precision <= extract(epoch FROM now()) "
        "FROM job_steps WHERE job_id = %(job)s AND name = %(wait)s) AS timed_out",
        {"job": job_id, "name": name, "wait": WAIT_STEP_PREFIX + name},
    ).fetchone()
    return WaitState(row["answer"], row["timed_out"])


def begin_wait(tx: Transaction, lease: Lease, name: str, timeout_seconds: float) -> float | None:
    deadline = tx.execute(
        "SELECT (extract(epoch FROM now()) + %s)::text AS deadline", (float(timeout_seconds),)
    ).fetchone()["deadline"]
    if not keep_step(tx, lease, WAIT_STEP_PREFIX + name, deadline):
        return None
    row = tx.execute(
        "SELECT greatest(0, result::double precision - extract(epoch FROM now())) AS left "
        "FROM job_steps WHERE job_id = %s AND name = %s",
        (lease.job_id, WAIT_STEP_PREFIX + name),
    ).fetchone()
    return float(row["left"])


def mark_waiting(tx: Transaction, job_id: str, name: str, prompt: str) -> bool:
    row = tx.execute(
        "UPDATE jobs SET result = %(prompt)s, updated_at = now(), "
        "waiting_signal = CASE WHEN answered.any THEN NULL ELSE %(name)s END, "
        f"run_at = CASE WHEN answered.any THEN now() ELSE jobs.run_at END, {NEXT_VERSION} "
        "FROM (SELECT EXISTS (SELECT 1 FROM job_signals WHERE job_id = %(id)s "
        "AND name = %(name)s) AS any) AS answered "
        "WHERE jobs.id = %(id)s AND jobs.status = 'queued' RETURNING answered.any",
        {"id": job_id, "name": name, "prompt": prompt},
    ).fetchone()
    transaction = postgres_transaction(tx)
    transaction.notify_changed((job_id,))
    due = row is not None and bool(row["any"])
    if due:
        transaction.notify_enqueued()
    return due


def _locked_job(tx: Transaction, job_id: str, household_id: int | None) -> Job | None:
    row = tx.execute(
        f"SELECT {COLUMNS} FROM jobs WHERE id = %(id)s "
        "AND (%(household)s::bigint IS NULL OR household_id = %(household)s) FOR UPDATE",
        {"id": job_id, "household": household_id},
    ).fetchone()
    return None if row is None else to_job(row)


def signal(
    tx: Transaction,
    job_id: str,
    name: str,
    payload: str,
    *,
    household_id: int | None,
    idempotency_key: str | None = None,
) -> SignalResult:
    job = _locked_job(tx, job_id, household_id)
    if job is None:
        return SignalResult(Signaled.NO_JOB, None)
    kept = tx.execute(
        "SELECT idempotency_key FROM job_signals WHERE job_id = %s AND name = %s", (job_id, name)
    ).fetchone()
    kept_key = kept["idempotency_key"] if kept is not None else None
    refusal = refused(job, name, kept is not None, kept_key, idempotency_key)
    if refusal is not None:
        return refusal
    tx.execute(
        "INSERT INTO job_signals (job_id, name, payload, idempotency_key, received_at) "
        "VALUES (%s, %s, %s, %s, now())",
        (job_id, name, payload, idempotency_key),
    )
    if not resumes(job, name):
        return SignalResult(Signaled.KEPT, job)
    row = tx.execute(
        f"UPDATE jobs SET run_at = now(), waiting_signal = NULL, updated_at = now(), "
        f"{NEXT_VERSION} WHERE id = %s RETURNING {COLUMNS}",
        (job_id,),
    ).fetchone()
    transaction = postgres_transaction(tx)
    transaction.notify_changed((job_id,))
    transaction.notify_enqueued()
    return SignalResult(Signaled.RESUMED, to_job(row))


def waiting_jobs(conn: Reads, *, household_id: int | None = None, limit: int = 50) -> list[Job]:
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM jobs WHERE status = 'queued' AND waiting_signal IS NOT NULL "
        "AND (%(household)s::bigint IS NULL OR household_id = %(household)s) "
        "ORDER BY run_at, seq LIMIT %(limit)s",
        {"household": household_id, "limit": limit},
    ).fetchall()
    return [to_job(row) for row in rows]


def waiting_summary(conn: Reads) -> tuple[int, float | None]:
    row = conn.execute(
        "SELECT count(*) AS waiting, "
        # greatest() passes over a NULL: none waiting must stay NULL.
        "(CASE WHEN min(run_at) IS NOT NULL "
        "THEN greatest(0, extract(epoch FROM min(run_at) - now())) END)::double precision AS left "
        "FROM jobs WHERE status = 'queued' AND waiting_signal IS NOT NULL"
    ).fetchone()
    return int(row["waiting"]), None if row["left"] is None else float(row["left"])
