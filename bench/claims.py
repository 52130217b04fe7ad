"""Claim rate with many finished jobs in the table, against an empty table.

The claim must stay an index lookup on queued jobs (the partial index
`jobs_claim`), so a table holding a million finished jobs claims as fast as
an empty one. Timed two ways on the same files: through the store (the
runner's real path, `Store.write(queries.claim, ClaimRequest(...))`, one job per claim) and
the statement alone on a plain connection, which no thread hop dilutes.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import fresh_database, store_pragmas
from bench.throughput import CLAIM, INSERT
from mealquest.clock import to_text
from mealquest.model.jobs import ClaimRequest

_FINISHED = "2024-01-01T00:00:00.000000Z"


def build_big_table(directory: Path, rows: int) -> str:
    """A migrated database holding `rows` succeeded jobs, built by one INSERT ... SELECT."""
    db, household = fresh_database(directory, "finished.sqlite3")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?1) "
        "INSERT INTO jobs (id, household_id, kind, payload, status, result, attempt, "
        "max_attempts, run_at, created_at, updated_at, started_at, finished_at) "
        "SELECT printf('%032x', x), ?2, 'noop', '{}', 'succeeded', '{}', 1, 1, "
        "?3, ?3, ?3, ?3, ?3 FROM n",
        (rows, household, _FINISHED),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return db


def _enqueue(db: str, household: int, n: int) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    now = to_text(datetime.now(UTC))
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        INSERT, ((uuid.uuid4().hex, household, "noop", "{}", 1, now, now, now) for _ in range(n))
    )
    conn.execute("COMMIT")
    conn.close()


def claim_rate_child(args: dict) -> dict:
    from mealquest.db.sqlite import jobs as queries
    from mealquest.db.sqlite.store import SqliteStore

    db, n = args["db"], args["claims"]
    _enqueue(db, args["household"], 2 * n)
    store = SqliteStore(db, synchronous=args["synchronous"])
    store.write(lambda tx: None)  # opens the writer connection and thread
    started = time.perf_counter()
    for _ in range(n):
        claimed = store.write(
            queries.claim, ClaimRequest(owner="bench", lease_seconds=30.0, limit=1, kinds=("noop",))
        )
        assert len(claimed) == 1
    through_store = time.perf_counter() - started
    store.close()

    conn = sqlite3.connect(db, isolation_level=None)
    store_pragmas(conn, args["synchronous"])
    started = time.perf_counter()
    for _ in range(n):
        moment = datetime.now(UTC)
        now, expires = to_text(moment), to_text(moment + timedelta(seconds=30))
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(CLAIM, ("bench", expires, now, now, now, 1)).fetchall()
        conn.execute("COMMIT")
        assert len(rows) == 1
    statement_alone = time.perf_counter() - started
    conn.close()
    return {"store_claims_per_s": n / through_store, "statement_claims_per_s": n / statement_alone}


CHILDREN = {"claim_rate": claim_rate_child}
