"""Fixtures: a real database, migrated by the real migrations: an SQLite file in a
temp dir, and, for the modules marked `both_databases`, a fresh database on the
private PostgreSQL server the test command starts as well.

A test runs on both databases when its module is marked `both_databases`,
unless it is marked `sqlite_only` or reads the SQLite file itself (`db_path`).
A test on a database that runs on SQLite alone says why: it reads the file
(`db_path`), or its `sqlite_only` mark gives the reason
(`pytest.mark.sqlite_only("the writer thread is SQLite's")`), or collection
fails: "every test runs on both databases" is then true of every test that
does not say otherwise.
Such a test also runs on PostgreSQL through the test PgBouncer (transaction
mode, the service set `MEALQUEST_PG_POOLER=transaction`) when it is marked
`through_pgbouncer`, or when `MEALQUEST_TEST_PGBOUNCER_ALL=1` asks for every
one of them to (all of them pass through it).
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest
from flask import Flask
from flask.testing import FlaskClient, FlaskCliRunner

from mealquest.application import create_app
from mealquest.db.driver import Store
from mealquest.db.sqlite import migrate
from mealquest.extensions import get_store
from mealquest.households import IssuedToken, create_household
from mealquest.jobs.service import JobService, get_jobs
from mealquest.jobs.service.live import get_live
from tests.support.gates import Gates
from tests.support.kinds import register_test_kinds
from tests.support.postgres import (
    fresh_database,
    require_pgbouncer_url,
    require_postgres_url,
    through_pgbouncer,
)
from tests.support.write_lock import LockHolder

# Short times so tests wait on conditions for fractions of a second.
FAST_POOL = {
    "JOB_POLL_SECONDS": 0.05,
    "JOB_LEASE_SECONDS": 2.0,
    "JOB_HEARTBEAT_SECONDS": 0.3,
    "JOB_RESCUE_SECONDS": 0.3,
    # Below the lease minus a heartbeat, as the configuration requires (only
    # `flask jobs work` processes act on it).
    "JOB_BLOCKED_EXIT_SECONDS": 1.5,
    # No hourly prune job appearing among a test's jobs when a test runs
    # across its minute (retention's own tests turn it on).
    "JOB_RETENTION_DAYS": 0,
}


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.01) -> Any:
    """Poll `condition` cooperatively (greenlets run meanwhile) until truthy or the deadline.

    The deadline is generous: a loaded machine may take seconds to start a
    connection or a process, and a passing test never waits it out."""
    deadline = gevent.get_hub().loop.now() + timeout
    while True:
        value = condition()
        if value:
            return value
        if gevent.get_hub().loop.now() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        gevent.sleep(interval)


# "pgbouncer": the PostgreSQL database reached through PgBouncer in transaction mode.
DATABASES = ("sqlite", "postgresql", "pgbouncer")
# Every `both_databases` test through PgBouncer as well, not only the marked ones.
PGBOUNCER_ALL = os.environ.get("MEALQUEST_TEST_PGBOUNCER_ALL") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_databases: run on SQLite and on PostgreSQL")
    config.addinivalue_line(
        "markers", "sqlite_only(reason): a test of SQLite itself, and why it runs there alone"
    )
    config.addinivalue_line(
        "markers", "through_pgbouncer: run on PostgreSQL through PgBouncer too (both_databases)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "database" not in metafunc.fixturenames:
        return
    node = metafunc.definition
    for mark in node.iter_markers("parametrize"):
        names = mark.args[0]
        if "database" in (names.replace(" ", "").split(",") if isinstance(names, str) else names):
            return  # the test names its databases itself
    both = (
        node.get_closest_marker("both_databases") is not None
        and node.get_closest_marker("sqlite_only") is None
        and "db_path" not in metafunc.fixturenames
    )
    sqlite_only = node.get_closest_marker("sqlite_only")
    if not both and "db_path" not in metafunc.fixturenames:
        reason = sqlite_only and (sqlite_only.args or sqlite_only.kwargs.get("reason"))
        if not reason:
            raise pytest.UsageError(
                f"{node.nodeid} runs on SQLite alone: mark its module `both_databases`, "
                'or mark it `sqlite_only("why")`'
            )
    bouncer = both and (PGBOUNCER_ALL or node.get_closest_marker("through_pgbouncer") is not None)
    databases = DATABASES if bouncer else DATABASES[:2] if both else DATABASES[:1]
    metafunc.parametrize("database", databases, indirect=True)


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite file migrated once per test process, which each test's own
    file is a copy of: migrating a new file took about 120 ms, a copy well
    under one, and a thousand tests start on SQLite. Checkpointed and
    closed first, so the file alone holds the whole schema."""
    path = tmp_path_factory.mktemp("migrated") / "mealquest.sqlite3"
    migrate.upgrade(str(path))
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return path


@pytest.fixture
def database(
    request: pytest.FixtureRequest, tmp_path: Path, migrated_sqlite: Path
) -> Iterator[dict[str, Any]]:
    """The test's migrated database, as the app's configuration names it."""
    if request.param == "pgbouncer":
        require_pgbouncer_url()
        with fresh_database(require_postgres_url(), migrated=True) as url:
            yield {"DATABASE_URL": through_pgbouncer(url), "PG_POOLER": "transaction"}
        return
    if request.param == "postgresql":
        with fresh_database(require_postgres_url(), migrated=True) as url:
            yield {"DATABASE_URL": url}
        return
    path = str(tmp_path / "mealquest.sqlite3")
    shutil.copyfile(migrated_sqlite, path)
    yield {"DATABASE": path}


@pytest.fixture
def db_path(database: dict[str, Any]) -> str:
    """The SQLite file of a test that reads it itself (such a test runs on SQLite only)."""
    return database["DATABASE"]


@pytest.fixture
def lock_holder(db_path: str) -> Iterator[LockHolder]:
    """Another process that takes the database's write lock when the test says."""
    holder = LockHolder(db_path)
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture
def write_lock(database: dict[str, Any]) -> Iterator[LockHolder]:
    """Another process that, when the test says, holds the lock every write of
    the test's database waits on (SQLite's or PostgreSQL's): the database as
    a write finds it while it is away."""
    holder = LockHolder.of(database)
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture
def gates() -> Iterator[Gates]:
    """Pages held until the test opens them: what `wait_for_gate` jobs wait on."""
    held = Gates()
    try:
        yield held
    finally:
        held.close()


@pytest.fixture
def make_app(database: dict[str, Any]) -> Iterator[Callable[..., Flask]]:
    """Builds apps on the test database; stops their pools and closes their stores after."""
    apps: list[Flask] = []

    def make(**config: Any) -> Flask:
        app = create_app({"TESTING": True, **database, **FAST_POOL, **config})
        register_test_kinds(get_jobs(app).registry)
        apps.append(app)
        return app

    yield make
    for app in apps:
        get_live(app).watcher.stop()
        pool = get_jobs(app).pool
        if pool is not None:
            pool.stop(timeout=1)
        get_store(app).close()


@pytest.fixture
def app(make_app: Callable[..., Flask]) -> Flask:
    return make_app()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def runner(app: Flask) -> FlaskCliRunner:
    return app.test_cli_runner()


@pytest.fixture
def store(app: Flask) -> Store:
    return get_store(app)


@pytest.fixture
def jobs(app: Flask) -> JobService:
    return get_jobs(app)


@pytest.fixture
def household(store: Store) -> IssuedToken:
    return create_household(store, "The Smiths")


@pytest.fixture
def other_household(store: Store) -> IssuedToken:
    return create_household(store, "The Joneses")


@pytest.fixture
def auth(household: IssuedToken) -> dict[str, str]:
    return {"Authorization": f"Bearer {household.token}"}


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every record of the `mealquest` logger (which does not propagate), DEBUG up."""
    logger = logging.getLogger("mealquest")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG)
    yield caplog
    logger.removeHandler(caplog.handler)
