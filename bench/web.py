"""`GET /api/v1/jobs/{id}` under real gunicorn, against a trivial JSON route of the same app.

gunicorn runs with the project's `gunicorn.conf.py` (gevent workers, each
with its job pool, access log on) and 2 workers, the bench app
(`bench.wsgi:app`) bound to a free loopback port. The two routes are loaded
alternately, the same way, a few seconds each.
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

from bench.common import REPO, free_port, fresh_database, median, wait_until
from bench.loadgen import run_load

_CREATED = "2024-01-01T00:00:00.000000Z"


def _seed(db: str, household: int) -> tuple[str, str]:
    """A token and a finished job of the household, written directly."""
    from mealquest.households import TOKEN_PREFIX, token_digest

    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    job_id = uuid.uuid4().hex
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO api_tokens (household_id, token_sha256, created_at) VALUES (?, ?, ?)",
        (household, token_digest(token), _CREATED),
    )
    conn.execute(
        "INSERT INTO jobs (id, household_id, kind, payload, status, result, attempt, "
        "max_attempts, run_at, created_at, updated_at, started_at, finished_at) "
        "VALUES (?1, ?2, 'noop', '{}', 'succeeded', '{}', 1, 1, ?3, ?3, ?3, ?3, ?3)",
        (job_id, household, _CREATED),
    )
    conn.execute("COMMIT")
    conn.close()
    return token, job_id


def _answers(url: str, headers: dict[str, str]) -> bool:
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serve_and_load(workdir: Path, seconds: float, connections: int, repeats: int, generator: str):
    db, household = fresh_database(workdir, "http.sqlite3")
    token, job_id = _seed(db, household)
    port = free_port()
    log = workdir / "gunicorn.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MEALQUEST_DATABASE": db,
        "WEB_CONCURRENCY": "2",
    }
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
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    trivial_url = f"{base}/bench/trivial"
    job_url = f"{base}/api/v1/jobs/{job_id}"
    auth = {"Authorization": f"Bearer {token}"}
    try:
        wait_until(
            lambda: _answers(trivial_url, {}) or server.poll() is not None,
            timeout=60,
            interval=0.1,
            what="gunicorn answering",
        )
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited:\n{log.read_text()[-4000:]}")
        if not _answers(job_url, auth):
            raise RuntimeError("GET /api/v1/jobs/{id} did not answer 200")
        # Warm both routes (imports, connections, caches) before timing.
        run_load(trivial_url, {}, min(1.0, seconds), connections, generator)
        run_load(job_url, auth, min(1.0, seconds), connections, generator)
        trivial, job = [], []
        for _ in range(repeats):
            trivial.append(run_load(trivial_url, {}, seconds, connections, generator))
            job.append(run_load(job_url, auth, seconds, connections, generator))
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    for run in trivial + job:
        if run["non_200"]:
            raise RuntimeError(f"{run['non_200']} answers were not 200")

    def summary(runs: list[dict]) -> dict:
        return {
            "requests_per_s": median([r["requests_per_s"] for r in runs]),
            "p99_ms": median([r["p99_ms"] for r in runs]),
            "generator": runs[0]["generator"],
        }

    return summary(job), summary(trivial)
