"""A PostgreSQL failover while jobs run: a primary and a streaming standby
(two real servers on loopback, `pg_basebackup -R`), the service given both in
one URL with `target_session_attrs=read-write`, the primary crashed
(immediate shutdown) and the standby promoted, while a real `flask jobs work`
process runs jobs and this process enqueues more.

Every job whose enqueue was answered ends exactly once, with synchronous
replication. With asynchronous replication, what is lost is exactly what the
standby had not received: the jobs enqueued after it stopped receiving are
gone, and a job whose success it never received runs again, under another
claim (never twice under the same one). `/healthz` is 503 while no primary
answers and 200 again after; and the pool's LISTEN comes back on the new
primary (an enqueue from another process wakes it long before its poll
would)."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from flask import Flask

from mealquest.application import create_app
from mealquest.db.errors import StoreError
from mealquest.db.postgresql.store import PostgresStore
from mealquest.extensions import get_store
from mealquest.households import create_household
from mealquest.jobs.service import get_jobs
from mealquest.model.jobs import Status
from tests.conftest import wait_for
from tests.support.kinds import register_test_kinds
from tests.support.postgres import require_postgres_url
from tests.support.private_postgres import PrivateServer
from tests.support.processes import flask_jobs_work, wait_working

FINAL = {Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}
# Deadlines for a loaded machine: a failover that works meets them at once.
RECOVERY = 90.0


@pytest.fixture
def replicated() -> Iterator[tuple[PrivateServer, PrivateServer]]:
    require_postgres_url()  # where a server can be had at all
    primary = PrivateServer()
    try:
        standby = PrivateServer(standby_of=primary)
    except BaseException:
        primary.remove()
        raise
    try:
        yield primary, standby
    finally:
        standby.remove()
        primary.remove()


def both_hosts(primary: PrivateServer, standby: PrivateServer) -> str:
    """One URL naming both servers: libpq keeps the one that takes writes."""
    head, _, tail = primary.url.rpartition(f":{primary.port}/")
    return f"{head}:{primary.port},127.0.0.1:{standby.port}/{tail}?target_session_attrs=read-write"


@pytest.fixture
def service(replicated) -> Iterator[tuple[PrivateServer, PrivateServer, str, Flask]]:
    primary, standby = replicated
    url = both_hosts(primary, standby)
    store = PostgresStore(url)
    try:
        store.upgrade()
    finally:
        store.close()
    app = create_app(
        {"TESTING": True, "DATABASE_URL": url, "DB_BUSY_TIMEOUT_SECONDS": 2, "PG_POOL_SIZE": 2}
    )
    register_test_kinds(get_jobs(app).registry)
    try:
        yield primary, standby, url, app
    finally:
        get_store(app).close()


def runs(ledger: Path) -> collections.Counter[str]:
    if not ledger.exists():
        return collections.Counter()
    return collections.Counter(line.split()[0] for line in ledger.read_text().splitlines())


def claims(ledger: Path) -> list[tuple[str, str]]:
    """Each run in the ledger: the job and the claim it ran under."""
    if not ledger.exists():
        return []
    return [(line.split()[0], line.split()[2]) for line in ledger.read_text().splitlines()]


def enqueue(
    app: Flask, household_id: int, ledger: Path, seconds: float, kind: str = "append_job_id"
) -> str:
    return get_jobs(app).enqueue(
        kind, {"log": str(ledger), "seconds": seconds}, household_id=household_id
    )


def one_value(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]


def statuses(app: Flask, ids: list[str]) -> dict[str, Any] | None:
    """Each job's status, or None while the database does not answer."""
    jobs = get_jobs(app)
    try:
        return {job_id: jobs.get(job_id).status for job_id in ids}
    except StoreError:
        return None


def ended(app: Flask, ids: list[str]) -> dict[str, Any] | None:
    """Each job's status once every one is final; None until then."""
    found = statuses(app, ids)
    return found if found and set(found.values()) <= FINAL else None


def healthz(app: Flask) -> int:
    return app.test_client().get("/healthz").status_code


def test_a_failover_to_a_synchronous_standby_loses_no_job_and_runs_none_twice(service, tmp_path):
    primary, standby, url, app = service
    primary.run("sync")
    ledger = tmp_path / "ledger"
    household = create_household(get_store(app), "The Smiths").household_id
    worker = flask_jobs_work({"DATABASE_URL": url}, JOB_WORKERS=4, JOB_POLL_SECONDS=0.2)
    with contextlib.ExitStack() as stack:
        stack.callback(worker.stop)
        wait_working(worker)
        before = [enqueue(app, household, ledger, 0.05) for _ in range(40)]
        wait_for(lambda: len(runs(ledger)) >= 5, timeout=RECOVERY)

        primary.run("crash")
        wait_for(lambda: healthz(app) == 503, timeout=RECOVERY)
        standby.run("promote")
        wait_for(lambda: healthz(app) == 200, timeout=RECOVERY)
        after = [enqueue(app, household, ledger, 0.0) for _ in range(10)]

        ids = before + after
        done = wait_for(lambda: ended(app, ids), timeout=RECOVERY)
        assert set(done.values()) == {Status.SUCCEEDED}, done
        ran = runs(ledger)
        assert set(ran) == set(ids)
        assert [job for job, count in ran.items() if count > 1] == [], worker.output()
        assert worker.stop() == 0, worker.output()


def test_after_a_failover_the_pools_listen_is_back_on_the_new_primary(service, tmp_path):
    primary, standby, url, app = service
    ledger = tmp_path / "ledger"
    household = create_household(get_store(app), "The Smiths").household_id
    # Its poll is far beyond the deadlines below: only a NOTIFY heard (or the
    # look a listener makes when it connects again) runs these jobs in time.
    worker = flask_jobs_work({"DATABASE_URL": url}, JOB_WORKERS=2, JOB_POLL_SECONDS=600)
    with contextlib.ExitStack() as stack:
        stack.callback(worker.stop)
        wait_working(worker)
        first = enqueue(app, household, ledger, 0.0)
        wait_for(lambda: first in runs(ledger), timeout=RECOVERY)

        primary.run("crash")
        standby.run("promote")
        wait_for(lambda: healthz(app) == 200, timeout=RECOVERY)
        second = enqueue(app, household, ledger, 0.0)
        try:
            wait_for(lambda: second in runs(ledger), timeout=RECOVERY)
        except AssertionError:
            raise AssertionError(worker.output()) from None
        assert worker.stop() == 0, worker.output()


def test_a_failover_to_an_asynchronous_standby_loses_exactly_what_it_had_not_received(
    service, tmp_path
):
    primary, standby, url, app = service
    ledger = tmp_path / "ledger"
    household = create_household(get_store(app), "The Smiths").household_id
    # Short leases: a job whose success the standby never received is
    # running there under a claim no process holds, and is rescued from it.
    worker = flask_jobs_work(
        {"DATABASE_URL": url},
        JOB_WORKERS=4,
        JOB_POLL_SECONDS=0.2,
        JOB_LEASE_SECONDS=3,
        JOB_HEARTBEAT_SECONDS=0.5,
        JOB_RESCUE_SECONDS=0.5,
        JOB_BLOCKED_EXIT_SECONDS=2,
    )
    kind = "append_job_id_retried"  # a run cut short runs again
    with contextlib.ExitStack() as stack:
        stack.callback(worker.stop)
        wait_working(worker)
        received = [enqueue(app, household, ledger, 0.05, kind) for _ in range(40)]
        wait_for(lambda: len(runs(ledger)) >= 5, timeout=RECOVERY)

        # The standby has received every one of them; then it receives no more.
        written = one_value(primary.url, "SELECT pg_current_wal_lsn()::text")
        wait_for(
            lambda: one_value(
                standby.url, f"SELECT pg_last_wal_receive_lsn() >= '{written}'::pg_lsn"
            ),
            timeout=RECOVERY,
        )
        standby.run("stop")
        not_received = [enqueue(app, household, ledger, 0.0, kind) for _ in range(10)]
        wait_for(lambda: set(not_received) <= set(runs(ledger)), timeout=RECOVERY)

        primary.run("crash")
        ran_on_the_old_primary = runs(ledger)
        standby.run("start")
        standby.run("promote")
        wait_for(lambda: healthz(app) == 200, timeout=RECOVERY)
        after = [enqueue(app, household, ledger, 0.0, kind) for _ in range(10)]

        ids = received + after
        done = wait_for(lambda: ended(app, ids), timeout=RECOVERY)
        assert set(done.values()) == {Status.SUCCEEDED}, done
        # Lost: exactly the jobs the standby never received, each run once
        # on the old primary and unknown to the new one.
        jobs = get_jobs(app)
        assert [job_id for job_id in not_received if jobs.get(job_id) is not None] == []
        ran = runs(ledger)
        assert set(ran) == set(ids) | set(not_received)
        assert all(ran[job_id] == 1 for job_id in not_received)
        # Run twice: only jobs that ran on the old primary (their success
        # was never received), and never twice under the same claim.
        twice = {job_id for job_id, count in ran.items() if count > 1}
        assert twice <= set(ran_on_the_old_primary) - set(not_received)
        every_claim = claims(ledger)
        assert len(every_claim) == len(set(every_claim))
        assert worker.stop() == 0, worker.output()
        print(
            f"asynchronous failover: {len(ids) + len(not_received)} answered, "
            f"{len(not_received)} lost (never received by the standby), "
            f"{len(twice)} run again under a new claim (their success never received)"
        )
