"""What a queue table of its own would buy on PostgreSQL, measured on the layout alone.

`python -m bench.queue_table [--jobs N] [--rounds R]`

SPEC 13.2 proposes that a queued or running job's claim state live in a
narrow table with only the indexes the claim needs, and that the `jobs`
row (the record households and operators read) be written at the enqueue
and at the end only. Before building that through every driver statement,
this measures what the layout itself buys, with raw statements on one
connection and none of the service's triggers, fairness or bookkeeping, on
three copies of the migrated `jobs` table (its columns and constraints):

* `today`: every index the migrated `jobs` has; the claim and the end each
  update the row;
* `queue`: `jobs` keeps only its full indexes and those of finished jobs;
  a narrow `job_queue` row (due time, priority, household, kind, lease)
  with the four partial indexes the claim and the rescue read is inserted
  beside it, the claim updates only that row, the end deletes it and
  updates the `jobs` row once;
* `queue_and_row`: the same two tables, but the claim also writes the
  `jobs` row's status (the form in which every reader keeps reading `jobs`).

For each, N jobs are enqueued one a transaction, then drained 32 at a time
(a claim transaction, then an end transaction). Per job: WAL bytes and the
server's CPU of the enqueues and of the drain, and the drain's wall time;
rounds interleaved, medians with their spread. Absolute figures say
something about this run only; compare the layouts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

from bench import pg
from bench.common import median

LAYOUTS = ("today", "queue", "queue_and_row")
BATCH = 32
LEASE = "interval '60 seconds'"

_QUEUE_TABLE = """
CREATE TABLE job_queue (
    seq bigint PRIMARY KEY,
    household_id bigint NOT NULL,
    kind text NOT NULL,
    priority smallint NOT NULL,
    run_at timestamptz NOT NULL,
    status text NOT NULL DEFAULT 'queued',
    attempt integer NOT NULL DEFAULT 0,
    lease_owner text,
    lease_expires_at timestamptz
);
CREATE INDEX job_queue_claim ON job_queue (priority, run_at, seq) WHERE status = 'queued';
CREATE INDEX job_queue_household ON job_queue (household_id, run_at, seq) WHERE status = 'queued';
CREATE INDEX job_queue_running ON job_queue (household_id, kind) WHERE status = 'running';
CREATE INDEX job_queue_lease ON job_queue (lease_expires_at) WHERE status = 'running'
"""

_INSERT_JOB = (
    "INSERT INTO {table} (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "run_at, created_at, updated_at) VALUES (%s, %s, 'noop', '{{}}', 'queued', 3, 'requeue', "
    "now(), now(), now()) RETURNING seq"
)
_INSERT_QUEUED = (
    "INSERT INTO job_queue (seq, household_id, kind, priority, run_at) "
    "VALUES (%s, %s, 'noop', 0, now())"
)
_DUE = (
    "SELECT seq FROM {table} WHERE status = 'queued' AND run_at <= now() "
    f"ORDER BY priority, run_at, seq LIMIT {BATCH} FOR UPDATE SKIP LOCKED"
)
_START_ROW = (
    "UPDATE {table} SET status = 'running', started_at = now(), attempt = attempt + 1, "
    f"lease_owner = 'probe', lease_expires_at = now() + {LEASE}, updated_at = now(), "
    "version = version + 1 WHERE {which} RETURNING *"
)
_START_QUEUED = (
    "UPDATE job_queue SET status = 'running', attempt = attempt + 1, lease_owner = 'probe', "
    f"lease_expires_at = now() + {LEASE} WHERE seq IN ({_DUE.format(table='job_queue')}) "
    "RETURNING seq"
)
_END_ROW = (
    "UPDATE {table} SET status = 'succeeded', result = 'null', {started}finished_at = now(), "
    "updated_at = now(), lease_owner = NULL, lease_expires_at = NULL, version = version + 1 "
    "WHERE seq = ANY(%s)"
)


def _make_tables(conn: psycopg.Connection) -> None:
    """A copy of `jobs` per layout, with the indexes it keeps, and the queue table."""
    indexes = [
        row[0] for row in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'jobs'")
    ]
    for layout in LAYOUTS:
        conn.execute(
            f"CREATE TABLE jobs_{layout} (LIKE jobs INCLUDING DEFAULTS INCLUDING IDENTITY "
            "INCLUDING CONSTRAINTS)"
        )
        for definition in indexes:
            claim_state = " WHERE " in definition and (
                "'queued'" in definition or "'running'" in definition
            )
            if layout != "today" and claim_state:
                continue  # in the queue table
            conn.execute(
                definition.replace(" ON public.jobs ", f" ON public.jobs_{layout} ").replace(
                    "INDEX jobs_", f"INDEX {layout}_"
                )
            )
    for statement in _QUEUE_TABLE.split(";"):
        conn.execute(statement)


def _enqueue(conn: psycopg.Connection, layout: str, household: int, jobs: int) -> None:
    table = f"jobs_{layout}"
    for _ in range(jobs):
        with conn.transaction():
            seq = conn.execute(
                _INSERT_JOB.format(table=table), (uuid.uuid4().hex, household)
            ).fetchone()[0]
            if layout != "today":
                conn.execute(_INSERT_QUEUED, (seq, household))


def _claim(conn: psycopg.Connection, layout: str) -> list[int]:
    table = f"jobs_{layout}"
    if layout == "today":
        which = f"seq IN ({_DUE.format(table=table)})"
        rows = conn.execute(_START_ROW.format(table=table, which=which)).fetchall()
        return [row[0] for row in rows]
    seqs = [row[0] for row in conn.execute(_START_QUEUED).fetchall()]
    if not seqs:
        return []
    if layout == "queue_and_row":
        conn.execute(_START_ROW.format(table=table, which="seq = ANY(%s)"), (seqs,)).fetchall()
    else:
        conn.execute(f"SELECT * FROM {table} WHERE seq = ANY(%s)", (seqs,)).fetchall()
    return seqs


def _end(conn: psycopg.Connection, layout: str, seqs: list[int]) -> None:
    table = f"jobs_{layout}"
    if layout != "today":
        conn.execute("DELETE FROM job_queue WHERE seq = ANY(%s)", (seqs,))
    # The queue layout's row learns of its start only now (the claim wrote the queue row).
    started = "started_at = now(), attempt = attempt + 1, " if layout == "queue" else ""
    conn.execute(_END_ROW.format(table=table, started=started), (seqs,))


def _drain(conn: psycopg.Connection, layout: str) -> int:
    done = 0
    while True:
        with conn.transaction():
            seqs = _claim(conn, layout)
        if not seqs:
            return done
        with conn.transaction():
            _end(conn, layout, seqs)
        done += len(seqs)


def _measured(url: str, jobs: int, step: Callable[[], object]) -> dict[str, float]:
    cpu = pg.DrainCpu(url)
    mark = pg.wal_mark(url)
    cpu.start()
    started = time.perf_counter()
    step()
    wall = time.perf_counter() - started
    cpu.stop()
    written = pg.written_since(url, mark, jobs)
    server = cpu.server
    return {
        "wal": written["wal_bytes"],
        "server_us": float("nan") if server is None else 1e6 * server / jobs,
        "wall_us": 1e6 * wall / jobs,
    }


def _round(url: str, layout: str, household: int, jobs: int) -> dict[str, dict[str, float]]:
    # One connection for the round, open while the server's CPU is read: a
    # backend that has exited is counted only once the postmaster reaps it.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE jobs_{layout}, job_queue")
        enqueue = _measured(url, jobs, lambda: _enqueue(conn, layout, household, jobs))
        conn.execute(f"ANALYZE jobs_{layout}, job_queue")
        drain = _measured(url, jobs, lambda: _drain(conn, layout))
    return {"enqueue": enqueue, "drain": drain}


def _spread(values: list[float], digits: int = 0) -> str:
    return f"{median(values):,.{digits}f} ({min(values):,.{digits}f} to {max(values):,.{digits}f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, dict[str, float]]]] = {layout: [] for layout in LAYOUTS}
    with (
        tempfile.TemporaryDirectory() as workdir,
        pg.server(Path(workdir)) as server,
        pg.databases(server) as dbs,
        dbs.new(migrated=True) as (url, household),
    ):
        with psycopg.connect(url, autocommit=True) as conn:
            _make_tables(conn)
        for _ in range(args.rounds):
            for layout in LAYOUTS:
                runs[layout].append(_round(url, layout, household, args.jobs))
    print(f"{args.jobs:,} jobs a round, {args.rounds} rounds, medians (range), per job\n")
    print(
        "| layout | enqueue WAL bytes | enqueue server CPU µs | drain WAL bytes "
        "| drain server CPU µs | drain wall µs | WAL bytes in all |"
    )
    print("|---|---|---|---|---|---|---|")
    for layout, rounds in runs.items():
        enqueue = [found["enqueue"] for found in rounds]
        drain = [found["drain"] for found in rounds]
        print(
            f"| {layout} | {_spread([e['wal'] for e in enqueue])} "
            f"| {_spread([e['server_us'] for e in enqueue])} "
            f"| {_spread([d['wal'] for d in drain])} "
            f"| {_spread([d['server_us'] for d in drain])} "
            f"| {_spread([d['wall_us'] for d in drain])} "
            f"| {_spread([e['wal'] + d['wal'] for e, d in zip(enqueue, drain, strict=True)])} |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
