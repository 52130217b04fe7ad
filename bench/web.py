"""`GET /api/v1/jobs/{id}` under real gunicorn, against a trivial JSON route of the same app.

gunicorn runs with the project's `gunicorn.conf.py` (gevent workers, each
with its job pool, access log on) and 2 workers, the bench app
(`bench.wsgi:app`) bound to a free loopback port. Three loads take turns,
the same way, a few seconds each: the trivial route; a finished job, which
never changes, so every read after the first is the read cache's (its best
case); and a running job that this process changes every few milliseconds
(a partial result, as a handler's `ctx.partial` writes it), so that most
reads find the database changed and read it again.
"""

from __future__ import annotations

import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

from bench.common import REPO, free_port, fresh_database, wait_until
from bench.loadgen import answers_not_ok, run_load
from mealquest.clock import to_text, utc_now

# How often the changing job changes: a handler writing partial results fast.
CHANGE_SECONDS = 0.005


def _seed(db: str, household: int) -> tuple[str, str, str]:
    """A token, a finished job and a running job of the household, written directly.

    Made now: the server's pools run `prune_jobs` every hour, and a job
    past the retention would vanish mid-run (every later answer a 404)."""
    from mealquest.households import TOKEN_PREFIX, token_digest

    created = to_text(utc_now())
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    job_id, running_id = uuid.uuid4().hex, uuid.uuid4().hex
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO api_tokens (household_id, token_sha256, created_at) VALUES (?, ?, ?)",
        (household, token_digest(token), created),
    )
    conn.execute(
        "INSERT INTO jobs (id, household_id, kind, payload, status, result, attempt, "
        "max_attempts, run_at, created_at, updated_at, started_at, finished_at) "
        "VALUES (?1, ?2, 'noop', '{}', 'succeeded', '{}', 1, 1, ?3, ?3, ?3, ?3, ?3)",
        (job_id, household, created),
    )
    conn.execute(
        "INSERT INTO jobs (id, household_id, kind, payload, status, attempt, "
        "max_attempts, run_at, created_at, updated_at, started_at, lease_owner, "
        "lease_expires_at) "
        "VALUES (?1, ?2, 'noop', '{}', 'running', 1, 1, ?3, ?3, ?3, ?3, 'bench', "
        "'9999-01-01T00:00:00.000000Z')",
        (running_id, household, created),
    )
    conn.execute("COMMIT")
    conn.close()
    return token, job_id, running_id


class _Changer:
    """Writes a new partial result to a running job every CHANGE_SECONDS while on."""

    def __init__(self, db: str, job_id: str) -> None:
        self._db, self._job_id = db, job_id
        self._stop = threading.Event()
        self.changes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Changer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        conn = sqlite3.connect(self._db, isolation_level=None, timeout=30)
        try:
            while not self._stop.wait(CHANGE_SECONDS):
                self.changes += 1
                conn.execute(
                    "UPDATE jobs SET result = json_object('step', ?1), "
                    "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') WHERE id = ?2",
                    (self.changes, self._job_id),
                )
        finally:
            conn.close()


def _answers(url: str, headers: dict[str, str]) -> bool:
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serve_and_load(workdir: Path, seconds: float, connections: int, repeats: int, generator: str):
    db, household = fresh_database(workdir, "http.sqlite3")
    token, job_id, running_id = _seed(db, household)
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
    running_url = f"{base}/api/v1/jobs/{running_id}"
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
        if not _answers(job_url, auth) or not _answers(running_url, auth):
            raise RuntimeError("GET /api/v1/jobs/{id} did not answer 200")
        # Warm the routes (imports, connections, caches) before timing.
        run_load(trivial_url, {}, min(1.0, seconds), connections, generator)
        run_load(job_url, auth, min(1.0, seconds), connections, generator)
        trivial, job, changing = [], [], []
        for _ in range(repeats):
            trivial.append(run_load(trivial_url, {}, seconds, connections, generator))
            job.append(run_load(job_url, auth, seconds, connections, generator))
            with _Changer(db, running_id) as changer:
                changing.append(run_load(running_url, auth, seconds, connections, generator))
            if changer.changes < seconds / CHANGE_SECONDS / 4:
                raise RuntimeError(f"the running job changed only {changer.changes} times")
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    for run in trivial + job + changing:
        if run["non_200"]:
            raise RuntimeError(f"{run['non_200']} answers were not 200; {answers_not_ok(log)}")
    return {"job": job, "changing": changing, "trivial": trivial}
