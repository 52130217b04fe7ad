"""One store per test, of each driver, on a fresh migrated database: the
statement suite runs unchanged against both (as River's `riverdrivertest`
and huey's `StorageTests` do), and against PostgreSQL through the test
PgBouncer in transaction mode (the store set for it) as well."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from mealquest.clock import to_text
from mealquest.db.driver import Store
from mealquest.db.postgresql.store import PostgresStore
from mealquest.db.sqlite import migrate
from mealquest.db.sqlite.store import SqliteStore
from mealquest.model.jobs import ClaimRequest, Job, NewJob, OnInterrupt
from tests.support.postgres import (
    fresh_database,
    require_pgbouncer_url,
    require_postgres_url,
    through_pgbouncer,
)

LEASE = 30.0


@pytest.fixture(params=["sqlite", "postgresql", "pgbouncer"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param in ("postgresql", "pgbouncer"):
        bouncer = request.param == "pgbouncer"
        if bouncer:
            require_pgbouncer_url()
        with fresh_database(require_postgres_url(), migrated=True) as url:
            pg = PostgresStore(
                through_pgbouncer(url) if bouncer else url,
                busy_timeout_seconds=5,
                pool_size=4,
                listen=False,
                pooler="transaction" if bouncer else "none",
            )
            yield pg
            pg.close()
        return
    path = str(tmp_path / "mealquest.sqlite3")
    migrate.upgrade(path)
    sqlite = SqliteStore(path, busy_timeout_seconds=5)
    yield sqlite
    sqlite.close()


@pytest.fixture
def household(store: Store) -> int:
    return store.write(store.households.create_household, name="Smiths", token_sha256="a" * 64)[0]


def enqueue(
    store: Store,
    household: int,
    kind: str = "succeed",
    *,
    on_interrupt: OnInterrupt = OnInterrupt.FAIL,
    max_attempts: int = 1,
    run_at: datetime | None = None,
) -> str:
    job_id = uuid.uuid4().hex
    store.write(
        store.jobs.insert_job,
        NewJob(
            job_id=job_id,
            household_id=household,
            kind=kind,
            payload="{}",
            max_attempts=max_attempts,
            on_interrupt=on_interrupt,
            run_at=run_at,
        ),
    )
    return job_id


def claim(store: Store, *, kinds=("succeed",), limit=10, owner="worker-1", now=None) -> list[Job]:
    return store.write(
        store.jobs.claim,
        ClaimRequest(owner=owner, lease_seconds=LEASE, limit=limit, kinds=tuple(kinds), now=now),
    )


def db_now(store: Store):
    """The database's "now", as its statements judge times."""
    return store.read(store.periodic.current_time)


def get(store: Store, job_id: str) -> Job:
    return store.read(store.jobs.get_job, job_id)


def set_run_at(store: Store, job_id: str, seconds_from_now: float) -> None:
    """Move a job's due time (each database keeps times its own way)."""
    if store.name == "postgresql":
        store.write(
            lambda tx: tx.execute(
                "UPDATE jobs SET run_at = now() + make_interval(secs => %s) WHERE id = %s",
                (float(seconds_from_now), job_id),
            )
        )
        return
    due = to_text(db_now(store) + timedelta(seconds=seconds_from_now))
    store.write(lambda tx: tx.execute("UPDATE jobs SET run_at = ? WHERE id = ?", (due, job_id)))


def other_household(store: Store, name: str = "Joneses", digest: str = "b") -> int:
    return store.write(store.households.create_household, name=name, token_sha256=digest * 64)[0]
