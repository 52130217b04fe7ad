"""The enqueue side: concurrent HTTP enqueuers, and what one enqueue writes.

* `serve_and_enqueue`: `POST /api/v1/recipe-imports` through real gunicorn
  (the project's `gunicorn.conf.py`, 2 gevent workers) with the kind's
  handler swapped for a no-op (`bench.app`), its jobs run either by the
  workers' own job pools, as deployed by default, or by a `flask jobs work`
  process beside them (`MEALQUEST_JOB_POOL_IN_WEB=false`), which shows the
  route's own cost. Every
  POST names one host, whose imports start at most 30 a minute (the kind's
  politeness limits, kept), so the household's queue grows through the run
  and each answer's place in line is read behind thousands of its jobs.
  Alternated, round by round, with the baseline: `GET /bench/trivial`
  (`{"status": "ok"}`) on the same gunicorn, loaded the same way, so the
  ratio is what the enqueue route costs above serving a route at all.
* (The single enqueue against huey's is measured by the throughput
  children, `enqueue_vs_huey`: `enqueue_many` against single enqueues
  rewarded a slow single enqueue.)
* `wal_child`: WAL pages (frames) one single-job enqueue appends, with the
  schema's triggers on `jobs` and with them dropped, counted from the size of
  the WAL file (automatic checkpoints off).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

from bench.common import (
    REPO,
    free_port,
    fresh_database,
    median,
    wait_until,
)
from bench.loadgen import answers_not_ok, run_load
from bench.throughput import INSERT, start_workers, stop_processes
from bench.web import _seed
from mealquest.clock import to_text

# Any http(s) URL with a host passes validation; no handler fetches it (the pool is off).
IMPORT_BODY = '{"url": "https://example.com/recipe"}'
_WAL_HEADER_BYTES = 32
_FRAME_HEADER_BYTES = 24


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serve_and_enqueue(
    workdir: Path,
    seconds: float,
    connections: int,
    repeats: int,
    generator: str,
    synchronous: str,
    *,
    jobs_elsewhere: bool = False,
) -> tuple[dict, dict]:
    """Requests/s and p99 of concurrent HTTP enqueues, and of the trivial route on the
    same gunicorn, the two loaded in alternating rounds (each summary's
    `rounds`: its requests/s round by round). `jobs_elsewhere`: the jobs run
    in a `flask jobs work` process, not in gunicorn's workers."""
    db, household = fresh_database(workdir, "http-enqueue.sqlite3")
    token, _, _ = _seed(db, household)
    port = free_port()
    server_log = workdir / "gunicorn-enqueue.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MEALQUEST_DATABASE": db,
        "MEALQUEST_DB_SYNCHRONOUS": synchronous,
        "MEALQUEST_BENCH_NOOP_IMPORTS": "1",
        "WEB_CONCURRENCY": "2",
        "MEALQUEST_JOB_POOL_IN_WEB": "false" if jobs_elsewhere else "true",
    }
    workers: list[subprocess.Popen] = []
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            "gunicorn.conf.py",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
            "bench.wsgi:app",
        ],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=server_log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    url = f"{base}/api/v1/recipe-imports"
    trivial_url = f"{base}/bench/trivial"
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    http, trivial = [], []
    try:
        if jobs_elsewhere:
            log = workdir / "worker-enqueue.log"
            workers = start_workers(db, [log], DB_SYNCHRONOUS=synchronous, BENCH_NOOP_IMPORTS=1)
        wait_until(
            lambda: _answers(trivial_url) or server.poll() is not None,
            timeout=60,
            interval=0.1,
            what="gunicorn answering",
        )
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited:\n{server_log.read_text()[-4000:]}")
        # Warm up (imports, connections, the writer threads) before timing.
        run_load(trivial_url, {}, min(1.0, seconds), connections, generator)
        run_load(url, headers, min(1.0, seconds), connections, generator, body=IMPORT_BODY)
        for _ in range(repeats):
            trivial.append(run_load(trivial_url, {}, seconds, connections, generator))
            http.append(run_load(url, headers, seconds, connections, generator, body=IMPORT_BODY))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        stop_processes(workers)
    for run in http + trivial:
        if run["non_200"]:
            why = answers_not_ok(server_log)
            raise RuntimeError(f"{run['non_200']} answers were not 2xx; {why}")

    def summary(runs: list[dict]) -> dict:
        return {
            "requests_per_s": median([r["requests_per_s"] for r in runs]),
            "p99_ms": median([r["p99_ms"] for r in runs]),
            "generator": runs[0]["generator"],
            "rounds": [r["requests_per_s"] for r in runs],
        }

    return summary(http), summary(trivial)


def _wal_frames(path: str) -> int:
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    page_size = sqlite3.connect(path).execute("PRAGMA page_size").fetchone()[0]
    return max(0, size - _WAL_HEADER_BYTES) // (page_size + _FRAME_HEADER_BYTES)


def _frames_per_enqueue(db: str, household: int, n: int, drop_triggers: bool) -> float:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    if drop_triggers:
        names = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'jobs'"
        ).fetchall()
        for (name,) in names:
            conn.execute(f'DROP TRIGGER "{name}"')
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # Warm: the first insert of a household and kind creates their counting rows.
    now = to_text(datetime.now(UTC))
    conn.execute(INSERT, (uuid.uuid4().hex, household, "noop", "{}", 1, now, now, now))
    before = _wal_frames(db)
    for _ in range(n):
        now = to_text(datetime.now(UTC))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(INSERT, (uuid.uuid4().hex, household, "noop", "{}", 1, now, now, now))
        conn.execute("COMMIT")
    frames = _wal_frames(db) - before
    conn.close()
    return frames / n


def wal_child(args: dict) -> dict:
    """WAL frames per single-row enqueue transaction, with and without the `jobs` triggers."""
    workdir, n = Path(args["workdir"]), args["jobs"]
    with_db, with_household = fresh_database(workdir, "wal-triggers.sqlite3")
    without_db, without_household = fresh_database(workdir, "wal-no-triggers.sqlite3")
    return {
        "with_triggers": _frames_per_enqueue(with_db, with_household, n, False),
        "without_triggers": _frames_per_enqueue(without_db, without_household, n, True),
    }


CHILDREN = {
    "enqueue_wal": wal_child,
}
