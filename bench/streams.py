"""Households waiting on their jobs: what an open event stream costs, and what
each way of waiting costs the database.

`python -m bench.streams [--streams N] [--seconds S] [--postgres URL]`

One gunicorn gevent worker (its job pool running) serves N households'
clients, each on a job of its own, all in this process (patched by gevent
first). Jobs are scheduled an hour ahead so nothing but the bench changes
them; a change is a job cancelled through the API (`POST
/api/v1/jobs/{id}/cancel`: a queued job is cancelled in that request's
transaction, as any service write, NOTIFY included on PostgreSQL).

* `rss_per_stream_kib`: the worker's resident memory with N streams open,
  less before any, over N.
* `idle_cpu_percent`: the worker's CPU while the N streams wait (their
  heartbeats included), as a share of one core.
* `change_to_event_ms` p50 and p99: each job cancelled in turn (N over
  `S` seconds), from the cancel's request here to the job's event at its
  client (the request's own time included: an upper bound).
* Waiting, for S seconds each: N streams; N clients polling every second
  with `If-None-Match` (answered 304); N clients polling every second without
  it (the baseline). For each, the worker's CPU per second and, on
  PostgreSQL, the database's transactions per second (each of the
  service's reads is one): the stream's and the conditional poll's as
  ratios of plain polling's.

Absolute figures say something about this run only; the ratios compare.
"""

from __future__ import annotations

from mealquest.gevent_patching import patch_all

patch_all()

import argparse  # noqa: E402 - after the patching, as in a gunicorn gevent worker
import json  # noqa: E402
import os  # noqa: E402
import secrets  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sqlite3  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable  # noqa: E402
from http.client import HTTPConnection  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402

from bench.common import REPO, free_port, median, percentile, rss_bytes  # noqa: E402

_LATER = "2999-01-01T00:00:00.000000Z"
_CREATED = "2024-01-01T00:00:00.000000Z"
_TICKS = os.sysconf("SC_CLK_TCK")


class Database:
    """The bench's database, SQLite or PostgreSQL, written directly."""

    def __init__(self, workdir: Path, postgres_url: str | None) -> None:
        self.postgres_url = postgres_url
        if postgres_url is None:
            from mealquest.db.sqlite import migrate

            self.path = str(workdir / "streams.sqlite3")
            migrate.upgrade(self.path)
            self.config = {"MEALQUEST_DATABASE": self.path}
        else:
            from mealquest.db.postgresql import migrate as pg_migrate

            pg_migrate.upgrade(postgres_url)
            self.config = {"MEALQUEST_DATABASE_URL": postgres_url}

    def _execute(self, statements: list[tuple[str, tuple]]) -> list[Any]:
        if self.postgres_url is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            try:
                conn.execute("BEGIN IMMEDIATE")
                rows = [conn.execute(sql, args).fetchall() for sql, args in statements]
                conn.execute("COMMIT")
                return rows
            finally:
                conn.close()
        import psycopg

        with psycopg.connect(self.postgres_url, autocommit=False) as conn:
            rows = []
            for sql, args in statements:
                cursor = conn.execute(sql.replace("?", "%s"), args)
                rows.append(cursor.fetchall() if cursor.description else [])
            conn.commit()
            return rows

    def seed(self, count: int) -> tuple[str, list[str]]:
        """A household (its token) and `count` jobs of it, due an hour ahead."""
        from mealquest.households import TOKEN_PREFIX, token_digest

        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        ids = [uuid.uuid4().hex for _ in range(count)]
        [[(household,)]] = self._execute(
            [
                (
                    "INSERT INTO households (name, created_at) VALUES ('bench', ?) RETURNING id",
                    (_CREATED,),
                )
            ]
        )
        statements = [
            (
                "INSERT INTO api_tokens (household_id, token_sha256, created_at) VALUES (?, ?, ?)",
                (household, token_digest(token), _CREATED),
            )
        ]
        statements += [
            (
                "INSERT INTO jobs (id, household_id, kind, payload, status, attempt, max_attempts, "
                "run_at, created_at, updated_at) "
                "VALUES (?, ?, 'noop', '{}', 'queued', 0, 1, ?, ?, ?)",
                (job_id, household, _LATER, _CREATED, _CREATED),
            )
            for job_id in ids
        ]
        self._execute(statements)
        return token, ids

    def transactions(self) -> int | None:
        """The database's transactions so far (PostgreSQL), or None."""
        if self.postgres_url is None:
            return None
        import psycopg

        with psycopg.connect(self.postgres_url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            [(count,)] = conn.execute(
                "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                "WHERE datname = current_database()"
            ).fetchall()
            return int(count)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def worker_of(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    if len(children) != 1:
        raise RuntimeError(f"expected one gunicorn worker, found {children}")
    return int(children[0])


class Stream:
    """One client's open event stream, read by a greenlet of its own."""

    def __init__(self, port: int, token: str, job_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(
            (
                f"GET /api/v1/jobs/{job_id}/events HTTP/1.1\r\nHost: bench\r\n"
                f"Authorization: Bearer {token}\r\n\r\n"
            ).encode()
        )
        self.file = self.sock.makefile("rb")
        status = self.file.readline()
        if b" 200 " not in status:
            raise RuntimeError(f"the stream was refused: {status!r}")
        self.events: list[tuple[float, str]] = []  # (when, event name)
        self.reader = gevent.spawn(self._read)

    def _read(self) -> None:
        name = None
        for line in self.file:
            if line.startswith(b"event: "):
                name = line[7:].strip().decode()
            elif line.startswith(b"data: ") and name is not None:
                self.events.append((time.time(), name))
                name = None

    def close(self) -> None:
        self.reader.kill(block=False)
        self.sock.close()


def poll_loop(
    port: int, token: str, job_id: str, conditional: bool, stop: list[bool], made: list[int]
) -> int:
    """Poll the job every second until stopped; the answers that were not 200/304."""
    conn = HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}"}
    bad = 0
    gevent.sleep(secrets.randbelow(1000) / 1000)  # spread the clients over the second
    while not stop[0]:
        started = time.monotonic()
        conn.request("GET", f"/api/v1/jobs/{job_id}", headers=headers)
        answer = conn.getresponse()
        answer.read()
        made[0] += 1
        if conditional and "If-None-Match" not in headers:
            headers["If-None-Match"] = answer.getheader("ETag") or ""
        bad += answer.status not in (200, 304)
        gevent.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    conn.close()
    return bad


def measure(
    worker: int, db: Database, seconds: float, clients_seconds: Callable[[], float]
) -> dict[str, float | None]:
    """The worker's CPU and the database's transactions per second, and both
    per client-second of waiting (`clients_seconds`: a stream open for a
    second, or one poll, which stands for a client's second of polling:
    one client may not manage a poll a second on a loaded machine)."""
    cpu, count, started = cpu_seconds(worker), db.transactions(), time.monotonic()
    served = clients_seconds()
    gevent.sleep(seconds)
    took = time.monotonic() - started
    after = db.transactions()
    served = clients_seconds() - served
    cpu_percent = 100 * (cpu_seconds(worker) - cpu) / took
    per_s = None if count is None or after is None else (after - count) / took
    return {
        "cpu_percent": cpu_percent,
        "transactions_per_s": per_s,
        "client_seconds_per_s": served / took,
        "cpu_ms_per_client_second": 10 * cpu_percent * took / served if served else None,
        "transactions_per_client_second": (
            None if per_s is None or not served else per_s * took / served
        ),
    }


def run(streams: int, seconds: float, postgres_url: str | None) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    db = Database(workdir, postgres_url)
    token, ids = db.seed(3 * streams)
    port = free_port()
    env = {
        **os.environ,
        **db.config,
        "PYTHONPATH": str(REPO),
        "MEALQUEST_LOG_LEVEL": "WARNING",
        "MEALQUEST_STREAM_MAX_PER_HOUSEHOLD": str(streams + 10),
        "MEALQUEST_STREAM_MAX_SECONDS": "3600",
        "MEALQUEST_JOB_MAX_PENDING_PER_HOUSEHOLD": str(10 * streams),
    }
    args = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"]
    args += ["--bind", f"127.0.0.1:{port}", "--workers", "1"]
    args += ["--worker-connections", str(2 * streams + 100), "bench.wsgi:app"]
    log = workdir / "gunicorn.log"
    server = subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        return _measure_all(server, port, token, ids, streams, seconds, db, log)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _measure_all(
    server: subprocess.Popen,
    port: int,
    token: str,
    ids: list[str],
    streams: int,
    seconds: float,
    db: Database,
    log: Path,
) -> dict[str, Any]:
    _wait(lambda: _answers(port), 60, server, log)
    worker = worker_of(server.pid)
    gevent.sleep(1)
    rss_before = rss_bytes(worker)

    opened = [Stream(port, token, job_id) for job_id in ids[:streams]]
    _wait(lambda: all(s.events for s in opened), 60, server, log)
    gevent.sleep(1)
    rss_per_stream = (rss_bytes(worker) - rss_before) / streams
    idle = measure(worker, db, seconds, lambda: time.monotonic() * streams)

    # Changes, spread over `seconds`: each from its cancel's request to its client.
    latencies = []
    gap = seconds / streams
    committed: dict[int, float] = {}  # when each cancel was sent
    canceller = HTTPConnection("127.0.0.1", port, timeout=30)
    for index in range(len(opened)):
        committed[index] = time.time()
        canceller.request(
            "POST",
            f"/api/v1/jobs/{ids[index]}/cancel",
            headers={"Authorization": f"Bearer {token}"},
        )
        answer = canceller.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"the cancel was answered {answer.status}")
        gevent.sleep(gap)
    canceller.close()
    _wait(lambda: all(len(s.events) >= 3 for s in opened), 60, server, log)  # job, job, end
    for index, stream in enumerate(opened):
        latencies.append(1000 * (stream.events[1][0] - committed[index]))
    for stream in opened:
        stream.close()
    gevent.sleep(1)

    # The three ways to wait, each on jobs of its own that do not change.
    waiting_streams = [Stream(port, token, job_id) for job_id in ids[streams : 2 * streams]]
    _wait(lambda: all(s.events for s in waiting_streams), 60, server, log)
    streaming = measure(worker, db, seconds, lambda: time.monotonic() * streams)
    for stream in waiting_streams:
        stream.close()
    polling: dict[bool, dict[str, Any]] = {}
    for conditional in (True, False):
        stop, made = [False], [0]
        clients = [
            gevent.spawn(poll_loop, port, token, job_id, conditional, stop, made)
            for job_id in ids[2 * streams :]
        ]
        gevent.sleep(2)  # every client past its first answer
        polling[conditional] = measure(worker, db, seconds, lambda made=made: float(made[0]))
        stop[0] = True
        gevent.joinall(clients, timeout=30)
        # An overloaded worker answers 503 (its database pool's wait ran out):
        # counted, as a poll that cost a request and told the client nothing.
        polling[conditional]["not_200_or_304"] = sum(client.value or 0 for client in clients)

    def ratio(key: str, figures: dict[str, float | None]) -> float | None:
        base = polling[False][key]
        value = figures[key]
        return None if value is None or not base else value / base

    return {
        "database": "postgresql" if db.postgres_url else "sqlite",
        "_ratios": "per client-second of waiting, each way against plain polling",
        "streams": streams,
        "rss_per_stream_kib": rss_per_stream / 1024,
        "idle_cpu_percent": idle["cpu_percent"],
        "change_to_event_ms_p50": median(latencies),
        "change_to_event_ms_p99": percentile(latencies, 0.99),
        "stream": streaming,
        "conditional_poll": polling[True],
        "plain_poll": polling[False],
        "stream_vs_plain_cpu": ratio("cpu_ms_per_client_second", streaming),
        "conditional_vs_plain_cpu": ratio("cpu_ms_per_client_second", polling[True]),
        "stream_vs_plain_transactions": ratio("transactions_per_client_second", streaming),
        "conditional_vs_plain_transactions": ratio("transactions_per_client_second", polling[True]),
    }


def _answers(port: int) -> bool:
    try:
        conn = HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def _wait(
    condition: Callable[[], bool], timeout: float, server: subprocess.Popen, log: Path
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"not within {timeout} s; gunicorn's log:\n{log.read_text()[-4000:]}"
            )
        gevent.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.streams", description=__doc__)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--postgres", default=os.environ.get("MEALQUEST_BENCH_POSTGRES_URL"))
    options = parser.parse_args(argv)
    figures = run(options.streams, options.seconds, options.postgres)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
