"""Worker RSS after draining many jobs, against its RSS after a few.

The worker is a real `flask jobs work` process of the bench app; this
process feeds it jobs in batches (plain inserts, one transaction per batch)
and reads its resident set size from /proc once it has drained them. Growth
between the two readings is what a long-lived worker would leak.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from bench.common import fresh_database, rss_bytes, wait_until
from bench.throughput import ACTIVE, INSERT, start_workers, stop_processes
from mealquest.clock import to_text

_BATCH = 5_000


def _feed(conn: sqlite3.Connection, household: int, n: int) -> None:
    while n > 0:
        batch = min(n, _BATCH)
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            INSERT,
            ((uuid.uuid4().hex, household, "noop", "{}", 1, now, now, now) for _ in range(batch)),
        )
        conn.execute("COMMIT")
        n -= batch
        # Keep the queue short, as a live worker's is.
        wait_until(lambda: not conn.execute(ACTIVE).fetchone()[0], timeout=600, what="drained")


def worker_rss(workdir: Path, small: int, large: int, workers: int) -> dict:
    db, household = fresh_database(workdir, "memory.sqlite3")
    log = workdir / "memory-worker.log"
    (process,) = start_workers(db, [log], JOB_WORKERS=workers)
    try:
        conn = sqlite3.connect(db, isolation_level=None)
        _feed(conn, household, small)
        time.sleep(0.5)
        after_small = rss_bytes(process.pid)
        _feed(conn, household, large - small)
        time.sleep(0.5)
        after_large = rss_bytes(process.pid)
        # Of the fed kind only: the app's periodic prune (minute 17 of each
        # hour) also runs in this worker when the run spans that minute.
        done = conn.execute(
            "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND kind = 'noop'"
        ).fetchone()[0]
        conn.close()
    finally:
        stop_processes([process])
    if done != large:
        raise RuntimeError(f"the worker finished {done} of {large} jobs")
    return {"rss_small_mb": after_small / 2**20, "rss_large_mb": after_large / 2**20}


CHILDREN: dict = {}
