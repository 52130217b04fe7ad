"""Runner throughput against a raw SQLite loop and against huey, and two processes on one file.

Each run drains `n` no-op jobs enqueued ahead. The runner and its baselines do
the same work per job: an enqueue transaction, a claim, and a completion that
stores an empty result. Times: enqueue (n single-job transactions), drain
(from the start of the workers until no job is queued or running).
"""

from __future__ import annotations

import logging
import os
import secrets
import sqlite3
import subprocess
import sys
import time
import uuid
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench.common import REPO, fresh_database, store_pragmas, wait_until
from mealquest.clock import to_text

# The store's statements, copied from mealquest/jobs/queries.py (claim with LIMIT 1).
INSERT = (
    "INSERT INTO jobs (id, household_id, kind, payload, status, max_attempts, run_at, "
    "created_at, updated_at) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)"
)
CLAIM = (
    "UPDATE jobs SET status = 'running', attempt = attempt + 1, lease_owner = ?, "
    "lease_expires_at = ?, started_at = ?, updated_at = ? "
    "WHERE seq IN (SELECT seq FROM jobs WHERE status = 'queued' AND run_at <= ? "
    "ORDER BY priority, run_at, seq LIMIT ?) "
    "RETURNING id, seq, household_id, kind, payload, status, result, error, attempt, "
    "max_attempts, run_at, lease_owner, lease_expires_at, created_at, updated_at, "
    "started_at, finished_at"
)
SUCCEED = (
    "UPDATE jobs SET status = 'succeeded', result = ?, lease_owner = NULL, "
    "lease_expires_at = NULL, updated_at = ?, finished_at = ? "
    "WHERE id = ? AND status = 'running' AND lease_owner = ? AND attempt = ?"
)
ACTIVE = (
    "SELECT EXISTS (SELECT 1 FROM jobs WHERE status = 'queued') "
    "OR EXISTS (SELECT 1 FROM jobs WHERE status = 'running')"
)


def raw_child(args: dict) -> dict:
    """The baseline: plain sqlite3, our pragmas, one transaction per enqueue, claim, completion."""
    conn = sqlite3.connect(args["db"], isolation_level=None)
    store_pragmas(conn, args["synchronous"])
    conn.execute("PRAGMA busy_timeout = 5000")
    household, n = args["household"], args["jobs"]
    started, enqueue_cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(INSERT, (uuid.uuid4().hex, household, "noop", "{}", 1, now, now, now))
        conn.execute("COMMIT")
    enqueued = time.perf_counter()
    enqueue_cpu = time.process_time() - enqueue_cpu
    cpu = time.process_time()
    owner = secrets.token_hex(16)
    while True:
        moment = datetime.now(UTC)
        now, expires = to_text(moment), to_text(moment + timedelta(seconds=30))
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(CLAIM, (owner, expires, now, now, now, 1)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            break
        job_id, attempt = rows[0][0], rows[0][8]
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(SUCCEED, ("{}", now, now, job_id, owner, attempt))
        conn.execute("COMMIT")
    drained = time.perf_counter()
    cpu = time.process_time() - cpu
    conn.close()
    return {
        "enqueue_seconds": enqueued - started,
        "enqueue_cpu_seconds": enqueue_cpu,
        "drain_seconds": drained - enqueued,
        "drain_cpu_seconds": cpu,
    }


# The physical limit on this machine: a queue table as small as a queue can
# be (8 columns, one index), one transaction per statement, no framework.
MINIMAL_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS queue (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
    "payload TEXT NOT NULL, status TEXT NOT NULL, result TEXT, owner TEXT, "
    "created_at TEXT NOT NULL, updated_at TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS queue_status ON queue (status, created_at)",
)
MINIMAL_INSERT = (
    "INSERT INTO queue (kind, payload, status, created_at, updated_at) "
    "VALUES ('noop', '{}', 'queued', ?, ?)"
)
MINIMAL_CLAIM = (
    "UPDATE queue SET status = 'running', owner = ?, updated_at = ? WHERE id = "
    "(SELECT id FROM queue WHERE status = 'queued' ORDER BY created_at LIMIT 1) "
    "RETURNING id, kind, payload"
)
MINIMAL_SUCCEED = (
    "UPDATE queue SET status = 'succeeded', result = ?, updated_at = ? WHERE id = ? AND owner = ?"
)


def minimal_child(args: dict) -> dict:
    """The floor: the raw loop on a minimal queue table, our pragmas."""
    conn = sqlite3.connect(args["db"], isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    store_pragmas(conn, args["synchronous"])
    for statement in MINIMAL_SCHEMA:
        conn.execute(statement)
    n = args["jobs"]
    started, enqueue_cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(MINIMAL_INSERT, (now, now))
        conn.execute("COMMIT")
    enqueued = time.perf_counter()
    enqueue_cpu = time.process_time() - enqueue_cpu
    cpu = time.process_time()
    owner = secrets.token_hex(16)
    while True:
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(MINIMAL_CLAIM, (owner, now)).fetchone()
        conn.execute("COMMIT")
        if row is None:
            break
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(MINIMAL_SUCCEED, ("{}", now, row[0], owner))
        conn.execute("COMMIT")
    drained = time.perf_counter()
    cpu = time.process_time() - cpu
    conn.close()
    return {
        "enqueue_seconds": enqueued - started,
        "enqueue_cpu_seconds": enqueue_cpu,
        "drain_seconds": drained - enqueued,
        "drain_cpu_seconds": cpu,
    }


def thread_cpu_seconds() -> dict[int, float]:
    """CPU seconds each thread of this process has run, by thread id (Linux's
    scheduler statistics: nanoseconds, where `stat`'s ticks are 10 ms)."""
    used: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        with suppress(FileNotFoundError):  # a thread that ended meanwhile
            on_cpu = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]
            used[int(tid)] = int(on_cpu) / 1e9
    if os.getpid() not in used:
        raise RuntimeError("this kernel gives no scheduler statistics for the main thread")
    return used


def runner_child(args: dict) -> dict:
    """Our runner: `JobService.enqueue` one job at a time, then one process's pool drains.

    Also the CPU each thread used during the drain: the main thread runs the
    hub (every greenlet), the others are the store's writer (and gevent's
    idle monitor)."""
    import gevent

    from bench.app import counter, create_bench_app
    from mealquest.extensions import get_store
    from mealquest.jobs.service import get_jobs
    from mealquest.serving import collector

    traced = bool(args.get("traced"))
    if traced:
        _trace_in_memory()
    app = create_bench_app(
        {
            "DATABASE": args["db"],
            "DB_SYNCHRONOUS": args["synchronous"],
            "JOB_WORKERS": args["workers"],
            "TRACING": traced,
        }
    )
    jobs, store = get_jobs(app), get_store(app)
    # As the service's worker processes are set once started.
    collector.settle()
    household, n = args["household"], args["jobs"]
    counter.expect(n)
    started, enqueue_cpu = time.perf_counter(), time.process_time()
    if traced:
        # Each enqueue under a span of its own, as a traced request's is.
        from opentelemetry import trace

        tracer = trace.get_tracer("bench")
        for _ in range(n):
            with tracer.start_as_current_span("POST /api/v1/jobs"):
                jobs.enqueue("noop", {}, household_id=household)
    elif args.get("batches"):
        # Batches of nine members and a callback that waits for them: the
        # same n jobs, a tenth of them unblocked by the unblocker.
        from mealquest.jobs.enqueueing import JobRequest

        member = JobRequest("noop", {}, household)
        for _ in range(n // 10):
            jobs.enqueue_batch([member] * 9, on_complete=member)
        for _ in range(n % 10):
            jobs.enqueue("noop", {}, household_id=household)
    else:
        for _ in range(n):
            jobs.enqueue("noop", {}, household_id=household)
    enqueued = time.perf_counter()
    enqueue_cpu = time.process_time() - enqueue_cpu
    before = thread_cpu_seconds()
    pool = jobs.start_pool()
    counter.done.wait()
    while store.read(lambda conn: conn.execute(ACTIVE).fetchone()[0]):
        gevent.sleep(0.001)
    drained = time.perf_counter()
    after = thread_cpu_seconds()
    pool.stop(5)
    store.close()
    used = {tid: seconds - before.get(tid, 0.0) for tid, seconds in after.items()}
    hub = used.pop(os.getpid(), 0.0)
    return {
        "enqueue_seconds": enqueued - started,
        "enqueue_cpu_seconds": enqueue_cpu,
        "drain_seconds": drained - enqueued,
        "hub_cpu_seconds": hub,
        "other_threads_cpu_seconds": sum(used.values()),
        "drain_cpu_seconds": hub + sum(used.values()),
    }


def _trace_in_memory() -> None:
    """The SDK as deployed (a batch span processor and its export thread),
    its exporter keeping the spans in memory: what tracing costs the
    process, not a collector's network."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from mealquest import tracing

    os.environ["OTEL_TRACES_EXPORTER"] = "none"
    tracing.install_provider().add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))


def huey_child(args: dict) -> dict:
    """The peer: huey's SqliteHuey, greenlet workers, at our `synchronous` setting."""
    from huey import SqliteHuey
    from huey.storage import SqliteStorage

    from bench.app import counter

    synchronous = args["synchronous"]

    class Storage(SqliteStorage):
        def _create_connection(self):
            conn = super()._create_connection()
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            return conn

    # Huey's consumer logs at INFO, as ours does; both go to the same kind of file.
    huey_logger = logging.getLogger("huey")
    huey_logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
    huey_logger.addHandler(handler)

    huey = SqliteHuey("bench", filename=args["db"], storage_class=Storage)

    @huey.task()
    def noop():
        counter.hit()
        return {}  # stored, as our runner stores each job's result

    n = args["jobs"]
    counter.expect(n)
    started, enqueue_cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        noop()
    enqueued = time.perf_counter()
    enqueue_cpu = time.process_time() - enqueue_cpu
    cpu = time.process_time()
    consumer = huey.create_consumer(
        workers=args["workers"], worker_type="greenlet", periodic=False, check_worker_health=False
    )
    consumer.start()
    counter.done.wait()
    # Drained at the last outcome committed, as seen from another connection
    # (huey's storage connects per thread): where ours is timed, not at the
    # last handler call, which comes before its result is stored.
    while huey.storage.result_store_size() < n or huey.storage.queue_size():
        time.sleep(0.001)
    drained = time.perf_counter()
    # Every thread of the process: huey's consumer and its greenlet workers.
    cpu = time.process_time() - cpu
    consumer.stop(graceful=True)
    return {
        "enqueue_seconds": enqueued - started,
        "enqueue_cpu_seconds": enqueue_cpu,
        "drain_seconds": drained - enqueued,
        "drain_cpu_seconds": cpu,
    }


CHILDREN = {
    "throughput_raw": raw_child,
    "throughput_runner": runner_child,
    "throughput_runner_batched": lambda args: runner_child({**args, "batches": True}),
    "throughput_runner_traced": lambda args: runner_child({**args, "traced": True}),
    "huey": huey_child,
    "throughput_minimal": minimal_child,
}


def worker_process(db: str | None, log: Path, **config: object) -> subprocess.Popen:
    """A `flask jobs work` process of the bench app (the deployed worker, without HTTP)
    on the SQLite file `db`, or on the database `config` names (`DATABASE_URL`)."""
    env = {
        "PYTHONPATH": str(REPO),
        **({"MEALQUEST_DATABASE": db} if db else {}),
        **{f"MEALQUEST_{key}": str(value) for key, value in config.items()},
    }
    import os

    return subprocess.Popen(
        [sys.executable, "-m", "flask", "--app", "bench.wsgi", "jobs", "work"],
        cwd=REPO,
        env={**os.environ, **env},
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def start_workers(db: str | None, logs: list[Path], **config: object) -> list[subprocess.Popen]:
    """A `worker_process` per log, returned once every one has started its pool.

    The logs are appended to, and a section's rounds reuse them: only what a
    log gained after its process started counts (the pool started line of an
    earlier round's process would start the clock while this one still boots).
    """
    marks = [(log, log.stat().st_size if log.exists() else 0) for log in logs]
    processes = [worker_process(db, log, **config) for log in logs]

    def written(log: Path, offset: int) -> str:
        with log.open("rb") as file:
            file.seek(offset)
            return file.read().decode(errors="replace")

    try:
        wait_until(
            lambda: (
                all("job pool started" in written(*mark) for mark in marks)
                or any(p.poll() is not None for p in processes)
            ),
            timeout=60,
            what="worker processes ready",
        )
        if any(p.poll() is not None for p in processes):
            raise RuntimeError("a worker exited:\n" + "\n".join(written(*mark) for mark in marks))
    except BaseException:
        stop_processes(processes)
        raise
    return processes


def stop_processes(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def drain_by_processes(workdir: Path, count: int, n: int, workers: int) -> float:
    """Seconds for `count` worker processes to drain `n` jobs committed at once."""
    db, household = fresh_database(workdir, f"procs{count}.sqlite3")
    logs = [workdir / f"procs{count}-{i}.log" for i in range(count)]
    processes = start_workers(db, logs, JOB_WORKERS=workers)
    try:
        conn = sqlite3.connect(db, isolation_level=None)
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            INSERT,
            ((uuid.uuid4().hex, household, "noop", "{}", 1, now, now, now) for _ in range(n)),
        )
        conn.execute("COMMIT")
        started = time.perf_counter()
        wait_until(
            lambda: not conn.execute(ACTIVE).fetchone()[0],
            timeout=600,
            interval=0.002,
            what="drained",
        )
        drained = time.perf_counter()
        conn.close()
    finally:
        stop_processes(processes)
    return drained - started
