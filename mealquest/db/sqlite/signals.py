"""A job's durable steps, its waits for its household and the household's
answers, on SQLite (see `SignalStatements`). Times are the machine's UTC
clock as fixed-width text, so a deadline compares as text; one writer at a
time makes each check-then-write exact."""

from __future__ import annotations

from datetime import timedelta

from mealquest.clock import from_text, to_text, utc_now
from mealquest.db.driver import Reads, Transaction
from mealquest.db.sqlite.job_rows import COLUMNS, NEXT_VERSION
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
    "EXISTS (SELECT 1 FROM jobs WHERE id = :job_id AND status = 'running' "
    "AND lease_owner = :owner AND attempt = :attempt)"
)


def _fence(lease: Lease) -> dict[str, object]:
    return {"job_id": lease.job_id, "owner": lease.owner, "attempt": lease.attempt}


def kept_step(conn: Reads, job_id: str, name: str) -> str | None:
    row = conn.execute(
        "SELECT result FROM job_steps WHERE job_id = ? AND name = ?", (job_id, name)
    ).fetchone()
    return None if row is None else str(row["result"])


def keep_step(tx: Transaction, lease: Lease, name: str, result: str) -> bool:
    if not tx.execute(f"SELECT {_FENCE} AS held", _fence(lease)).fetchone()["held"]:
        return False
    tx.execute(
        "INSERT INTO job_steps (job_id, name, result, kept_at) VALUES (:job_id, :name, "
        ":result, :now) ON CONFLICT (job_id, name) DO NOTHING",
        {**_fence(lease), "name": name, "result": result, "now": to_text(utc_now())},
    )
    return True


def wait_state(conn: Reads, job_id: str, name: str) -> WaitState:
    row = conn.execute(
        "SELECT (SELECT payload FROM job_signals WHERE job_id = :job AND name = :name) AS answer, "
        "(SELECT result FROM job_steps WHERE job_id = :job AND name = :wait) AS deadline",
        {"job": job_id, "name": name, "wait": WAIT_STEP_PREFIX + name},
    ).fetchone()
    deadline = row["deadline"]
    return WaitState(row["answer"], None if deadline is None else deadline <= to_text(utc_now()))


def begin_wait(tx: Transaction, lease: Lease, name: str, timeout_seconds: float) -> float | None:
    now = utc_now()
    kept = keep_step(
        tx, lease, WAIT_STEP_PREFIX + name, to_text(now + timedelta(seconds=timeout_seconds))
    )
    if not kept:
        return None
    deadline = kept_step(tx, lease.job_id, WAIT_STEP_PREFIX + name)
    assert deadline is not None
    return max(0.0, (from_text(deadline) - now).total_seconds())


def mark_waiting(tx: Transaction, job_id: str, name: str, prompt: str) -> bool:
    answered = tx.execute(
        "SELECT 1 FROM job_signals WHERE job_id = ? AND name = ?", (job_id, name)
    ).fetchone()
    now = to_text(utc_now())
    if answered is not None:
        cursor = tx.execute(
            f"UPDATE jobs SET run_at = :now, result = :prompt, updated_at = :now, {NEXT_VERSION} "
            "WHERE id = :id AND status = 'queued'",
            {"id": job_id, "prompt": prompt, "now": now},
        )
        return cursor.rowcount == 1
    tx.execute(
        "UPDATE jobs SET waiting_signal = :name, result = :prompt, updated_at = :now, "
        f"{NEXT_VERSION} WHERE id = :id AND status = 'queued'",
        {"id": job_id, "name": name, "prompt": prompt, "now": now},
    )
    return False


def _job(tx: Reads, job_id: str, household_id: int | None) -> Job | None:
    sql = f"SELECT {COLUMNS} FROM jobs WHERE id = ?"
    params: tuple[object, ...] = (job_id,)
    if household_id is not None:
        sql += " AND household_id = ?"
        params += (household_id,)
    row = tx.execute(sql, params).fetchone()
    return None if row is None else Job.from_row(row)


def signal(
    tx: Transaction,
    job_id: str,
    name: str,
    payload: str,
    *,
    household_id: int | None,
    idempotency_key: str | None = None,
) -> SignalResult:
    job = _job(tx, job_id, household_id)
    if job is None:
        return SignalResult(Signaled.NO_JOB, None)
    kept = tx.execute(
        "SELECT idempotency_key FROM job_signals WHERE job_id = ? AND name = ?", (job_id, name)
    ).fetchone()
    kept_key = kept["idempotency_key"] if kept is not None else None
    refusal = refused(job, name, kept is not None, kept_key, idempotency_key)
    if refusal is not None:
        return refusal
    now = to_text(utc_now())
    tx.execute(
        "INSERT INTO job_signals (job_id, name, payload, idempotency_key, received_at) "
        "VALUES (?, ?, ?, ?, ?)",
        (job_id, name, payload, idempotency_key, now),
    )
    if not resumes(job, name):
        return SignalResult(Signaled.KEPT, job)
    tx.execute(
        f"UPDATE jobs SET run_at = :now, waiting_signal = NULL, updated_at = :now, {NEXT_VERSION} "
        "WHERE id = :id",
        {"id": job_id, "now": now},
    )
    return SignalResult(Signaled.RESUMED, _job(tx, job_id, household_id))


def waiting_jobs(conn: Reads, *, household_id: int | None = None, limit: int = 50) -> list[Job]:
    household = "" if household_id is None else " AND household_id = :household"
    rows = conn.execute(
        f"SELECT {COLUMNS} FROM jobs WHERE status = 'queued' AND waiting_signal IS NOT NULL"
        f"{household} ORDER BY run_at, seq LIMIT :limit",
        {"household": household_id, "limit": limit},
    ).fetchall()
    return [Job.from_row(row) for row in rows]


def waiting_summary(conn: Reads) -> tuple[int, float | None]:
    row = conn.execute(
        "SELECT count(*) AS waiting, min(run_at) AS soonest FROM jobs "
        "WHERE status = 'queued' AND waiting_signal IS NOT NULL"
    ).fetchone()
    if row["soonest"] is None:
        return int(row["waiting"]), None
    left = (from_text(row["soonest"]) - utc_now()).total_seconds()
    return int(row["waiting"]), max(0.0, left)
