"""Jobs under faults: a steady stream of jobs while processes and the database
are killed, and every job counted.

Households post jobs through real gunicorn (two workers) while a `flask jobs
work` process runs them beside the web workers' pools; each run appends a
line when it starts and one when its work is done, with its job, pid and
claim, to a ledger file (O_APPEND lines, which no database fault can lose:
`tests.support.chaos_ledger`). Meanwhile faults come in turn: a web worker killed (`kill -9`), the
`flask jobs work` process killed and started again, the whole gunicorn killed
and started again, and on PostgreSQL the service's backends terminated
(`pg_terminate_backend`) and the server restarted `fast` and `immediate`
(a private server of the test's own), and through PgBouncer in transaction
mode, PgBouncer killed (`kill -9`) and started again too; on SQLite, its
file system filled to the last byte (a small tmpfs, as root) until the
service has answered `503`, then freed.

Then every job whose enqueue was answered (`202`, or `200` for a repeat of
its `Idempotency-Key`) must end `succeeded`: lost 0; run twice 0, except a
job whose lease was provably lost (counted and reported): its next run
under a claim of its own, and its earlier run's process killed after that
run began and before the next, or its fenced outcome write refused. No job
runs that no client saw answered. No answer is a `500`; a `503`
carries `Retry-After`. A client retries what got no answer with the same key.

`scripts/chaos --long` runs it for longer (`MQ_CHAOS_ROUNDS`) and prints the
table of counts.
"""

from __future__ import annotations

import collections
import contextlib
import http.client as http_client
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mealquest.db.driver import Store
from mealquest.db.errors import StoreError
from mealquest.db.postgresql import migrate as pg_migrate
from mealquest.db.sqlite import migrate as sqlite_migrate
from mealquest.households import create_household
from tests.support import chaos_ledger
from tests.support.postgres import require_pgbouncer_url, require_postgres_url
from tests.support.private_postgres import PrivateServer
from tests.support.processes import REPO
from tests.support.servers import (
    BIN,
    FINAL,
    Gunicorn,
    JobRow,
    Process,
    http,
    jobs_by_id,
    open_test_store,
    serving_env,
    wait_until,
)
from tests.support.small_disk import SmallDisk

# Rounds of the fault sequence; `scripts/chaos --long` raises it.
ROUNDS = int(os.environ.get("MQ_CHAOS_ROUNDS", "1"))
HOUSEHOLDS = 3
# SQLite's own file system: room for every round's jobs, and little enough
# to fill in a moment.
DISK_BYTES = 64 * 1024 * 1024
# Deadlines for a loaded machine; a run that works meets them at once.
DEADLINE = 120.0
pytestmark = pytest.mark.timeout(300 + 240 * ROUNDS)


@dataclass(frozen=True)
class Served:
    """The database as the service is configured for it, and what the test may
    crash: the PostgreSQL server, and the PgBouncer in front of it."""

    database: dict[str, Any]
    server: PrivateServer | None = None
    bouncer: str | None = None  # its directory, for `scripts/pgbouncer`
    # SQLite's file system, which the test fills to the last byte (as root).
    disk: SmallDisk | None = None


@pytest.fixture(params=["sqlite", "postgresql", "pgbouncer"])
def chaos_database(request, tmp_path: Path) -> Iterator[Served]:
    if request.param == "sqlite":
        try:
            disk = SmallDisk(tmp_path / "disk", DISK_BYTES)
        except (OSError, subprocess.CalledProcessError):
            disk = None  # not root: every fault but the full disk
        try:
            path = str((disk.path if disk else tmp_path) / "mealquest.sqlite3")
            sqlite_migrate.upgrade(path)
            yield Served({"DATABASE": path}, disk=disk)
        finally:
            if disk is not None:
                disk.unmount()
        return
    require_postgres_url()
    if request.param == "pgbouncer":
        require_pgbouncer_url()
    server = PrivateServer()
    bouncer = None
    try:
        # A commit must survive the server's crash (`immediate`), as it would
        # in production: the test server's default is to answer before WAL.
        server.run("durable")
        pg_migrate.upgrade(server.url)
        database = {"DATABASE_URL": server.url, "DB_BUSY_TIMEOUT_SECONDS": 2}
        if request.param == "pgbouncer":
            # Inside the server's directory, which its own user may write.
            bouncer = os.path.join(server.directory, "pgbouncer")
            url = run_script("pgbouncer", "start", bouncer, server.url)
            database = {**database, "DATABASE_URL": url, "PG_POOLER": "transaction"}
        yield Served(database, server, bouncer)
    finally:
        if bouncer is not None:
            with contextlib.suppress(AssertionError):
                run_script("pgbouncer", "stop", bouncer)
        server.remove()


def run_script(name: str, *arguments: str) -> str:
    done = subprocess.run(
        [str(REPO / "scripts" / name), *arguments],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@dataclass
class Tally:
    """What the clients saw, and what the faults did."""

    answered: set[str] = field(default_factory=set)
    statuses: collections.Counter[int] = field(default_factory=collections.Counter)
    no_answer: int = 0
    bad: list[str] = field(default_factory=list)
    # When each pid the test killed was killed (wall clock, as the ledger's).
    kills: dict[int, float] = field(default_factory=dict)
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    # The longest time, per fault, from its start until ten more jobs had run.
    recovery: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def post_jobs(
    url: Callable[[], str], token: str, ledger: Path, tally: Tally, stop: threading.Event
):
    """One household's client: posts jobs one after another, each retried with
    its key until answered (a dropped connection, a 503, the quota)."""
    try:
        _post_until_stopped(url, token, ledger, tally, stop)
    except Exception as error:  # a client that died would hide what it would have seen
        with tally.lock:
            tally.bad.append(f"the client failed: {error!r}")


def _post_until_stopped(url, token, ledger, tally, stop) -> None:
    while not stop.is_set():
        key = uuid.uuid4().hex
        body = {"kind": "ledger_run", "payload": {"log": str(ledger), "seconds": 0.02}}
        while True:
            try:
                answer = http(
                    "POST",
                    f"{url()}/api/v1/test-jobs",
                    token=token,
                    json_body=body,
                    headers={"Idempotency-Key": key},
                    timeout=30,
                )
            except (OSError, http_client.HTTPException):
                # No answer, or half of one (its worker was killed): the same
                # request again, with the same key.
                with tally.lock:
                    tally.no_answer += 1
                time.sleep(0.05)
                continue
            with tally.lock:
                tally.statuses[answer.status] += 1
                if answer.status in (200, 202):
                    tally.answered.add(answer.json["id"])
                elif answer.status in (429, 503):
                    if "Retry-After" not in answer.headers:
                        tally.bad.append(f"{answer.status} without Retry-After")
                else:
                    tally.bad.append(f"{answer.status}: {answer.body[:200]!r}")
            if answer.status in (200, 202) or answer.status not in (429, 503):
                break
            time.sleep(0.1)


def ended(store: Store, job_ids: list[str]) -> dict[str, JobRow | None] | None:
    """Each job's row once none is queued or running (None: no such job, lost);
    None while some still are, or while the database does not answer."""
    try:
        rows = jobs_by_id(store)
    except StoreError:
        return None
    if any(job_id in rows and rows[job_id]["status"] not in FINAL for job_id in job_ids):
        return None
    return {job_id: rows.get(job_id) for job_id in job_ids}


def ran(ledger: Path) -> set[str]:
    """The jobs one of whose runs did its work to the end."""
    return chaos_ledger.completed(chaos_ledger.read(ledger))


def test_every_answered_job_ends_exactly_once_under_faults(chaos_database, tmp_path):
    served = chaos_database
    database, server = served.database, served.server
    store = open_test_store(database)
    env = serving_env(database)
    processes: list[Process] = []
    tally = Tally()
    stop = threading.Event()
    ledger = tmp_path / "ledger"
    began_test = time.monotonic()

    def start_web() -> Gunicorn:
        web = Gunicorn(tmp_path / f"gunicorn-{len(processes)}.log", env)
        processes.append(web)
        web.wait_ready()
        return web

    def start_worker() -> Process:
        worker = Process(
            [str(BIN / "flask"), "--app", "tests.support.serving_app", "jobs", "work"],
            env,
            tmp_path / f"worker-{len(processes)}.log",
        )
        processes.append(worker)
        wait_until(lambda: "working with" in worker.log(), DEADLINE, "the worker did not start")
        return worker

    def kill(process: Process, *, group: bool = False) -> None:
        pids = [process.pid, *(process.worker_pids() if isinstance(process, Gunicorn) else [])]
        tally.kills.update(dict.fromkeys(pids, time.time()))
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                os.kill(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            process.wait(10)

    def settle(fault: str | None = None, since: float = 0.0) -> None:
        """Let jobs flow between faults: ten more run. With `fault`, count it and
        how long jobs took to flow again since it began (`since`)."""
        before = len(ran(ledger))
        wait_until(lambda: len(ran(ledger)) >= before + 10, DEADLINE, "jobs stopped running")
        if fault is not None:
            tally.faults[fault] += 1
            took = time.monotonic() - since
            tally.recovery[fault] = max(tally.recovery.get(fault, 0.0), took)

    try:
        tokens = [create_household(store, f"Household {n}").token for n in range(HOUSEHOLDS)]
        holder = {"web": start_web()}
        worker = {"process": start_worker()}
        clients = [
            threading.Thread(
                target=post_jobs,
                args=(lambda: holder["web"].url, token, ledger, tally, stop),
                daemon=True,
            )
            for token in tokens
        ]
        for client in clients:
            client.start()
        settle()

        for _ in range(ROUNDS):
            # A web worker, killed mid-write (its master starts another).
            began = time.monotonic()
            victim = holder["web"].worker_pids()[0]
            tally.kills[victim] = time.time()
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
            settle("a web worker killed", began)

            # The jobs-only process, killed and started again.
            began = time.monotonic()
            kill(worker["process"])
            worker["process"] = start_worker()
            settle("flask jobs work killed", began)

            # The whole gunicorn, master and workers, killed and started again.
            began = time.monotonic()
            kill(holder["web"], group=True)
            holder["web"] = start_web()
            settle("the whole gunicorn killed", began)

            if server is not None:
                began = time.monotonic()
                with contextlib.suppress(Exception):
                    store.write(
                        lambda tx: tx.execute(
                            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                            "WHERE usename = current_user AND pid <> pg_backend_pid()"
                        )
                    )
                settle("the service's backends terminated", began)
                began = time.monotonic()
                server.run("restart")
                settle("PostgreSQL restarted fast", began)
                began = time.monotonic()
                server.run("crash")
                server.run("start")
                settle("PostgreSQL restarted immediate", began)
            if served.bouncer is not None:
                began = time.monotonic()
                run_script("pgbouncer", "crash", served.bouncer)
                settle("PgBouncer killed and started again", began)
            if served.disk is not None:
                # The disk full to the last byte while households post and
                # jobs run, until the service has answered some of it `503`;
                # then freed.
                began = time.monotonic()
                refused = tally.statuses[503]
                served.disk.fill()
                try:
                    wait_until(
                        lambda refused=refused: tally.statuses[503] > refused,
                        DEADLINE,
                        "a full disk got no 503",
                    )
                finally:
                    served.disk.free()
                settle("the disk full, then freed", began)

        stop.set()
        for client in clients:
            client.join(DEADLINE)

        answered = sorted(tally.answered)
        done = wait_until(lambda: ended(store, answered), DEADLINE, "answered jobs did not all end")
        runs = chaos_ledger.read(ledger)
        done_runs = chaos_ledger.completed(runs)
        lost = [
            job
            for job in answered
            if done[job] is None or done[job]["status"] != "succeeded" or job not in done_runs
        ]
        verdict = chaos_ledger.judge(
            runs,
            answered=tally.answered,
            kills=tally.kills,
            fenced=chaos_ledger.fenced_writes(process.log() for process in processes),
            rescued=chaos_ledger.rescued_claims(process.log() for process in processes),
        )
        unexplained = verdict.unexplained
        table = {
            "database": "pgbouncer" if served.bouncer else "postgresql" if server else "sqlite",
            "faults": dict(tally.faults),
            "longest recovery (s)": {
                fault: round(took, 1) for fault, took in tally.recovery.items()
            },
            "jobs answered": len(answered),
            "lost": len(lost),
            "run twice, lease lost with a killed process": len(verdict.twice_killed),
            "run twice, lease expired while the database was away": len(verdict.twice_fenced),
            "run twice, unexplained": len(unexplained),
            "runs of jobs never answered": len(verdict.unanswered),
            "answers": dict(sorted(tally.statuses.items())),
            "requests without an answer (retried)": tally.no_answer,
            "seconds": round(time.monotonic() - began_test),
        }
        print(json.dumps(table, indent=2))  # `scripts/chaos` shows it
        if os.environ.get("MQ_CHAOS_TABLE"):
            with open(os.environ["MQ_CHAOS_TABLE"], "a") as out:
                out.write(json.dumps(table) + "\n")
        assert lost == [], {
            job: done[job]
            and (done[job]["status"], done[job]["attempt"], done[job]["error"], runs.get(job))
            for job in lost
        }
        assert unexplained == {}, {
            job: (
                job_runs,
                [line for p in processes for line in p.log().splitlines() if job in line],
            )
            for job, job_runs in list(unexplained.items())[:3]
        }
        assert verdict.unanswered == {}
        assert tally.bad == []
        assert 500 not in tally.statuses
    finally:
        stop.set()
        for process in reversed(processes):
            process.stop()
        store.close()
