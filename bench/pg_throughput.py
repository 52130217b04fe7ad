"""Runner throughput on PostgreSQL: against a raw psycopg loop, against procrastinate
and pgqueuer, and two worker processes against one.

Each run drains `n` no-op jobs enqueued ahead, in a database of its own on
one server. Our runner and the raw loop do the same work per job: an insert,
a claim (`FOR UPDATE SKIP LOCKED`) and a completion that stores an empty
result. Times: enqueue (n single-job transactions) and drain (from the start
of the workers until no job is queued or running).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench import pg
from bench.common import wait_until
from bench.throughput import start_workers, stop_processes

# The driver's statements (the PostgreSQL job queries), with a claim of LIMIT 1.
_COLUMNS = (
    "jobs.id, jobs.seq, jobs.household_id, jobs.kind, jobs.payload, jobs.status, jobs.result, "
    "jobs.error, jobs.attempt, jobs.max_attempts, jobs.run_at, jobs.lease_owner, "
    "jobs.lease_expires_at, jobs.created_at, jobs.updated_at, jobs.started_at, "
    "jobs.finished_at, jobs.on_interrupt, jobs.interruptions"
)
INSERT = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "run_at, created_at, updated_at) "
    "VALUES (%s, %s, 'noop', '{}', 'queued', 1, 'fail', now(), now(), now())"
)
CLAIM = (
    "WITH next AS (SELECT seq FROM jobs WHERE status = 'queued' AND run_at <= now() "
    "AND kind = ANY(%(kinds)s::text[]) ORDER BY priority, run_at, seq "
    "LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = %(owner)s, "
    "lease_expires_at = now() + make_interval(secs => 60.0), started_at = now(), "
    f"updated_at = now() FROM next WHERE jobs.seq = next.seq RETURNING {_COLUMNS}"
)
SUCCEED = (
    "UPDATE jobs SET status = 'succeeded', result = '{}', finished_at = now(), "
    "interruptions = 0, lease_owner = NULL, lease_expires_at = NULL, updated_at = now() "
    "WHERE id = %s AND status = 'running' AND lease_owner = %s AND attempt = %s"
)
ACTIVE = (
    "SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued') "
    "OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running') AS active"
)
# N jobs committed at once, with the wake-up an enqueue sends listening
# workers: posted in turns by the households named (job i by the i-th, round).
BULK_INSERT = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, on_interrupt, "
    "run_at, created_at, updated_at) "
    "SELECT replace(gen_random_uuid()::text, '-', ''), "
    "(%(households)s::bigint[])[1 + i %% cardinality(%(households)s::bigint[])], "
    "'noop', '{}', 'queued', 1, 'fail', now(), now(), now() "
    "FROM generate_series(0, %(n)s - 1) AS g(i)"
)
NOTIFY = "NOTIFY mealquest_jobs"


def raw_child(args: dict) -> dict:
    """The baseline: one psycopg connection, one transaction per insert, claim, completion."""
    import psycopg

    conn = psycopg.connect(args["url"], autocommit=True)
    household, n = args["household"], args["jobs"]
    cpu = pg.DrainCpu(args["url"])
    mark = pg.wal_mark(args["url"])
    started = time.perf_counter()
    for _ in range(n):
        conn.execute("BEGIN")
        conn.execute(INSERT, (uuid.uuid4().hex, household))
        conn.execute("COMMIT")
    enqueued = time.perf_counter()
    cpu.start()
    owner = secrets.token_hex(16)
    claim = {"kinds": ["noop"], "owner": owner}
    while True:
        conn.execute("BEGIN")
        row = conn.execute(CLAIM, claim).fetchone()
        conn.execute("COMMIT")
        if row is None:
            break
        conn.execute("BEGIN")
        conn.execute(SUCCEED, (row[0], owner, row[8]))
        conn.execute("COMMIT")
    drained = time.perf_counter()
    cpu.stop()
    conn.close()
    return {
        "enqueue_seconds": enqueued - started,
        "drain_seconds": drained - enqueued,
        **cpu.figures(),
        "written": pg.written_since(args["url"], mark, n),
    }


def _active(conn: Any) -> bool:
    return bool(conn.execute(ACTIVE).fetchone()["active"])


def runner_child(args: dict) -> dict:
    """Our runner on PostgreSQL: `JobService.enqueue` one job at a time, then one
    process's pool drains."""
    import gevent

    from bench.app import counter, create_bench_app
    from mealquest.extensions import get_store
    from mealquest.jobs.service import get_jobs
    from mealquest.serving import collector

    app = create_bench_app({"DATABASE_URL": args["url"], "JOB_WORKERS": args["workers"]})
    jobs, store = get_jobs(app), get_store(app)
    # As the service's worker processes are set once started.
    collector.settle()
    household, n = args["household"], args["jobs"]
    counter.expect(n)
    cpu = pg.DrainCpu(args["url"])
    mark = pg.wal_mark(args["url"])
    started = time.perf_counter()
    for _ in range(n):
        jobs.enqueue("noop", {}, household_id=household)
    enqueued = time.perf_counter()
    cpu.start()
    pool = jobs.start_pool()
    counter.done.wait()
    while store.read(_active):
        gevent.sleep(0.001)
    drained = time.perf_counter()
    cpu.stop()
    pool.stop(5)
    try:
        store.close()
    except RuntimeError:
        # The store's listener was being started by the producer greenlet when
        # the stop killed it, and a thread never started cannot be joined. The
        # figure is measured by then; the log keeps the trace for the store's owner.
        logging.getLogger(__name__).exception("closing the PostgreSQL store failed")
    written = pg.written_since(args["url"], mark, n)
    return {
        "enqueue_seconds": enqueued - started,
        "drain_seconds": drained - enqueued,
        **cpu.figures(),
        "written": written,
    }


def procrastinate_child(args: dict) -> dict:
    """The peer: procrastinate's asyncio worker (`concurrency` = our workers) on an
    empty database of the same server, its schema applied, a no-op task.

    Runs in a process of its own event loop, not patched by gevent: that is
    how procrastinate's worker is meant to run.
    """
    import procrastinate

    # Procrastinate's worker logs each job's end at INFO, as our runner does.
    proc_logger = logging.getLogger("procrastinate")
    proc_logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    proc_logger.addHandler(handler)

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args["url"]))
    done = {"count": 0}

    @app.task(name="noop")
    async def noop() -> dict:
        done["count"] += 1
        return {}

    n = args["jobs"]

    async def run() -> dict:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            cpu = pg.DrainCpu(args["url"])
            mark = pg.wal_mark(args["url"])
            started = time.perf_counter()
            for _ in range(n):
                await noop.defer_async()
            enqueued = time.perf_counter()
            cpu.start()
            # wait=False: the worker returns once it finds the queue empty.
            await app.run_worker_async(
                concurrency=args["workers"], wait=False, install_signal_handlers=False
            )
            drained = time.perf_counter()
            cpu.stop()
            written = pg.written_since(args["url"], mark, n)
            rows = await app.connector.execute_query_all_async(
                "SELECT status, count(*) AS jobs FROM procrastinate_jobs GROUP BY status"
            )
        by_status = {row["status"]: row["jobs"] for row in rows}
        if by_status != {"succeeded": n} or done["count"] != n:
            raise RuntimeError(f"procrastinate drained {done['count']} of {n}: {by_status}")
        return {
            "enqueue_seconds": enqueued - started,
            "drain_seconds": drained - enqueued,
            **cpu.figures(),
            "written": written,
        }

    return asyncio.run(run())


# awa's jobs not yet completed, through its own view of every job.
_AWA_UNFINISHED = "SELECT count(*) FROM awa.jobs WHERE state <> 'completed'"


def awa_schema_child(args: dict) -> dict:
    """awa's schema made on the empty database at `url` by its client's own
    migration, once a bench run (the measured runs get clones of it)."""
    from awa import AsyncClient

    async def run() -> None:
        await AsyncClient(args["url"]).migrate()

    asyncio.run(run())
    return {}


def awa_child(args: dict) -> dict:
    """The peer: awa (a Rust engine, its Python SDK `awa-pg`), its async
    workers (`workers` on one queue) on a database of the same server holding
    its schema (migrated by its client: finding it up to date here), a no-op
    task; jobs inserted one at a time, as ours are."""
    from dataclasses import dataclass

    import asyncpg
    from awa import AsyncClient

    @dataclass
    class Noop:
        n: int = 0

    n = args["jobs"]

    async def run() -> dict:
        client = AsyncClient(args["url"])
        await client.migrate()
        done, count = asyncio.Event(), {"jobs": 0}

        @client.task(Noop, queue="bench")
        async def noop(job: object) -> None:
            count["jobs"] += 1
            if count["jobs"] >= n:
                done.set()

        cpu = pg.DrainCpu(args["url"])
        mark = pg.wal_mark(args["url"])
        started = time.perf_counter()
        for _ in range(n):
            await client.insert(Noop(), queue="bench")
        enqueued = time.perf_counter()
        cpu.start()
        await client.start([("bench", args["workers"])])
        await asyncio.wait_for(done.wait(), timeout=600)
        # Drained at its last outcome committed, as seen from another
        # connection, where ours is timed: the last handler call comes first.
        watching = await asyncpg.connect(args["url"])
        while await watching.fetchval(_AWA_UNFINISHED):
            await asyncio.sleep(0.001)
        drained = time.perf_counter()
        cpu.stop()
        await watching.close()
        await client.shutdown()
        written = pg.written_since(args["url"], mark, n)
        if count["jobs"] != n:
            raise RuntimeError(f"awa ran {count['jobs']} of {n}")
        return {
            "enqueue_seconds": enqueued - started,
            "drain_seconds": drained - enqueued,
            **cpu.figures(),
            "written": written,
        }

    return asyncio.run(run())


def pgqueuer_child(args: dict) -> dict:
    """The other peer: pgqueuer's asyncio `QueueManager` in drain mode (it returns once
    the queue is empty and its tasks are done) on an empty database of the same
    server, its schema made as its `pgq install` makes it (`Queries.install`, in
    this process: the command's own start costs seconds), a no-op async entrypoint,
    `batch` jobs per dequeue (and per batch of logged outcomes; None: pgqueuer's
    default, whatever its `run` says it is).

    Unpatched, in an event loop of its own, as its worker runs, on asyncpg: its
    documented driver, the one its own benchmark runs on. (On one psycopg
    connection it is throttled: psycopg 3.2+ holds the connection's lock for
    the whole `notifies()` generator its driver reads on that connection, so
    each dequeue waits behind it; measured, about a third of its speed here.)
    """
    import inspect

    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    # pgqueuer's logger, at INFO to the log file as ours is (it logs no line per job).
    peer_logger = logging.getLogger("pgqueuer")
    peer_logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    peer_logger.addHandler(handler)

    url, n = args["url"], args["jobs"]
    batch = args["batch"] or inspect.signature(QueueManager.run).parameters["batch_size"].default
    done = {"count": 0}

    async def run() -> dict:
        connection = await asyncpg.connect(url)
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        watching = await asyncpg.connect(url)
        watcher = Queries(AsyncpgDriver(watching))
        cpu = pg.DrainCpu(args["url"])
        mark = pg.wal_mark(args["url"])
        started = time.perf_counter()
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        enqueued = time.perf_counter()
        cpu.start()
        manager = QueueManager(queries)

        @manager.entrypoint("noop")
        async def noop(job: Job) -> None:
            done["count"] += 1

        # Drained when no job is queued or picked, as ours is timed (until no job
        # is queued or running): its `run` returns some seconds later, once its
        # background tasks have stopped, and that tail is not draining.
        worker = asyncio.create_task(manager.run(batch_size=batch, mode=QueueExecutionMode.drain))
        while not worker.done() and (
            done["count"] < n or sum(size.count for size in await watcher.queue_size())
        ):
            await asyncio.sleep(0.001)
        drained = time.perf_counter()
        cpu.stop()
        manager.shutdown.set()
        await worker
        left = sum(size.count for size in await watcher.queue_size())
        await watching.close()
        await connection.close()
        written = pg.written_since(args["url"], mark, n)
        if left or done["count"] != n:
            raise RuntimeError(f"pgqueuer drained {done['count']} of {n}, {left} left queued")
        return {
            "enqueue_seconds": enqueued - started,
            "drain_seconds": drained - enqueued,
            **cpu.figures(),
            "batch": batch,
            "written": written,
        }

    return asyncio.run(run())


CHILDREN = {
    "pg_raw": raw_child,
    "pg_runner": runner_child,
    "pg_awa": awa_child,
    "pg_awa_schema": awa_schema_child,
    "pg_procrastinate": procrastinate_child,
    "pg_pgqueuer": pgqueuer_child,
}


def drain_by_processes(
    url: str, household: int, workdir: Path, count: int, n: int, workers: int, households: int
) -> float:
    """Seconds for `count` `flask jobs work` processes to drain `n` jobs committed
    at once, posted by `households` households in turns (`household` and others
    made for the run)."""
    import psycopg
    from psycopg.rows import dict_row

    logs = [workdir / f"pg-procs{count}-{i}.log" for i in range(count)]
    processes = start_workers(None, logs, DATABASE_URL=url, JOB_WORKERS=workers)
    try:
        with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
            others = conn.execute(
                "INSERT INTO households (name) SELECT 'bench ' || g "
                "FROM generate_series(2, %s) AS g RETURNING id",
                (households,),
            ).fetchall()
            posting = [household, *(row["id"] for row in others)]
            with conn.transaction():
                conn.execute(BULK_INSERT, {"households": posting, "n": n})
                conn.execute(NOTIFY)
            started = time.perf_counter()
            wait_until(lambda: not _active(conn), timeout=600, interval=0.002, what="drained")
            drained = time.perf_counter()
    finally:
        stop_processes(processes)
    return drained - started
