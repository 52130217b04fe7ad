"""The reads of a queued job's place in line on SQLite (`mealquest.db.standing`
plays the claims over them). Each walks the claim's own indexes in the
claim's order, so it reads about what the claims it plays would read."""

from __future__ import annotations

from typing import Any

from mealquest.db.driver import Reads
from mealquest.db.standing import HouseholdRow

_TIER_DUE = (
    "j.household_id = q.household_id AND j.status = 'queued' AND j.priority = :priority "
    "AND j.run_at <= :now"
)
_DUE_COUNTED = (
    "(SELECT count(*) FROM (SELECT 1 FROM jobs AS j INDEXED BY jobs_household_queued "
    f"WHERE {_TIER_DUE} LIMIT :most))"
)
# The households with due jobs of one priority, as the claim ranks them: the
# idle ones in its turn index's order, then every one with jobs running
# (INDEXED BY and `+` as the claim has them, for the same plan: the
# household's queued and running jobs through their partial indexes).
_TIER = f"""
SELECT * FROM (
    SELECT q.household_id, 0 AS running, q.served_at, q.served_jobs, q.head_run_at, q.head_seq,
           {_DUE_COUNTED} AS due
    FROM household_queues AS q INDEXED BY household_queues_turn
    WHERE +q.head_run_at <= :now
    AND NOT EXISTS (SELECT 1 FROM jobs AS r INDEXED BY jobs_running
                    WHERE r.household_id = q.household_id AND r.status = 'running')
    AND EXISTS (SELECT 1 FROM jobs AS j INDEXED BY jobs_household_queued WHERE {_TIER_DUE})
    ORDER BY q.served_at, q.served_jobs, q.head_run_at, q.head_seq LIMIT :idle
)
UNION ALL
SELECT q.household_id, b.running, q.served_at, q.served_jobs, q.head_run_at, q.head_seq,
       {_DUE_COUNTED} AS due
FROM (SELECT household_id, count(*) AS running FROM jobs INDEXED BY jobs_running
      WHERE status = 'running' GROUP BY household_id) AS b
JOIN household_queues AS q ON q.household_id = b.household_id
WHERE q.head_run_at <= :now
AND EXISTS (SELECT 1 FROM jobs AS j INDEXED BY jobs_household_queued WHERE {_TIER_DUE})
"""


def _row(row: Any, *, counted: bool = True) -> HouseholdRow:
    return HouseholdRow(
        int(row["household_id"]),
        int(row["running"]),
        row["served_at"],
        int(row["served_jobs"]),
        row["head_run_at"],
        int(row["head_seq"]),
        int(row["due"]) if counted else 0,
    )


def next_priority(conn: Reads, after: int | None, up_to: int, now: str, /) -> int | None:
    above = "" if after is None else "AND priority > :after "
    row = conn.execute(
        "SELECT priority FROM jobs INDEXED BY jobs_claim WHERE status = 'queued' "
        f"AND priority <= :up_to {above}AND run_at <= :now ORDER BY priority LIMIT 1",
        {"after": after, "up_to": up_to, "now": now},
    ).fetchone()
    return None if row is None else int(row["priority"])


def tier(conn: Reads, priority: int, now: str, idle: int, most: int, /) -> list[HouseholdRow]:
    rows = conn.execute(
        _TIER, {"priority": priority, "now": now, "idle": idle, "most": most}
    ).fetchall()
    return [_row(row) for row in rows]


def household(conn: Reads, household_id: int, /) -> HouseholdRow | None:
    row = conn.execute(
        "SELECT q.household_id, (SELECT count(*) FROM jobs INDEXED BY jobs_running "
        "WHERE household_id = q.household_id AND status = 'running') AS running, "
        "q.served_at, q.served_jobs, q.head_run_at, q.head_seq "
        "FROM household_queues AS q WHERE q.household_id = ?",
        (household_id,),
    ).fetchone()
    return None if row is None else _row(row, counted=False)


def household_due(conn: Reads, household_id: int, now: str, most: int, /) -> list[tuple[str, int]]:
    # The household's queued jobs are at most its quota: read through its
    # queue index, then put in claim order.
    rows = conn.execute(
        "SELECT id, priority FROM jobs INDEXED BY jobs_household_queued "
        "WHERE household_id = ? AND status = 'queued' AND run_at <= ? "
        "ORDER BY priority, run_at, seq LIMIT ?",
        (household_id, now, most),
    ).fetchall()
    return [(row["id"], int(row["priority"])) for row in rows]


def household_ahead(conn: Reads, job_id: str, now: str, most: int, /) -> int:
    # The job first (CROSS JOIN keeps that order), then its household's queue
    # index up to the job's own due time: jobs due later are never read.
    row = conn.execute(
        "SELECT count(*) AS ahead FROM (SELECT 1 FROM jobs AS t "
        "CROSS JOIN jobs AS j INDEXED BY jobs_household_queued "
        "WHERE t.id = ? AND t.status = 'queued' AND j.household_id = t.household_id "
        "AND j.status = 'queued' AND j.run_at <= t.run_at AND j.run_at <= ? "
        "AND (j.priority, j.run_at, j.seq) < (t.priority, t.run_at, t.seq) LIMIT ?)",
        (job_id, now, most),
    ).fetchone()
    return int(row["ahead"])


def due_count(conn: Reads, now: str, most: int, household_id: int | None, /) -> int:
    if household_id is None:
        sql = "SELECT 1 FROM jobs INDEXED BY jobs_claim WHERE status = 'queued' AND run_at <= ?"
        params: tuple[object, ...] = (now, most)
    else:
        sql = (
            "SELECT 1 FROM jobs INDEXED BY jobs_household_queued "
            "WHERE household_id = ? AND status = 'queued' AND run_at <= ?"
        )
        params = (household_id, now, most)
    row = conn.execute(f"SELECT count(*) AS due FROM ({sql} LIMIT ?)", params).fetchone()
    return int(row["due"])


def kind_running(conn: Reads, kind: str, /) -> int:
    row = conn.execute(
        "SELECT count(*) AS running FROM jobs INDEXED BY jobs_running "
        "WHERE status = 'running' AND kind = ?",
        (kind,),
    ).fetchone()
    return int(row["running"])
