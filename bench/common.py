"""What every benchmark shares: sizes, a migrated database, child processes, statistics.

Each measurement runs in a fresh child process (`python -m bench.child NAME`),
monkey-patched by gevent as a gunicorn gevent worker is, so that one figure's
memory, connections and greenlets cannot colour the next one's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def store_pragmas(conn: sqlite3.Connection, synchronous: str) -> None:
    """The pragmas `mealquest.db.sqlite.connection.connect` sets, for the baselines that run
    statements on a plain connection: a baseline without one of them would
    measure the pragma, not the code."""
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA temp_store = MEMORY")


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is; `quick` keeps the whole suite to seconds."""

    jobs: int  # jobs per throughput run
    repeats: int  # runs of each figure and baseline, interleaved; the median is kept
    # The pool's JOB_WORKERS (and huey's greenlet workers): the service's
    # default, which the bench's test holds it to (not imported: the peers'
    # children import this module and must not load the service).
    workers: int
    latency_samples: int
    big_table_rows: int  # finished jobs in the table for the claim-rate figure
    claims: int  # claims timed per claim-rate run
    memory_small: int
    memory_large: int
    http_seconds: float  # per round of each route
    http_rounds: int  # rounds per route, alternating; the median is kept
    http_connections: int
    lock_seconds: float
    pg_jobs: int  # jobs per PostgreSQL throughput run
    pg_backlog_jobs: int  # jobs of the PostgreSQL drain whose cost must not grow with them
    # Jobs the PostgreSQL drains by one and by two processes share: enough that
    # each process drains for seconds, not for the time its first wake takes.
    pg_process_jobs: int
    fair_jobs: int  # queued jobs, between 1,000 households or held by one, for the fair claim
    fair_a_jobs: int  # household A's jobs ahead of B's one in the B-behind-A delay
    wal_jobs: int  # single-job enqueues whose WAL frames are counted
    enqueue_part_calls: int  # calls a round of each part of the HTTP enqueue route


FULL = Sizes(
    jobs=10_000,
    repeats=3,
    workers=32,
    latency_samples=1_000,
    big_table_rows=1_000_000,
    claims=3_000,
    memory_small=1_000,
    memory_large=100_000,
    http_seconds=3.0,
    http_rounds=5,
    http_connections=32,
    lock_seconds=2.0,
    pg_jobs=2_000,
    pg_backlog_jobs=16_000,
    pg_process_jobs=8_000,
    fair_jobs=20_000,
    fair_a_jobs=100,
    wal_jobs=1_000,
    enqueue_part_calls=1_000,
)

QUICK = Sizes(
    jobs=200,
    repeats=1,
    workers=32,
    latency_samples=30,
    big_table_rows=5_000,
    claims=100,
    memory_small=50,
    memory_large=300,
    http_seconds=0.5,
    http_rounds=1,
    http_connections=4,
    lock_seconds=0.3,
    pg_jobs=100,
    pg_backlog_jobs=800,
    pg_process_jobs=100,
    fair_jobs=2_000,
    fair_a_jobs=15,
    wal_jobs=50,
    enqueue_part_calls=50,
)


def fresh_database(directory: Path, name: str = "bench.sqlite3") -> tuple[str, int]:
    """A migrated database with one household; returns its path and the household id."""
    from mealquest.db.sqlite import migrate

    path = directory / name
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    migrate.upgrade(str(path))
    conn = sqlite3.connect(path)
    with conn:
        cursor = conn.execute(
            "INSERT INTO households (name, created_at) "
            "VALUES ('bench', '2024-01-01T00:00:00.000000Z')"
        )
    conn.close()
    return str(path), int(cursor.lastrowid or 0)


def copy_database(source: str, target: Path) -> str:
    """Copy a database file (checkpointed first, so the copy needs no WAL)."""
    conn = sqlite3.connect(source)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    for suffix in ("-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(source, target)
    return str(target)


def run_child(name: str, args: dict, *, timeout: float = 600.0) -> dict:
    """Run one measurement in a fresh process; returns the JSON it prints last.

    `args["log"]`, if given, receives the child's log lines and its traceback.
    """
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    completed = subprocess.run(
        [sys.executable, "-m", "bench.child", name, json.dumps(args)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if completed.returncode != 0:
        log = Path(args["log"]).read_text()[-4000:] if args.get("log") else ""
        raise RuntimeError(
            f"benchmark {name} failed ({completed.returncode}):\n{completed.stderr[-4000:]}{log}"
        )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty sample."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[index]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size now (not the peak), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc status")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition, timeout: float, interval: float = 0.01, what: str = "condition"):
    """Poll `condition` until truthy (plain sleeps: for the parent, which is not patched)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout}s")
        time.sleep(interval)
