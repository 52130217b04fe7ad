"""Retention: how long one prune batch holds SQLite's write lock, by batch size.

`python -m bench.retention [--rows N] [--sizes 50,200,1000] [--rounds R]`
builds a migrated database holding N finished jobs (1,000,000 by default, one
`INSERT ... SELECT`; their finish times spread over a year, as a table that
grew for a year would hold them), then, for each batch size in turn, runs R
transactions of the driver's own `delete_finished` exactly as a prune does:
`BEGIN IMMEDIATE`, one batch, `COMMIT`, on a connection opened with the
store's pragmas (WAL, `synchronous=NORMAL`, foreign keys on, so the
`recipes.job_id` foreign key is checked for every deleted row) and the
writer's `wal_autocheckpoint`.

The time from `BEGIN IMMEDIATE` returning to `COMMIT` returning is the time
the write lock is held: every other write of every process waits that long
at most behind a prune. It prints the median, 95th percentile and maximum
per batch size. Absolute times say something about this run's machine only;
compare the sizes with each other (see bench/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import fresh_database
from mealquest.db.sqlite.checkpoints import WAL_AUTOCHECKPOINT_PAGES
from mealquest.db.sqlite.connection import connect
from mealquest.db.sqlite.retention import delete_finished
from mealquest.db.sqlite.store import SqliteTransaction

SIZES = (50, 100, 200, 500, 1000, 5000)


def build(directory: Path, rows: int) -> str:
    """A migrated database holding `rows` succeeded jobs finished over the past year."""
    db, household = fresh_database(directory, "retention.sqlite3")
    conn = connect(db, synchronous="NORMAL", busy_timeout_ms=5000)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < ?1) "
        "INSERT INTO jobs (id, household_id, kind, payload, status, result, attempt, "
        "max_attempts, run_at, created_at, updated_at, started_at, finished_at) "
        "SELECT printf('%032x', x), ?2, 'noop', '{}', 'succeeded', '{}', 1, 1, t, t, t, t, t "
        "FROM (SELECT x, strftime('%Y-%m-%dT%H:%M:%f000Z', '2025-01-01', "
        "'+' || (x * 31536 / ?1) || ' seconds') AS t FROM n)",
        (rows, household),
    )
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return db


def hold_times(db: str, size: int, rounds: int) -> list[float]:
    """Seconds the write lock was held by each of `rounds` batches of `size`."""
    conn = connect(db, synchronous="NORMAL", busy_timeout_ms=5000)
    # As the store's writer connection: SQLite's own checkpoint (inside a
    # COMMIT, under the lock) only past this many WAL pages.
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
    tx = SqliteTransaction(conn)
    held = []
    try:
        for _ in range(rounds):
            conn.execute("BEGIN IMMEDIATE")
            started = time.perf_counter()
            deleted = delete_finished(tx, older_than_seconds=0.0, limit=size)
            conn.execute("COMMIT")
            held.append(time.perf_counter() - started)
            if deleted != size:
                raise RuntimeError(f"the table ran out of finished jobs at size {size}")
    finally:
        conn.close()
    return held


def run(rows: int, sizes: tuple[int, ...], rounds: int) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="mq-bench-retention-") as work:
        built = time.perf_counter()
        db = build(Path(work), rows)
        print(f"built {rows:,} finished jobs in {time.perf_counter() - built:.1f} s")
        results = []
        for size in sizes:
            held = sorted(hold_times(db, size, rounds))
            results.append(
                {
                    "batch": size,
                    "median_ms": statistics.median(held) * 1000,
                    "p95_ms": held[int(0.95 * (len(held) - 1))] * 1000,
                    "max_ms": held[-1] * 1000,
                    "us_per_row": statistics.median(held) / size * 1e6,
                }
            )
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    sizes = tuple(int(size) for size in args.sizes.split(","))
    results = run(args.rows, sizes, args.rounds)
    print("| batch | lock held, median | p95 | max | per row |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['batch']:,} | {r['median_ms']:.2f} ms | {r['p95_ms']:.2f} ms "
            f"| {r['max_ms']:.2f} ms | {r['us_per_row']:.1f} µs |"
        )


if __name__ == "__main__":
    main()
