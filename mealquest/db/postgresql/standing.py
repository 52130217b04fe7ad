"""The reads of a queued job's place in line on PostgreSQL (`mealquest.db.standing`
plays the claims over them). Each walks the claim's own indexes in the
claim's order (`OFFSET 0` fences as the claim has them), so it reads about
what the claims it plays would read. Times travel as the drivers' fixed-width
UTC text; a household never served (`-infinity`) reads as None, as SQLite's
NULL does."""

from __future__ import annotations

from typing import Any

from mealquest.clock import to_text
from mealquest.db.driver import Reads
from mealquest.db.standing import HouseholdRow

_NOW = "%(now)s::timestamptz"
_TIER_DUE = (
    "j.household_id = q.household_id AND j.status = 'queued' AND j.priority = %(priority)s "
    f"AND j.run_at <= {_NOW}"
)
_DUE_COUNTED = (
    f"(SELECT count(*) FROM (SELECT 1 FROM jobs AS j WHERE {_TIER_DUE} LIMIT %(most)s) AS d)"
)
_TURN_COLUMNS = (
    "q.household_id, nullif(q.served_at, '-infinity') AS served_at, q.served_jobs, "
    "q.head_run_at, q.head_seq"
)
_TIER = f"""
(SELECT {_TURN_COLUMNS}, 0::bigint AS running, {_DUE_COUNTED} AS due
 FROM household_queues AS q
 WHERE q.head_run_at <= {_NOW}
 AND NOT EXISTS (SELECT 1 FROM jobs AS r
                 WHERE r.household_id = q.household_id AND r.status = 'running')
 AND EXISTS (SELECT 1 FROM jobs AS j WHERE {_TIER_DUE} ORDER BY j.run_at, j.seq LIMIT 1 OFFSET 0)
 ORDER BY q.served_at, q.served_jobs, q.head_run_at, q.head_seq LIMIT %(idle)s)
UNION ALL
SELECT {_TURN_COLUMNS}, b.running, {_DUE_COUNTED} AS due
FROM (SELECT household_id, count(*) AS running FROM jobs
      WHERE status = 'running' GROUP BY household_id) AS b
JOIN household_queues AS q ON q.household_id = b.household_id
WHERE q.head_run_at <= {_NOW}
AND EXISTS (SELECT 1 FROM jobs AS j WHERE {_TIER_DUE} ORDER BY j.run_at, j.seq LIMIT 1 OFFSET 0)
"""


def _row(row: Any, *, counted: bool = True) -> HouseholdRow:
    served = row["served_at"]
    return HouseholdRow(
        int(row["household_id"]),
        int(row["running"]),
        None if served is None else to_text(served),
        int(row["served_jobs"]),
        to_text(row["head_run_at"]),
        int(row["head_seq"]),
        int(row["due"]) if counted else 0,
    )


def next_priority(conn: Reads, after: int | None, up_to: int, now: str, /) -> int | None:
    row = conn.execute(
        "SELECT priority FROM (SELECT priority, run_at FROM jobs WHERE status = 'queued' "
        "AND priority <= %(up_to)s AND (%(after)s::integer IS NULL OR priority > %(after)s) "
        f"ORDER BY priority, run_at, seq OFFSET 0) AS ordered WHERE run_at <= {_NOW} LIMIT 1",
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
        f"SELECT {_TURN_COLUMNS}, (SELECT count(*) FROM jobs WHERE household_id = q.household_id "
        "AND status = 'running') AS running FROM household_queues AS q "
        "WHERE q.household_id = %s",
        (household_id,),
    ).fetchone()
    return None if row is None else _row(row, counted=False)


def household_due(conn: Reads, household_id: int, now: str, most: int, /) -> list[tuple[str, int]]:
    # The household's queued jobs are at most its quota: read through its
    # queue index, then put in claim order.
    rows = conn.execute(
        "SELECT id, priority FROM jobs WHERE household_id = %s AND status = 'queued' "
        "AND run_at <= %s::timestamptz ORDER BY priority, run_at, seq LIMIT %s",
        (household_id, now, most),
    ).fetchall()
    return [(row["id"], int(row["priority"])) for row in rows]


def household_ahead(conn: Reads, job_id: str, now: str, most: int, /) -> int:
    # Its household's queued jobs up to the job's own due time: jobs due
    # later are never read.
    row = conn.execute(
        "SELECT count(*) AS ahead FROM (SELECT 1 FROM jobs AS t "
        "JOIN jobs AS j ON j.household_id = t.household_id "
        "WHERE t.id = %s AND t.status = 'queued' AND j.status = 'queued' "
        "AND j.run_at <= t.run_at AND j.run_at <= %s::timestamptz "
        "AND (j.priority, j.run_at, j.seq) < (t.priority, t.run_at, t.seq) LIMIT %s) AS ahead",
        (job_id, now, most),
    ).fetchone()
    return int(row["ahead"])


def due_count(conn: Reads, now: str, most: int, household_id: int | None, /) -> int:
    row = conn.execute(
        "SELECT count(*) AS due FROM (SELECT 1 FROM jobs WHERE status = 'queued' "
        "AND run_at <= %(now)s::timestamptz "
        "AND (%(household)s::bigint IS NULL OR household_id = %(household)s) "
        "LIMIT %(most)s) AS d",
        {"now": now, "household": household_id, "most": most},
    ).fetchone()
    return int(row["due"])


def kind_running(conn: Reads, kind: str, /) -> int:
    row = conn.execute(
        "SELECT count(*) AS running FROM jobs WHERE status = 'running' AND kind = %s", (kind,)
    ).fetchone()
    return int(row["running"])
